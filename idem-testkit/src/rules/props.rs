//! Property tests: random delivery streams, with duplicates, reordering and several concurrent
//! workers, against an oracle that applies each message exactly once in version order.
//!
//! `PROPTEST_CASES` sets the cases per property (default 32; 2,100 with `IDEM_SOAK=1`, over
//! 100,000 deliveries per property), `IDEM_PROPTEST_SEED` replays a run:
//! a failure prints its seed and the shrunk stream.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem::{idempotent, Outcome, Tx};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sqlx::Pool;

use crate::backend::{exec, fetch, Kit, KitDb, Ty, Value};
use crate::{Backend, Dialect};

/// The proptest runner of these properties: modest case counts, a printed seed, no persistence
/// files.
pub mod runner {
    use proptest::strategy::Strategy;
    use proptest::test_runner::{
        Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
    };

    /// Cases per property: `PROPTEST_CASES`, default 32, or 2,100 with `IDEM_SOAK=1` (streams
    /// average about 48 deliveries: over 100,000 deliveries per property).
    pub fn cases() -> u32 {
        let soak = std::env::var_os("IDEM_SOAK").is_some_and(|v| v == "1");
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(if soak { 2_100 } else { 32 })
    }

    /// Runs `test` on `cases()` values of `strategy`, from the seed `IDEM_PROPTEST_SEED` (or a
    /// random one); on failure panics with the seed and the shrunk value, printed with `Debug`.
    pub fn check<S: Strategy>(
        name: &str,
        strategy: S,
        test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    ) where
        S::Value: std::fmt::Debug,
    {
        let seed: u64 = std::env::var("IDEM_PROPTEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let mut bytes = [0_u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: cases(),
            max_shrink_iters: 1000,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(config, rng);
        match runner.run(&strategy, test) {
            Ok(()) => {}
            Err(TestError::Fail(reason, value)) => panic!(
                "{name}: property failed (replay with IDEM_PROPTEST_SEED={seed})\n\
                 reason: {reason}\nshrunk input: {value:?}"
            ),
            Err(TestError::Abort(reason)) => {
                panic!("{name}: aborted (IDEM_PROPTEST_SEED={seed}): {reason}")
            }
        }
    }
}

/// Workers a stream is spread over (each a tokio task with its own connections).
const MAX_WORKERS: u8 = 4;
/// Longest stream of deliveries per case.
const MAX_DELIVERIES: usize = 96;
/// Distinct key-only messages a stream draws from (so long streams repeat many of them).
const CREDIT_IDS: u8 = 16;
/// Orders and versions per order a status stream draws from.
const ORDERS: u8 = 4;
const VERSIONS: u8 = 9;

/// One delivery of the key-only message `id` (it credits `id + 1` to account `id % 3`), handled by
/// worker `worker % workers`. Shown as `c{id}@w{worker}`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Credit {
    id: u8,
    worker: u8,
}

impl Credit {
    fn account(&self) -> i64 {
        i64::from(self.id % 3)
    }

    fn amount(&self) -> i64 {
        i64::from(self.id) + 1
    }
}

impl fmt::Debug for Credit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}@w{}", self.id, self.worker)
    }
}

/// One delivery of a status change: `version` of `order`, event id `o{order}v{version}`, status
/// `s{version}`. Shown as `o{order}v{version}@w{worker}`.
#[derive(Clone, PartialEq, Eq)]
struct Change {
    order: u8,
    version: u8,
    worker: u8,
    event_id: String,
}

impl Change {
    fn new(order: u8, version: u8, worker: u8) -> Self {
        Change {
            order,
            version,
            worker,
            event_id: format!("o{order}v{version}"),
        }
    }
}

impl fmt::Debug for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "o{}v{}@w{}", self.order, self.version, self.worker)
    }
}

/// A delivery stream and the number of concurrent workers it is spread over.
#[derive(Clone)]
struct Stream<T> {
    workers: u8,
    deliveries: Vec<T>,
}

impl<T: fmt::Debug> fmt::Debug for Stream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} workers, {} deliveries: {:?}",
            self.workers,
            self.deliveries.len(),
            self.deliveries
        )
    }
}

fn credits() -> impl Strategy<Value = Stream<Credit>> {
    let delivery = (0..CREDIT_IDS, 0..MAX_WORKERS).prop_map(|(id, worker)| Credit { id, worker });
    (
        1..=MAX_WORKERS,
        proptest::collection::vec(delivery, 1..=MAX_DELIVERIES),
    )
        .prop_map(|(workers, deliveries)| Stream {
            workers,
            deliveries,
        })
}

fn changes() -> impl Strategy<Value = Stream<Change>> {
    let delivery = (0..ORDERS, 1..=VERSIONS, 0..MAX_WORKERS)
        .prop_map(|(order, version, worker)| Change::new(order, version, worker));
    (
        1..=MAX_WORKERS,
        proptest::collection::vec(delivery, 1..=MAX_DELIVERIES),
    )
        .prop_map(|(workers, deliveries)| Stream {
            workers,
            deliveries,
        })
}

/// Key only: appends to the effect log and credits the account.
#[idempotent(key = "msg.id", scope = "props::credit")]
async fn credit<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Credit,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    log_effect::<DB>(&mut **tx, d, "credit", &msg.id.to_string()).await?;
    // Let the other workers run while this transaction is open.
    tokio::task::yield_now().await;
    crate::fixtures::add_to_account::<DB>(&mut **tx, d, msg.account().into(), msg.amount()).await?;
    Ok(())
}

/// Key + version: the order is the key and the entity.
#[idempotent(
    key = "msg.order",
    version = "msg.version",
    scope = "props::set_status"
)]
async fn set_status<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Change,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    apply_change::<DB>(&mut **tx, d, "set_status", msg).await
}

/// Key + version + entity: each event once, never an older version over a newer one.
#[idempotent(
    key = "msg.event_id",
    version = "msg.version",
    entity = "msg.order",
    scope = "props::on_status"
)]
async fn on_status<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Change,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    apply_change::<DB>(&mut **tx, d, "on_status", msg).await
}

/// Appends the delivery of `msg` by the handler of `scope` to the effect log.
async fn log_effect<DB: KitDb>(
    conn: &mut DB::Connection,
    d: &Dialect,
    scope: &str,
    msg: &str,
) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO effects (scope, msg) VALUES ($1, $2)";
    exec::<DB>(conn, d, sql, &[scope.into(), msg.into()]).await
}

/// Appends to the effect log and moves the order to this version; refuses (a handler error, which
/// fails the property) to move it anywhere but forward, so every applied change is checked to
/// come after the ones applied before it, inside the same transaction.
///
/// Portable and atomic without rows-affected counts (MySQL reports matched rows): a conditional
/// `UPDATE … WHERE version < new` stamps the row with this event; if the stamp is not there, the
/// order must be new, and a plain `INSERT` fails on an existing row.
async fn apply_change<DB: KitDb>(
    conn: &mut DB::Connection,
    d: &Dialect,
    scope: &str,
    msg: &Change,
) -> Result<(), sqlx::Error> {
    log_effect::<DB>(&mut *conn, d, scope, &msg.event_id).await?;
    tokio::task::yield_now().await;
    let (order, version) = (i64::from(msg.order), i64::from(msg.version));
    let status = format!("s{}", msg.version);
    exec::<DB>(
        &mut *conn,
        d,
        "UPDATE orders SET status = $1, version = $2, last_event = $3 \
         WHERE scope = $4 AND id = $5 AND version < $6",
        &[
            status.clone().into(),
            version.into(),
            (&msg.event_id).into(),
            scope.into(),
            order.into(),
            version.into(),
        ],
    )
    .await?;
    let stamped = fetch::<DB>(
        &mut *conn,
        d,
        "SELECT COUNT(*) FROM orders WHERE scope = $1 AND id = $2 AND last_event = $3",
        &[scope.into(), order.into(), (&msg.event_id).into()],
        &[Ty::Int],
    )
    .await?;
    if stamped[0][0].int() == 1 {
        return Ok(());
    }
    let inserted = exec::<DB>(
        conn,
        d,
        "INSERT INTO orders (scope, id, status, version, last_event) VALUES ($1, $2, $3, $4, $5)",
        &[
            scope.into(),
            order.into(),
            status.into(),
            version.into(),
            (&msg.event_id).into(),
        ],
    )
    .await;
    inserted.map_err(|err| {
        sqlx::Error::Protocol(format!(
            "{msg:?} was applied but order {} already had this or a newer version ({err})",
            msg.order
        ))
    })
}

async fn setup<B: Backend>(k: &Kit<B>) {
    let key = k.dialect.key_type;
    for sql in [
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)".to_string(),
        "CREATE TABLE effects (scope TEXT NOT NULL, msg TEXT NOT NULL)".to_string(),
        format!(
            "CREATE TABLE orders (scope {key} NOT NULL, id BIGINT NOT NULL, status TEXT NOT NULL, \
             version BIGINT NOT NULL, last_event TEXT NOT NULL, PRIMARY KEY (scope, id))"
        ),
    ] {
        k.exec(&sql, &[]).await;
    }
}

/// Empties every table, so each case starts from nothing.
async fn reset<DB: KitDb>(pool: &Pool<DB>, d: &Dialect) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    for table in [
        "accounts",
        "effects",
        "orders",
        "idem_records",
        "idem_versions",
    ] {
        exec::<DB>(&mut conn, d, &format!("DELETE FROM {table}"), &[]).await?;
    }
    Ok(())
}

type Handled = Result<Outcome<()>, idem::Error<sqlx::Error>>;
type Deliver<DB, T> = fn(Pool<DB>, T, Dialect) -> Pin<Box<dyn Future<Output = Handled> + Send>>;

fn deliver_credit<DB: KitDb>(
    pool: Pool<DB>,
    msg: Credit,
    d: Dialect,
) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { credit(&pool, &msg, &d).await })
}

fn deliver_set_status<DB: KitDb>(
    pool: Pool<DB>,
    msg: Change,
    d: Dialect,
) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { set_status(&pool, &msg, &d).await })
}

fn deliver_on_status<DB: KitDb>(
    pool: Pool<DB>,
    msg: Change,
    d: Dialect,
) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { on_status(&pool, &msg, &d).await })
}

/// Splits the stream into one lane per worker (keeping the stream's order within a lane), runs
/// the lanes as concurrent tasks and returns every delivery with its outcome, lane by lane. Any
/// error (a duplicate or stale message must never be one) fails the case.
async fn run_lanes<B: Backend, T>(
    k: &Kit<B>,
    stream: &Stream<T>,
    deliver: Deliver<B::Db, T>,
) -> Result<Vec<(T, Outcome<()>)>, TestCaseError>
where
    T: Clone + fmt::Debug + Send + 'static,
    T: HasWorker,
{
    let mut lanes: Vec<Vec<T>> = vec![Vec::new(); usize::from(stream.workers)];
    for d in &stream.deliveries {
        lanes[usize::from(d.worker() % stream.workers)].push(d.clone());
    }
    let d = k.dialect;
    // A JoinSet aborts the lanes still running when this returns early (or is dropped), so a
    // failed case never leaves workers writing into the next one's tables.
    let mut tasks = tokio::task::JoinSet::new();
    for (i, lane) in lanes.into_iter().enumerate() {
        let pool = k.pool.clone();
        tasks.spawn(async move {
            let mut out = Vec::with_capacity(lane.len());
            for msg in lane {
                match deliver(pool.clone(), msg.clone(), d).await {
                    Ok(outcome) => out.push((msg, outcome)),
                    Err(err) => return Err(format!("{msg:?}: {err:?}")),
                }
            }
            Ok((i, out))
        });
    }
    let mut done = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(lane)) => done.push(lane),
            Ok(Err(err)) => return Err(TestCaseError::fail(format!("error surfaced: {err}"))),
            Err(join) => return Err(TestCaseError::fail(format!("worker panicked: {join}"))),
        }
    }
    done.sort_unstable_by_key(|(i, _)| *i);
    Ok(done.into_iter().flat_map(|(_, out)| out).collect())
}

trait HasWorker {
    fn worker(&self) -> u8;
}

impl HasWorker for Credit {
    fn worker(&self) -> u8 {
        self.worker
    }
}

impl HasWorker for Change {
    fn worker(&self) -> u8 {
        self.worker
    }
}

/// Reads rows, as a case's result.
async fn rows<B: Backend>(
    k: &Kit<B>,
    sql: &str,
    binds: &[Value],
    columns: &[Ty],
) -> Result<Vec<Vec<Value>>, TestCaseError> {
    let mut conn = k.pool.acquire().await.map_err(db_err)?;
    fetch::<B::Db>(&mut conn, &k.dialect, sql, binds, columns)
        .await
        .map_err(db_err)
}

/// How many effect rows each message of `scope` left: the effect log has no unique constraint,
/// so a message applied twice shows as 2.
async fn effects<B: Backend>(
    k: &Kit<B>,
    scope: &str,
) -> Result<BTreeMap<String, i64>, TestCaseError> {
    let rows = rows(
        k,
        "SELECT msg, COUNT(*) FROM effects WHERE scope = $1 GROUP BY msg",
        &[scope.into()],
        &[Ty::Text, Ty::Int],
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r[0].text(), r[1].int()))
        .collect())
}

async fn record_keys<B: Backend>(
    k: &Kit<B>,
    scope: &str,
) -> Result<BTreeSet<Vec<u8>>, TestCaseError> {
    let rows = rows(
        k,
        "SELECT msg_key FROM idem_records WHERE scope = $1",
        &[scope.into()],
        &[Ty::Bytes],
    )
    .await?;
    Ok(rows.into_iter().map(|r| r[0].bytes()).collect())
}

fn db_err(err: sqlx::Error) -> TestCaseError {
    TestCaseError::fail(format!("checking the database: {err}"))
}

/// Key only. Oracle: every distinct message applied exactly once.
async fn check_credits<B: Backend>(
    k: &Kit<B>,
    stream: Stream<Credit>,
) -> Result<(), TestCaseError> {
    reset(&k.pool, &k.dialect).await.map_err(db_err)?;
    let results = run_lanes(k, &stream, deliver_credit::<B::Db>).await?;
    let distinct: BTreeSet<u8> = stream.deliveries.iter().map(|d| d.id).collect();
    let mut applied: Vec<u8> = Vec::new();
    for (msg, outcome) in &results {
        match outcome {
            Outcome::Applied(()) => applied.push(msg.id),
            Outcome::Duplicate => {}
            other => return Err(TestCaseError::fail(format!("{msg:?}: {other:?}"))),
        }
    }
    applied.sort_unstable();
    let once: Vec<u8> = distinct.iter().copied().collect();
    prop_assert_eq!(
        &applied,
        &once,
        "outcomes: each message Applied exactly once"
    );
    let expected_effects: BTreeMap<String, i64> =
        distinct.iter().map(|id| (id.to_string(), 1)).collect();
    prop_assert_eq!(
        effects(k, "credit").await?,
        expected_effects,
        "effect rows per message"
    );
    let mut expected_balances: BTreeMap<i64, i64> = BTreeMap::new();
    for &id in &distinct {
        let msg = Credit { id, worker: 0 };
        *expected_balances.entry(msg.account()).or_default() += msg.amount();
    }
    let balances = rows(
        k,
        "SELECT id, balance FROM accounts",
        &[],
        &[Ty::Int, Ty::Int],
    )
    .await?;
    prop_assert_eq!(
        balances
            .into_iter()
            .map(|r| (r[0].int(), r[1].int()))
            .collect::<BTreeMap<_, _>>(),
        expected_balances,
        "balances"
    );
    let expected_keys: BTreeSet<Vec<u8>> = distinct
        .iter()
        .map(|id| id.to_string().into_bytes())
        .collect();
    prop_assert_eq!(
        record_keys(k, "props::credit").await?,
        expected_keys,
        "records"
    );
    Ok(())
}

/// The exactly-once, in-order oracle for status changes, run delivery by delivery.
#[derive(Default)]
struct Model {
    /// Per order: the last applied version.
    last: BTreeMap<u8, u8>,
    /// Applied event ids (key + version + entity only).
    seen: BTreeSet<String>,
}

impl Model {
    fn deliver(&mut self, entity_mode: bool, msg: &Change) -> Outcome<()> {
        let last = self.last.get(&msg.order).copied();
        if entity_mode && self.seen.contains(&msg.event_id) {
            return Outcome::Duplicate;
        }
        match last {
            Some(last) if !entity_mode && last == msg.version => Outcome::Duplicate,
            Some(last) if last >= msg.version => Outcome::Stale {
                latest: i64::from(last),
            },
            _ => {
                self.last.insert(msg.order, msg.version);
                self.seen.insert(msg.event_id.clone());
                Outcome::Applied(())
            }
        }
    }
}

/// Key + version (`entity_mode` false) or key + version + entity (true). Oracle: the final state
/// of every order is its newest version, applied exactly once; no event is applied twice; every
/// applied change moved its order forward (checked in the handler); with one worker, every
/// outcome is the one the sequential oracle gives.
async fn check_changes<B: Backend>(
    k: &Kit<B>,
    stream: Stream<Change>,
    entity_mode: bool,
) -> Result<(), TestCaseError> {
    reset(&k.pool, &k.dialect).await.map_err(db_err)?;
    let (scope, deliver): (&str, Deliver<B::Db, Change>) = if entity_mode {
        ("on_status", deliver_on_status::<B::Db>)
    } else {
        ("set_status", deliver_set_status::<B::Db>)
    };
    let results = run_lanes(k, &stream, deliver).await?;

    let mut model = Model::default();
    let expected: Vec<Outcome<()>> = stream
        .deliveries
        .iter()
        .map(|d| model.deliver(entity_mode, d))
        .collect();
    if stream.workers == 1 {
        let got: Vec<Outcome<()>> = results.iter().map(|(_, o)| o.clone()).collect();
        prop_assert_eq!(
            got,
            expected,
            "one worker: every outcome as the sequential oracle says"
        );
    }

    let mut applied: BTreeMap<String, i64> = BTreeMap::new();
    for (msg, outcome) in &results {
        match outcome {
            Outcome::Applied(()) => *applied.entry(msg.event_id.clone()).or_default() += 1,
            Outcome::Duplicate => {}
            Outcome::Stale { latest } => {
                prop_assert!(
                    *latest >= i64::from(msg.version),
                    "{msg:?}: stale behind {latest}"
                );
            }
            other => return Err(TestCaseError::fail(format!("{msg:?}: {other:?}"))),
        }
    }
    prop_assert!(
        applied.values().all(|&n| n == 1),
        "an event was applied twice: {applied:?}"
    );
    prop_assert_eq!(
        &effects(k, scope).await?,
        &applied,
        "effect rows = applied outcomes"
    );

    // The newest version of every order was applied, and is the final state.
    let newest: BTreeMap<u8, u8> = model.last;
    for (&order, &version) in &newest {
        prop_assert!(
            applied.contains_key(&format!("o{order}v{version}")),
            "newest version of order {order} lost"
        );
    }
    let final_state: BTreeMap<i64, (String, i64)> = rows(
        k,
        "SELECT id, status, version FROM orders WHERE scope = $1",
        &[scope.into()],
        &[Ty::Int, Ty::Text, Ty::Int],
    )
    .await?
    .into_iter()
    .map(|r| (r[0].int(), (r[1].text(), r[2].int())))
    .collect();
    let expected_state: BTreeMap<i64, (String, i64)> = newest
        .iter()
        .map(|(&o, &v)| (i64::from(o), (format!("s{v}"), i64::from(v))))
        .collect();
    prop_assert_eq!(final_state, expected_state, "final orders");
    let versions: BTreeMap<Vec<u8>, i64> = rows(
        k,
        "SELECT entity, version FROM idem_versions WHERE scope = $1",
        &[format!("props::{scope}").into()],
        &[Ty::Bytes, Ty::Int],
    )
    .await?
    .into_iter()
    .map(|r| (r[0].bytes(), r[1].int()))
    .collect();
    let expected_versions: BTreeMap<Vec<u8>, i64> = newest
        .iter()
        .map(|(&o, &v)| (o.to_string().into_bytes(), i64::from(v)))
        .collect();
    prop_assert_eq!(versions, expected_versions, "version high-water marks");
    let records = record_keys(k, &format!("props::{scope}")).await?;
    let expected_records: BTreeSet<Vec<u8>> = if entity_mode {
        applied.keys().map(|k| k.clone().into_bytes()).collect()
    } else {
        BTreeSet::new() // key + version keeps a version per entity, no record per message
    };
    prop_assert_eq!(
        records,
        expected_records,
        "records: the applied events, and only them"
    );
    Ok(())
}

/// Runs one property on a fresh database of the backend, each case bounded in time. The
/// proptest runner is synchronous: it runs in `block_in_place`, each case on the rule's runtime.
async fn property<B: Backend, T: Clone + fmt::Debug + 'static>(
    name: &str,
    strategy: impl Strategy<Value = Stream<T>>,
    check: impl for<'a> Fn(
        &'a Kit<B>,
        Stream<T>,
    ) -> Pin<Box<dyn Future<Output = Result<(), TestCaseError>> + 'a>>,
) {
    let (k, _) = crate::__open!(B, setup);
    let started = std::time::Instant::now();
    let deliveries = std::cell::Cell::new(0);
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        runner::check(name, strategy, |stream| {
            deliveries.set(deliveries.get() + stream.deliveries.len());
            handle.block_on(async {
                match tokio::time::timeout(Duration::from_secs(60), check(&k, stream)).await {
                    Ok(result) => result,
                    Err(_) => Err(TestCaseError::fail("case did not finish within 60 s")),
                }
            })
        })
    });
    eprintln!(
        "{name}: {} cases, {} deliveries (with shrinking) in {:.1?}",
        runner::cases(),
        deliveries.get(),
        started.elapsed()
    );
    k.close().await;
}

/// Random key-only streams over concurrent workers apply each message exactly once.
pub async fn key_only_streams_apply_each_message_once<B: Backend>() {
    property::<B, _>("key_only", credits(), |k, stream| {
        Box::pin(check_credits(k, stream))
    })
    .await;
}

/// Random key + version streams end in each entity's newest state, as the oracle says.
pub async fn key_version_streams_end_in_the_newest_state<B: Backend>() {
    property::<B, _>("key_version", changes(), |k, stream| {
        Box::pin(check_changes(k, stream, false))
    })
    .await;
}

/// Random key + version + entity streams apply each event at most once, in order, as the
/// oracle says.
pub async fn key_version_entity_streams_apply_each_event_once_in_order<B: Backend>() {
    property::<B, _>("key_version_entity", changes(), |k, stream| {
        Box::pin(check_changes(k, stream, true))
    })
    .await;
}

// The body of `tests/reliability_props.rs`, included once per backend: it sees that backend's
// `Db`, `database()` and `release()`. (Included, so no inner doc comments here.)

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem::{idempotent, Outcome, Tx};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sqlx::Pool;

use crate::runner;

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
async fn credit(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (scope, msg) VALUES ('credit', $1)")
        .bind(msg.id.to_string())
        .execute(&mut **tx)
        .await?;
    // Let the other workers run while this transaction is open.
    tokio::task::yield_now().await;
    sqlx::query(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
    )
    .bind(msg.account())
    .bind(msg.amount())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Key + version: the order is the key and the entity.
#[idempotent(
    key = "msg.order",
    version = "msg.version",
    scope = "props::set_status"
)]
async fn set_status(tx: &mut Tx<'_, Db>, msg: &Change) -> Result<(), sqlx::Error> {
    apply_change(tx, "set_status", msg).await
}

/// Key + version + entity: each event once, never an older version over a newer one.
#[idempotent(
    key = "msg.event_id",
    version = "msg.version",
    entity = "msg.order",
    scope = "props::on_status"
)]
async fn on_status(tx: &mut Tx<'_, Db>, msg: &Change) -> Result<(), sqlx::Error> {
    apply_change(tx, "on_status", msg).await
}

/// Appends to the effect log and moves the order to this version; refuses (a handler error, which
/// fails the property) to move it anywhere but forward, so every applied change is checked to
/// come after the ones applied before it, inside the same transaction.
async fn apply_change(tx: &mut Tx<'_, Db>, scope: &str, msg: &Change) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (scope, msg) VALUES ($1, $2)")
        .bind(scope)
        .bind(&msg.event_id)
        .execute(&mut **tx)
        .await?;
    tokio::task::yield_now().await;
    let moved = sqlx::query(
        "INSERT INTO orders (scope, id, status, version) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (scope, id) DO UPDATE SET status = excluded.status, version = excluded.version \
         WHERE orders.version < excluded.version",
    )
    .bind(scope)
    .bind(i64::from(msg.order))
    .bind(format!("s{}", msg.version))
    .bind(i64::from(msg.version))
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved != 1 {
        return Err(sqlx::Error::Protocol(format!(
            "{msg:?} was applied but order {} already had this or a newer version",
            msg.order
        )));
    }
    Ok(())
}

async fn setup(pool: &Pool<Db>) {
    for sql in [
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE effects (scope TEXT NOT NULL, msg TEXT NOT NULL)",
        "CREATE TABLE orders (scope TEXT NOT NULL, id BIGINT NOT NULL, status TEXT NOT NULL, \
         version BIGINT NOT NULL, PRIMARY KEY (scope, id))",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// Empties every table, so each case starts from nothing.
async fn reset(pool: &Pool<Db>) -> Result<(), sqlx::Error> {
    for table in [
        "accounts",
        "effects",
        "orders",
        "idem_records",
        "idem_versions",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
            .execute(pool)
            .await?;
    }
    Ok(())
}

type Handled = Result<Outcome<()>, idem::Error<sqlx::Error>>;
type Deliver<T> = fn(Pool<Db>, T) -> Pin<Box<dyn Future<Output = Handled> + Send>>;

fn deliver_credit(pool: Pool<Db>, msg: Credit) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { credit(&pool, &msg).await })
}

fn deliver_set_status(
    pool: Pool<Db>,
    msg: Change,
) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { set_status(&pool, &msg).await })
}

fn deliver_on_status(pool: Pool<Db>, msg: Change) -> Pin<Box<dyn Future<Output = Handled> + Send>> {
    Box::pin(async move { on_status(&pool, &msg).await })
}

/// Splits the stream into one lane per worker (keeping the stream's order within a lane), runs
/// the lanes as concurrent tasks and returns every delivery with its outcome, lane by lane. Any
/// error (a duplicate or stale message must never be one) fails the case.
async fn run_lanes<T>(
    pool: &Pool<Db>,
    stream: &Stream<T>,
    deliver: Deliver<T>,
) -> Result<Vec<(T, Outcome<()>)>, TestCaseError>
where
    T: Clone + fmt::Debug + Send + 'static,
    T: HasWorker,
{
    let mut lanes: Vec<Vec<T>> = vec![Vec::new(); usize::from(stream.workers)];
    for d in &stream.deliveries {
        lanes[usize::from(d.worker() % stream.workers)].push(d.clone());
    }
    let tasks: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(lane.len());
                for msg in lane {
                    match deliver(pool.clone(), msg.clone()).await {
                        Ok(outcome) => out.push((msg, outcome)),
                        Err(err) => return Err(format!("{msg:?}: {err:?}")),
                    }
                }
                Ok(out)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(out)) => all.extend(out),
            Ok(Err(err)) => return Err(TestCaseError::fail(format!("error surfaced: {err}"))),
            Err(join) => return Err(TestCaseError::fail(format!("worker panicked: {join}"))),
        }
    }
    Ok(all)
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

/// How many effect rows each message of `scope` left: the effect log has no unique constraint,
/// so a message applied twice shows as 2.
async fn effects(pool: &Pool<Db>, scope: &str) -> Result<BTreeMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg, COUNT(*) FROM effects WHERE scope = $1 GROUP BY msg")
            .bind(scope)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

async fn record_keys(pool: &Pool<Db>, scope: &str) -> Result<BTreeSet<Vec<u8>>, sqlx::Error> {
    let rows: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT msg_key FROM idem_records WHERE scope = $1")
            .bind(scope)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

fn db_err(err: sqlx::Error) -> TestCaseError {
    TestCaseError::fail(format!("checking the database: {err}"))
}

/// Key only. Oracle: every distinct message applied exactly once.
async fn check_credits(pool: &Pool<Db>, stream: Stream<Credit>) -> Result<(), TestCaseError> {
    reset(pool).await.map_err(db_err)?;
    let results = run_lanes(pool, &stream, deliver_credit).await?;
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
        effects(pool, "credit").await.map_err(db_err)?,
        expected_effects,
        "effect rows per message"
    );
    let mut expected_balances: BTreeMap<i64, i64> = BTreeMap::new();
    for &id in &distinct {
        let msg = Credit { id, worker: 0 };
        *expected_balances.entry(msg.account()).or_default() += msg.amount();
    }
    let balances: Vec<(i64, i64)> = sqlx::query_as("SELECT id, balance FROM accounts")
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    prop_assert_eq!(
        balances.into_iter().collect::<BTreeMap<_, _>>(),
        expected_balances,
        "balances"
    );
    let expected_keys: BTreeSet<Vec<u8>> = distinct
        .iter()
        .map(|id| id.to_string().into_bytes())
        .collect();
    prop_assert_eq!(
        record_keys(pool, "props::credit").await.map_err(db_err)?,
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
async fn check_changes(
    pool: &Pool<Db>,
    stream: Stream<Change>,
    entity_mode: bool,
) -> Result<(), TestCaseError> {
    reset(pool).await.map_err(db_err)?;
    let (scope, deliver): (&str, Deliver<Change>) = if entity_mode {
        ("on_status", deliver_on_status)
    } else {
        ("set_status", deliver_set_status)
    };
    let results = run_lanes(pool, &stream, deliver).await?;

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
        &effects(pool, scope).await.map_err(db_err)?,
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
    let rows: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, status, version FROM orders WHERE scope = $1")
            .bind(scope)
            .fetch_all(pool)
            .await
            .map_err(db_err)?;
    let final_state: BTreeMap<i64, (String, i64)> =
        rows.into_iter().map(|(id, s, v)| (id, (s, v))).collect();
    let expected_state: BTreeMap<i64, (String, i64)> = newest
        .iter()
        .map(|(&o, &v)| (i64::from(o), (format!("s{v}"), i64::from(v))))
        .collect();
    prop_assert_eq!(final_state, expected_state, "final orders");
    let versions: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT entity, version FROM idem_versions WHERE scope = $1")
            .bind(format!("props::{scope}"))
            .fetch_all(pool)
            .await
            .map_err(db_err)?;
    let expected_versions: BTreeMap<Vec<u8>, i64> = newest
        .iter()
        .map(|(&o, &v)| (o.to_string().into_bytes(), i64::from(v)))
        .collect();
    prop_assert_eq!(
        versions.into_iter().collect::<BTreeMap<_, _>>(),
        expected_versions,
        "version high-water marks"
    );
    let records = record_keys(pool, &format!("props::{scope}"))
        .await
        .map_err(db_err)?;
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

/// Runs one property on a fresh database of this backend, each case bounded in time.
fn property<T: Clone + fmt::Debug + 'static>(
    name: &str,
    strategy: impl Strategy<Value = Stream<T>>,
    check: impl for<'a> Fn(
        &'a Pool<Db>,
        Stream<T>,
    ) -> Pin<Box<dyn Future<Output = Result<(), TestCaseError>> + 'a>>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(MAX_WORKERS))
        .enable_all()
        .build()
        .unwrap();
    let Some(pool) = rt.block_on(database()) else {
        return;
    };
    rt.block_on(setup(&pool));
    let started = std::time::Instant::now();
    let deliveries = std::cell::Cell::new(0);
    runner::check(name, strategy, |stream| {
        deliveries.set(deliveries.get() + stream.deliveries.len());
        rt.block_on(async {
            match tokio::time::timeout(Duration::from_secs(60), check(&pool, stream)).await {
                Ok(result) => result,
                Err(_) => Err(TestCaseError::fail("case did not finish within 60 s")),
            }
        })
    });
    eprintln!(
        "{name}: {} cases, {} deliveries (with shrinking) in {:.1?}",
        runner::cases(),
        deliveries.get(),
        started.elapsed()
    );
    rt.block_on(release(pool));
}

#[test]
fn key_only_streams_apply_each_message_once() {
    property("key_only", credits(), |pool, stream| {
        Box::pin(check_credits(pool, stream))
    });
}

#[test]
fn key_version_streams_end_in_the_newest_state() {
    property("key_version", changes(), |pool, stream| {
        Box::pin(check_changes(pool, stream, false))
    });
}

#[test]
fn key_version_entity_streams_apply_each_event_once_in_order() {
    property("key_version_entity", changes(), |pool, stream| {
        Box::pin(check_changes(pool, stream, true))
    });
}

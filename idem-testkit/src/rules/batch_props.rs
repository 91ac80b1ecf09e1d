//! A batch decides as one by one: random streams handled through `idem::batch` give, delivery
//! for delivery, the outcomes the same deliveries give handled one at a time in the same order,
//! and leave the same effects, records and versions. Every mode, with and without the handler
//! options (`fingerprint`, `replay`, `max_attempts`), on streams with copies, reordering, stale
//! versions, payload conflicts and failing bodies.
//!
//! Both runs share the rule's database: each case's keys and entities carry a prefix of their
//! own (`a<case>-` one by one, `b<case>-` in batches), so the two runs never meet.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::store::{Attempts, Stamps};
use idem::{Error, Outcome, Tx};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::props::runner;
use crate::backend::{exec, Kit, KitDb, Ty, Value};
use crate::{Backend, Dialect};

/// Distinct messages a stream draws from: message `n` is about entity `n % ENTITIES` at
/// version `n / ENTITIES + 1`, so a stream that reorders them delivers stale versions.
const MESSAGES: u8 = 12;
const ENTITIES: u8 = 3;
/// Longest stream of deliveries per case, and largest batch.
const MAX_DELIVERIES: usize = 40;
const MAX_BATCH: usize = 8;

/// One delivery: message `n`, its payload (another one, for a fingerprint conflict, when
/// `other_payload`), and whether its handler's body fails this time.
#[derive(Clone, PartialEq, Eq)]
struct Delivery {
    n: u8,
    other_payload: bool,
    fail: bool,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}", self.n)?;
        if self.other_payload {
            f.write_str("'")?;
        }
        if self.fail {
            f.write_str("!")?;
        }
        Ok(())
    }
}

/// A stream and the batch size its batched run uses.
#[derive(Clone)]
struct Stream {
    batch: usize,
    deliveries: Vec<Delivery>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batches of {}: {:?}", self.batch, self.deliveries)
    }
}

fn streams() -> impl Strategy<Value = Stream> {
    // One delivery in ten carries another payload, one in four fails.
    let delivery = (0..MESSAGES, 0..10_u8, 0..4_u8).prop_map(|(n, payload, fail)| Delivery {
        n,
        other_payload: payload == 0,
        fail: fail == 0,
    });
    (
        1..=MAX_BATCH,
        proptest::collection::vec(delivery, 1..=MAX_DELIVERIES),
    )
        .prop_map(|(batch, deliveries)| Stream { batch, deliveries })
}

/// A delivery as a handler sees it, under a run's prefix.
#[derive(Clone, Debug)]
pub struct Message {
    run: String,
    id: String,
    entity: String,
    version: i64,
    payload: i64,
    fail: bool,
}

impl Message {
    fn new(run: &str, d: &Delivery) -> Self {
        Message {
            run: run.to_string(),
            id: format!("{run}-m{}", d.n),
            entity: format!("{run}-e{}", d.n % ENTITIES),
            version: i64::from(d.n / ENTITIES) + 1,
            payload: i64::from(d.n) * 10 + i64::from(d.other_payload),
            fail: d.fail,
        }
    }
}

/// The body of every handler: an effect row under the handler's `scope`, then the failure the
/// delivery asks for; the value (replayed by `replay = true`) tells the payload it ran with.
async fn body<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Message,
    scope: &str,
    d: &Dialect,
) -> Result<i64, String> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO eq_effects (run, scope, msg) VALUES ($1, $2, $3)",
        &[(&msg.run).into(), scope.into(), (&msg.id).into()],
    )
    .await
    .map_err(|e| e.to_string())?;
    if msg.fail {
        return Err(format!("{} fails", msg.id));
    }
    Ok(msg.payload)
}

/// A delivery's result, comparable between the two runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Applied(i64),
    Duplicate,
    Stale(i64),
    Replayed(i64),
    Poisoned(u32),
    InProgress,
    Failed,
    Conflict,
    Other(String),
}

fn seen(result: Result<Outcome<i64>, Error<String>>) -> Seen {
    match result {
        Ok(Outcome::Applied(v)) => Seen::Applied(v),
        Ok(Outcome::Duplicate) => Seen::Duplicate,
        Ok(Outcome::Stale { latest }) => Seen::Stale(latest),
        Ok(Outcome::Replayed(v)) => Seen::Replayed(v),
        Ok(Outcome::Poisoned { attempts }) => Seen::Poisoned(attempts),
        Ok(Outcome::InProgress) => Seen::InProgress,
        Err(Error::Handler(_)) => Seen::Failed,
        Err(Error::Conflict { .. }) => Seen::Conflict,
        other => Seen::Other(format!("{other:?}")),
    }
}

/// The mode a property runs.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Key,
    Version,
    Entity,
}

impl Seen {
    /// The variant's name, for the tally a property prints.
    fn kind(&self) -> &'static str {
        match self {
            Seen::Applied(_) => "applied",
            Seen::Duplicate => "duplicate",
            Seen::Stale(_) => "stale",
            Seen::Replayed(_) => "replayed",
            Seen::Poisoned(_) => "poisoned",
            Seen::InProgress => "in_progress",
            Seen::Failed => "failed",
            Seen::Conflict => "conflict",
            Seen::Other(_) => "other",
        }
    }
}

/// The handlers a property runs: each mode's without options ([`Plain`]), or with all of them
/// ([`WithOptions`], for a backend with [`Stamps`] and [`Attempts`]).
trait Handlers<DB: KitDb> {
    /// The scope of `mode`'s handler (`key`, `key_options`, ...).
    fn scope(mode: Mode) -> &'static str;

    /// Handles `msg` alone, on the pool.
    async fn alone(
        pool: &sqlx::Pool<DB>,
        mode: Mode,
        msg: &Message,
        d: &Dialect,
    ) -> Result<Outcome<i64>, Error<String>>;

    /// Handles `messages` in one `idem::batch`.
    async fn batched(
        pool: &sqlx::Pool<DB>,
        mode: Mode,
        messages: &[Message],
        d: &Dialect,
    ) -> Result<Vec<Result<Outcome<i64>, Error<String>>>, sqlx::Error>;
}

/// A [`Handlers`] implementation and its three handlers, `key`, `version` and `entity`: each
/// runs the body given, with the `#[idempotent]` arguments given, its name its scope in
/// `eq_effects`, on a database with `KitDb` and the bounds.
macro_rules! modes {
    (
        $(#[$doc:meta])* $handlers:ident<$($bound:path),*>;
        $body:ident $params:tt -> $ret:ty;
        key: $key:ident $key_args:tt;
        version: $version:ident $version_args:tt;
        entity: $entity:ident $entity_args:tt;
    ) => {
        $(#[$doc])*
        struct $handlers;

        crate::options::handlers! {
            $body $params -> $ret;
            $key<$($bound),*> $key_args;
            $version<$($bound),*> $version_args;
            $entity<$($bound),*> $entity_args;
        }

        impl<DB: KitDb $(+ $bound)*> Handlers<DB> for $handlers {
            fn scope(mode: Mode) -> &'static str {
                match mode {
                    Mode::Key => stringify!($key),
                    Mode::Version => stringify!($version),
                    Mode::Entity => stringify!($entity),
                }
            }

            async fn alone(
                pool: &sqlx::Pool<DB>,
                mode: Mode,
                msg: &Message,
                d: &Dialect,
            ) -> Result<Outcome<i64>, Error<String>> {
                let scope = <Self as Handlers<DB>>::scope(mode);
                match mode {
                    Mode::Key => $key(pool, msg, scope, d).await,
                    Mode::Version => $version(pool, msg, scope, d).await,
                    Mode::Entity => $entity(pool, msg, scope, d).await,
                }
            }

            async fn batched(
                pool: &sqlx::Pool<DB>,
                mode: Mode,
                messages: &[Message],
                d: &Dialect,
            ) -> Result<Vec<Result<Outcome<i64>, Error<String>>>, sqlx::Error> {
                let scope = <Self as Handlers<DB>>::scope(mode);
                match mode {
                    Mode::Key => {
                        idem::batch(pool, messages, async |b, m| $key(b, m, scope, d).await).await
                    }
                    Mode::Version => {
                        idem::batch(pool, messages, async |b, m| $version(b, m, scope, d).await)
                            .await
                    }
                    Mode::Entity => {
                        idem::batch(pool, messages, async |b, m| $entity(b, m, scope, d).await)
                            .await
                    }
                }
            }
        }
    };
}

modes! {
    /// The handlers without options: any backend.
    Plain<>;
    body(msg: &Message, scope: &str, d: &Dialect) -> Result<i64, String>;
    key: key(key = "msg.id", scope = "eq::key");
    version: version(key = "msg.entity", version = "msg.version", scope = "eq::version");
    entity: entity(
        key = "msg.id", version = "msg.version", entity = "msg.entity", scope = "eq::entity"
    );
}

modes! {
    /// The handlers with `fingerprint`, `replay` and `max_attempts`.
    WithOptions<Stamps, Attempts>;
    body(msg: &Message, scope: &str, d: &Dialect) -> Result<i64, String>;
    key: key_options(
        key = "msg.id", fingerprint = "msg.payload", replay = true, max_attempts = 2,
        scope = "eq::key_options"
    );
    version: version_options(
        key = "msg.entity", version = "msg.version", fingerprint = "msg.payload", replay = true,
        max_attempts = 2, scope = "eq::version_options"
    );
    entity: entity_options(
        key = "msg.id", version = "msg.version", entity = "msg.entity",
        fingerprint = "msg.payload", replay = true, max_attempts = 2, scope = "eq::entity_options"
    );
}

/// What a run left in the database, its prefix taken out: effect rows per message, records,
/// version rows.
#[derive(Debug, PartialEq, Eq)]
struct State {
    effects: BTreeMap<String, i64>,
    records: Vec<Vec<u8>>,
    versions: BTreeMap<Vec<u8>, i64>,
}

async fn state<B: Backend>(k: &Kit<B>, run: &str, scope: &str) -> Result<State, TestCaseError> {
    let fail = |e: sqlx::Error| TestCaseError::fail(format!("reading the database: {e}"));
    let strip = |bytes: Vec<u8>| bytes[run.len()..].to_vec();
    let mut conn = k.pool.acquire().await.map_err(fail)?;
    let d = &k.dialect;
    let effects = crate::fetch::<B::Db>(
        &mut conn,
        d,
        "SELECT msg, COUNT(*) FROM eq_effects WHERE run = $1 AND scope = $2 GROUP BY msg",
        &[run.into(), scope.into()],
        &[Ty::Text, Ty::Int],
    )
    .await
    .map_err(fail)?
    .into_iter()
    .map(|r| (r[0].text()[run.len()..].to_string(), r[1].int()))
    .collect();
    let idem_scope = format!("eq::{scope}");
    let mut records: Vec<Vec<u8>> = crate::fetch::<B::Db>(
        &mut conn,
        d,
        "SELECT msg_key FROM idem_records WHERE scope = $1",
        &[Value::from(idem_scope.as_str())],
        &[Ty::Bytes],
    )
    .await
    .map_err(fail)?
    .into_iter()
    .map(|r| r[0].bytes())
    .filter(|key| key.starts_with(run.as_bytes()))
    .map(strip)
    .collect();
    records.sort();
    let versions = crate::fetch::<B::Db>(
        &mut conn,
        d,
        "SELECT entity, version FROM idem_versions WHERE scope = $1",
        &[Value::from(idem_scope.as_str())],
        &[Ty::Bytes, Ty::Int],
    )
    .await
    .map_err(fail)?
    .into_iter()
    .filter(|r| r[0].bytes().starts_with(run.as_bytes()))
    .map(|r| (strip(r[0].bytes()), r[1].int()))
    .collect();
    Ok(State {
        effects,
        records,
        versions,
    })
}

/// One case: the stream one by one under `a<case>`, in batches under `b<case>`, through the
/// handler `H` has for the mode; outcomes and what each run left must be the same.
async fn check<B: Backend, H: Handlers<B::Db>>(
    k: &Kit<B>,
    mode: Mode,
    stream: Stream,
    tally: &std::sync::Mutex<BTreeMap<&'static str, u64>>,
) -> Result<(), TestCaseError> {
    static CASE: AtomicU32 = AtomicU32::new(0);
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let (a, b) = (format!("a{case}"), format!("b{case}"));
    let d = k.dialect;
    let scope = H::scope(mode);
    let mut one_by_one = Vec::with_capacity(stream.deliveries.len());
    for delivery in &stream.deliveries {
        let msg = Message::new(&a, delivery);
        one_by_one.push(seen(H::alone(&k.pool, mode, &msg, &d).await));
    }
    let messages: Vec<Message> = stream
        .deliveries
        .iter()
        .map(|delivery| Message::new(&b, delivery))
        .collect();
    let mut in_batches = Vec::with_capacity(messages.len());
    for chunk in messages.chunks(stream.batch) {
        let results = H::batched(&k.pool, mode, chunk, &d)
            .await
            .map_err(|e| TestCaseError::fail(format!("{scope}: the batch failed: {e}")))?;
        prop_assert_eq!(
            results.len(),
            chunk.len(),
            "{}: one result a message",
            scope
        );
        in_batches.extend(results.into_iter().map(seen));
    }
    if let Ok(mut tally) = tally.lock() {
        for seen in &in_batches {
            *tally.entry(seen.kind()).or_default() += 1;
        }
    }
    prop_assert_eq!(
        &in_batches,
        &one_by_one,
        "{}: outcomes in batches (left) and one by one (right)",
        scope
    );
    prop_assert_eq!(
        state(k, &b, scope).await?,
        state(k, &a, scope).await?,
        "{}: what the runs left, in batches (left) and one by one (right)",
        scope
    );
    Ok(())
}

/// Runs the property of `mode` through the handlers `H` on a fresh database of the backend.
async fn property<B: Backend, H: Handlers<B::Db>>(mode: Mode) {
    let k = crate::__open!(B);
    k.exec(
        "CREATE TABLE eq_effects (run TEXT NOT NULL, scope TEXT NOT NULL, msg TEXT NOT NULL)",
        &[],
    )
    .await;
    let handle = tokio::runtime::Handle::current();
    let name = format!("batch_as_one_by_one::{}", H::scope(mode));
    let tally = std::sync::Mutex::new(BTreeMap::new());
    tokio::task::block_in_place(|| {
        runner::check(&name, streams(), |stream| {
            handle.block_on(async {
                let case = check::<B, H>(&k, mode, stream, &tally);
                match tokio::time::timeout(Duration::from_secs(120), case).await {
                    Ok(result) => result,
                    Err(_) => Err(TestCaseError::fail("case did not finish within 120 s")),
                }
            })
        })
    });
    // What the streams exercised (every kind of outcome should show up).
    eprintln!(
        "{name}: outcomes in batches {:?}",
        tally.lock().map(|t| t.clone())
    );
    k.close().await;
}

/// Key only: a batch's outcomes are those of its deliveries one by one, in order.
pub async fn key_only_batches_decide_as_one_by_one<B: Backend>() {
    property::<B, Plain>(Mode::Key).await;
}

/// Key + version: a batch's outcomes are those of its deliveries one by one, in order.
pub async fn key_version_batches_decide_as_one_by_one<B: Backend>() {
    property::<B, Plain>(Mode::Version).await;
}

/// Key + version + entity: a batch's outcomes are those of its deliveries one by one, in
/// order (a stale message twice in a batch is stale twice, not stale then a duplicate).
pub async fn key_version_entity_batches_decide_as_one_by_one<B: Backend>() {
    property::<B, Plain>(Mode::Entity).await;
}

/// Key only, with `fingerprint`, `replay` and `max_attempts`: a batch's outcomes (replayed,
/// conflicts, poisoned among them) are those of its deliveries one by one, in order.
pub async fn key_only_batches_with_options_decide_as_one_by_one<
    B: Backend<Db: Stamps + Attempts>,
>() {
    property::<B, WithOptions>(Mode::Key).await;
}

/// Key + version, with `fingerprint`, `replay` and `max_attempts`: a batch's outcomes are
/// those of its deliveries one by one, in order.
pub async fn key_version_batches_with_options_decide_as_one_by_one<
    B: Backend<Db: Stamps + Attempts>,
>() {
    property::<B, WithOptions>(Mode::Version).await;
}

/// Key + version + entity, with `fingerprint`, `replay` and `max_attempts`: a batch's
/// outcomes are those of its deliveries one by one, in order.
pub async fn key_version_entity_batches_with_options_decide_as_one_by_one<
    B: Backend<Db: Stamps + Attempts>,
>() {
    property::<B, WithOptions>(Mode::Entity).await;
}

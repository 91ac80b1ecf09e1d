//! Throughput of `#[idempotent]` handlers against the same effect without dedupe and with the
//! hand-written classic pattern, on SQLite (file, WAL, `synchronous=FULL`) and PostgreSQL
//! (`synchronous_commit` as the server has it, normally `on`): every commit is durable.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench throughput --features sqlite,postgres -- modes    # msg/s, ratios, round trips
//! cargo bench --bench throughput --features sqlite,postgres -- scale    # 1..16 workers on PostgreSQL
//! cargo bench --bench throughput --features sqlite,postgres -- memory   # max RSS over 1,000,000 messages
//! cargo bench --bench throughput --features sqlite,postgres -- peers    # the peers' workload.jsonl
//! ```
//!
//! Sections run in the order given (default: `modes`). Every mode of a section runs in the same
//! process, interleaved round by round in a rotating order, and ratios are taken within a round,
//! then the median over rounds is reported: the machine is shared, so absolute figures move,
//! ratios much less.
//!
//! Environment: `IDEM_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`; each run
//! works in a schema of its own, dropped at the end), `BENCH_ROUNDS` (300), `BENCH_SINGLE` (messages
//! per per-message mode and round, 10), `BENCH_BATCH` (messages per batch mode and round, 100),
//! `BENCH_SCALE_SECONDS` (3), `BENCH_SCALE_ROUNDS` (3), `BENCH_MEMORY_MSGS` (1,000,000),
//! `BENCH_MEMORY_BATCH` (100; 1 = one transaction per message), `BENCH_MEMORY_SECONDS` (900),
//! `PEERS_DIR` (`/tmp/idem-peers`: reads `work/workload.jsonl` and `work/expected.json`),
//! `PEERS_RUNS` (3), `BENCH_ONLY` (`sqlite` or `postgres`: one backend only).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context as _};
use idem::Outcome;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Database, PgPool, Pool, SqlitePool};

/// Accounts the business effect spreads its updates over.
const ACCOUNTS: i64 = 10_000;
/// The classic pattern's consumer name (its dedupe table is scoped like idem's).
const CONSUMER: &str = "bench::credit";

// ---------------------------------------------------------------------------------------------
// Messages

/// One message: credit `amount` to `account`. `version` grows with every message, so the
/// versioned handler always advances (the stale path is not what is measured).
#[derive(Clone, Debug)]
struct Credit {
    id: String,
    account: i64,
    amount: i64,
    version: i64,
}

/// Generates messages with new ids (36 characters, the length of the peers' UUIDs); the low 48
/// bits of the sequence number are in the id, so ids never repeat.
struct Gen {
    next: u64,
    tag: u32,
}

impl Gen {
    fn new(tag: u32) -> Self {
        Gen { next: 0, tag }
    }

    fn one(&mut self) -> Credit {
        self.next += 1;
        let seq = self.next;
        // A UUID-shaped id, random-looking (like a v4 UUID), so records spread over the B-tree.
        let h = splitmix64(seq ^ (u64::from(self.tag) << 40));
        Credit {
            id: format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                h >> 32,
                (h >> 16) & 0xffff,
                h & 0xfff,
                seq >> 48,
                seq & 0xffff_ffff_ffff
            ),
            account: ((seq as i64).wrapping_mul(7919)).rem_euclid(ACCOUNTS),
            amount: (seq % 1000) as i64 + 1,
            version: seq as i64,
        }
    }

    fn take(&mut self, n: usize) -> Vec<Credit> {
        (0..n).map(|_| self.one()).collect()
    }
}

/// A bijective 64-bit mixer (SplitMix64's finalizer).
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A message of the peers' workload file.
#[derive(Clone, Debug, serde::Deserialize)]
struct PeerMsg {
    id: String,
    account: String,
    amount: i64,
}

// ---------------------------------------------------------------------------------------------
// Handlers, for each backend: the same code, with `Db` the backend's sqlx database.

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// Runs a slice of messages through one mode; returns (applied, skipped).
type RunFn<DB> = for<'a> fn(&'a Pool<DB>, &'a [Credit]) -> BoxFut<'a, (u64, u64)>;

/// Counts an idem result: applied, or skipped (duplicate / stale); an error stops the bench.
fn tally<E: std::error::Error + Send + Sync + 'static>(
    result: Result<Outcome<()>, idem::Error<E>>,
    counts: &mut (u64, u64),
) -> anyhow::Result<()> {
    match result? {
        Outcome::Applied(()) => counts.0 += 1,
        _ => counts.1 += 1,
    }
    Ok(())
}

macro_rules! backend {
    ($db:ty) => {
        use idem::{idempotent, Tx};
        use sqlx::Pool;

        use super::{tally, BoxFut, Credit, Mode, PeerMsg, Replay, Size, CONSUMER};

        pub type Db = $db;

        /// The business effect: one UPDATE.
        pub async fn effect(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            sqlx::query("UPDATE bench_accounts SET balance = balance + $1 WHERE id = $2")
                .bind(msg.amount)
                .bind(msg.account)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// (3) key only.
        #[idempotent(key = "msg.id", scope = "bench::credit")]
        pub async fn credit_key(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            effect(tx, msg).await
        }

        /// (4) key + version + entity.
        #[idempotent(
            key = "msg.id",
            version = "msg.version",
            entity = "msg.account",
            scope = "bench::credit_versioned"
        )]
        pub async fn credit_versioned(
            tx: &mut Tx<'_, Db>,
            msg: &Credit,
        ) -> Result<(), sqlx::Error> {
            effect(tx, msg).await
        }

        /// The peers' workload: credit the account named in the message.
        #[idempotent(key = "msg.id", scope = "peers::credit")]
        pub async fn peer_credit(tx: &mut Tx<'_, Db>, msg: &PeerMsg) -> Result<(), sqlx::Error> {
            sqlx::query("UPDATE balances SET balance = balance + $1 WHERE account = $2")
                .bind(msg.amount)
                .bind(&msg.account)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// (1) the effect in a transaction, no dedupe.
        async fn plain(pool: &Pool<Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            let mut tx = pool.begin().await?;
            effect(&mut tx, msg).await?;
            tx.commit().await
        }

        /// (2) the classic pattern by hand: INSERT ... ON CONFLICT DO NOTHING, then the effect.
        async fn classic(pool: &Pool<Db>, msg: &Credit) -> Result<bool, sqlx::Error> {
            let mut tx = pool.begin().await?;
            let fresh = sqlx::query(
                "INSERT INTO bench_processed (consumer, message_id) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(CONSUMER)
            .bind(&msg.id)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            if !fresh {
                tx.rollback().await?;
                return Ok(false);
            }
            effect(&mut tx, msg).await?;
            tx.commit().await?;
            Ok(true)
        }

        fn run_plain<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                for msg in msgs {
                    plain(pool, msg).await?;
                }
                Ok((msgs.len() as u64, 0))
            })
        }

        fn run_classic<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for msg in msgs {
                    if classic(pool, msg).await? {
                        counts.0 += 1;
                    } else {
                        counts.1 += 1;
                    }
                }
                Ok(counts)
            })
        }

        fn run_key<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for msg in msgs {
                    tally(credit_key(pool, msg).await, &mut counts)?;
                }
                Ok(counts)
            })
        }

        fn run_versioned<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for msg in msgs {
                    tally(credit_versioned(pool, msg).await, &mut counts)?;
                }
                Ok(counts)
            })
        }

        async fn batches<const N: usize, const VERSIONED: bool>(
            pool: &Pool<Db>,
            msgs: &[Credit],
        ) -> anyhow::Result<(u64, u64)> {
            let mut counts = (0, 0);
            for chunk in msgs.chunks(N) {
                let results = if VERSIONED {
                    idem::batch(pool, chunk, async |b, m| credit_versioned(b, m).await).await?
                } else {
                    idem::batch(pool, chunk, async |b, m| credit_key(b, m).await).await?
                };
                for result in results {
                    tally(result, &mut counts)?;
                }
            }
            Ok(counts)
        }

        fn run_batch10<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(batches::<10, false>(pool, msgs))
        }

        fn run_batch100<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(batches::<100, false>(pool, msgs))
        }

        fn run_batch100_versioned<'a>(
            pool: &'a Pool<Db>,
            msgs: &'a [Credit],
        ) -> BoxFut<'a, (u64, u64)> {
            Box::pin(batches::<100, true>(pool, msgs))
        }

        fn run_hand_batch100<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for chunk in msgs.chunks(100) {
                    let mut tx = pool.begin().await?;
                    let mut fresh: std::collections::HashSet<String> =
                        claim_all(&mut tx, chunk).await?.into_iter().collect();
                    for msg in chunk {
                        if fresh.remove(&msg.id) {
                            effect(&mut tx, msg).await?;
                            counts.0 += 1;
                        } else {
                            counts.1 += 1;
                        }
                    }
                    tx.commit().await?;
                }
                Ok(counts)
            })
        }

        /// Every mode of the `modes` section, in the order they are reported.
        pub fn modes() -> Vec<Mode<Db>> {
            vec![
                Mode::new("plain (no dedupe)", Size::Single, None, run_plain),
                Mode::new("classic by hand", Size::Single, None, run_classic),
                Mode::new("idem key", Size::Single, None, run_key),
                Mode::new("idem key+version+entity", Size::Single, None, run_versioned),
                Mode::new("idem duplicate", Size::Single, Some(Replay::Idem), run_key),
                Mode::new(
                    "classic duplicate",
                    Size::Single,
                    Some(Replay::Classic),
                    run_classic,
                ),
                Mode::new("idem batch 10", Size::Batch, None, run_batch10),
                Mode::new("idem batch 100", Size::Batch, None, run_batch100),
                Mode::new(
                    "idem batch 100 key+version+entity",
                    Size::Batch,
                    None,
                    run_batch100_versioned,
                ),
                Mode::new(
                    "hand batch 100 (floor)",
                    Size::Batch,
                    None,
                    run_hand_batch100,
                ),
            ]
        }

        /// Fills the dedupe tables fast: idem batches of 100, and the hand-written batch.
        pub fn prefillers() -> (super::RunFn<Db>, super::RunFn<Db>) {
            (run_batch100, run_hand_batch100)
        }

        /// Prepares the messages a replay mode redelivers: applies them once.
        pub fn preapply(replay: Replay) -> super::RunFn<Db> {
            match replay {
                Replay::Idem => run_key,
                Replay::Classic => run_classic,
            }
        }

        /// Runs the peers' workload, per message (`batch` 1) or in batches; returns
        /// (applied, duplicates).
        pub async fn peers(
            pool: &Pool<Db>,
            msgs: &[PeerMsg],
            batch: usize,
        ) -> anyhow::Result<(u64, u64)> {
            let mut counts = (0, 0);
            if batch <= 1 {
                for msg in msgs {
                    tally(peer_credit(pool, msg).await, &mut counts)?;
                }
            } else {
                for chunk in msgs.chunks(batch) {
                    let results =
                        idem::batch(pool, chunk, async |b, m| peer_credit(b, m).await).await?;
                    for result in results {
                        tally(result, &mut counts)?;
                    }
                }
            }
            Ok(counts)
        }
    };
}

mod sq {
    backend!(sqlx::Sqlite);

    /// The hand-written batch claim: one multi-row insert, returning the ids that were new.
    async fn claim_all(tx: &mut Tx<'_, Db>, msgs: &[Credit]) -> Result<Vec<String>, sqlx::Error> {
        let mut sql = String::from("INSERT INTO bench_processed (consumer, message_id) VALUES ");
        for i in 0..msgs.len() {
            sql.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
        }
        sql.push_str(" ON CONFLICT DO NOTHING RETURNING message_id");
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
        for msg in msgs {
            query = query.bind(CONSUMER).bind(&msg.id);
        }
        query.fetch_all(&mut **tx).await
    }
}

mod pg {
    backend!(sqlx::Postgres);

    /// The hand-written batch claim: one INSERT ... SELECT FROM UNNEST, returning the new ids.
    async fn claim_all(tx: &mut Tx<'_, Db>, msgs: &[Credit]) -> Result<Vec<String>, sqlx::Error> {
        let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
        sqlx::query_scalar(
            "INSERT INTO bench_processed (consumer, message_id) \
             SELECT $1, id FROM UNNEST($2::text[]) AS t(id) \
             ON CONFLICT DO NOTHING RETURNING message_id",
        )
        .bind(CONSUMER)
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
    }
}

/// How many messages a mode handles per round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Size {
    Single,
    Batch,
}

/// Which pre-applied messages a duplicate mode redelivers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Replay {
    Idem,
    Classic,
}

struct Mode<DB: Database> {
    name: &'static str,
    size: Size,
    replay: Option<Replay>,
    run: RunFn<DB>,
}

impl<DB: Database> Mode<DB> {
    fn new(name: &'static str, size: Size, replay: Option<Replay>, run: RunFn<DB>) -> Self {
        Mode {
            name,
            size,
            replay,
            run,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Counting statements and pool pings (round trips), through a minimal tracing subscriber that
// only listens to sqlx's statement log while `COUNTING` is set.

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static PINGS: AtomicU64 = AtomicU64::new(0);
static CAPTURE: Mutex<Option<Vec<String>>> = Mutex::new(None);

struct StatementCounter;

struct Summary(String);

impl tracing::field::Visit for Summary {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query" && COUNTING.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = CAPTURE.lock().unwrap().as_mut() {
            let mut summary = Summary(String::new());
            event.record(&mut summary);
            log.push(summary.0);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Counts a pool acquire of an idle connection: sqlx pings it first (`test_before_acquire`,
/// on by default), which on PostgreSQL is one round trip.
fn count_acquire() {
    if COUNTING.load(Ordering::Relaxed) {
        PINGS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The statements (and pings) one run of `f` makes.
async fn count<F: Future<Output = anyhow::Result<(u64, u64)>>>(
    capture: bool,
    f: F,
) -> anyhow::Result<(u64, u64, Vec<String>)> {
    STATEMENTS.store(0, Ordering::Relaxed);
    PINGS.store(0, Ordering::Relaxed);
    *CAPTURE.lock().unwrap() = capture.then(Vec::new);
    COUNTING.store(true, Ordering::Relaxed);
    let result = f.await;
    COUNTING.store(false, Ordering::Relaxed);
    result?;
    let log = CAPTURE.lock().unwrap().take().unwrap_or_default();
    Ok((
        STATEMENTS.load(Ordering::Relaxed),
        PINGS.load(Ordering::Relaxed),
        log,
    ))
}

/// "INSERT INTO idem_records …; UPDATE … ×100; COMMIT": consecutive repeats of one statement or
/// of a group of up to four statements folded.
fn fold(log: &[String]) -> String {
    let log: Vec<&str> = log.iter().map(|s| s.trim_end_matches(" …")).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < log.len() {
        // The period (1..=4) whose consecutive repeats from `i` cover the most statements.
        let mut best = (1, 1);
        for period in 1..=4.min(log.len() - i) {
            let mut reps = 1;
            while i + (reps + 1) * period <= log.len()
                && log[i..i + period] == log[i + reps * period..i + (reps + 1) * period]
            {
                reps += 1;
            }
            if reps > 1 && reps * period > best.0 * best.1 {
                best = (period, reps);
            }
        }
        let (period, reps) = best;
        let group = log[i..i + period].join("; ");
        out.push(match (period, reps) {
            (_, 1) => group,
            (1, n) => format!("{group} ×{n}"),
            (_, n) => format!("({group}) ×{n}"),
        });
        i += period * reps;
    }
    out.join("; ")
}

// ---------------------------------------------------------------------------------------------
// Databases

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// `synchronous=FULL` (durable commits) unless `BENCH_SQLITE_SYNCHRONOUS` says `normal` or `off`
/// (to see the CPU cost without the fsync; those figures are not durable).
fn sqlite_synchronous() -> SqliteSynchronous {
    match std::env::var("BENCH_SQLITE_SYNCHRONOUS").as_deref() {
        Ok("off") => SqliteSynchronous::Off,
        Ok("normal") => SqliteSynchronous::Normal,
        _ => SqliteSynchronous::Full,
    }
}

/// A SQLite file in WAL mode with durable commits (`synchronous=FULL`), migrated.
struct SqliteDb {
    pool: SqlitePool,
    path: std::path::PathBuf,
}

impl SqliteDb {
    async fn open(connections: u32) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("{}.db", unique("idem_bench")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sqlite_synchronous())
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .before_acquire(|_, _| {
                Box::pin(async {
                    count_acquire();
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        idem::migrate(&pool).await?;
        Ok(SqliteDb { pool, path })
    }

    async fn close(self) {
        self.pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A schema of its own on the PostgreSQL server, migrated; dropped by `close`.
struct PostgresDb {
    pool: PgPool,
    schema: String,
}

impl PostgresDb {
    async fn open(connections: u32) -> anyhow::Result<Self> {
        let url = postgres_url();
        let admin = PgPool::connect(&url)
            .await
            .with_context(|| format!("no PostgreSQL at {url}"))?;
        let schema = unique("idem_bench");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await?;
        admin.close().await;
        let db = PostgresDb {
            pool: Self::pool_in(&schema, connections).await?,
            schema,
        };
        idem::migrate(&db.pool).await?;
        Ok(db)
    }

    async fn pool_in(schema: &str, connections: u32) -> anyhow::Result<PgPool> {
        let options: PgConnectOptions = postgres_url().parse()?;
        let options = options.options([("search_path", schema)]);
        Ok(PgPoolOptions::new()
            .max_connections(connections)
            .before_acquire(|_, _| {
                Box::pin(async {
                    count_acquire();
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?)
    }

    async fn close(self) {
        let drop = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema
        )))
        .execute(&self.pool)
        .await;
        if let Err(err) = drop {
            eprintln!("could not drop schema {}: {err}", self.schema);
        }
        self.pool.close().await;
    }
}

/// The business table and the classic pattern's dedupe table (shaped like idem's records).
async fn create_tables_sqlite(pool: &SqlitePool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        "CREATE TABLE bench_processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
         processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
         PRIMARY KEY (consumer, message_id)) WITHOUT ROWID",
        "CREATE INDEX bench_processed_at ON bench_processed (processed_at)",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1) \
         INSERT INTO bench_accounts (id, balance) SELECT i, 0 FROM n",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records already in both dedupe tables before the run (`BENCH_PREFILL`, default 50,000 each,
/// written through idem and through the classic pattern): a consumer's tables are never
/// empty, and equal sizes keep the two tables' B-trees alike.
async fn prefill<DB: Database>(
    pool: &Pool<DB>,
    (idem, classic): (RunFn<DB>, RunFn<DB>),
) -> anyhow::Result<usize> {
    let n = env_usize("BENCH_PREFILL", 50_000);
    let mut gen = Gen::new(0xf111);
    for run in [idem, classic] {
        for _ in 0..n / 1000 {
            let msgs = gen.take(1000);
            let (applied, _) = run(pool, &msgs).await?;
            ensure!(applied == 1000, "prefill failed");
        }
    }
    Ok(n / 1000 * 1000)
}

async fn create_tables_postgres(pool: &PgPool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE bench_processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
         processed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (consumer, message_id))",
        "CREATE INDEX bench_processed_at ON bench_processed (processed_at)",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        "INSERT INTO bench_accounts (id, balance) SELECT i, 0 FROM generate_series(0, $1 - 1) AS i",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{lo:.2}–{hi:.2}"),
        _ => "-".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Section `modes`

struct ModesConfig {
    rounds: usize,
    single: usize,
    batch: usize,
}

/// Runs every mode `rounds` times, interleaved in a rotating order, then counts the statements
/// of each; prints a table and the ratios.
async fn modes<DB: Database>(
    backend: &str,
    unlogged_per_tx: f64,
    pool: &Pool<DB>,
    modes: Vec<Mode<DB>>,
    preapply: fn(Replay) -> RunFn<DB>,
    cfg: &ModesConfig,
) -> anyhow::Result<()> {
    // `BENCH_MODES=dup,classic`: only the modes whose name contains one of these.
    let modes: Vec<Mode<DB>> = match std::env::var("BENCH_MODES") {
        Ok(filter) => modes
            .into_iter()
            .filter(|m| filter.split(',').any(|f| m.name.contains(f.trim())))
            .collect(),
        Err(_) => modes,
    };
    let mut gen = Gen::new(0x1de5);
    // The messages the duplicate modes redeliver, applied once beforehand.
    let mut replays: HashMap<Replay, Vec<Credit>> = HashMap::new();
    for replay in [Replay::Idem, Replay::Classic] {
        let msgs = gen.take(500);
        let (applied, _) = (preapply(replay))(pool, &msgs).await?;
        ensure!(
            applied == msgs.len() as u64,
            "pre-apply of {replay:?} failed"
        );
        replays.insert(replay, msgs);
    }
    // Warm-up: connections, prepared statements, caches.
    for mode in &modes {
        let msgs = match mode.replay {
            Some(replay) => replays[&replay].iter().cycle().take(50).cloned().collect(),
            None => gen.take(200),
        };
        (mode.run)(pool, &msgs).await?;
    }

    // Per mode: the rate of each round's slice, and the totals.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut totals: Vec<(usize, f64)> = vec![(0, 0.0); modes.len()];
    for round in 0..cfg.rounds {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        order.rotate_left(round % modes.len());
        for &i in &order {
            let mode = &modes[i];
            let msgs = match (mode.replay, mode.size) {
                (Some(replay), _) => {
                    let set = &replays[&replay];
                    let at = round * cfg.single % set.len();
                    set.iter()
                        .cycle()
                        .skip(at)
                        .take(cfg.single)
                        .cloned()
                        .collect()
                }
                (None, Size::Single) => gen.take(cfg.single),
                (None, Size::Batch) => gen.take(cfg.batch),
            };
            let start = Instant::now();
            let (applied, skipped) = (mode.run)(pool, &msgs).await?;
            let secs = start.elapsed().as_secs_f64();
            let want = if mode.replay.is_some() {
                (0, msgs.len() as u64)
            } else {
                (msgs.len() as u64, 0)
            };
            ensure!(
                (applied, skipped) == want,
                "{backend} {}: applied {applied} skipped {skipped}, expected {want:?}",
                mode.name
            );
            rates[i].push(msgs.len() as f64 / secs);
            totals[i].0 += msgs.len();
            totals[i].1 += secs;
        }
        if (round + 1) % 50 == 0 {
            eprintln!("[{backend}] round {}/{} done", round + 1, cfg.rounds);
        }
    }

    // Statements and pings per message, after the timed rounds (statement caches are warm).
    let mut counted = Vec::new();
    for mode in &modes {
        let (unit, total) = match mode.size {
            Size::Single => (1, 100),
            Size::Batch => (
                if mode.name.contains(" 10") && !mode.name.contains(" 100") {
                    10
                } else {
                    100
                },
                200,
            ),
        };
        let take = |gen: &mut Gen, n: usize| match mode.replay {
            Some(replay) => replays[&replay].iter().cycle().take(n).cloned().collect(),
            None => gen.take(n),
        };
        let first = take(&mut gen, unit);
        let (_, _, log) = count(true, (mode.run)(pool, &first)).await?;
        let msgs = take(&mut gen, total);
        let (statements, pings, _) = count(false, (mode.run)(pool, &msgs)).await?;
        counted.push((
            statements as f64 / total as f64,
            pings as f64 / total as f64,
            fold(&log),
        ));
    }

    let position = |name: &str| modes.iter().position(|m| m.name == name);
    let rate = |i: usize| totals[i].0 as f64 / totals[i].1;
    // cost(num) / cost(den) = rate(den) / rate(num): over the whole run, and round by round.
    let ratio = |num: &str, den: &str| -> Option<(f64, Vec<f64>)> {
        let (n, d) = (position(num)?, position(den)?);
        let rounds = rates[d].iter().zip(&rates[n]).map(|(d, n)| d / n).collect();
        Some((rate(d) / rate(n), rounds))
    };

    println!();
    println!(
        "## {backend}: {} rounds; per round, in a rotating order, {} messages of each per-message mode and {} of each batch mode",
        cfg.rounds, cfg.single, cfg.batch
    );
    println!();
    println!("| mode | msg/s (whole run) | median msg/s of the rounds | round trips/msg | logged statements/msg | transactions/msg | logged statements of one message (or one batch) |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (i, mode) in modes.iter().enumerate() {
        // Each transaction here is one pool acquire: a ping, then round trips sqlx does not
        // log (PostgreSQL: BEGIN; SQLite: BEGIN and COMMIT/ROLLBACK, handed to its worker).
        let (statements, transactions, log) = &counted[i];
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
            mode.name,
            rate(i),
            median(&rates[i]),
            statements + transactions * (1.0 + unlogged_per_tx),
            statements,
            transactions,
            log
        );
    }
    println!();
    println!("| ratio | whole run | median of the rounds | target |");
    println!("|---|---:|---:|---|");
    let ratios: [(&str, &str, &str, &str); 7] = [
        (
            "cost classic / plain",
            "classic by hand",
            "plain (no dedupe)",
            "(info)",
        ),
        (
            "cost idem key / classic",
            "idem key",
            "classic by hand",
            "≤ 1.05",
        ),
        (
            "cost idem key+version+entity / classic",
            "idem key+version+entity",
            "classic by hand",
            "≤ 1.30",
        ),
        (
            "cost idem duplicate / idem key",
            "idem duplicate",
            "idem key",
            "≤ 0.50",
        ),
        (
            "cost classic duplicate / classic",
            "classic duplicate",
            "classic by hand",
            "(info)",
        ),
        (
            "cost idem batch 100 / hand batch 100",
            "idem batch 100",
            "hand batch 100 (floor)",
            "(info: 1.00 = the floor)",
        ),
        (
            "cost idem batch 100 k+v+e / idem key+version+entity",
            "idem batch 100 key+version+entity",
            "idem key+version+entity",
            "(info)",
        ),
    ];
    for (label, num, den, target) in ratios {
        if let Some((whole, rounds)) = ratio(num, den) {
            println!(
                "| {label} | {whole:.3} | {:.3} | {target} |",
                median(&rounds)
            );
        }
    }
    for batch in ["idem batch 10", "idem batch 100"] {
        let target = if batch.ends_with("100") && backend == "PostgreSQL" {
            "≥ 6 (PostgreSQL)"
        } else {
            "(info)"
        };
        if let Some((whole, rounds)) = ratio("idem key", batch) {
            println!(
                "| speed-up {batch} / idem key (msg/s) | {whole:.2} | {:.2} | {target} |",
                median(&rounds)
            );
        }
    }
    Ok(())
}

async fn section_modes(only: Option<&str>) -> anyhow::Result<()> {
    let cfg = ModesConfig {
        rounds: env_usize("BENCH_ROUNDS", 300),
        single: env_usize("BENCH_SINGLE", 10),
        batch: env_usize("BENCH_BATCH", 100),
    };
    if only != Some("postgres") {
        let db = SqliteDb::open(4).await?;
        create_tables_sqlite(&db.pool).await?;
        let prefilled = prefill(&db.pool, sq::prefillers()).await?;
        println!("\nSQLite: {prefilled} records in each dedupe table before the run");
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&db.pool)
            .await?;
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&db.pool)
            .await?;
        let sync = ["OFF", "NORMAL", "FULL", "EXTRA"]
            .get(sync as usize)
            .unwrap_or(&"?");
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&db.pool)
            .await?;
        println!("\nSQLite {version}: file, journal_mode={journal}, synchronous={sync}");
        let result = modes("SQLite", 2.0, &db.pool, sq::modes(), sq::preapply, &cfg).await;
        db.close().await;
        result?;
    }
    if only != Some("sqlite") {
        let db = PostgresDb::open(4).await?;
        let result = async {
            create_tables_postgres(&db.pool).await?;
            let prefilled = prefill(&db.pool, pg::prefillers()).await?;
            sqlx::query("ANALYZE").execute(&db.pool).await?;
            println!("\nPostgreSQL: {prefilled} records in each dedupe table before the run");
            let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&db.pool)
                .await?;
            let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(&db.pool).await?;
            println!("\nPostgreSQL: synchronous_commit={sync}, fsync={fsync}");
            modes("PostgreSQL", 1.0, &db.pool, pg::modes(), pg::preapply, &cfg).await
        }
        .await;
        db.close().await;
        result?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Section `scale`: idem key-only with 1..16 concurrent workers on PostgreSQL.

async fn section_scale() -> anyhow::Result<()> {
    let seconds = env_usize("BENCH_SCALE_SECONDS", 3) as f64;
    let rounds = env_usize("BENCH_SCALE_ROUNDS", 3);
    let workers = [1usize, 2, 4, 8, 16];
    let db = PostgresDb::open(2).await?;
    let result = async {
        create_tables_postgres(&db.pool).await?;
        let mut pools = Vec::new();
        for &w in &workers {
            pools.push(PostgresDb::pool_in(&db.schema, w as u32).await?);
        }
        let mut rates: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        let next = std::sync::Arc::new(AtomicU64::new(0));
        for round in 0..rounds {
            for (i, &w) in workers.iter().enumerate() {
                let pool = pools[i].clone();
                let deadline = Instant::now() + Duration::from_secs_f64(seconds);
                let start = Instant::now();
                let mut tasks = Vec::new();
                for worker in 0..w {
                    let pool = pool.clone();
                    let next = next.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut gen = Gen::new(0x5ca1e000 + worker as u32);
                        gen.next = next.fetch_add(1 << 32, Ordering::Relaxed);
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            let msg = gen.one();
                            match pg::credit_key(&pool, &msg).await? {
                                Outcome::Applied(()) => done += 1,
                                other => bail!("unexpected {other:?}"),
                            }
                        }
                        Ok(done)
                    }));
                }
                let mut total = 0;
                for task in tasks {
                    total += task.await??;
                }
                rates
                    .entry(w)
                    .or_default()
                    .push(total as f64 / start.elapsed().as_secs_f64());
            }
            eprintln!("[scale] round {}/{rounds} done", round + 1);
        }
        for pool in pools {
            pool.close().await;
        }
        println!();
        println!("## PostgreSQL scale: idem key-only, one transaction per message, {rounds} rounds of {seconds} s per worker count");
        println!();
        println!("| workers | median msg/s | min–max msg/s | vs 1 worker |");
        println!("|---:|---:|---:|---:|");
        let one = median(&rates[&1]);
        for (w, r) in &rates {
            println!(
                "| {w} | {:.0} | {} | {:.2}x |",
                median(r),
                spread(r).replace(".00", ""),
                median(r) / one
            );
        }
        Ok(())
    }
    .await;
    db.close().await;
    result
}

// ---------------------------------------------------------------------------------------------
// Section `memory`: peak RSS of a consumer handling 1,000,000 messages (SQLite file).

fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn section_memory() -> anyhow::Result<()> {
    let total = env_usize("BENCH_MEMORY_MSGS", 1_000_000);
    let batch = env_usize("BENCH_MEMORY_BATCH", 100).max(1);
    let limit = Duration::from_secs(env_usize("BENCH_MEMORY_SECONDS", 900) as u64);
    let db = SqliteDb::open(2).await?;
    let result = async {
        create_tables_sqlite(&db.pool).await?;
        let mut gen = Gen::new(0x3e3);
        let checkpoints = [10_000usize, 100_000, 250_000, 500_000, 750_000, 1_000_000];
        println!();
        println!(
            "## SQLite memory: {total} messages through idem key-only, {} (file, WAL, synchronous=FULL)",
            if batch == 1 { "one transaction per message".to_string() } else { format!("idem::batch of {batch}") }
        );
        println!();
        println!("| messages | VmHWM (peak RSS) kB | VmRSS kB | elapsed s | msg/s so far |");
        println!("|---:|---:|---:|---:|---:|");
        println!(
            "| 0 | {} | {} | 0 | - |",
            proc_status("VmHWM:"),
            proc_status("VmRSS:")
        );
        let start = Instant::now();
        let mut done = 0usize;
        let mut next_checkpoint = 0;
        while done < total {
            if start.elapsed() > limit {
                println!("\nstopped at the time limit ({} s) after {done} messages", limit.as_secs());
                break;
            }
            let n = batch.min(total - done);
            let msgs = gen.take(n);
            let mut counts = (0, 0);
            if batch == 1 {
                for msg in &msgs {
                    tally(sq::credit_key(&db.pool, msg).await, &mut counts)?;
                }
            } else {
                for result in idem::batch(&db.pool, &msgs, async |b, m| sq::credit_key(b, m).await).await? {
                    tally(result, &mut counts)?;
                }
            }
            let (applied, _) = counts;
            ensure!(applied == n as u64, "not all applied");
            done += n;
            while next_checkpoint < checkpoints.len() && done >= checkpoints[next_checkpoint] {
                let secs = start.elapsed().as_secs_f64();
                println!(
                    "| {done} | {} | {} | {secs:.0} | {:.0} |",
                    proc_status("VmHWM:"),
                    proc_status("VmRSS:"),
                    done as f64 / secs
                );
                next_checkpoint += 1;
            }
        }
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
            .fetch_one(&db.pool)
            .await?;
        println!("\nidem_records rows at the end: {rows}");
        Ok(())
    }
    .await;
    db.close().await;
    result
}

// ---------------------------------------------------------------------------------------------
// Section `peers`: the peers' workload file, checked against expected.json.

#[derive(serde::Deserialize)]
struct Expected {
    messages: u64,
    applied: u64,
    duplicates: u64,
    balances: BTreeMap<String, i64>,
}

async fn section_peers() -> anyhow::Result<()> {
    let dir = std::env::var("PEERS_DIR").unwrap_or_else(|_| "/tmp/idem-peers".into());
    let work = std::path::Path::new(&dir).join("work");
    let text = std::fs::read_to_string(work.join("workload.jsonl")).with_context(|| {
        format!(
            "no {}/workload.jsonl: run `bash /work/shared/bench/peers/run.sh` first, or \
             `python3 gen_workload.py --out {}`",
            work.display(),
            work.display()
        )
    })?;
    let msgs: Vec<PeerMsg> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(work.join("expected.json"))?)?;
    let runs = env_usize("PEERS_RUNS", 3);
    let accounts: Vec<&String> = expected.balances.keys().collect();
    let only = std::env::var("BENCH_ONLY").ok();

    for _ in 0..runs {
        for (name, batch) in [
            ("idem-sqlite", 1),
            ("idem-sqlite-batch100", 100),
            ("idem-postgres", 1),
            ("idem-postgres-batch100", 100),
        ] {
            let sqlite = name.starts_with("idem-sqlite");
            if only.as_deref().is_some_and(|o| sqlite != (o == "sqlite")) {
                continue;
            }
            // A fresh database for every run; only the processing loop is timed.
            let (counts, secs, balances) = if sqlite {
                let db = SqliteDb::open(2).await?;
                let result = async {
                    sqlx::query("CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
                        .execute(&db.pool)
                        .await?;
                    for a in &accounts {
                        sqlx::query("INSERT INTO balances VALUES ($1, 0)").bind(a).execute(&db.pool).await?;
                    }
                    let start = Instant::now();
                    let counts = sq::peers(&db.pool, &msgs, batch).await?;
                    let secs = start.elapsed().as_secs_f64();
                    let balances: Vec<(String, i64)> = sqlx::query_as("SELECT account, balance FROM balances")
                        .fetch_all(&db.pool)
                        .await?;
                    anyhow::Ok((counts, secs, balances))
                }
                .await;
                db.close().await;
                result?
            } else {
                let db = PostgresDb::open(2).await?;
                let result = async {
                    sqlx::query(
                        "CREATE TABLE balances (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
                    )
                    .execute(&db.pool)
                    .await?;
                    sqlx::query("INSERT INTO balances SELECT a, 0 FROM UNNEST($1::text[]) AS a")
                        .bind(&accounts)
                        .execute(&db.pool)
                        .await?;
                    let start = Instant::now();
                    let counts = pg::peers(&db.pool, &msgs, batch).await?;
                    let secs = start.elapsed().as_secs_f64();
                    let balances: Vec<(String, i64)> =
                        sqlx::query_as("SELECT account, balance FROM balances")
                            .fetch_all(&db.pool)
                            .await?;
                    anyhow::Ok((counts, secs, balances))
                }
                .await;
                db.close().await;
                result?
            };
            let balances: BTreeMap<String, i64> = balances.into_iter().collect();
            let correct = msgs.len() as u64 == expected.messages
                && counts.0 == expected.applied
                && counts.1 == expected.duplicates
                && balances == expected.balances;
            println!(
                "RESULT name={name} messages={} applied={} duplicates={} seconds={secs:.4} msgs_per_s={:.1} correct={correct}",
                msgs.len(),
                counts.0,
                counts.1,
                msgs.len() as f64 / secs
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    tracing::subscriber::set_global_default(StatementCounter)?;
    // `cargo bench` passes `--bench`; sections are the other arguments.
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let sections = if sections.is_empty() {
        vec!["modes".to_string()]
    } else {
        sections
    };
    let only = std::env::var("BENCH_ONLY").ok();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "machine: {} cpus; load average at start: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    runtime.block_on(async {
        for section in &sections {
            match section.as_str() {
                "modes" => section_modes(only.as_deref()).await?,
                "scale" => section_scale().await?,
                "memory" => section_memory().await?,
                "peers" => section_peers().await?,
                other => bail!("unknown section {other}: modes, scale, memory or peers"),
            }
        }
        println!(
            "\nload average at end: {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        Ok(())
    })
}

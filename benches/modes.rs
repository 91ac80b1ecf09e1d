//! Per-message cost of `#[idempotent]` handlers against the same effect without dedupe and with
//! the hand-written classic pattern; duplicates; batches of 10 and 100; round trips per message.
//! On SQLite (file, WAL, `synchronous=FULL`), PostgreSQL (`synchronous_commit` as the server
//! has it, normally `on`) and, with feature `mysql`, MySQL / MariaDB (InnoDB as the server has
//! it, normally `innodb_flush_log_at_trx_commit=1`): every commit is durable.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench modes --features sqlite,postgres    # msg/s, ratios, round trips
//! cargo bench --bench modes --features sqlite,postgres,mysql   # and MySQL / MariaDB
//! ```
//!
//! Every mode runs in the same process, interleaved round by round in an order shuffled anew
//! each round (so that no mode always follows the same one), and ratios are taken within a
//! round, then the median over rounds is reported: the machine is shared, so absolute figures
//! move, ratios much less. Each mode's client CPU (this process's user and system time over its
//! timed rounds; the server is another process) is reported beside its rate.
//!
//! Environment: `IDEM_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`; each run
//! works in a schema of its own, dropped at the end), `BENCH_ROUNDS` (300), `BENCH_SINGLE` (messages
//! per per-message mode and round, 10), `BENCH_BATCH` (messages per batch mode and round, 100),
//! `BENCH_PREFILL` (50,000), `BENCH_MODES` (substring filter; `=name` for one name exactly),
//! `BENCH_SQLITE_SYNCHRONOUS` (`off|normal`: CPU-only view, not durable), `BENCH_ONLY`
//! (`sqlite`, `postgres` or `mysql`: one backend only), `IDEM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`; a database of its
//! own, dropped at the end), `BENCH_FLOOR` (`same-shape`, `records` or `idem-sql`: what the
//! hand-written batches claim into, see `Floor`), `BENCH_ORDER` (`shuffle`,
//! the default, or `rotate`: the order of the runs before 2026-12-04, see `support::order`).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

// Below the default of 128 on purpose: only an optimized build lays futures out this deep, and
// this bench is the one optimized build of a MySQL batch. It compiles at 84 (the bench's own
// `MySqlPool::connect`); idem's batch compiles even at 72. Were a change to bury sqlx's connect in
// the handler's futures again (it once took 118-120), this fails to compile (the measurements
// behind this are in the history of BENCHMARKS.md).
#![recursion_limit = "100"]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use anyhow::ensure;
use sqlx::{Database, Pool};

#[allow(dead_code)] // shared by every bench; this one uses part of it
mod support;

#[cfg(feature = "mysql")]
use support::backends::MySqlDb;
use support::backends::{with_tables, PostgresDb, SqliteDb};
use support::order::Rounds;
use support::round_trips::{count, fold};
use support::stats::{median, process_cpu_secs, spread3};
use support::workload::{Credit, Gen};
use support::{env_usize, run};

/// The classic pattern's consumer name (its dedupe table is scoped like idem's).
const CONSUMER: &str = "bench::credit";

// ---------------------------------------------------------------------------------------------
// Modes, for each backend: the same code, with `Db` the backend's sqlx database.

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// Runs a slice of messages through one mode; returns (applied, skipped).
type RunFn<DB> = for<'a> fn(&'a Pool<DB>, &'a [Credit]) -> BoxFut<'a, (u64, u64)>;

macro_rules! backend {
    ($backend:ident) => {
        backend!(
            $backend,
            "INSERT INTO bench_processed (consumer, message_id) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING"
        );
    };
    ($backend:ident, $classic_claim:literal) => {
        use idem::Tx;
        use sqlx::Pool;

        use super::{BoxFut, Mode, Replay, Size, CONSUMER};
        use crate::support::hand::$backend::{hand_batches, one_column};
        use crate::support::handlers::tally;
        use crate::support::handlers::$backend::{credit_key, credit_versioned, effect, Db};
        use crate::support::workload::Credit;

        /// (1) the effect in a transaction, no dedupe.
        async fn plain(pool: &Pool<Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            let mut tx = pool.begin().await?;
            effect(&mut tx, msg).await?;
            tx.commit().await
        }

        /// (2) the classic pattern by hand: INSERT ... ON CONFLICT DO NOTHING (MySQL: INSERT
        /// IGNORE), then the effect.
        async fn classic(pool: &Pool<Db>, msg: &Credit) -> Result<bool, sqlx::Error> {
            let mut tx = pool.begin().await?;
            let fresh = sqlx::query($classic_claim)
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

        fn run_one_column<'a>(pool: &'a Pool<Db>, msgs: &'a [Credit]) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for msg in msgs {
                    if one_column::<false>(pool, msg).await? {
                        counts.0 += 1;
                    } else {
                        counts.1 += 1;
                    }
                }
                Ok(counts)
            })
        }

        fn run_one_column_versioned<'a>(
            pool: &'a Pool<Db>,
            msgs: &'a [Credit],
        ) -> BoxFut<'a, (u64, u64)> {
            Box::pin(async move {
                let mut counts = (0, 0);
                for msg in msgs {
                    if one_column::<true>(pool, msg).await? {
                        counts.0 += 1;
                    } else {
                        counts.1 += 1;
                    }
                }
                Ok(counts)
            })
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

        fn run_hand_batch100_one<'a>(
            pool: &'a Pool<Db>,
            msgs: &'a [Credit],
        ) -> BoxFut<'a, (u64, u64)> {
            Box::pin(hand_batches(pool, msgs, 100))
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
                Mode::new("one-column by hand", Size::Single, None, run_one_column),
                Mode::new(
                    "one-column + version check by hand",
                    Size::Single,
                    None,
                    run_one_column_versioned,
                ),
                Mode::new("idem key", Size::Single, None, run_key),
                Mode::new("idem key+version+entity", Size::Single, None, run_versioned),
                Mode::new("idem duplicate", Size::Single, Some(Replay::Idem), run_key),
                Mode::new(
                    "classic duplicate",
                    Size::Single,
                    Some(Replay::Classic),
                    run_classic,
                ),
                Mode::new(
                    "one-column duplicate",
                    Size::Single,
                    Some(Replay::OneColumn),
                    run_one_column,
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
                Mode::new(
                    "hand batch 100 one-column",
                    Size::Batch,
                    None,
                    run_hand_batch100_one,
                ),
            ]
        }

        /// Fills the dedupe tables fast: idem batches of 100, and the hand-written batches.
        pub fn prefillers() -> Vec<super::RunFn<Db>> {
            vec![run_batch100, run_hand_batch100, run_hand_batch100_one]
        }

        /// Prepares the messages a replay mode redelivers: applies them once.
        pub fn preapply(replay: Replay) -> super::RunFn<Db> {
            match replay {
                Replay::Idem => run_key,
                Replay::Classic => run_classic,
                Replay::OneColumn => run_one_column,
            }
        }
    };
}

/// What the hand-written batch claims into (`BENCH_FLOOR`), to take the
/// gap between idem's batch and the floor apart: the table, the statement, or idem's client
/// path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// `same-shape` (the default): the floor's statement into `bench_processed`.
    SameShape,
    /// `records`: the floor's statement (one scope bound once, `ON CONFLICT DO NOTHING` or
    /// `INSERT IGNORE`) into `idem_records` itself.
    Records,
    /// `idem-sql`: idem's own batch claim into `idem_records`, written by hand (idem's table
    /// and statement, without idem's client path).
    IdemSql,
}

fn floor() -> Floor {
    static FLOOR: std::sync::OnceLock<Floor> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| match std::env::var("BENCH_FLOOR").as_deref() {
        Ok("records") => Floor::Records,
        Ok("idem-sql") => Floor::IdemSql,
        Ok("same-shape") | Err(_) => Floor::SameShape,
        Ok(other) => panic!("BENCH_FLOOR={other}: same-shape, records or idem-sql"),
    })
}

/// The retention the hand-written claims into `idem_records` give their records (7 days).
const FLOOR_RETENTION_MS: i64 = 7 * 24 * 3_600_000;

/// The scope the hand-written claims into `idem_records` use.
const FLOOR_SCOPE: &str = "bench::hand";

/// The hand-written batch claim as one multi-row insert, `$head` then a `(?, ?)` row per message
/// then `$tail` (SQLite, MariaDB); or, with `BENCH_FLOOR`, the backend's `claim_records`.
macro_rules! multi_row_claim {
    ($doc:literal, $head:literal, $tail:literal) => {
        #[doc = $doc]
        async fn claim_all(
            tx: &mut Tx<'_, Db>,
            msgs: &[Credit],
        ) -> Result<Vec<String>, sqlx::Error> {
            let floor = super::floor();
            if floor != super::Floor::SameShape {
                return claim_records(tx, msgs, floor).await;
            }
            let mut sql = String::from($head);
            for i in 0..msgs.len() {
                sql.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
            }
            sql.push_str($tail);
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for msg in msgs {
                query = query.bind(CONSUMER).bind(&msg.id);
            }
            query.fetch_all(&mut **tx).await
        }
    };
}

mod sq {
    backend!(sq);

    multi_row_claim!(
        "The hand-written batch claim: one multi-row insert, returning the ids that were new.",
        "INSERT INTO bench_processed (consumer, message_id) VALUES ",
        " ON CONFLICT DO NOTHING RETURNING message_id"
    );

    /// The batch claim into `idem_records` ([`FLOOR_SCOPE`](super::FLOOR_SCOPE)): the floor's
    /// statement (scope, key and expiry bound in each row, `processed_at` by its default), or
    /// the one idem sends for a batch of one handler (the keys in a `WITH`, the shared values
    /// bound once after them).
    async fn claim_records(
        tx: &mut Tx<'_, Db>,
        msgs: &[Credit],
        floor: super::Floor,
    ) -> Result<Vec<String>, sqlx::Error> {
        let expires_at = super::now_ms() + super::FLOOR_RETENTION_MS;
        let rows: Vec<Vec<u8>> = if floor == super::Floor::Records {
            let mut sql =
                String::from("INSERT INTO idem_records (scope, msg_key, expires_at) VALUES ");
            for i in 0..msgs.len() {
                sql.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
            }
            sql.push_str(" ON CONFLICT DO NOTHING RETURNING msg_key");
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for msg in msgs {
                query = query
                    .bind(super::FLOOR_SCOPE)
                    .bind(msg.id.as_bytes())
                    .bind(expires_at);
            }
            query.fetch_all(&mut **tx).await?
        } else {
            // idem binds processed_at as text it formats from the clock; any text of that
            // shape costs SQLite the same.
            let mut sql = String::from("WITH batch (msg_key) AS (VALUES ");
            for i in 0..msgs.len() {
                sql.push_str(if i == 0 { "(?)" } else { ", (?)" });
            }
            sql.push_str(
                ") INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
                 SELECT ?, msg_key, ?, ? FROM batch WHERE true \
                 ON CONFLICT DO NOTHING RETURNING msg_key",
            );
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for msg in msgs {
                query = query.bind(msg.id.as_bytes());
            }
            query
                .bind(super::FLOOR_SCOPE)
                .bind("2026-12-04T21:00:00.000Z")
                .bind(expires_at)
                .fetch_all(&mut **tx)
                .await?
        };
        Ok(rows
            .into_iter()
            .filter_map(|key| String::from_utf8(key).ok())
            .collect())
    }
}

/// Now, in Unix epoch milliseconds (the hand-written SQLite claims' expiry).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

mod pg {
    backend!(pg);

    /// The hand-written batch claim: one INSERT ... SELECT FROM UNNEST, returning the new ids.
    async fn claim_all(tx: &mut Tx<'_, Db>, msgs: &[Credit]) -> Result<Vec<String>, sqlx::Error> {
        let floor = super::floor();
        if floor != super::Floor::SameShape {
            return claim_records(tx, msgs, floor).await;
        }
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

    /// The batch claim into `idem_records` ([`FLOOR_SCOPE`](super::FLOOR_SCOPE)): the floor's
    /// statement (unsorted), or the one idem sends for a batch of one handler (sorted by key,
    /// so that batches lock in one order). Before idem took that statement, `idem-sql` here
    /// was its general one (arrays of scopes and retentions).
    async fn claim_records(
        tx: &mut Tx<'_, Db>,
        msgs: &[Credit],
        floor: super::Floor,
    ) -> Result<Vec<String>, sqlx::Error> {
        let sql = if floor == super::Floor::Records {
            "INSERT INTO idem_records (scope, msg_key, expires_at) \
             SELECT $1, msg_key, now() + $3 * interval '1 millisecond' \
             FROM UNNEST($2::bytea[]) AS r (msg_key) \
             ON CONFLICT DO NOTHING RETURNING msg_key"
        } else {
            "INSERT INTO idem_records (scope, msg_key, expires_at) \
             SELECT $1, msg_key, now() + $3 * interval '1 millisecond' \
             FROM UNNEST($2::bytea[]) AS r (msg_key) \
             ORDER BY msg_key \
             ON CONFLICT DO NOTHING RETURNING msg_key"
        };
        let keys: Vec<&[u8]> = msgs.iter().map(|m| m.id.as_bytes()).collect();
        let rows: Vec<Vec<u8>> = sqlx::query_scalar(sql)
            .bind(super::FLOOR_SCOPE)
            .bind(&keys)
            .bind(super::FLOOR_RETENTION_MS)
            .fetch_all(&mut **tx)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|key| String::from_utf8(key).ok())
            .collect())
    }
}

#[cfg(feature = "mysql")]
mod my {
    backend!(
        my,
        "INSERT IGNORE INTO bench_processed (consumer, message_id) VALUES (?, ?)"
    );

    multi_row_claim!(
        "The hand-written batch claim: one multi-row INSERT IGNORE, returning the ids that were \
         new (MariaDB's RETURNING, which lists the rows inserted, not the ignored ones).",
        "INSERT IGNORE INTO bench_processed (consumer, message_id) VALUES ",
        " RETURNING message_id"
    );

    /// The batch claim into `idem_records` ([`FLOOR_SCOPE`](super::FLOOR_SCOPE)), with the
    /// floor's statement or with idem's (MariaDB: the upsert returns every row, the fresh ones
    /// at `dup_count = 0`).
    async fn claim_records(
        tx: &mut Tx<'_, Db>,
        msgs: &[Credit],
        floor: super::Floor,
    ) -> Result<Vec<String>, sqlx::Error> {
        use super::Floor;
        let mut sql = String::from(match floor {
            Floor::Records => "INSERT IGNORE INTO idem_records ",
            _ => "INSERT INTO idem_records ",
        });
        sql.push_str("(scope, msg_key, processed_at, expires_at) VALUES ");
        for i in 0..msgs.len() {
            sql.push_str(if i == 0 { "(" } else { ", (" });
            sql.push_str(
                "?, ?, UTC_TIMESTAMP(6), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
                 UTC_TIMESTAMP(6)) DIV 1000) + ?)",
            );
        }
        sql.push_str(match floor {
            Floor::Records => " RETURNING msg_key, 0",
            _ => " ON DUPLICATE KEY UPDATE dup_count = dup_count + 1 RETURNING msg_key, dup_count",
        });
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
        for msg in msgs {
            query = query
                .bind(super::FLOOR_SCOPE)
                .bind(msg.id.as_bytes())
                .bind(super::FLOOR_RETENTION_MS);
        }
        let rows: Vec<(Vec<u8>, i64)> = query.fetch_all(&mut **tx).await?;
        Ok(rows
            .into_iter()
            .filter(|(_, dups)| *dups == 0)
            .filter_map(|(key, _)| String::from_utf8(key).ok())
            .collect())
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
    OneColumn,
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

/// Records already in both dedupe tables before the run (`BENCH_PREFILL`, default 50,000 each,
/// written through idem and through the classic pattern): a consumer's tables are never
/// empty, and equal sizes keep the two tables' B-trees alike.
async fn prefill<DB: Database>(pool: &Pool<DB>, fillers: Vec<RunFn<DB>>) -> anyhow::Result<usize> {
    let n = env_usize("BENCH_PREFILL", 50_000);
    let mut gen = Gen::new(0xf111);
    for run in fillers {
        for _ in 0..n / 1000 {
            let msgs = gen.take(1000);
            let (applied, _) = run(pool, &msgs).await?;
            ensure!(applied == 1000, "prefill failed");
        }
    }
    Ok(n / 1000 * 1000)
}

// ---------------------------------------------------------------------------------------------
// Section `modes`

struct ModesConfig {
    rounds: usize,
    /// Blocks of consecutive rounds whose ratios give the median and the spread.
    blocks: usize,
    single: usize,
    batch: usize,
}

/// Runs every mode `rounds` times, interleaved in an order shuffled each round (`Rounds`),
/// then counts the statements of each; prints a table and the ratios.
async fn modes<DB: Database>(
    backend: &str,
    unlogged_per_tx: f64,
    pool: &Pool<DB>,
    modes: Vec<Mode<DB>>,
    preapply: fn(Replay) -> RunFn<DB>,
    cfg: &ModesConfig,
) -> anyhow::Result<()> {
    // `BENCH_MODES=dup,classic`: only the modes whose name contains one of these; `=name`
    // matches that name only (`=idem batch 100` without its key+version+entity sibling).
    let modes: Vec<Mode<DB>> = match std::env::var("BENCH_MODES") {
        Ok(filter) => modes
            .into_iter()
            .filter(|m| {
                filter
                    .split(',')
                    .map(str::trim)
                    .any(|f| match f.strip_prefix('=') {
                        Some(exact) => m.name == exact,
                        None => m.name.contains(f),
                    })
            })
            .collect(),
        Err(_) => modes,
    };
    let mut gen = Gen::new(0x1de5);
    // The messages the duplicate modes redeliver, applied once beforehand.
    let mut replays: HashMap<Replay, Vec<Credit>> = HashMap::new();
    for replay in [Replay::Idem, Replay::Classic, Replay::OneColumn] {
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
    // Per mode: the client's CPU seconds (this process, every thread) over the timed rounds.
    let mut cpu: Vec<f64> = vec![0.0; modes.len()];
    let mut order = Rounds::from_env();
    for round in 0..cfg.rounds {
        for i in order.next(round, modes.len()) {
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
            let (start, cpu_start) = (Instant::now(), process_cpu_secs());
            let (applied, skipped) = (mode.run)(pool, &msgs).await?;
            let secs = start.elapsed().as_secs_f64();
            cpu[i] += process_cpu_secs() - cpu_start;
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
        "## {backend}: {} rounds; per round, in {} order, {} messages of each per-message mode and {} of each batch mode",
        cfg.rounds,
        order.order().describe(),
        cfg.single,
        cfg.batch
    );
    println!();
    println!("| mode | msg/s (whole run) | median msg/s of the rounds | client CPU µs/msg | round trips/msg | logged statements/msg | transactions/msg | logged statements of one message (or one batch) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (i, mode) in modes.iter().enumerate() {
        // Each transaction here is one pool acquire: a ping, then round trips sqlx does not
        // log (PostgreSQL: BEGIN; SQLite: BEGIN and COMMIT/ROLLBACK, handed to its worker).
        let (statements, transactions, log) = &counted[i];
        println!(
            "| {} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {} |",
            mode.name,
            rate(i),
            median(&rates[i]),
            cpu[i] / totals[i].0 as f64 * 1e6,
            statements + transactions * (1.0 + unlogged_per_tx),
            statements,
            transactions,
            log
        );
    }
    println!();
    // The rounds in `cfg.blocks` consecutive blocks; a block's ratio is its total cost per
    // message of one mode over the other's: each block is a run of its own, interleaved.
    let blocks = |rounds: &[f64], num: usize, den: usize| -> Vec<f64> {
        let n = rounds.len();
        let b = cfg.blocks.clamp(1, n.max(1));
        (0..b)
            .map(|k| {
                let (lo, hi) = (k * n / b, (k + 1) * n / b);
                let cost = |i: usize| rates[i][lo..hi].iter().map(|r| 1.0 / r).sum::<f64>();
                cost(num) / cost(den)
            })
            .collect()
    };
    println!(
        "| ratio (cost = time per message) | whole run | median of the rounds | median of {} blocks | min–max of the blocks | target |",
        cfg.blocks
    );
    println!("|---|---:|---:|---:|---:|---|");
    let ratios: [(&str, &str, &str, &str); 13] = [
        (
            "cost idem key / one-column",
            "idem key",
            "one-column by hand",
            "≤ 1.03",
        ),
        (
            "cost idem key+version+entity / one-column + version check",
            "idem key+version+entity",
            "one-column + version check by hand",
            "≤ 1.15",
        ),
        (
            "cost idem duplicate / idem key",
            "idem duplicate",
            "idem key",
            "≤ 0.30",
        ),
        (
            "cost idem batch 100 / hand batch 100",
            "idem batch 100",
            "hand batch 100 (floor)",
            "≤ 1.03 (1.00 = the floor)",
        ),
        (
            "cost idem batch 100 / hand batch 100 one-column",
            "idem batch 100",
            "hand batch 100 one-column",
            "(info)",
        ),
        (
            "cost one-column duplicate / one-column",
            "one-column duplicate",
            "one-column by hand",
            "(info)",
        ),
        (
            "cost classic (idem-shaped table) / one-column",
            "classic by hand",
            "one-column by hand",
            "(info: the retention index and width)",
        ),
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
            "(info: same-shape table)",
        ),
        (
            "cost idem key+version+entity / classic",
            "idem key+version+entity",
            "classic by hand",
            "(info)",
        ),
        (
            "cost classic duplicate / classic",
            "classic duplicate",
            "classic by hand",
            "(info)",
        ),
        (
            "cost hand batch 100 (floor) / hand batch 100 one-column",
            "hand batch 100 (floor)",
            "hand batch 100 one-column",
            "(info)",
        ),
        (
            "cost idem batch 100 k+v+e / idem key+version+entity",
            "idem batch 100 key+version+entity",
            "idem key+version+entity",
            "(info)",
        ),
    ];
    for (label, num, den, target) in ratios {
        if let (Some((whole, rounds)), Some(n), Some(d)) =
            (ratio(num, den), position(num), position(den))
        {
            let blocks = blocks(&rounds, n, d);
            println!(
                "| {label} | {whole:.3} | {:.3} | {:.3} | {} | {target} |",
                median(&rounds),
                median(&blocks),
                spread3(&blocks)
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

/// `BENCH_RECORD_INDEX=none|brin`: what idem's record table would cost without its retention
/// index on `expires_at`, or (PostgreSQL) with a BRIN index in its place. Default: idem's schema
/// as migrated. `on` completes `DROP INDEX` (MySQL: `ON idem_records`), `brin` is the index
/// method clause (empty: not available on this backend).
async fn record_index<DB: Database>(pool: &Pool<DB>, on: &str, brin: &str) -> anyhow::Result<()>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let option = std::env::var("BENCH_RECORD_INDEX").unwrap_or_default();
    if option.is_empty() || option == "btree" {
        return Ok(());
    }
    ensure!(
        option == "none" || (option == "brin" && !brin.is_empty()),
        "BENCH_RECORD_INDEX={option}: none, or brin on PostgreSQL"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP INDEX idem_records_expires_at{on}"
    )))
    .execute(pool)
    .await?;
    if option == "brin" {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE INDEX idem_records_expires_at ON idem_records {brin}(expires_at)"
        )))
        .execute(pool)
        .await?;
    }
    println!(
        "
idem_records: retention index {option} (BENCH_RECORD_INDEX)"
    );
    Ok(())
}

async fn section_modes(only: Option<&str>) -> anyhow::Result<()> {
    let cfg = ModesConfig {
        rounds: env_usize("BENCH_ROUNDS", 300),
        blocks: env_usize("BENCH_BLOCKS", 6),
        single: env_usize("BENCH_SINGLE", 10),
        batch: env_usize("BENCH_BATCH", 100),
    };
    if only.is_none() || only == Some("sqlite") {
        with_tables::<SqliteDb, _>(4, async |pool| {
            record_index(pool, "", "").await?;
            let prefilled = prefill(pool, sq::prefillers()).await?;
            println!("\nSQLite: {prefilled} records in each dedupe table before the run");
            let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(pool)
                .await?;
            let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(pool)
                .await?;
            let sync = ["OFF", "NORMAL", "FULL", "EXTRA"]
                .get(sync as usize)
                .unwrap_or(&"?");
            let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(pool)
                .await?;
            println!("\nSQLite {version}: file, journal_mode={journal}, synchronous={sync}");
            modes("SQLite", 2.0, pool, sq::modes(), sq::preapply, &cfg).await
        })
        .await?;
    }
    if only.is_none() || only == Some("postgres") {
        with_tables::<PostgresDb, _>(4, async |pool| {
            record_index(pool, "", "USING brin ").await?;
            let prefilled = prefill(pool, pg::prefillers()).await?;
            sqlx::query("ANALYZE").execute(pool).await?;
            println!("\nPostgreSQL: {prefilled} records in each dedupe table before the run");
            let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(pool)
                .await?;
            let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(pool).await?;
            println!("\nPostgreSQL: synchronous_commit={sync}, fsync={fsync}");
            modes("PostgreSQL", 1.0, pool, pg::modes(), pg::preapply, &cfg).await
        })
        .await?;
    }
    #[cfg(feature = "mysql")]
    if only.is_none() || only == Some("mysql") {
        with_tables::<MySqlDb, _>(4, async |pool| {
            record_index(pool, " ON idem_records", "").await?;
            let prefilled = prefill(pool, my::prefillers()).await?;
            sqlx::raw_sql("ANALYZE TABLE idem_records, bench_processed, bench_accounts")
                .execute(pool)
                .await?;
            println!("\nMySQL: {prefilled} records in each dedupe table before the run");
            // The server's default isolation (REPEATABLE READ unless configured otherwise).
            let (version, flush): (String, u64) =
                sqlx::query_as("SELECT VERSION(), @@innodb_flush_log_at_trx_commit")
                    .fetch_one(pool)
                    .await?;
            println!("\nMySQL {version}: innodb_flush_log_at_trx_commit={flush}");
            modes("MySQL", 1.0, pool, my::modes(), my::preapply, &cfg).await
        })
        .await?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    run(|| async {
        let only = std::env::var("BENCH_ONLY").ok();
        section_modes(only.as_deref()).await
    })
}

//! The per-message cost of the handler options `replay = true` and `fingerprint = "..."` beside
//! the same handler with a key only, on PostgreSQL, SQLite and (feature `mysql`) MySQL/MariaDB:
//! a fresh message (applied: `replay` stamps its value in one more statement before the commit;
//! the fingerprint goes in with the claim) and a redelivery (duplicate: one more read).
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench options --features sqlite,postgres,mysql
//! ```
//!
//! The six modes run in one process, interleaved round by round in an order shuffled each round
//! (`BENCH_ORDER`); each round's rate is divided by the key-only rate of the same round and kind
//! (applied or duplicate), and the median ratio over rounds is reported, so a shared machine's
//! drift cancels out. Environment: `IDEM_POSTGRES_URL`, `BENCH_ROUNDS` (200), `BENCH_SINGLE`
//! (messages per mode and round, 10), `BENCH_BATCH` (0: one message at a time; n: `idem::batch`
//! of n, with `BENCH_SINGLE` a multiple of it), `IDEM_MYSQL_URL`, `BENCH_ONLY` (`sqlite`,
//! `postgres` or `mysql`).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::time::Instant;

use anyhow::ensure;
use sqlx::Pool;

#[allow(dead_code)] // shared by every bench; this one uses the backends, workload and stats
mod support;

#[cfg(feature = "mysql")]
use support::backends::MySqlDb;
use support::backends::{with_tables, PostgresDb, SqliteDb};
use support::order::Rounds;
use support::stats::{median, spread};
use support::workload::{Credit, Gen};
use support::{env_usize, run};

/// What `replay = true` keeps: a small receipt, as a handler would return.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct Receipt {
    account: i64,
    amount: i64,
}

macro_rules! options {
    ($db:ty) => {
        options!(
            $db,
            "UPDATE bench_accounts SET balance = balance + $1 WHERE id = $2"
        );
    };
    ($db:ty, $effect:literal) => {
        use idem::{idempotent, Outcome, Tx};
        use sqlx::Pool;

        use super::Receipt;
        use crate::support::workload::Credit;

        pub type Db = $db;

        /// The business effect: one UPDATE.
        async fn effect(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<Receipt, sqlx::Error> {
            sqlx::query($effect)
                .bind(msg.amount)
                .bind(msg.account)
                .execute(&mut **tx)
                .await?;
            Ok(Receipt {
                account: msg.account,
                amount: msg.amount,
            })
        }

        #[idempotent(key = "msg.id", scope = "bench::options_key")]
        async fn key_only(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<Receipt, sqlx::Error> {
            effect(tx, msg).await
        }

        #[idempotent(key = "msg.id", replay = true, scope = "bench::options_replay")]
        async fn replay(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<Receipt, sqlx::Error> {
            effect(tx, msg).await
        }

        #[idempotent(
            key = "msg.id",
            fingerprint = "(msg.account, msg.amount)",
            scope = "bench::options_fingerprint"
        )]
        async fn fingerprint(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<Receipt, sqlx::Error> {
            effect(tx, msg).await
        }

        /// Runs `msgs` through option `option` (0 key, 1 replay, 2 fingerprint), one at a time
        /// or in `idem::batch`es of `batch`; returns how many applied and how many were
        /// skipped (duplicate or replayed).
        pub async fn deliver(
            pool: &Pool<Db>,
            option: usize,
            msgs: &[Credit],
            batch: usize,
        ) -> anyhow::Result<(usize, usize)> {
            let mut outcomes = Vec::with_capacity(msgs.len());
            if batch == 0 {
                for msg in msgs {
                    outcomes.push(match option {
                        0 => key_only(pool, msg).await?,
                        1 => replay(pool, msg).await?,
                        _ => fingerprint(pool, msg).await?,
                    });
                }
            } else {
                for chunk in msgs.chunks(batch) {
                    let results = match option {
                        0 => idem::batch(pool, chunk, async |b, m| key_only(b, m).await).await?,
                        1 => idem::batch(pool, chunk, async |b, m| replay(b, m).await).await?,
                        _ => idem::batch(pool, chunk, async |b, m| fingerprint(b, m).await).await?,
                    };
                    for result in results {
                        outcomes.push(result?);
                    }
                }
            }
            let mut counts = (0, 0);
            for outcome in outcomes {
                match outcome {
                    Outcome::Applied(_) => counts.0 += 1,
                    Outcome::Duplicate | Outcome::Replayed(_) => counts.1 += 1,
                    other => anyhow::bail!("unexpected {other:?}"),
                }
            }
            Ok(counts)
        }
    };
}

mod sq {
    options!(sqlx::Sqlite);
}

mod pg {
    options!(sqlx::Postgres);
}

#[cfg(feature = "mysql")]
mod my {
    options!(
        sqlx::MySql,
        "UPDATE bench_accounts SET balance = balance + ? WHERE id = ?"
    );
}

const OPTIONS: [&str; 3] = ["key only", "replay = true", "fingerprint"];

/// The future of one mode's slice: (applied, skipped).
type Slice<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<(usize, usize)>> + Send + 'a>,
>;

type Deliver<DB> = for<'a> fn(&'a Pool<DB>, usize, &'a [Credit], usize) -> Slice<'a>;

/// Interleaves the six modes (three options, applied and duplicate) for `rounds` rounds and
/// prints each one's median msg/s and its median ratio to key-only of the same kind.
async fn measure<DB: sqlx::Database>(
    backend: &str,
    pool: &Pool<DB>,
    deliver: Deliver<DB>,
) -> anyhow::Result<()> {
    let (rounds, single, batch) = (
        env_usize("BENCH_ROUNDS", 200),
        env_usize("BENCH_SINGLE", 10),
        env_usize("BENCH_BATCH", 0),
    );
    let mut gen = Gen::new(0x0b7e);
    // Messages each option has applied, for its duplicate mode; and a warm-up.
    let mut seen: Vec<Vec<Credit>> = Vec::new();
    for (option, name) in OPTIONS.iter().enumerate() {
        let msgs = gen.take(200);
        let (applied, _) = deliver(pool, option, &msgs, batch).await?;
        ensure!(applied == msgs.len(), "{backend}: warm-up of {name}");
        seen.push(msgs);
    }
    // rates[duplicate][option] per round.
    let mut rates = vec![vec![Vec::new(); 3]; 2];
    let mut order = Rounds::from_env();
    for round in 0..rounds {
        for mode in order.next(round, 6) {
            let (duplicate, option) = (mode / 3, mode % 3);
            let msgs: Vec<Credit> = if duplicate == 1 {
                let set = &seen[option];
                set.iter()
                    .cycle()
                    .skip(round * single % set.len())
                    .take(single)
                    .cloned()
                    .collect()
            } else {
                gen.take(single)
            };
            let start = Instant::now();
            let counts = deliver(pool, option, &msgs, batch).await?;
            let secs = start.elapsed().as_secs_f64();
            let want = if duplicate == 1 {
                (0, single)
            } else {
                (single, 0)
            };
            ensure!(
                counts == want,
                "{backend} {}: {counts:?}, expected {want:?}",
                OPTIONS[option]
            );
            rates[duplicate][option].push(single as f64 / secs);
        }
    }
    let how = match batch {
        0 => "one at a time".to_string(),
        n => format!("in batches of {n}"),
    };
    println!("\n{backend}: {rounds} rounds of {single} messages per mode ({how}), interleaved");
    println!(
        "{:<16} {:>10} {:>14} {:>16}",
        "option", "kind", "msg/s (median)", "cost vs key only"
    );
    for (duplicate, kind) in ["applied", "duplicate"].iter().enumerate() {
        for option in 0..3 {
            let own = &rates[duplicate][option];
            let base = &rates[duplicate][0];
            // Per round: how much longer a message took than key-only's of the same round.
            let costs: Vec<f64> = own.iter().zip(base).map(|(o, b)| b / o - 1.0).collect();
            println!(
                "{:<16} {:>10} {:>14.0} {:>+15.1}%  (rounds {})",
                OPTIONS[option],
                kind,
                median(own),
                100.0 * median(&costs),
                spread(&costs.iter().map(|c| 100.0 * c).collect::<Vec<_>>()),
            );
        }
    }
    Ok(())
}

fn sq_deliver<'a>(
    pool: &'a Pool<sq::Db>,
    option: usize,
    msgs: &'a [Credit],
    batch: usize,
) -> Slice<'a> {
    Box::pin(sq::deliver(pool, option, msgs, batch))
}

fn pg_deliver<'a>(
    pool: &'a Pool<pg::Db>,
    option: usize,
    msgs: &'a [Credit],
    batch: usize,
) -> Slice<'a> {
    Box::pin(pg::deliver(pool, option, msgs, batch))
}

#[cfg(feature = "mysql")]
fn my_deliver<'a>(
    pool: &'a Pool<my::Db>,
    option: usize,
    msgs: &'a [Credit],
    batch: usize,
) -> Slice<'a> {
    Box::pin(my::deliver(pool, option, msgs, batch))
}

fn main() -> anyhow::Result<()> {
    run(|| async {
        let only = std::env::var("BENCH_ONLY").ok();
        let runs = |backend: &str| only.as_deref().is_none_or(|only| only == backend);
        if runs("postgres") {
            with_tables::<PostgresDb, _>(4, async |pool| {
                measure("PostgreSQL", pool, pg_deliver).await
            })
            .await?;
        }
        if runs("sqlite") {
            with_tables::<SqliteDb, _>(4, async |pool| measure("SQLite", pool, sq_deliver).await)
                .await?;
        }
        #[cfg(feature = "mysql")]
        if runs("mysql") {
            with_tables::<MySqlDb, _>(4, async |pool| measure("MySQL", pool, my_deliver).await)
                .await?;
        }
        Ok(())
    })
}

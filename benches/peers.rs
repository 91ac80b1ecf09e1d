//! The peers' workload through idem: the messages of `work/workload.jsonl` (written by
//! `bash /work/shared/bench/peers/run.sh`), one sequential consumer, per message and in batches
//! of 100, on SQLite and PostgreSQL, a fresh database for every run; each run is checked against
//! `work/expected.json` and printed as a `RESULT` line like the peers' runners.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! bash /work/shared/bench/peers/run.sh                    # peers, writes /tmp/idem-peers/work/
//! cargo bench --bench peers --features sqlite,postgres    # the same workload through idem
//! ```
//!
//! Environment: `PEERS_DIR` (`/tmp/idem-peers`: reads `work/workload.jsonl` and
//! `work/expected.json`), `PEERS_RUNS` (3), `BENCH_ONLY` (`sqlite` or `postgres`: one backend
//! only), `IDEM_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`; each run works in
//! a schema of its own, dropped at the end).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;

#[allow(dead_code)] // shared by every bench; this one needs only the backends and `tally`
mod support;

use support::backends::{with_db, PostgresDb, SqliteDb};
use support::{env_usize, run};

/// A message of the peers' workload file.
#[derive(Clone, Debug, serde::Deserialize)]
struct PeerMsg {
    id: String,
    account: String,
    amount: i64,
}

// ---------------------------------------------------------------------------------------------
// The handler, for each backend: the same code, with `Db` the backend's sqlx database.

macro_rules! backend {
    ($db:ty) => {
        use idem::{idempotent, Tx};
        use sqlx::Pool;

        use super::PeerMsg;
        use crate::support::handlers::tally;

        pub type Db = $db;

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
}

mod pg {
    backend!(sqlx::Postgres);
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
                with_db::<SqliteDb, _>(2, async |pool| {
                    sqlx::query("CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
                        .execute(pool)
                        .await?;
                    for a in &accounts {
                        sqlx::query("INSERT INTO balances VALUES ($1, 0)").bind(a).execute(pool).await?;
                    }
                    let start = Instant::now();
                    let counts = sq::peers(pool, &msgs, batch).await?;
                    let secs = start.elapsed().as_secs_f64();
                    let balances: Vec<(String, i64)> = sqlx::query_as("SELECT account, balance FROM balances")
                        .fetch_all(pool)
                        .await?;
                    anyhow::Ok((counts, secs, balances))
                })
                .await?
            } else {
                with_db::<PostgresDb, _>(2, async |pool| {
                    sqlx::query(
                        "CREATE TABLE balances (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
                    )
                    .execute(pool)
                    .await?;
                    sqlx::query("INSERT INTO balances SELECT a, 0 FROM UNNEST($1::text[]) AS a")
                        .bind(&accounts)
                        .execute(pool)
                        .await?;
                    let start = Instant::now();
                    let counts = pg::peers(pool, &msgs, batch).await?;
                    let secs = start.elapsed().as_secs_f64();
                    let balances: Vec<(String, i64)> =
                        sqlx::query_as("SELECT account, balance FROM balances")
                            .fetch_all(pool)
                            .await?;
                    anyhow::Ok((counts, secs, balances))
                })
                .await?
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

fn main() -> anyhow::Result<()> {
    run(section_peers)
}

//! How idem scales with concurrent workers: key-only handlers, one transaction per message,
//! 1, 2, 4, 8 and 16 workers (a pool of as many connections) on PostgreSQL.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench scale --features sqlite,postgres    # 1..16 workers on PostgreSQL
//! ```
//!
//! Environment: `IDEM_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`; the run
//! works in a schema of its own, dropped at the end), `BENCH_SCALE_SECONDS` (3 per worker count
//! and round), `BENCH_SCALE_ROUNDS` (3).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use idem::Outcome;

#[allow(dead_code)] // shared by every bench; this one runs PostgreSQL and key-only handlers alone
mod support;

use support::backends::{create_tables_postgres, PostgresDb};
use support::handlers::pg;
use support::stats::{median, spread};
use support::workload::Gen;
use support::{env_usize, run};

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

fn main() -> anyhow::Result<()> {
    run(section_scale)
}

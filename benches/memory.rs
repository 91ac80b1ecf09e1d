//! Memory of a consumer over many messages: peak and current RSS (`VmHWM`, `VmRSS`) of one
//! consumer handling 1,000,000 messages through idem key-only on a SQLite file (WAL,
//! `synchronous=FULL`); messages are generated as they go, so RSS is the consumer's own.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench memory --features sqlite,postgres   # max RSS over 1,000,000 messages
//! ```
//!
//! Environment: `BENCH_MEMORY_MSGS` (1,000,000), `BENCH_MEMORY_BATCH` (100; 1 = one transaction
//! per message), `BENCH_MEMORY_SECONDS` (900: stops there), `BENCH_SQLITE_SYNCHRONOUS`
//! (`off|normal`: not durable).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::time::{Duration, Instant};

use anyhow::ensure;

#[allow(dead_code)] // shared by every bench; this one runs SQLite and key-only handlers alone
mod support;

use support::backends::{create_tables_sqlite, SqliteDb};
use support::handlers::{sq, tally};
use support::workload::Gen;
use support::{env_usize, run};

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

fn main() -> anyhow::Result<()> {
    run(section_memory)
}

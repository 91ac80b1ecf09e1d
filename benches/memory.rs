//! Memory of a consumer over many messages: peak and current RSS (`VmHWM`, `VmRSS`) of one
//! consumer handling 1,000,000 messages through idem key-only on a SQLite file (WAL,
//! `synchronous=FULL`); messages are generated as they go, so RSS is the consumer's own.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench memory --features sqlite,postgres   # max RSS over 1,000,000 messages
//! ```
//!
//! With `BENCH_MEMORY_LOOP=consumer`, the messages go through the consumer loop instead
//! (`idem::consume::Consumer` with `batch(BENCH_MEMORY_BATCH)` on the in-memory broker, JSON
//! payloads decoded by the loop, every delivery acked): a feeder publishes as the consumer goes,
//! keeping at most 5,000 messages open, so RSS is the loop's own and not a backlog's.
//!
//! ```text
//! BENCH_MEMORY_LOOP=consumer cargo bench --bench memory --features sqlite,postgres
//! ```
//!
//! Environment: `BENCH_MEMORY_MSGS` (1,000,000), `BENCH_MEMORY_BATCH` (100; 1 = one transaction
//! per message), `BENCH_MEMORY_SECONDS` (900: stops there), `BENCH_SQLITE_SYNCHRONOUS`
//! (`off|normal`: not durable), `BENCH_MEMORY_LOOP` (`batch`, the default, or `consumer`).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;

#[allow(dead_code)] // shared by every bench; this one runs SQLite and key-only handlers alone
mod support;

use support::backends::{with_tables, SqliteDb};
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

/// A row of the table: messages done, peak and current RSS (kB), seconds, messages per second.
fn print_checkpoint(done: u64, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    println!(
        "| {done} | {} | {} | {secs:.0} | {:.0} |",
        proc_status("VmHWM:"),
        proc_status("VmRSS:"),
        done as f64 / secs
    );
}

async fn section_memory() -> anyhow::Result<()> {
    let total = env_usize("BENCH_MEMORY_MSGS", 1_000_000);
    let batch = env_usize("BENCH_MEMORY_BATCH", 100).max(1);
    let limit = Duration::from_secs(env_usize("BENCH_MEMORY_SECONDS", 900) as u64);
    with_tables::<SqliteDb, _>(2, async |pool| {
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
                    tally(sq::credit_key(pool, msg).await, &mut counts)?;
                }
            } else {
                for result in idem::batch(pool, &msgs, async |b, m| sq::credit_key(b, m).await).await? {
                    tally(result, &mut counts)?;
                }
            }
            let (applied, _) = counts;
            ensure!(applied == n as u64, "not all applied");
            done += n;
            while next_checkpoint < checkpoints.len() && done >= checkpoints[next_checkpoint] {
                print_checkpoint(done as u64, start);
                next_checkpoint += 1;
            }
        }
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
            .fetch_one(pool)
            .await?;
        println!("\nidem_records rows at the end: {rows}");
        Ok(())
    })
    .await
}

/// The message on the wire of the consumer part.
#[derive(serde::Serialize, serde::Deserialize)]
struct Wire {
    id: String,
    account: i64,
    amount: i64,
    version: i64,
}

fn decode(bytes: &[u8]) -> Result<support::workload::Credit, serde_json::Error> {
    let w: Wire = serde_json::from_slice(bytes)?;
    Ok(support::workload::Credit {
        id: w.id,
        account: w.account,
        amount: w.amount,
        version: w.version,
    })
}

/// `BENCH_MEMORY_LOOP=consumer`: the same messages through the consumer loop on the in-memory
/// broker, RSS printed as the acks pass the checkpoints.
async fn section_consumer_memory() -> anyhow::Result<()> {
    use idem::consume::{memory::MemoryQueue, Consumer};

    const OPEN_AT_MOST: usize = 5_000;
    let total = env_usize("BENCH_MEMORY_MSGS", 1_000_000);
    let batch = env_usize("BENCH_MEMORY_BATCH", 100).max(1);
    let limit = Duration::from_secs(env_usize("BENCH_MEMORY_SECONDS", 900) as u64);
    with_tables::<SqliteDb, _>(2, async |pool| {
        let queue = MemoryQueue::new();
        let fed = Arc::new(AtomicBool::new(false));
        let feeder = tokio::spawn({
            let (queue, fed) = (queue.clone(), fed.clone());
            async move {
                let mut gen = Gen::new(0x3e4);
                let mut published = 0;
                while published < total {
                    if queue.open() >= OPEN_AT_MOST {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    for m in gen.take(1_000.min(total - published)) {
                        let wire = Wire { id: m.id, account: m.account, amount: m.amount, version: m.version };
                        queue.publish(serde_json::to_vec(&wire).expect("plain JSON"));
                        published += 1;
                    }
                }
                fed.store(true, Ordering::SeqCst);
            }
        });
        let checkpoints = [10_000u64, 100_000, 250_000, 500_000, 750_000, 1_000_000];
        println!();
        println!(
            "## SQLite memory: {total} messages through the consumer loop (in-memory broker, batch({batch}), concurrency(1); file, WAL, synchronous=FULL)"
        );
        println!();
        println!("| messages acked | VmHWM (peak RSS) kB | VmRSS kB | elapsed s | msg/s so far |");
        println!("|---:|---:|---:|---:|---:|");
        println!("| 0 | {} | {} | 0 | - |", proc_status("VmHWM:"), proc_status("VmRSS:"));
        let start = Instant::now();
        let monitor = tokio::spawn({
            let queue = queue.clone();
            async move {
                let mut next = 0;
                while next < checkpoints.len() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let done = queue.acked();
                    while next < checkpoints.len() && done >= checkpoints[next] {
                        print_checkpoint(done, start);
                        next += 1;
                    }
                }
            }
        });
        let until = {
            let (queue, fed) = (queue.clone(), fed.clone());
            async move {
                let deadline = tokio::time::sleep(limit);
                tokio::pin!(deadline);
                loop {
                    if fed.load(Ordering::SeqCst) {
                        tokio::select! {
                            () = queue.idle() => return,
                            () = &mut deadline => return,
                        }
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(10)) => {}
                        () = &mut deadline => return,
                    }
                }
            }
        };
        let counts = Consumer::new(pool.clone())
            .batch(batch)
            .run(queue.deliveries(), decode, async |b, m| sq::credit_key(b, m).await, until)
            .await;
        feeder.abort();
        tokio::time::sleep(Duration::from_millis(50)).await;
        monitor.abort();
        if start.elapsed() > limit {
            println!("\nstopped at the time limit ({} s) after {} messages", limit.as_secs(), queue.acked());
        }
        ensure!(counts.applied == queue.acked(), "applied {counts:?}, acked {}", queue.acked());
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
            .fetch_one(pool)
            .await?;
        println!("\n{counts:?}\nidem_records rows at the end: {rows}");
        Ok(())
    })
    .await
}

fn main() -> anyhow::Result<()> {
    match std::env::var("BENCH_MEMORY_LOOP").as_deref() {
        Ok("consumer") => run(section_consumer_memory),
        _ => run(section_memory),
    }
}

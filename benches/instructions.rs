//! CPU instructions per message of idem and of the hand-written one-column pattern, counted by
//! `valgrind --tool=callgrind` on SQLite in memory (no fsync, no socket: what is left is the CPU
//! of the client, sqlx and SQLite). Instruction counts do not move with the machine's load,
//! where times do.
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench instructions --features sqlite,postgres
//! ```
//!
//! Run as above, the binary is the driver: for every mode it runs itself twice under callgrind
//! (`IDEM_INSTR_MODE=<mode> IDEM_INSTR_N=<n> valgrind --tool=callgrind --callgrind-out-file=…
//! <this binary>`), with `n` = `BENCH_INSTR_SMALL` (200) and `BENCH_INSTR_LARGE` (1,200)
//! messages after the same setup, and reports (Ir(large) − Ir(small)) / (large − small): the
//! instructions of one message, setup and warm-up cancelled out. Then it counts each mode's
//! statements and transactions per message, natively. `BENCH_MODES` filters modes by substring.
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::process::Command;
use std::str::FromStr;

use anyhow::{bail, ensure, Context as _};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::SqlitePool;

#[allow(dead_code)] // shared by every bench; this one uses the SQLite part
mod support;

use support::backends::create_tables_sqlite;
use support::env_usize;
use support::hand::sq::{hand_batches, idem_batches, one_column};
use support::handlers::sq::{credit_key, credit_versioned, effect};
use support::handlers::tally;
use support::round_trips::{count, fold, StatementCounter};
use support::workload::{Credit, Gen};

/// Records in the dedupe tables before anything is counted, and messages pre-applied for the
/// duplicate modes: the same in every child, so they cancel out.
const PREFILL: usize = 5_000;
const REPLAYS: usize = 2_000;

/// The modes, in the order they are reported.
const MODES: &[&str] = &[
    "plain (no dedupe)",
    "one-column by hand",
    "idem key",
    "one-column + version check by hand",
    "idem key+version+entity",
    "one-column duplicate",
    "idem duplicate",
    "hand batch 100 one-column",
    "idem batch 100",
];

/// An in-memory SQLite database on one connection that lives as long as the pool.
async fn open() -> anyhow::Result<SqlitePool> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(SqliteConnectOptions::from_str("sqlite::memory:")?)
        .await?;
    idem::migrate(&pool).await?;
    create_tables_sqlite(&pool).await?;
    Ok(pool)
}

/// Runs `msgs` through `mode`; returns (applied, skipped).
async fn run_mode(pool: &SqlitePool, mode: &str, msgs: &[Credit]) -> anyhow::Result<(u64, u64)> {
    let mut counts = (0, 0);
    match mode {
        "plain (no dedupe)" => {
            for msg in msgs {
                let mut tx = pool.begin().await?;
                effect(&mut tx, msg).await?;
                tx.commit().await?;
                counts.0 += 1;
            }
        }
        "one-column by hand" | "one-column duplicate" => {
            for msg in msgs {
                if one_column::<false>(pool, msg).await? {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
            }
        }
        "one-column + version check by hand" => {
            for msg in msgs {
                if one_column::<true>(pool, msg).await? {
                    counts.0 += 1;
                } else {
                    counts.1 += 1;
                }
            }
        }
        "idem key" | "idem duplicate" => {
            for msg in msgs {
                tally(credit_key(pool, msg).await, &mut counts)?;
            }
        }
        "idem key+version+entity" => {
            for msg in msgs {
                tally(credit_versioned(pool, msg).await, &mut counts)?;
            }
        }
        "hand batch 100 one-column" => return hand_batches(pool, msgs, 100).await,
        "idem batch 100" => return idem_batches(pool, msgs, 100).await,
        other => bail!("unknown mode {other:?}"),
    }
    Ok(counts)
}

/// The same setup for every mode and size: prefilled tables, pre-applied replays. Returns the
/// generator for fresh messages and the messages a duplicate mode redelivers.
async fn setup(pool: &SqlitePool, mode: &str) -> anyhow::Result<(Gen, Vec<Credit>)> {
    let mut gen = Gen::new(0x1457);
    idem_batches(pool, &gen.take(PREFILL), 100).await?;
    hand_batches(pool, &gen.take(PREFILL), 100).await?;
    let replays = gen.take(REPLAYS);
    let first = if mode.starts_with("idem") {
        "idem key"
    } else {
        "one-column by hand"
    };
    run_mode(pool, first, &replays).await?;
    Ok((gen, replays))
}

fn messages(mode: &str, gen: &mut Gen, replays: &[Credit], n: usize, at: usize) -> Vec<Credit> {
    if mode.contains("duplicate") {
        replays.iter().cycle().skip(at).take(n).cloned().collect()
    } else {
        gen.take(n)
    }
}

/// Under callgrind: setup, a warm-up of 100 messages, then `n` messages of `mode`.
async fn child(mode: &str, n: usize) -> anyhow::Result<()> {
    let pool = open().await?;
    let (mut gen, replays) = setup(&pool, mode).await?;
    let warm = messages(mode, &mut gen, &replays, 100, 0);
    run_mode(&pool, mode, &warm).await?;
    let msgs = messages(mode, &mut gen, &replays, n, 100);
    let (applied, skipped) = run_mode(&pool, mode, &msgs).await?;
    let want = if mode.contains("duplicate") {
        (0, n as u64)
    } else {
        (n as u64, 0)
    };
    ensure!(
        (applied, skipped) == want,
        "{mode}: applied {applied} skipped {skipped}"
    );
    pool.close().await;
    Ok(())
}

/// Total instructions (Ir) of one run of this binary under callgrind.
fn callgrind(mode: &str, n: usize) -> anyhow::Result<u64> {
    let out = std::env::temp_dir().join(format!("idem_instr_{}_{n}.out", std::process::id()));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(std::env::current_exe()?)
        .env("IDEM_INSTR_MODE", mode)
        .env("IDEM_INSTR_N", n.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("valgrind not found (apt-get install valgrind)")?;
    ensure!(status.success(), "callgrind run of {mode} ({n}) failed");
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no totals in the callgrind output")
}

/// Statements (sqlx's log) and transactions per message of `mode`, and one message's log.
async fn statements(mode: &str) -> anyhow::Result<(f64, f64, String)> {
    let pool = open().await?;
    let (mut gen, replays) = setup(&pool, mode).await?;
    let (unit, total) = if mode.contains("batch") {
        (100, 200)
    } else {
        (1, 100)
    };
    let one = messages(mode, &mut gen, &replays, unit, 0);
    let (_, _, log) = count(true, run_mode(&pool, mode, &one)).await?;
    let msgs = messages(mode, &mut gen, &replays, total, unit);
    let (logged, _, _) = count(false, run_mode(&pool, mode, &msgs)).await?;
    pool.close().await;
    let per_tx = if mode.contains("batch") { 100.0 } else { 1.0 };
    Ok((logged as f64 / total as f64, 1.0 / per_tx, fold(&log)))
}

async fn driver() -> anyhow::Result<()> {
    let small = env_usize("BENCH_INSTR_SMALL", 200);
    let large = env_usize("BENCH_INSTR_LARGE", 1_200);
    ensure!(
        large > small,
        "BENCH_INSTR_LARGE must exceed BENCH_INSTR_SMALL"
    );
    let filter = std::env::var("BENCH_MODES").ok();
    let modes: Vec<&str> = MODES
        .iter()
        .copied()
        .filter(|m| {
            filter
                .as_deref()
                .is_none_or(|f| f.split(',').any(|f| m.contains(f.trim())))
        })
        .collect();
    let mut rows = Vec::new();
    for mode in &modes {
        let a = callgrind(mode, small)?;
        let b = callgrind(mode, large)?;
        let per = (b as f64 - a as f64) / (large - small) as f64;
        eprintln!("[instructions] {mode}: {per:.0} Ir/msg");
        let (logged, tx, log) = statements(mode).await?;
        rows.push((mode, per, logged, tx, log));
    }
    let of = |name: &str| rows.iter().find(|r| *r.0 == name).map(|r| r.1);
    println!();
    println!("## Instructions per message, SQLite in memory (callgrind Ir, ({large} − {small}) messages' difference)");
    println!();
    println!("| mode | Ir / msg | vs one-column by hand | logged statements / msg | transactions / msg | logged statements of one message (or batch) |");
    println!("|---|---:|---:|---:|---:|---|");
    for (mode, per, logged, tx, log) in &rows {
        let base = if mode.contains("batch") {
            of("hand batch 100 one-column")
        } else if mode.contains("version") {
            of("one-column + version check by hand")
        } else if mode.contains("duplicate") {
            of("one-column duplicate")
        } else {
            of("one-column by hand")
        };
        let vs = base.map_or("-".into(), |b| format!("{:.3}", per / b));
        println!("| {mode} | {per:.0} | {vs} | {logged:.2} | {tx:.2} | {log} |");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Ok(mode) = std::env::var("IDEM_INSTR_MODE") {
        let n = env_usize("IDEM_INSTR_N", 200);
        return runtime.block_on(child(&mode, n));
    }
    tracing::subscriber::set_global_default(StatementCounter)?;
    println!(
        "load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    runtime.block_on(driver())
}

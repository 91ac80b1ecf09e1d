//! Plumbing shared by the benches in `benches/`: the backends (a SQLite file, a PostgreSQL
//! schema, a MySQL / MariaDB database) with their tables and `with_tables`, the message
//! generator, the handlers under measurement (idem's and the hand-written one-column pattern),
//! the statement counter, median/spread, the env knobs, and `run`, which every bench's `main`
//! calls.
//!
//! Nothing here measures by itself; each bench (`modes.rs`, `scale.rs`, `memory.rs`, `peers.rs`,
//! ..., the brokers' `rabbitmq.rs`, `nats.rs`, `redis.rs` and `kafka.rs` through `e2e`, the
//! brokers' outbox benches through `relay`) uses the part it needs.

pub mod backends;
pub mod e2e;
pub mod hand;
pub mod handlers;
pub mod order;
pub mod relay;
pub mod round_trips;
pub mod stats;
pub mod workload;

use std::future::Future;

use anyhow::bail;

/// An env knob: a number, or `default` when unset or unparseable.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A bench's `main`: installs the statement counter, prints the machine line, runs `bench` on a
/// multi-threaded tokio runtime, then prints the load average at the end.
pub fn run<F, Fut>(bench: F) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    tracing::subscriber::set_global_default(round_trips::StatementCounter)?;
    // `cargo bench` passes `--bench`; the sections of the former `throughput` bench are benches
    // of their own now, so any other argument is a mistake.
    if let Some(arg) = std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        bail!(
            "unexpected argument {arg}: each section is a bench of its own, \
             `cargo bench --bench modes|scale|memory|peers --features sqlite,postgres`"
        );
    }
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
        bench().await?;
        println!(
            "\nload average at end: {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        Ok(())
    })
}

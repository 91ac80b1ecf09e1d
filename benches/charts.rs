//! Two sweeps, idem beside the hand-written one-column pattern, per backend, drawn as SVG charts
//! in `benches/charts/`: msg/s against concurrent workers (1–16, one transaction per message)
//! and against batch size (1–500, one worker; `idem::batch` against the hand-written batch).
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench charts --features sqlite,postgres,mysql
//! ```
//!
//! Each point runs for `BENCH_CHART_SECONDS` (1) and the sweep is repeated `BENCH_CHART_ROUNDS`
//! (3) times, idem and the hand-written code alternating point by point; a chart shows the
//! median of the rounds. `BENCH_ONLY=sqlite|postgres|mysql` runs one backend,
//! `BENCH_PREFILL` (10,000) sets the records in each dedupe table before the sweeps,
//! `BENCH_CHARTS_DIR` where the SVG files go. The backends are those of `modes.rs` (SQLite file
//! with durable commits, a PostgreSQL schema, a MySQL / MariaDB database of their own).
//!
//! No timing is asserted anywhere; this binary only measures, prints and draws.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use plotters::prelude::*;
use sqlx::{Database, Pool};

#[allow(dead_code)] // shared by every bench; this one uses part of it
mod support;

#[cfg(feature = "mysql")]
use support::backends::MySqlDb;
use support::backends::{with_tables, PostgresDb, SqliteDb};
use support::stats::median;
use support::workload::{Credit, Gen};
use support::{env_usize, run};

const WORKERS: [usize; 5] = [1, 2, 4, 8, 16];
const BATCHES: [usize; 7] = [1, 10, 50, 100, 200, 300, 500];

/// One message, one transaction: Ok(true) if applied.
type OneFn<DB> = for<'a> fn(&'a Pool<DB>, &'a Credit) -> BoxFut<'a, bool>;
/// A slice in batches of `n`: (applied, skipped).
type BatchFn<DB> = for<'a> fn(&'a Pool<DB>, &'a [Credit], usize) -> BoxFut<'a, (u64, u64)>;
type BoxFut<'a, T> = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// A backend's two implementations, for both sweeps.
struct Impls<DB: Database> {
    idem_one: OneFn<DB>,
    hand_one: OneFn<DB>,
    idem_batch: BatchFn<DB>,
    hand_batch: BatchFn<DB>,
}

macro_rules! impls {
    ($backend:ident) => {{
        use support::hand::$backend as hand;
        use support::handlers::$backend as handlers;
        Impls {
            idem_one: |pool, msg| {
                Box::pin(async move {
                    Ok(matches!(
                        handlers::credit_key(pool, msg).await?,
                        idem::Outcome::Applied(())
                    ))
                })
            },
            hand_one: |pool, msg| {
                Box::pin(async move { Ok(hand::one_column::<false>(pool, msg).await?) })
            },
            idem_batch: |pool, msgs, n| Box::pin(hand::idem_batches(pool, msgs, n)),
            hand_batch: |pool, msgs, n| Box::pin(hand::hand_batches(pool, msgs, n)),
        }
    }};
}

/// Fresh ids for every worker of every point: the high bits of a generator's sequence.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn generator() -> Gen {
    let mut gen = Gen::new(0xc4a7);
    gen.next = NEXT.fetch_add(1 << 32, Ordering::Relaxed);
    gen
}

/// msg/s of `workers` tasks, each handling one message per transaction for `secs`.
async fn workers_point<DB: Database>(
    pool: &Pool<DB>,
    one: OneFn<DB>,
    workers: usize,
    secs: f64,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut gen = generator();
            let mut done = 0u64;
            while Instant::now() < deadline {
                let msg = gen.one();
                ensure!(one(&pool, &msg).await?, "a fresh message was not applied");
                done += 1;
            }
            Ok(done)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// msg/s of one worker handling batches of `n` for `secs`.
async fn batch_point<DB: Database>(
    pool: &Pool<DB>,
    batch: BatchFn<DB>,
    n: usize,
    secs: f64,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut gen = generator();
    let mut done = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let msgs = gen.take(n);
        let (applied, _) = batch(pool, &msgs, n).await?;
        ensure!(applied == n as u64, "a fresh batch was not applied whole");
        done += applied;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Medians per x of (idem, hand-written).
type Sweep = BTreeMap<usize, (Vec<f64>, Vec<f64>)>;

/// Both sweeps on one backend; prints the tables and draws the two charts.
async fn sweeps<DB: Database>(
    backend: &str,
    pool: &Pool<DB>,
    impls: Impls<DB>,
    dir: &Path,
) -> anyhow::Result<()> {
    let secs = std::env::var("BENCH_CHART_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds = env_usize("BENCH_CHART_ROUNDS", 3);
    let prefill = env_usize("BENCH_PREFILL", 10_000);
    let mut gen = generator();
    for chunk in 0..prefill / 500 {
        let _ = chunk;
        (impls.idem_batch)(pool, &gen.take(500), 100).await?;
        (impls.hand_batch)(pool, &gen.take(500), 100).await?;
    }
    // Warm-up: connections and statement caches.
    workers_point(pool, impls.idem_one, 16, 0.3).await?;
    workers_point(pool, impls.hand_one, 16, 0.3).await?;
    let mut by_workers = Sweep::new();
    let mut by_batch = Sweep::new();
    for round in 0..rounds {
        // Alternate which goes first, so neither always follows the other.
        let flip = round % 2 == 1;
        for w in WORKERS {
            let mut pair = [(impls.idem_one, 0.0), (impls.hand_one, 0.0)];
            for k in if flip { [1, 0] } else { [0, 1] } {
                pair[k].1 = workers_point(pool, pair[k].0, w, secs).await?;
            }
            let entry = by_workers.entry(w).or_default();
            entry.0.push(pair[0].1);
            entry.1.push(pair[1].1);
        }
        for n in BATCHES {
            let mut pair = [(impls.idem_batch, 0.0), (impls.hand_batch, 0.0)];
            for k in if flip { [1, 0] } else { [0, 1] } {
                pair[k].1 = batch_point(pool, pair[k].0, n, secs).await?;
            }
            let entry = by_batch.entry(n).or_default();
            entry.0.push(pair[0].1);
            entry.1.push(pair[1].1);
        }
        eprintln!("[charts {backend}] round {}/{rounds} done", round + 1);
    }
    let slug = backend.to_lowercase().replace(' ', "-");
    print_table(backend, "workers", &by_workers, rounds, secs);
    print_table(backend, "batch size", &by_batch, rounds, secs);
    draw(
        &dir.join(format!("workers-{slug}.svg")),
        &format!("{backend}: msg/s against workers (one transaction per message)"),
        "workers",
        &by_workers,
    )?;
    draw(
        &dir.join(format!("batch-{slug}.svg")),
        &format!("{backend}: msg/s against batch size (one worker)"),
        "messages per batch",
        &by_batch,
    )?;
    Ok(())
}

fn print_table(backend: &str, x: &str, sweep: &Sweep, rounds: usize, secs: f64) {
    println!();
    println!("## {backend}: msg/s by {x}, median of {rounds} rounds of {secs} s per point");
    println!();
    println!("| {x} | idem | hand-written | idem / hand-written (msg/s) |");
    println!("|---:|---:|---:|---:|");
    for (x, (idem, hand)) in sweep {
        let (i, h) = (median(idem), median(hand));
        println!("| {x} | {i:.0} | {h:.0} | {:.3} |", i / h);
    }
}

/// A line chart of both implementations' medians, x on a log scale.
fn draw(path: &Path, title: &str, x_desc: &str, sweep: &Sweep) -> anyhow::Result<()> {
    let plot = |e| anyhow!("drawing {}: {e:?}", path.display());
    let idem: Vec<(f64, f64)> = sweep
        .iter()
        .map(|(x, (idem, _))| (*x as f64, median(idem)))
        .collect();
    let hand: Vec<(f64, f64)> = sweep
        .iter()
        .map(|(x, (_, hand))| (*x as f64, median(hand)))
        .collect();
    let x_max = sweep.keys().max().copied().unwrap_or(1) as f64;
    let y_max = idem.iter().chain(&hand).map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (760, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(plot)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..x_max).log_scale(), 0.0..y_max.max(1.0))
        .map_err(plot)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("messages per second")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(plot)?;
    for (label, data, color) in [("idem", &idem, RED), ("hand-written", &hand, BLUE)] {
        chart
            .draw_series(LineSeries::new(data.iter().copied(), color.stroke_width(2)))
            .map_err(plot)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(data.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(plot)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(plot)?;
    root.present().map_err(plot)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

async fn section_charts(only: Option<&str>) -> anyhow::Result<()> {
    let dir = std::env::var("BENCH_CHARTS_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/charts"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir)?;
    if only.is_none() || only == Some("sqlite") {
        let sweep = async |pool: &_| sweeps("SQLite", pool, impls!(sq), &dir).await;
        with_tables::<SqliteDb, _>(16, sweep).await?;
    }
    if only.is_none() || only == Some("postgres") {
        let sweep = async |pool: &_| sweeps("PostgreSQL", pool, impls!(pg), &dir).await;
        with_tables::<PostgresDb, _>(16, sweep).await?;
    }
    #[cfg(feature = "mysql")]
    if only.is_none() || only == Some("mysql") {
        let sweep = async |pool: &_| sweeps("MariaDB", pool, impls!(my), &dir).await;
        with_tables::<MySqlDb, _>(16, sweep).await?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    run(|| async {
        let only = std::env::var("BENCH_ONLY").ok();
        section_charts(only.as_deref()).await
    })
}

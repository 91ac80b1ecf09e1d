//! The picture of the Grafana dashboard (`docs/dashboards/idem.json`) in the book, drawn from a
//! real run: `docs/src/images/dashboard.svg`.
//!
//! ```text
//! cargo bench --bench dashboard --features sqlite,metrics
//! ```
//!
//! For `BENCH_DASHBOARD_SECONDS` (80), two consumers run on a SQLite file (WAL,
//! `synchronous=NORMAL`) with in-memory queues (`workload.rs`): `orders`, whose handler keeps
//! each order's latest status (versioned, some versions swapped so they arrive stale) and
//! publishes a shipment through the outbox, and `payments`, with durable retries (4 runs, 1 s
//! doubling to 4 s), where one payment in twenty-five fails once or twice and one in three
//! hundred every time. A producer sends at a rate that changes over the run (with a burst of
//! 3,000 at once at 62 %), about one message in five twice. The outbox's relay stops from 25 %
//! to 50 % of the run, the orders consumer from 55 % to 68 % (a deploy); at 80 % the
//! payments' failures are fixed and their dead letters replayed to the consumer (as `idem
//! dead-letters replay --to-consumer` would); `idem::gauges::Gauges` reads every second.
//!
//! The recorder is `metrics-exporter-prometheus` (buckets for the two duration histograms).
//! Every second its text exposition is rendered and parsed (`dashboard/prom.rs`); the panels'
//! queries are then evaluated over those samples, with 5 s windows for `$__rate_interval`
//! (Grafana would take 4 s, four scrape intervals, over so short a range)
//! (`dashboard/query.rs`, `dashboard/panels.rs`), and drawn in the dashboard's layout
//! (`dashboard/draw.rs`). `BENCH_DASHBOARD_SVG` writes the picture elsewhere. Nothing is
//! asserted about timing.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use idem::admin::{DeadLetterAdmin as _, DeadLetterFilter, Page, ReplayTo};
use idem::consume::memory::MemoryQueue;
use idem::consume::{json, Consumer, Counts, DeadLetters, Recovery};
use idem::gauges::Gauges;
use idem::outbox::Relay;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Sqlite;
use tokio::sync::watch;

#[path = "dashboard/draw.rs"]
mod draw;
#[path = "dashboard/panels.rs"]
mod panels;
#[path = "dashboard/prom.rs"]
mod prom;
#[path = "dashboard/query.rs"]
mod query;
#[path = "dashboard/workload.rs"]
mod workload;

use workload::{on_payment, on_status, Payment, Producer, Runs, Shipments, StatusChanged};

/// Upper bounds of the duration histograms' buckets, in seconds.
const BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];
/// The window of every `rate()`.
const RATE_WINDOW: f64 = 5.0;
const BURST: usize = 3_000;

/// Messages per second at `f` (0 to 1) of the run, the burst aside.
fn rate_at(f: f64) -> f64 {
    match f {
        f if f < 0.15 => 150.0,
        f if f < 0.35 => 150.0 + 300.0 * (f - 0.15) / 0.20,
        f if f < 0.50 => 250.0,
        _ => 200.0 + 80.0 * ((f - 0.5) * 20.0).sin(),
    }
}

/// The orders consumer, until `shutdown`.
async fn orders_run(
    pool: &sqlx::SqlitePool,
    orders: &MemoryQueue,
    shutdown: impl std::future::Future<Output = ()>,
) -> Counts {
    Consumer::new(pool.clone())
        .batch(50)
        .recovery(Recovery::new("orders").dead_letters(DeadLetters::Database))
        .run(
            orders.deliveries(),
            json::<StatusChanged>,
            async |b, msg| on_status(b, msg).await,
            shutdown,
        )
        .await
}

/// The run's database directory, removed when dropped (on an error too).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A future that completes once `stop` turns true.
fn stopped(stop: &watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + use<> {
    let mut stop = stop.clone();
    async move {
        let _ = stop.wait_for(|s| *s).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: f64 = std::env::var("BENCH_DASHBOARD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(80.0);
    let out = std::env::var("BENCH_DASHBOARD_SVG").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/src/images/dashboard.svg"),
        PathBuf::from,
    );
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), &BUCKETS)?
        .install_recorder()?;
    idem::metrics::describe();
    // Counters appear at their first increment, and a rate needs two samples of a series: the
    // replay's counter is created at 0 beforehand so that its one increase shows, as an
    // application would for the counters it knows it will increase.
    metrics::counter!(idem::metrics::DEAD_LETTERS_REPLAYED_TOTAL, "to" => "consumer").increment(0);

    let dir = TempDir(std::env::temp_dir().join(format!("idem-dashboard-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let options = SqliteConnectOptions::new()
        .filename(dir.0.join("run.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    idem::migrate(&pool).await?;
    workload::create_tables(&pool).await?;

    let orders = MemoryQueue::named("orders");
    let payments = MemoryQueue::named("payments");
    let (stop_tx, stop) = watch::channel(false);

    // The orders consumer, stopped from 55 % to 68 % of the run (a deploy, say).
    let orders_consumer = {
        let (pool, orders, stop) = (pool.clone(), orders.clone(), stop.clone());
        tokio::spawn(async move {
            let down = Duration::from_secs_f64(seconds * 0.55);
            let up = Duration::from_secs_f64(seconds * 0.13);
            let first = orders_run(&pool, &orders, async {
                tokio::select! {
                    () = tokio::time::sleep(down) => {}
                    () = stopped(&stop) => {}
                }
            })
            .await;
            tokio::time::sleep(up).await;
            let second = orders_run(&pool, &orders, stopped(&stop)).await;
            (first, second)
        })
    };
    let runs = Runs::default();
    // At 80 % of the run the cause of the failures is fixed, and the payments' dead letters
    // of `retries_exhausted` are replayed to their consumer (`idem dead-letters replay
    // --to-consumer`).
    let fix = {
        let (pool, fixed) = (pool.clone(), runs.fixed.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(seconds * 0.8)).await;
            fixed.store(true, Ordering::Relaxed);
            let filter = DeadLetterFilter {
                consumer: Some("payments".into()),
                reason: Some("retries_exhausted".into()),
                ..DeadLetterFilter::default()
            };
            let page = Page {
                after: None,
                limit: 1_000,
            };
            let ids: Vec<i64> = Sqlite::list(&pool, &filter, page)
                .await?
                .iter()
                .map(|d| d.id)
                .collect();
            let replays = Sqlite::replay_to(&pool, &ids, ReplayTo::Consumer).await?;
            anyhow::Ok(replays.len())
        })
    };
    let payments_consumer = tokio::spawn(
        Consumer::new(pool.clone())
            .batch(50)
            .concurrency(2)
            .recovery(
                Recovery::new("payments")
                    .durable_retries(4, Duration::from_secs(1), Duration::from_secs(4))
                    .dead_letters(DeadLetters::Database)
                    .poll(Duration::from_millis(500)),
            )
            .run(
                payments.deliveries(),
                json::<Payment>,
                async move |b, msg| on_payment(b, msg, &runs).await,
                stopped(&stop),
            ),
    );

    // The relay, stopped from 25 % to 50 % of the run.
    let shipments = Shipments::default();
    let relay = {
        let (pool, shipments, stop) = (pool.clone(), shipments.clone(), stop.clone());
        tokio::spawn(async move {
            let pause = Duration::from_secs_f64(seconds * 0.25);
            let resume = Duration::from_secs_f64(seconds * 0.25);
            Relay::new(pool.clone(), shipments.clone())
                .run(tokio::time::sleep(pause))
                .await;
            tokio::time::sleep(resume).await;
            Relay::new(pool, shipments).run(stopped(&stop)).await
        })
    };

    let producer = {
        let mut producer = Producer::new(orders.clone(), payments.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut due = 0.0;
            let mut burst = false;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !*stop.borrow() {
                tick.tick().await;
                let f = start.elapsed().as_secs_f64() / seconds;
                due += rate_at(f) * 0.1;
                producer.send(due as usize);
                due -= due.floor();
                if f >= 0.62 && !burst {
                    producer.send(BURST);
                    burst = true;
                }
            }
            producer.sent
        })
    };

    let gauges = Gauges::new(pool.clone())
        .interval(Duration::from_secs(1))
        .lag_of(&orders)
        .lag_of(&payments);
    let sampler = async {
        let start = Instant::now();
        let mut scrapes = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let read = loop {
            tick.tick().await;
            let t = start.elapsed().as_secs_f64();
            recorder.run_upkeep();
            match prom::parse(&recorder.render()) {
                Ok(samples) => scrapes.push(prom::Scrape { t, samples }),
                Err(err) => break Err(err),
            }
            if t >= seconds {
                break Ok(scrapes);
            }
        };
        // Everything stops, whether the samples were read or not.
        let _ = stop_tx.send(true);
        read
    };
    let ((), scrapes) = tokio::join!(gauges.run(stopped(&stop)), sampler);
    let scrapes = scrapes?;
    let sent = producer.await?;
    let (orders_before, orders_after) = orders_consumer.await?;
    let payments_counts = payments_consumer.await?;
    let relay_stats = relay.await?;
    let replayed = fix.await??;
    pool.close().await;
    drop(dir);

    println!("sent: {sent:?}");
    println!("orders consumer, before its stop: {orders_before:?}");
    println!("orders consumer, after it: {orders_after:?}");
    println!("payments consumer: {payments_counts:?}");
    println!("dead letters replayed to the payments consumer: {replayed}");
    println!(
        "relay: {relay_stats:?}; shipments confirmed: {}",
        shipments.0.load(Ordering::Relaxed)
    );

    let query = query::Query {
        scrapes: &scrapes,
        window: RATE_WINDOW,
    };
    let json = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/dashboards/idem.json");
    let (title, panels) = panels::load(&json, &query)?;
    for panel in &panels {
        for (legend, points) in &panel.lines {
            let last = query::last(points).map(|v| draw::format_value(&panel.unit, v));
            let max = points
                .iter()
                .map(|p| p.1)
                .filter(|v| v.is_finite())
                .fold(0.0, f64::max);
            println!(
                "{:45} {:35} max {:>12}  last {}",
                panel.title,
                legend,
                draw::format_value(&panel.unit, max),
                last.unwrap_or_else(|| "-".into())
            );
        }
    }
    let subtitle = format!(
        "Drawn by benches/dashboard.rs from a {seconds:.0} s run (SQLite, in-memory queues): \
         the Prometheus exporter's samples, one a second, each panel's query evaluated over \
         them (rates over {RATE_WINDOW:.0} s). Not a Grafana screenshot."
    );
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    draw::draw(&out, &title, &subtitle, &panels, seconds)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

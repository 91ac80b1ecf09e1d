//! What the `otel` feature costs a consumer per message: SQLite (a file, WAL), the in-memory
//! broker, batches of 100, each message with a `traceparent` and an `idem-message-id` header as
//! an OpenTelemetry-enabled producer sends them. Build it with and without the feature and
//! compare the two runs:
//!
//! ```text
//! cargo bench --bench otel --features sqlite        # the feature off
//! cargo bench --bench otel --features sqlite,otel   # the feature on
//! ```
//!
//! The modes, each a run of the consumer over `BENCH_MESSAGES` (5,000) new messages:
//! - `none`: no subscriber is the thread's default (idem makes no span);
//! - `registry`: a `tracing_subscriber` registry at `INFO` without an OpenTelemetry layer
//!   (idem's `idempotent` spans are made and recorded; with the feature, so are its `process`
//!   spans, but nothing is extracted into them);
//! - `otel` (with the feature only): the registry with a `tracing-opentelemetry` layer on an
//!   SDK tracer without an exporter: each group's span extracts its messages' contexts (a
//!   parent or links), and every span is an OpenTelemetry span.
//!
//! The runs are on one thread (a current-thread runtime, each mode's subscriber its default
//! there), interleaved round by round in an order that rotates each round; for each mode the
//! median over `BENCH_ROUNDS` (15) rounds of messages per second and of CPU time per message
//! (this process's user and system time, SQLite's work included) is printed.
//!
//! `BENCH_MODES` (e.g. `none,otel`) runs only the modes it names. Times move by ±15% from run
//! to run here, so a difference of 1% is resolved by counting instructions instead: run the
//! built binary under `valgrind --tool=callgrind` with `BENCH_MODES=<one mode> BENCH_ROUNDS=1`
//! and `BENCH_MESSAGES` 200, then 1,200; (Ir(1,200) − Ir(200)) / 1,000 is one message's
//! instructions, setup and warm-up cancelled out (BENCHMARKS.md has the commands).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::time::Instant;

use idem::consume::{memory::MemoryQueue, Consumer};
use idem::sqlx::{Sqlite, SqlitePool};
use idem::{idempotent, Tx};
use tracing_subscriber::layer::SubscriberExt as _;

#[derive(serde::Serialize, serde::Deserialize)]
struct Credit {
    id: String,
    account: i64,
}

#[idempotent(key = "msg.id", scope = "bench::otel")]
async fn credit(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = ?")
        .bind(msg.account)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's user and system CPU time, in seconds.
fn cpu() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// One run over `n` new messages (ids from `first`): messages per second and CPU µs per message.
async fn once(pool: &SqlitePool, first: usize, n: usize) -> (f64, f64) {
    let queue = MemoryQueue::new();
    for i in first..first + n {
        let msg = Credit {
            id: format!("c{i}"),
            account: (i % 100) as i64,
        };
        // A W3C context as a producer with OpenTelemetry sends it: a trace per 100 messages.
        let headers = vec![
            (
                "traceparent".to_string(),
                format!("00-{:032x}-{:016x}-01", 1 + i / 100, 1 + i),
            ),
            ("idem-message-id".to_string(), format!("idem-{i:032x}")),
        ];
        queue.publish_with_headers(serde_json::to_vec(&msg).unwrap(), headers);
    }
    let (started, cpu_before) = (Instant::now(), cpu());
    let counts = Consumer::new(pool.clone())
        .batch(100)
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            async |b, m| credit(b, m).await,
            queue.idle(),
        )
        .await;
    let (elapsed, cpu_used) = (started.elapsed().as_secs_f64(), cpu() - cpu_before);
    assert_eq!(counts.applied as usize, n, "{counts:?}");
    (n as f64 / elapsed, cpu_used / n as f64 * 1e6)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = env_usize("BENCH_ROUNDS", 15);
    let messages = env_usize("BENCH_MESSAGES", 5_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = std::env::temp_dir().join(format!("idem_bench_otel_{}.db", std::process::id()));
    let pool = runtime.block_on(async {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let pool = SqlitePool::connect_with(options).await.unwrap();
        idem::migrate(&pool).await.unwrap();
        sqlx::query("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        for id in 0..100 {
            sqlx::query("INSERT INTO accounts (id, balance) VALUES (?, 0)")
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool
    });

    let mut modes: Vec<(&str, Option<tracing::Dispatch>)> = vec![
        ("none", None),
        (
            "registry",
            Some(tracing::Dispatch::new(
                tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO),
            )),
        ),
    ];
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TracerProvider as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(layer);
        modes.push(("otel", Some(tracing::Dispatch::new(subscriber))));
    }
    if let Ok(only) = std::env::var("BENCH_MODES") {
        modes.retain(|(name, _)| only.split(',').any(|m| m == *name));
    }
    println!(
        "feature otel: {}; {rounds} rounds of {messages} messages per mode; load average at start: {}",
        cfg!(feature = "otel"),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );

    let mut next = 0;
    let mut run = |dispatch: &Option<tracing::Dispatch>, n: usize| {
        let first = next;
        next += n;
        let work = || runtime.block_on(once(&pool, first, n));
        match dispatch {
            Some(dispatch) => tracing::dispatcher::with_default(dispatch, work),
            None => work(),
        }
    };
    for (_, dispatch) in &modes {
        run(dispatch, 500); // warm-up
    }
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    for round in 0..rounds {
        for k in 0..modes.len() {
            let mode = (round + k) % modes.len();
            let (rate, cpu_us) = run(&modes[mode].1, messages);
            results[mode].0.push(rate);
            results[mode].1.push(cpu_us);
        }
    }
    for ((name, _), (rates, cpus)) in modes.iter().zip(results) {
        println!(
            "{name:>9}: {:>8.0} msg/s, {:>6.1} µs CPU per message (medians)",
            median(rates),
            median(cpus)
        );
    }
    drop(pool);
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

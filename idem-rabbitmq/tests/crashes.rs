//! Crashes through the real broker: two consumer processes (this test binary again, with
//! `IDEM_RMQ_CRASH_CHILD` set) share one queue and one database; they are SIGKILLed at random
//! points (spread over the stream by the database's progress, some right after a start) and
//! restarted, at least `KILLS` times in all. At the end the database equals the exactly-once
//! oracle, the queue is empty, and nothing was applied twice. On SQLite and PostgreSQL.
//!
//! About 3,300 messages by default; `IDEM_SOAK=1` publishes 20,000 and kills 30 times.
//! `IDEM_RMQ_SEED` replays a run (the seed is printed).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{generate, model, oracle, source, Broker, Event, Kind};
use idem::consume::{json, Consumer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Set in a consumer process: `sqlite` or `postgres`.
const CHILD: &str = "IDEM_RMQ_CRASH_CHILD";
/// Set in a consumer process: the SQLite file or the PostgreSQL schema.
const CHILD_DB: &str = "IDEM_RMQ_CRASH_DB";
const CHILD_QUEUE: &str = "IDEM_RMQ_CRASH_QUEUE";
const CHILD_DLX: &str = "IDEM_RMQ_CRASH_DLX";

fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v != "0")
}

/// The consumer process: consumes until its stdin closes (then shuts down gracefully), or
/// until it is killed. Does nothing in a normal test run.
#[test]
fn crash_child() {
    let Ok(backend) = std::env::var(CHILD) else {
        return;
    };
    let location = std::env::var(CHILD_DB).unwrap();
    let names = common::Names {
        queue: std::env::var(CHILD_QUEUE).unwrap(),
        dlx: std::env::var(CHILD_DLX).unwrap(),
        dlq: String::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            })
            .await;
        };
        let deliveries = source(&common::rabbit_url(), &names, 40)
            .connect()
            .await
            .unwrap()
            .deliveries();
        let counts = match backend.as_str() {
            "sqlite" => {
                let pool = common::sqlite_open(std::path::Path::new(&location)).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<Event>,
                        async |b, e| model::sqlite::handle(b, e).await,
                        stdin_closed,
                    )
                    .await
            }
            "postgres" => {
                let pool = common::postgres_schema(&location).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<Event>,
                        async |b, e| model::postgres::handle(b, e).await,
                        stdin_closed,
                    )
                    .await
            }
            other => panic!("unknown backend {other}"),
        };
        println!("counts {counts:?}");
    });
}

fn consumer<DB: idem::store::Store>(pool: sqlx::Pool<DB>) -> Consumer<DB> {
    Consumer::new(pool)
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(10), Duration::from_millis(100))
}

fn spawn(backend: &str, location: &str, names: &common::Names) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, backend)
        .env(CHILD_DB, location)
        .env(CHILD_QUEUE, &names.queue)
        .env(CHILD_DLX, &names.dlx)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn killed_by_sigkill(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    // A process that had already exited would be a failure of its own.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "a consumer died by itself: {status}"
    );
}

macro_rules! crashes {
    ($m:ident, $backend:literal, $pool:expr, $location:expr) => {
        async {
            let pool = $pool;
            let location: String = $location;
            let Some(broker) = Broker::connect().await else {
                return;
            };
            let (unique, kills) = if soak() { (14_000, 30) } else { (2_300, 12) };
            let seed = std::env::var("IDEM_RMQ_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(rand::random::<u64>);
            eprintln!("seed: IDEM_RMQ_SEED={seed}");
            let mut rng = StdRng::seed_from_u64(seed ^ 0xc4a5);
            let names = broker.declare("idem_crash", Kind::Classic).await;
            let events = generate(seed, unique);
            let oracle = oracle(&events);
            model::$m::schema(&pool).await;
            let messages: Vec<_> = events.iter().map(Event::message).collect();
            broker.publish(&names.queue, &messages).await;
            let started = Instant::now();

            // Kill points: after the database's ledger reached a random share of the stream
            // (sorted), so the kills are spread over it; one in four right after a restart.
            let mut points: Vec<usize> = (0..kills)
                .map(|_| rng.random_range(0..unique * 3 / 4))
                .collect();
            points.sort_unstable();
            let mut children = [
                spawn($backend, &location, &names),
                spawn($backend, &location, &names),
            ];
            let deadline = Instant::now() + Duration::from_secs(if soak() { 600 } else { 120 });
            let mut killed = 0;
            for point in points {
                let early = rng.random_ratio(1, 4);
                if !early {
                    while model::$m::ledger(&pool).await.len() < point {
                        assert!(
                            Instant::now() < deadline,
                            "no progress before kill {killed}"
                        );
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    tokio::time::sleep(Duration::from_micros(rng.random_range(0..3_000))).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
                }
                let victim = rng.random_range(0..2);
                killed_by_sigkill(&mut children[victim]);
                killed += 1;
                children[victim] = spawn($backend, &location, &names);
            }
            assert!(killed >= kills);

            // Then let them finish: everything applied and nothing ready, for a moment.
            let mut quiet_since: Option<Instant> = None;
            loop {
                assert!(Instant::now() < deadline, "the consumers did not finish");
                let ledger = model::$m::ledger(&pool).await;
                let done = oracle
                    .credits
                    .iter()
                    .chain(&oracle.latest)
                    .all(|id| ledger.contains_key(id))
                    && broker.depth(&names.queue).await.0 == 0;
                match (done, quiet_since) {
                    (true, Some(since)) if since.elapsed() > Duration::from_millis(1_500) => break,
                    (true, None) => quiet_since = Some(Instant::now()),
                    (false, _) => quiet_since = None,
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A graceful shutdown of both: stdin closes, they drain, settle and exit 0.
            for child in &mut children {
                drop(child.stdin.take());
            }
            for child in &mut children {
                let status = child.wait().unwrap();
                assert!(
                    status.success(),
                    "a consumer did not shut down cleanly: {status}"
                );
            }
            eprintln!(
                "{} messages, {killed} kills, in {:?}",
                events.len(),
                started.elapsed()
            );
            broker.settles_at(&names.queue, 0).await;
            assert_eq!(broker.depth(&names.dlq).await, (0, 0));
            model::$m::verify(&pool, &oracle).await;
            broker.delete(&names).await;
            broker.close().await;
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_two_consumers_killed_and_restarted_on_sqlite() {
    let (pool, path) = common::sqlite().await;
    crashes!(sqlite, "sqlite", pool.clone(), path.clone()).await;
    common::drop_sqlite(pool, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_two_consumers_killed_and_restarted_on_postgres() {
    let Some((pool, schema)) = common::postgres().await else {
        return;
    };
    crashes!(postgres, "postgres", pool.clone(), schema.clone()).await;
    common::drop_postgres(pool, &schema).await;
}

//! Crashes with real processes on a Kafka-protocol broker (`IDEM_KAFKA_BROKERS`). Two consumer
//! processes (this test binary again, with `IDEM_KAFKA_CHILD` set) in one group consume order
//! events with duplicates and reordered versions; the test SIGKILLs each of them at random
//! moments (at least 5 times each) and restarts it, and some lives kill themselves between a
//! batch's commit and its settlement. Once every kill is made, the lives stop gracefully and two
//! fresh ones drain the rest in a group with no dead member left (see [`SESSION_EXPIRY`]). At
//! the end the database equals the exactly-once oracle, nothing was applied twice, and the group
//! has committed every partition to its end. Once on SQLite (a file) and once on PostgreSQL (a
//! schema of its own, dropped after).
//! `IDEM_SOAK=1` runs the full size (10,000 records); `IDEM_KAFKA_SEED` replays a run.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Fixture, OrderEvent};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Set in a consumer process: its backend, `sqlite` or `postgres`.
const CHILD: &str = "IDEM_KAFKA_CHILD";
/// Set in a consumer process: the SQLite file, or the PostgreSQL schema.
const CHILD_DB: &str = "IDEM_KAFKA_DB";
/// Set in a consumer process: `brokers topic group`.
const CHILD_TOPIC: &str = "IDEM_KAFKA_TOPIC";
/// Set in some lives: the process SIGKILLs itself at its n-th ack, after the batch committed
/// and before the offset is settled.
const KILL_ON_ACK: &str = "IDEM_KAFKA_KILL_ON_ACK";
/// Set in a consumer process: a file the test creates once every planned kill is made. Until
/// it exists the consumer takes a record every [`PACE`], so the kills land mid-stream however
/// fast the machine; after, it drains at full speed.
const RELEASE: &str = "IDEM_KAFKA_RELEASE";
const PACE: Duration = Duration::from_millis(40);
/// Set in a consumer process: a file the test creates to stop it gracefully (it finishes what
/// it started, commits and leaves the group).
const STOP: &str = "IDEM_KAFKA_STOP";
/// Longer than the consumers' `session.timeout.ms` (6 s): after it, the broker has expired every
/// SIGKILLed member. tansu 0.6.0 mishandles such an expiry while the group is stable: it
/// re-forms the group under the same generation without telling the followers, so a partition
/// stays assigned to the dead member and nothing consumes it (seen here: generation 18 assigned
/// to 3 members, then to 2, and one live member kept its 1-partition assignment). A real Kafka
/// bumps the generation and the followers rejoin. So the final drain starts after this wait, in
/// a group with no dead member.
const SESSION_EXPIRY: Duration = Duration::from_secs(9);

const PARTITIONS: i32 = 4;

struct Size {
    orders: i64,
    versions: i64,
    duplicates: f64,
    swaps: usize,
    /// Random SIGKILLs per process.
    kills_each: usize,
    commit_kills: usize,
}

fn size() -> Size {
    if std::env::var_os("IDEM_SOAK").is_some() {
        // 7,700 events and 30% duplicates: 10,010 records.
        Size {
            orders: 385,
            versions: 20,
            duplicates: 0.3,
            swaps: 6_000,
            kills_each: 10,
            commit_kills: 6,
        }
    } else {
        // 2,000 events and 30% duplicates: 2,600 records.
        Size {
            orders: 100,
            versions: 20,
            duplicates: 0.3,
            swaps: 1_500,
            kills_each: 5,
            commit_kills: 2,
        }
    }
}

/// The consumer process: does nothing in a normal test run.
#[test]
fn consumer_child() {
    let Ok(backend) = std::env::var(CHILD) else {
        return;
    };
    let location = std::env::var(CHILD_DB).unwrap();
    let spec = std::env::var(CHILD_TOPIC).unwrap();
    let [brokers, topic, group]: [&str; 3] =
        spec.split(' ').collect::<Vec<_>>().try_into().unwrap();
    let kill_on_ack = std::env::var(KILL_ON_ACK).ok().map(|n| n.parse().unwrap());
    let release = std::path::PathBuf::from(std::env::var(RELEASE).unwrap());
    let stop = std::path::PathBuf::from(std::env::var(STOP).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let fx = Fixture::attach(brokers, topic, group, PARTITIONS);
        let shutdown = async {
            let stopped = async {
                while !stop.exists() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            tokio::select! {
                () = fx.settled() => {}
                () = stopped => {}
            }
        };
        let source = fx.source().await;
        let countdown = Arc::new(AtomicUsize::new(kill_on_ack.unwrap_or(0)));
        let deliveries = source.deliveries().then(move |d| {
            let countdown = countdown.clone();
            let paced = !release.exists();
            async move {
                if paced {
                    tokio::time::sleep(PACE).await;
                }
                d.map(|inner| KillOnAck { inner, countdown })
            }
        });
        match backend.as_str() {
            "sqlite" => {
                let pool = common::sqlite_file(std::path::Path::new(&location)).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<OrderEvent>,
                        async |b, e| common::order_status(b, e).await,
                        shutdown,
                    )
                    .await;
            }
            "postgres" => {
                let pool = common::postgres_schema(&location).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<OrderEvent>,
                        async |b, e| common::postgres::order_status(b, e).await,
                        shutdown,
                    )
                    .await;
            }
            other => panic!("unknown backend {other}"),
        }
        source.close().await.unwrap();
    });
}

fn consumer<DB: idem::store::Store>(pool: sqlx::Pool<DB>) -> Consumer<DB> {
    Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(500))
}

/// A delivery that kills its process at the n-th ack: after the commit, before the offset
/// settles.
struct KillOnAck {
    inner: idem::kafka::Delivery,
    countdown: Arc<AtomicUsize>,
}

impl Delivery for KillOnAck {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }

    fn revoked(&self) -> bool {
        self.inner.revoked()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        if settle == Settle::Ack && self.countdown.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        self.inner.settle(settle).await
    }
}

/// A consumer process, killed if the test ends (or fails) while it runs.
struct Life(Child);

impl Drop for Life {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(
    backend: &str,
    location: &str,
    release: &std::path::Path,
    stop: &std::path::Path,
    fx: &Fixture,
    kill_on_ack: Option<usize>,
) -> Life {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "consumer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, backend)
        .env(CHILD_DB, location)
        .env(RELEASE, release)
        .env(STOP, stop)
        .env(
            CHILD_TOPIC,
            format!("{} {} {}", fx.brokers, fx.topic, fx.group),
        )
        .env_remove(KILL_ON_ACK)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(n) = kill_on_ack {
        command.env(KILL_ON_ACK, n.to_string());
    }
    Life(command.spawn().unwrap())
}

/// The events: `versions` of each order, 30% of them produced again later, and neighbours
/// swapped so versions arrive out of order.
fn events(size: &Size, rng: &mut StdRng) -> Vec<OrderEvent> {
    let mut events: Vec<OrderEvent> = (1..=size.versions)
        .flat_map(|v| (1..=size.orders).map(move |o| OrderEvent::new(o, v)))
        .collect();
    let copies = (events.len() as f64 * size.duplicates) as usize;
    for _ in 0..copies {
        let from = rng.random_range(0..events.len());
        let to = rng.random_range(from..=events.len());
        let copy = events[from].clone();
        events.insert(to, copy);
    }
    for _ in 0..size.swaps {
        let a = rng.random_range(0..events.len());
        let b = (a + rng.random_range(1..=16)).min(events.len() - 1);
        events.swap(a, b);
    }
    events
}

#[derive(Default, Debug)]
struct Kills {
    random: [usize; 2],
    at_commit: usize,
    lives: usize,
}

/// Whether a life that exited was SIGKILLed (by itself, at a commit); any other failure fails
/// the test.
fn killed(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    if status.success() {
        return false;
    }
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "a consumer failed: {status}"
    );
    true
}

/// Fails the test past `deadline`, with the group's progress.
async fn in_time(deadline: Instant, fx: &Fixture, kills: &Kills) {
    assert!(
        Instant::now() < deadline,
        "not settled in time: {kills:?}, committed {:?} of {:?}",
        fx.committed().await,
        fx.ends().await
    );
}

/// Runs two consumer processes, killing each at random moments; once every kill is made, stops
/// them, waits for the broker to expire the killed members, and runs two fresh lives until both
/// exit on their own (the group committed every record).
async fn crash_run(backend: &str, location: &str, fx: &Fixture, rng: &mut StdRng) -> Kills {
    let size = size();
    let mut kills = Kills::default();
    let mut commit_kills_left = size.commit_kills;
    let release = std::env::temp_dir().join(format!("{}.release", fx.topic));
    let stop = std::env::temp_dir().join(format!("{}.stop", fx.topic));
    let _ = std::fs::remove_file(&release);
    let _ = std::fs::remove_file(&stop);
    let mut next_life = |kills: &mut Kills, rng: &mut StdRng, may_kill: bool| {
        kills.lives += 1;
        let commit_kill =
            may_kill && commit_kills_left > 0 && (kills.lives == 1 || rng.random_bool(0.3));
        if commit_kill {
            commit_kills_left -= 1;
        }
        let kill_on_ack = commit_kill.then(|| rng.random_range(1..=50));
        (
            spawn_child(backend, location, &release, &stop, fx, kill_on_ack),
            commit_kill,
        )
    };
    // Each slot's life, and whether it is to kill itself at a commit (random kills spare it).
    let mut children: Vec<Option<(Life, bool)>> = vec![
        Some(next_life(&mut kills, rng, true)),
        Some(next_life(&mut kills, rng, true)),
    ];
    let deadline = Instant::now() + Duration::from_secs(900);
    // The kills, while the lives pace themselves.
    let mut next_kill = Instant::now() + Duration::from_millis(rng.random_range(500..2_000));
    while kills.random.iter().any(|k| *k < size.kills_each) {
        in_time(deadline, fx, &kills).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..300))).await;
        for slot in children.iter_mut() {
            let Some((child, _)) = slot.as_mut() else {
                continue;
            };
            if let Some(status) = child.0.try_wait().unwrap() {
                if killed(status) {
                    kills.at_commit += 1;
                    *slot = Some(next_life(&mut kills, rng, true));
                } else {
                    *slot = None;
                }
            }
        }
        if children.iter().all(Option::is_none) {
            // Settled before every kill was made: not the test this is.
            panic!("all settled before the planned kills: {kills:?}; make the run bigger");
        }
        if Instant::now() >= next_kill {
            // The process owed more kills goes first, so each is killed `kills_each` times.
            let i = usize::from(kills.random[1] < kills.random[0]);
            if let Some((child, false)) = children[i].as_mut() {
                child.0.kill().unwrap(); // SIGKILL
                child.0.wait().unwrap();
                kills.random[i] += 1;
                children[i] = Some(next_life(&mut kills, rng, true));
            }
            next_kill = Instant::now() + Duration::from_millis(rng.random_range(500..3_000));
        }
    }
    // Every kill made: the lives stop gracefully (one may still kill itself at a commit), the
    // broker expires the killed members, and two fresh lives drain the rest at full speed.
    std::fs::write(&stop, b"").unwrap();
    for slot in children.iter_mut() {
        while let Some((child, _)) = slot.as_mut() {
            in_time(deadline, fx, &kills).await;
            match child.0.try_wait().unwrap() {
                Some(status) => {
                    kills.at_commit += usize::from(killed(status));
                    *slot = None;
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    tokio::time::sleep(SESSION_EXPIRY).await;
    std::fs::remove_file(&stop).unwrap();
    std::fs::write(&release, b"").unwrap();
    for slot in children.iter_mut() {
        *slot = Some(next_life(&mut kills, rng, false));
    }
    while children.iter().any(Option::is_some) {
        in_time(deadline, fx, &kills).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for slot in children.iter_mut() {
            if let Some((child, _)) = slot.as_mut() {
                if let Some(status) = child.0.try_wait().unwrap() {
                    assert!(status.success(), "a draining consumer failed: {status}");
                    *slot = None;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&release);
    kills
}

fn seeded() -> StdRng {
    let seed = std::env::var("IDEM_KAFKA_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("IDEM_KAFKA_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// What a run must leave, on either backend: every kill made, the database equal to the oracle,
/// nothing applied twice, every partition committed to its end.
async fn assert_run<DB: sqlx::Database>(
    backend: &str,
    pool: &sqlx::Pool<DB>,
    fx: &Fixture,
    events: &[OrderEvent],
    kills: &Kills,
    started: Instant,
) where
    for<'r> (i64, String, i64): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    eprintln!(
        "{backend}: {} records, {kills:?}, {:?}",
        events.len(),
        started.elapsed()
    );
    assert!(kills.random.iter().all(|k| *k >= size().kills_each));
    assert!(
        kills.at_commit >= 1,
        "no life was killed between commit and settlement: {kills:?}"
    );
    assert_eq!(common::orders(pool).await, common::oracle(events));
    assert_eq!(common::applied_twice(pool).await, Vec::<String>::new());
    let committed: Vec<i64> = fx.committed().await.into_iter().flatten().collect();
    assert_eq!(
        committed,
        fx.ends().await,
        "every partition committed to its end"
    );
    assert_eq!(fx.ends().await.iter().sum::<i64>() as usize, events.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_sqlite() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(fx) = Fixture::new(PARTITIONS).await else {
        return;
    };
    let started = Instant::now();
    let mut rng = seeded();
    let events = events(&size(), &mut rng);
    fx.produce_all(&events).await;
    let (pool, path) = common::sqlite().await;
    let kills = crash_run("sqlite", path.to_str().unwrap(), &fx, &mut rng).await;
    assert_run("sqlite", &pool, &fx, &events, &kills, started).await;
    common::drop_sqlite(pool, &path).await;
    fx.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_postgres() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(fx) = Fixture::new(PARTITIONS).await else {
        return;
    };
    let Some((pool, schema)) = common::postgres().await else {
        fx.delete().await;
        return;
    };
    let started = Instant::now();
    let mut rng = seeded();
    let events = events(&size(), &mut rng);
    fx.produce_all(&events).await;
    let kills = crash_run("postgres", &schema, &fx, &mut rng).await;
    assert_run("postgres", &pool, &fx, &events, &kills, started).await;
    common::drop_postgres(pool, &schema).await;
    fx.delete().await;
}

//! Crashes with real processes on the local NATS server. Consumer processes (this test binary
//! again, with `IDEM_NATS_CHILD` set) consume a stream of order events with duplicates and
//! reordered versions; the test SIGKILLs them at random moments and restarts them, and some
//! lives kill themselves between a batch's commit and its acks. At the end the database equals
//! the exactly-once oracle, nothing was applied twice, and the JetStream consumer has nothing
//! pending or unacked. On SQLite and PostgreSQL; `IDEM_SOAK=1` runs the full size.
//! `IDEM_NATS_SEED` replays a run (the seed is printed).

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Fixture, OrderEvent, Settings};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Set in a consumer process: its backend, `sqlite` or `postgres`.
const CHILD: &str = "IDEM_NATS_CHILD";
/// Set in a consumer process: the SQLite file, or the PostgreSQL schema.
const CHILD_DB: &str = "IDEM_NATS_DB";
/// Set in a consumer process: the stream of the test's fixture.
const CHILD_STREAM: &str = "IDEM_NATS_STREAM";
/// Set in some lives: the process SIGKILLs itself at its n-th ack, after the batch committed
/// and before the ack is sent.
const KILL_ON_ACK: &str = "IDEM_NATS_KILL_ON_ACK";

struct Size {
    orders: i64,
    versions: i64,
    /// Copies of earlier events published again later, as a fraction of the events.
    duplicates: f64,
    swaps: usize,
    random_kills: usize,
    commit_kills: usize,
}

fn size() -> Size {
    if std::env::var_os("IDEM_SOAK").is_some() {
        Size {
            orders: 1_000,
            versions: 20,
            duplicates: 0.3,
            swaps: 6_000,
            random_kills: 40,
            commit_kills: 12,
        }
    } else {
        Size {
            orders: 200,
            versions: 12,
            duplicates: 0.3,
            swaps: 720,
            random_kills: 8,
            commit_kills: 3,
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
    let stream = std::env::var(CHILD_STREAM).unwrap();
    let kill_on_ack = std::env::var(KILL_ON_ACK).ok().map(|n| n.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = idem::nats::async_nats::connect(common::nats_url())
            .await
            .unwrap();
        let fx = Fixture::attach(client, &stream);
        let deliveries = fx
            .source()
            .prefetch(50)
            .connect()
            .await
            .unwrap()
            .deliveries();
        let countdown = Arc::new(AtomicUsize::new(kill_on_ack.unwrap_or(0)));
        let deliveries = deliveries.map(move |d| {
            d.map(|inner| KillOnAck {
                inner,
                countdown: countdown.clone(),
            })
        });
        match backend.as_str() {
            "sqlite" => {
                let pool = common::sqlite_file(std::path::Path::new(&location)).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<OrderEvent>,
                        async |b, e| common::sqlite::order_status(b, e).await,
                        fx.settled(),
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
                        fx.settled(),
                    )
                    .await;
            }
            other => panic!("unknown backend {other}"),
        }
    });
}

fn consumer<DB: idem::store::Store>(pool: sqlx::Pool<DB>) -> Consumer<DB> {
    Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(500))
}

/// A delivery that kills its process at the n-th ack: after the commit, before the ack.
struct KillOnAck {
    inner: idem::nats::Delivery,
    countdown: Arc<AtomicUsize>,
}

impl Delivery for KillOnAck {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }

    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
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

impl std::ops::Deref for Life {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Life {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn spawn_child(backend: &str, location: &str, stream: &str, kill_on_ack: Option<usize>) -> Life {
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
        .env(CHILD_STREAM, stream)
        .env_remove(KILL_ON_ACK)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(n) = kill_on_ack {
        command.env(KILL_ON_ACK, n.to_string());
    }
    Life(command.spawn().unwrap())
}

/// The events: `versions` of each order, every 30th of them published again later, and
/// neighbours swapped so versions arrive out of order.
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
    random: usize,
    at_commit: usize,
    lives: usize,
}

/// Runs two consumer processes over the published events, killing them as planned, until
/// they both exit on their own (the JetStream consumer settled).
async fn crash_run(backend: &str, location: &str, fx: &Fixture, rng: &mut StdRng) -> Kills {
    let size = size();
    let mut kills = Kills::default();
    let mut commit_kills_left = size.commit_kills;
    let mut next_life = |kills: &mut Kills, rng: &mut StdRng| {
        kills.lives += 1;
        // The first life always dies at a commit; later ones now and then.
        let commit_kill = commit_kills_left > 0 && (kills.lives == 1 || rng.random_bool(0.5));
        if commit_kill {
            commit_kills_left -= 1;
        }
        let kill_on_ack = commit_kill.then(|| rng.random_range(1..=100));
        spawn_child(backend, location, &fx.stream, kill_on_ack)
    };
    let mut children: Vec<Option<Life>> = vec![
        Some(next_life(&mut kills, rng)),
        Some(next_life(&mut kills, rng)),
    ];
    let deadline =
        Instant::now() + Duration::from_secs(if size.random_kills > 10 { 600 } else { 55 });
    loop {
        assert!(
            Instant::now() < deadline,
            "not settled in time: {kills:?}, {:?}",
            fx.state().await
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..600))).await;
        for slot in children.iter_mut() {
            let Some(child) = slot.as_mut() else { continue };
            match child.try_wait().unwrap() {
                None => {}
                Some(status) if status.success() => *slot = None,
                Some(status) => {
                    // Killed itself between a commit and its acks; anything else is a failure.
                    use std::os::unix::process::ExitStatusExt as _;
                    assert_eq!(
                        status.signal(),
                        Some(libc::SIGKILL),
                        "a consumer failed: {status}"
                    );
                    kills.at_commit += 1;
                    *slot = Some(next_life(&mut kills, rng));
                }
            }
        }
        if kills.random < size.random_kills {
            let i = rng.random_range(0..children.len());
            if let Some(child) = children[i].as_mut() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills.random += 1;
                children[i] = Some(next_life(&mut kills, rng));
            }
        }
        if children.iter().all(Option::is_none) {
            return kills;
        }
    }
}

/// The final state the events must leave, had each been applied exactly once in its order:
/// each order at its highest version.
fn oracle(events: &[OrderEvent]) -> Vec<(i64, String, i64)> {
    let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
    for e in events {
        let v = latest.entry(e.order).or_insert(0);
        *v = (*v).max(e.version);
    }
    latest
        .into_iter()
        .map(|(order, version)| (order, format!("status-{version}"), version))
        .collect()
}

fn seeded() -> StdRng {
    let seed = std::env::var("IDEM_NATS_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("IDEM_NATS_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

async fn crash_fixture() -> Option<Fixture> {
    let client = common::connect().await?;
    Some(
        Fixture::new(
            client,
            Settings {
                ack_wait: Duration::from_secs(2),
                ..Settings::default()
            },
        )
        .await,
    )
}

async fn assert_consumer_clean(fx: &Fixture) {
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    assert!(fx.dead_letters().await.is_empty(), "nothing is poison here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_sqlite() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(fx) = crash_fixture().await else {
        return;
    };
    let started = Instant::now();
    let mut rng = seeded();
    let events = events(&size(), &mut rng);
    fx.publish_all(&events).await;
    let path = std::env::temp_dir().join(format!("{}.db", common::unique_name("idem_nats_crash")));
    let pool = common::sqlite_file(&path).await;
    let kills = crash_run("sqlite", path.to_str().unwrap(), &fx, &mut rng).await;
    eprintln!(
        "sqlite: {} events, {kills:?}, {:?}",
        events.len(),
        started.elapsed()
    );
    assert!(
        kills.at_commit >= 1,
        "no life was killed between commit and ack: {kills:?}"
    );
    assert_eq!(common::orders_sqlite(&pool).await, oracle(&events));
    assert!(common::applied_twice_sqlite(&pool).await.is_empty());
    assert_consumer_clean(&fx).await;
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_postgres() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(fx) = crash_fixture().await else {
        return;
    };
    let Some((pool, schema)) = common::postgres().await else {
        fx.delete().await;
        return;
    };
    let started = Instant::now();
    let mut rng = seeded();
    let events = events(&size(), &mut rng);
    fx.publish_all(&events).await;
    let kills = crash_run("postgres", &schema, &fx, &mut rng).await;
    eprintln!(
        "postgres: {} events, {kills:?}, {:?}",
        events.len(),
        started.elapsed()
    );
    assert!(
        kills.at_commit >= 1,
        "no life was killed between commit and ack: {kills:?}"
    );
    let orders: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, status, version FROM orders ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(orders, oracle(&events));
    let twice: Vec<String> =
        sqlx::query_scalar("SELECT id FROM applied GROUP BY id HAVING COUNT(*) > 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(twice.is_empty(), "applied twice: {twice:?}");
    assert_consumer_clean(&fx).await;
    common::drop_postgres(pool, &schema).await;
    fx.delete().await;
}

/// A consumer killed after its batch committed and before any ack: JetStream redelivers the
/// batch after `ack_wait`; each redelivery is a Duplicate, acked, and nothing is applied twice.
#[tokio::test]
async fn ack_after_commit_a_kill_before_the_ack_redelivers_duplicates() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(fx) = crash_fixture().await else {
        return;
    };
    let events: Vec<OrderEvent> = (1..=5).map(|o| OrderEvent::new(o, 1)).collect();
    fx.publish_all(&events).await;
    let path = std::env::temp_dir().join(format!("{}.db", common::unique_name("idem_nats_ack")));
    let pool = common::sqlite_file(&path).await;
    let mut child = spawn_child("sqlite", path.to_str().unwrap(), &fx.stream, Some(1));
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(
        !status.success(),
        "the child killed itself at its first ack"
    );
    let committed = common::applied_sqlite(&pool).await as u64;
    assert!(committed >= 1);
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!(pending + ack_pending as u64, 5, "nothing was acked");
    assert!(ack_pending as u64 >= committed);

    let counts = consumer(pool.clone())
        .run(
            fx.source().connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |b, e| common::sqlite::order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(counts.duplicate, committed, "{counts:?}");
    assert_eq!(counts.applied, 5 - committed, "{counts:?}");
    assert_eq!(common::applied_sqlite(&pool).await, 5);
    assert!(common::applied_twice_sqlite(&pool).await.is_empty());
    assert_consumer_clean(&fx).await;
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

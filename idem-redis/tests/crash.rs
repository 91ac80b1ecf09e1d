//! Crashes with real processes on the local Redis. Consumer processes (this test binary again,
//! with `IDEM_REDIS_CHILD` set) consume a stream of order events with duplicates and reordered
//! versions in one consumer group; the test SIGKILLs each of them at random moments at least 5
//! times and restarts it under a new consumer name, and some lives kill themselves between a
//! batch's commit and its `XACK`s. What a dead consumer left pending is taken over by the others'
//! `XAUTOCLAIM`. At the end the database equals the exactly-once oracle, nothing was applied twice,
//! the group has read every entry and has nothing pending, and nothing was dead-lettered. On SQLite
//! and PostgreSQL; `IDEM_SOAK=1` runs the full size (10,010 entries, 20 random kills).
//! `IDEM_REDIS_SEED` replays a run (the seed is printed).

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{GroupState, OrderEvent, Streams, GROUP};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::redis::Source;
use rand::rngs::StdRng;
use rand::Rng;

/// Set in a consumer process: its backend, `sqlite` or `postgres`.
const CHILD: &str = "IDEM_REDIS_CHILD";
/// Set in a consumer process: the SQLite file, or the PostgreSQL schema.
const CHILD_DB: &str = "IDEM_REDIS_DB";
/// Set in a consumer process: the stream.
const CHILD_STREAM: &str = "IDEM_REDIS_STREAM";
/// Set in a consumer process: its consumer name in the group.
const CHILD_NAME: &str = "IDEM_REDIS_CONSUMER";
/// Set in some lives: the process SIGKILLs itself at its n-th ack, after the batch committed
/// and before the `XACK` is sent.
const KILL_ON_ACK: &str = "IDEM_REDIS_KILL_ON_ACK";

/// Entries pending longer than this in a dead consumer are taken over.
const CLAIM_IDLE: Duration = Duration::from_secs(2);

struct Size {
    orders: i64,
    versions: i64,
    swaps: usize,
    /// Random SIGKILLs in all, taking the two processes in turn.
    random_kills: usize,
    commit_kills: usize,
}

fn size() -> Size {
    if std::env::var_os("IDEM_SOAK").is_some() {
        // 7,700 events + 30% copies = 10,010 entries.
        Size {
            orders: 770,
            versions: 10,
            swaps: 6_000,
            random_kills: 20,
            commit_kills: 6,
        }
    } else {
        // 2,400 events + 30% copies = 3,120 entries.
        Size {
            orders: 200,
            versions: 12,
            swaps: 720,
            random_kills: 10,
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
    let name = std::env::var(CHILD_NAME).unwrap();
    let kill_on_ack = std::env::var(KILL_ON_ACK).ok().map(|n| n.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let streams = Streams::attach(&stream).await;
        let source = Source::builder(common::url(), &stream, GROUP, &name)
            .prefetch(50)
            .block(Duration::from_millis(100))
            .claim_idle(CLAIM_IDLE)
            .connect()
            .await
            .unwrap();
        let countdown = Arc::new(AtomicUsize::new(kill_on_ack.unwrap_or(0)));
        let deliveries = source.deliveries().map(move |d| {
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
                        async |b, e| {
                            pace().await;
                            common::sqlite::order_status(b, e).await
                        },
                        streams.settled(GROUP),
                    )
                    .await;
            }
            "postgres" => {
                let pool = common::postgres_schema(&location).await;
                consumer(pool)
                    .run(
                        deliveries,
                        json::<OrderEvent>,
                        async |b, e| {
                            pace().await;
                            common::postgres::order_status(b, e).await
                        },
                        streams.settled(GROUP),
                    )
                    .await;
            }
            other => panic!("unknown backend {other}"),
        }
    });
}

/// Slows each delivery a little, so that the stream outlasts the planned kills however quiet
/// the machine is (on an idle one the two processes drained it before ten kills had landed).
async fn pace() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

fn consumer<DB: idem::store::Store>(pool: sqlx::Pool<DB>) -> Consumer<DB> {
    Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(500))
}

/// A delivery that kills its process at the n-th ack: after the commit, before the `XACK`.
struct KillOnAck {
    inner: idem::redis::Delivery,
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

fn spawn_child(
    backend: &str,
    location: &str,
    stream: &str,
    name: &str,
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
        .env(CHILD_STREAM, stream)
        .env(CHILD_NAME, name)
        .env_remove(KILL_ON_ACK)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(n) = kill_on_ack {
        command.env(KILL_ON_ACK, n.to_string());
    }
    Life(command.spawn().unwrap())
}

#[derive(Default, Debug)]
struct Kills {
    /// Random SIGKILLs of each of the two processes.
    random: [usize; 2],
    at_commit: usize,
    lives: usize,
}

/// Runs two consumer processes over the stream, killing them as planned, until they both exit
/// on their own (the group read and settled everything).
async fn crash_run(backend: &str, location: &str, streams: &Streams, rng: &mut StdRng) -> Kills {
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
        let kill_on_ack = commit_kill.then(|| rng.random_range(1..=20));
        // A new process is a new consumer of the group: what the old one left pending is
        // only taken over by XAUTOCLAIM.
        let name = format!("life-{}", kills.lives);
        let life = spawn_child(backend, location, &streams.name, &name, kill_on_ack);
        (life, commit_kill)
    };
    // Each slot's life, and whether it is to kill itself at a commit: random kills spare such
    // a life, or on a slow machine they could take it before its commit comes.
    let mut children: Vec<Option<(Life, bool)>> = vec![
        Some(next_life(&mut kills, rng)),
        Some(next_life(&mut kills, rng)),
    ];
    let soak = std::env::var_os("IDEM_SOAK").is_some();
    let deadline = Instant::now() + Duration::from_secs(if soak { 900 } else { 240 });
    let mut turn = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "not settled in time: {kills:?}, {:?}",
            streams.group(GROUP).await
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        for slot in children.iter_mut() {
            let Some((child, _)) = slot.as_mut() else {
                continue;
            };
            match child.0.try_wait().unwrap() {
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
        if kills.random.iter().sum::<usize>() < size.random_kills {
            // The two processes in turn, so each is killed at least random_kills / 2 times.
            let i = turn % 2;
            if let Some((child, false)) = children[i].as_mut() {
                child.0.kill().unwrap(); // SIGKILL
                child.0.wait().unwrap();
                kills.random[i] += 1;
                turn += 1;
                children[i] = Some(next_life(&mut kills, rng));
            }
        }
        if children.iter().all(Option::is_none) {
            return kills;
        }
    }
}

async fn assert_group_clean(streams: &Streams, entries: usize) {
    assert_eq!(
        streams.group(GROUP).await,
        GroupState { pending: 0, lag: 0 },
        "every entry read and acknowledged"
    );
    assert_eq!(streams.len().await, entries, "no entry was added again");
    assert!(
        streams.dead_letters().await.is_empty(),
        "nothing is poison here"
    );
}

fn assert_kills(kills: &Kills) {
    let size = size();
    assert!(
        kills.random.iter().all(|&k| k >= size.random_kills / 2),
        "each process killed at random at least {} times: {kills:?}",
        size.random_kills / 2
    );
    assert!(
        kills.at_commit >= 1,
        "no life was killed between commit and ack: {kills:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_sqlite() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(streams) = Streams::new("crash_sqlite").await else {
        return;
    };
    let started = Instant::now();
    let mut rng = common::seeded();
    let size = size();
    let events = common::events(size.orders, size.versions, 0.3, size.swaps, &mut rng);
    streams.publish_all(&events).await;
    let (pool, path) = common::sqlite().await;
    let kills = crash_run("sqlite", path.to_str().unwrap(), &streams, &mut rng).await;
    eprintln!(
        "sqlite: {} entries, {kills:?}, {:?}",
        events.len(),
        started.elapsed()
    );
    assert_kills(&kills);
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    assert_eq!(common::applied_twice(&pool).await, Vec::<String>::new());
    assert_group_clean(&streams, events.len()).await;
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_sigkills_on_postgres() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(streams) = Streams::new("crash_postgres").await else {
        return;
    };
    let Some((pool, schema)) = common::postgres().await else {
        streams.delete().await;
        return;
    };
    let started = Instant::now();
    let mut rng = common::seeded();
    let size = size();
    let events = common::events(size.orders, size.versions, 0.3, size.swaps, &mut rng);
    streams.publish_all(&events).await;
    let kills = crash_run("postgres", &schema, &streams, &mut rng).await;
    eprintln!(
        "postgres: {} entries, {kills:?}, {:?}",
        events.len(),
        started.elapsed()
    );
    assert_kills(&kills);
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    assert_eq!(common::applied_twice(&pool).await, Vec::<String>::new());
    assert_group_clean(&streams, events.len()).await;
    common::drop_postgres(pool, &schema).await;
    streams.delete().await;
}

/// A consumer process killed after its first batch committed and before any `XACK`, holding
/// entries pending (committed ones and read-but-unhandled ones): another consumer's
/// `XAUTOCLAIM` takes them over under their own ids; the committed ones are Duplicates, the
/// others apply, each once, and the dead consumer has nothing left pending.
#[tokio::test]
async fn entries_a_killed_consumer_left_pending_are_taken_over_and_apply_once() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(streams) = Streams::new("killed").await else {
        return;
    };
    let events: Vec<OrderEvent> = (1..=120).map(|o| OrderEvent::new(o, 1)).collect();
    streams.publish_all(&events).await;
    let (pool, path) = common::sqlite().await;
    let mut child = spawn_child(
        "sqlite",
        path.to_str().unwrap(),
        &streams.name,
        "doomed",
        Some(1),
    );
    let status = tokio::task::spawn_blocking(move || child.0.wait().unwrap())
        .await
        .unwrap();
    assert!(
        !status.success(),
        "the child killed itself at its first ack"
    );
    let committed = common::applied(&pool).await.0 as u64;
    assert!(committed >= 1, "a batch committed before the kill");
    let left = streams.pending_by_consumer(GROUP).await;
    let doomed = left.get("doomed").copied().unwrap_or(0);
    assert!(
        doomed as u64 >= committed,
        "the dead consumer holds its committed entries unacked: {left:?}"
    );

    let source = Source::builder(common::url(), &streams.name, GROUP, "heir")
        .block(Duration::from_millis(50))
        .claim_idle(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let counts = consumer(pool.clone())
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| common::sqlite::order_status(b, e).await,
            streams.settled(GROUP),
        )
        .await;
    assert_eq!(counts.duplicate, committed, "{counts:?}");
    assert_eq!(counts.applied, 120 - committed, "{counts:?}");
    assert_eq!(common::applied(&pool).await, (120, 120));
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    assert_eq!(streams.pending_by_consumer(GROUP).await.get("doomed"), None);
    assert_group_clean(&streams, 120).await;
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

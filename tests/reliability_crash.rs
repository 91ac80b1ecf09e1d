//! Crash test with real processes: a consumer reads a durable message log (a table), handles each
//! message through `#[idempotent]` handlers, and acknowledges it (advances its offset) in a
//! separate transaction after the handler committed. The test starts the consumer as a child
//! process (this test binary again, with `IDEM_CRASH_CHILD` set), kills it with SIGKILL at random
//! moments, restarts it each time, and at the end compares the database with an exactly-once
//! oracle: every message's effect exactly once, nothing lost, nothing doubled.
//!
//! The body for one backend is `tests/reliability/crash.rs`, included for SQLite and PostgreSQL.
//! `IDEM_CRASH_SEED` replays a run (the seed is printed). `IDEM_SOAK=1` runs it at 99,750 log
//! entries instead of 5,250.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Set in a consumer process: its backend, `sqlite` or `postgres`.
const CHILD: &str = "IDEM_CRASH_CHILD";
/// Set in a consumer process: where its database is (the SQLite file, or the PostgreSQL schema).
const CHILD_DB: &str = "IDEM_CRASH_DB";
/// Set in some lives: the consumer SIGKILLs itself after its n-th applied message, after the
/// handler committed and before the acknowledgement: the window a crash test is about.
const KILL_AFTER_COMMIT: &str = "IDEM_CRASH_KILL_AFTER_COMMIT";

/// Distinct messages in the log; with the redeliveries added, over 5,000 entries (100,000 with
/// `IDEM_SOAK=1`: every count below times 19).
const UNIQUE: usize = 4_200;
/// Copies of earlier messages inserted later in the log (a broker's redeliveries).
const DUPLICATES: usize = 1_050;
/// Swaps of neighbouring entries (up to 16 apart), so versions arrive out of order.
const SWAPS: usize = 630;

/// How many times the log is scaled: 19 with `IDEM_SOAK=1` (99,750 entries), else 1.
fn scale() -> usize {
    if std::env::var_os("IDEM_SOAK").is_some_and(|v| v == "1") {
        19
    } else {
        1
    }
}
/// Kills from outside at random moments, and self-kills between commit and ack.
const RANDOM_KILLS: usize = 24;
const COMMIT_KILLS: usize = 6;

/// The consumer process: does nothing in a normal test run.
#[test]
fn consumer_child() {
    let Ok(backend) = std::env::var(CHILD) else {
        return;
    };
    let location = std::env::var(CHILD_DB).expect("IDEM_CRASH_DB");
    let kill_after = std::env::var(KILL_AFTER_COMMIT)
        .ok()
        .map(|n| n.parse::<usize>().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match backend.as_str() {
        "sqlite" => rt.block_on(sqlite::consume(&location, kill_after)),
        #[cfg(feature = "postgres")]
        "postgres" => rt.block_on(postgres::consume(&location, kill_after)),
        other => panic!("unknown backend {other}"),
    }
}

/// Kills this process the way `kill -9` would: no destructor, no flush, no rollback.
fn sigkill_self() -> ! {
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL did not kill the process")
}

/// A message of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Msg {
    /// Key only: credit `amount` to `account`.
    Credit {
        id: String,
        account: i64,
        amount: i64,
    },
    /// Key + version + entity: order `order` moves to status `v{version}`.
    Status {
        id: String,
        order: i64,
        version: i64,
    },
}

impl Msg {
    fn id(&self) -> &str {
        match self {
            Msg::Credit { id, .. } | Msg::Status { id, .. } => id,
        }
    }
}

/// One entry of the durable log; `first_copy` is false for a redelivery of an earlier entry.
#[derive(Clone, Debug)]
struct Entry {
    seq: i64,
    msg: Msg,
    first_copy: bool,
}

/// The log: distinct messages, neighbours swapped (reordering), copies inserted later.
fn generate(seed: u64) -> Vec<Entry> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_version: BTreeMap<i64, i64> = BTreeMap::new();
    let mut msgs: Vec<Msg> = (0..UNIQUE * scale())
        .map(|i| {
            if rng.random_bool(0.6) {
                Msg::Credit {
                    id: format!("c{i}"),
                    account: rng.random_range(0..50),
                    amount: rng.random_range(1..1_000),
                }
            } else {
                let order = rng.random_range(0..30);
                let version = next_version.entry(order).or_default();
                *version += 1;
                Msg::Status {
                    id: format!("s{i}"),
                    order,
                    version: *version,
                }
            }
        })
        .collect();
    for _ in 0..SWAPS * scale() {
        let i = rng.random_range(0..msgs.len() - 16);
        let j = i + rng.random_range(1..=16);
        msgs.swap(i, j);
    }
    for _ in 0..DUPLICATES * scale() {
        let i = rng.random_range(0..msgs.len());
        let j = rng.random_range(i + 1..=(i + 400).min(msgs.len()));
        let copy = msgs[i].clone();
        msgs.insert(j, copy);
    }
    let mut seen = BTreeSet::new();
    msgs.into_iter()
        .enumerate()
        .map(|(n, msg)| Entry {
            seq: n as i64 + 1,
            first_copy: seen.insert(msg.id().to_string()),
            msg,
        })
        .collect()
}

/// What one consumer reading the log in order, applying each message exactly once, ends with.
#[derive(Debug, Default)]
struct Oracle {
    applied: BTreeSet<String>,
    credits: BTreeSet<String>,
    balances: BTreeMap<i64, i64>,
    orders: BTreeMap<i64, (String, i64)>,
    duplicates: usize,
    stale: usize,
}

fn oracle(log: &[Entry]) -> Oracle {
    let mut o = Oracle::default();
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for entry in log {
        let id = entry.msg.id().to_string();
        if o.applied.contains(&id) {
            o.duplicates += 1;
            continue;
        }
        match &entry.msg {
            Msg::Credit {
                account, amount, ..
            } => {
                *o.balances.entry(*account).or_default() += amount;
                o.credits.insert(id.clone());
            }
            Msg::Status { order, version, .. } => {
                if last.get(order).is_some_and(|l| l >= version) {
                    o.stale += 1;
                    continue;
                }
                last.insert(*order, *version);
                o.orders.insert(*order, (format!("v{version}"), *version));
            }
        }
        o.applied.insert(id);
    }
    o
}

/// What the consumer processes said on stdout.
enum Event {
    Acked,
    Redelivered,
    Exited,
}

/// What the kills did.
#[derive(Debug, Default)]
struct Kills {
    lives: usize,
    random: usize,
    after_commit: usize,
    redelivered: usize,
}

/// Runs the consumer until it has read the whole log: `RANDOM_KILLS` lives killed by SIGKILL at
/// random moments, `COMMIT_KILLS` lives that SIGKILL themselves between commit and ack, then a
/// last life that runs to the end.
fn run_with_kills(backend: &str, location: &str, entries: usize, seed: u64) -> Kills {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6b11);
    let mut kills = Kills::default();
    // Spend about half the log on the lives that get killed, the rest on the last one.
    let lives = RANDOM_KILLS + COMMIT_KILLS;
    let mean = entries / (2 * lives);
    let mut plan: Vec<bool> = (0..lives).map(|n| n < COMMIT_KILLS).collect();
    plan.shuffle(&mut rng);
    let deadline = Instant::now() + Duration::from_secs(100 * scale() as u64);
    for (life, commit_kill) in plan.into_iter().chain([false]).enumerate() {
        let last = life == lives;
        let stderr = std::env::temp_dir().join(common::unique_name("idem_crash_stderr"));
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
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        if commit_kill {
            command.env(KILL_AFTER_COMMIT, rng.random_range(1..=mean).to_string());
        }
        let mut child = command.spawn().unwrap();
        kills.lives += 1;
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The test harness prints `test consumer_child ... ` before the first line.
                let event = if line.contains("acked ") {
                    Event::Acked
                } else if line.contains("redelivered ") {
                    Event::Redelivered
                } else {
                    continue;
                };
                if tx.send(event).is_err() {
                    break;
                }
            }
            let _ = tx.send(Event::Exited);
        });
        // When to kill: after a random number of acknowledgements plus a random fraction of a
        // message, or (one life in five) a random time after the start, often before it has
        // even opened the database.
        let by_time = !last && !commit_kill && rng.random_ratio(1, 5);
        let acks_before_kill = rng.random_range(1..=2 * mean);
        let started = Instant::now();
        let time_kill = Duration::from_micros(rng.random_range(0..60_000));
        let mut acked = 0;
        let mut exited = false;
        loop {
            let wait = if by_time {
                time_kill.saturating_sub(started.elapsed())
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match rx.recv_timeout(wait) {
                Ok(Event::Acked) => acked += 1,
                Ok(Event::Redelivered) => kills.redelivered += 1,
                Ok(Event::Exited) => {
                    exited = true;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) if by_time => break,
                Err(err) => panic!("life {life}: no word from the consumer: {err:?}"),
            }
            if !last && !commit_kill && !by_time && acked >= acks_before_kill {
                std::thread::sleep(Duration::from_micros(rng.random_range(0..1_500)));
                break;
            }
        }
        let random_kill = !last && !commit_kill && !exited;
        if random_kill {
            child.kill().unwrap(); // SIGKILL on Unix
        }
        let status = child.wait().unwrap();
        // Drain what it printed before it died.
        for event in rx.iter() {
            if let Event::Redelivered = event {
                kills.redelivered += 1;
            }
        }
        reader.join().unwrap();
        let output = std::fs::read_to_string(&stderr).unwrap_or_default();
        let _ = std::fs::remove_file(&stderr);
        if random_kill || commit_kill {
            assert_eq!(
                killed_by(status),
                Some(libc::SIGKILL),
                "life {life} should have died of SIGKILL: {status}\n{output}"
            );
            if random_kill {
                kills.random += 1;
            } else {
                kills.after_commit += 1;
            }
        } else {
            assert!(status.success(), "life {life}: {status}\n{output}");
            assert!(
                last,
                "life {life}: the consumer finished the log before its kill"
            );
        }
        assert!(Instant::now() < deadline, "the crash test ran out of time");
    }
    kills
}

fn killed_by(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

fn seed() -> u64 {
    let seed = std::env::var("IDEM_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("crash test seed: IDEM_CRASH_SEED={seed}");
    seed
}

mod sqlite {
    type Db = sqlx::Sqlite;
    const BACKEND: &str = "sqlite";

    /// A new SQLite file for the test; its path is what the consumer is told.
    async fn database() -> Option<(sqlx::Pool<Db>, String)> {
        let path =
            std::env::temp_dir().join(format!("{}.db", crate::common::unique_name("idem_crash")));
        let pool = crate::common::sqlite_file(&path).await;
        Some((pool, path.to_string_lossy().into_owned()))
    }

    /// The consumer's connection to that file.
    async fn connect(location: &str) -> sqlx::Pool<Db> {
        crate::common::sqlite_file(std::path::Path::new(location)).await
    }

    async fn release(pool: sqlx::Pool<Db>, location: &str) {
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{location}{suffix}"));
        }
    }

    include!("reliability/crash.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    type Db = sqlx::Postgres;
    const BACKEND: &str = "postgres";

    /// A new schema for the test; its name is what the consumer is told.
    async fn database() -> Option<(sqlx::Pool<Db>, String)> {
        let pool = crate::common::postgres().await?;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await
            .unwrap();
        Some((pool, schema))
    }

    /// The consumer's connection to that schema.
    async fn connect(location: &str) -> sqlx::Pool<Db> {
        let options: sqlx::postgres::PgConnectOptions =
            crate::common::postgres_url().parse().unwrap();
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.options([("search_path", location)]))
            .await
            .unwrap()
    }

    async fn release(pool: sqlx::Pool<Db>, _location: &str) {
        crate::common::drop_postgres(pool).await;
    }

    include!("reliability/crash.rs");
}

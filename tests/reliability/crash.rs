//! Crash test with real processes: a consumer reads a durable message log (a table), handles each
//! message through `#[idempotent]` handlers, and acknowledges it (advances its offset) in a
//! separate transaction after the handler committed. The test starts the consumer as a child
//! process (this test binary again, with `IDEM_CRASH_CHILD` set), kills it with SIGKILL at random
//! moments, restarts it each time, and at the end compares the database with an exactly-once
//! oracle: every message's effect exactly once, nothing lost, nothing doubled.
//!
//! On SQLite and PostgreSQL; the log and its consumer are `support/log.rs`. `IDEM_CRASH_SEED`
//! replays a run (the seed is printed). `IDEM_SOAK=1` runs it at 99,750 log entries instead of
//! 5,250.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idem::RetryPolicy;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::support::log::{self, Entry};
use crate::support::{child, killed_by, soak};

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
    if soak() {
        19
    } else {
        1
    }
}
/// Kills from outside at random moments, and self-kills between commit and ack.
const RANDOM_KILLS: usize = 24;
const COMMIT_KILLS: usize = 6;

/// One consumer reads the whole log, one life at a time.
const ALONE: (i64, i64) = (0, 1);
/// No retry: any error of a delivery fails the run.
const ONE_ATTEMPT: RetryPolicy = RetryPolicy {
    attempts: 1,
    first_delay: Duration::ZERO,
    max_delay: Duration::ZERO,
};

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
        #[cfg(feature = "sqlite")]
        "sqlite" => rt.block_on(log::sqlite::consume(
            &location,
            ALONE,
            ONE_ATTEMPT,
            kill_after,
        )),
        #[cfg(feature = "postgres")]
        "postgres" => rt.block_on(log::postgres::consume(
            &location,
            ALONE,
            ONE_ATTEMPT,
            kill_after,
        )),
        other => panic!("unknown backend {other}"),
    }
}

/// The log: distinct messages, neighbours swapped (reordering), copies inserted later.
fn generate(seed: u64) -> Vec<Entry> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut msgs = log::distinct(&mut rng, UNIQUE * scale(), 30);
    log::swap_neighbours(&mut rng, &mut msgs, SWAPS * scale(), 16);
    log::with_copies(&mut rng, msgs, DUPLICATES * scale())
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
        let stderr = std::env::temp_dir().join(crate::common::unique_name("idem_crash_stderr"));
        let mut command = child("crash::consumer_child");
        command
            .env(CHILD, backend)
            .env(CHILD_DB, location)
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
                // The test harness prints `test crash::consumer_child ... ` before the first line.
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

/// The crash test on one backend of `support::log`; ignored with the reason when the cfg given
/// holds (the backend's server was not named at build time).
macro_rules! crash_test {
    ($backend:ident $(, $absent:ident = $why:literal)?) => {
        mod $backend {
            use crate::support::log::{$backend as db, Oracle};

            #[test]
            $(#[cfg_attr($absent, ignore = $why)])?
            fn sigkilled_consumers_lose_and_double_nothing() {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let Some((pool, location)) = rt.block_on(db::database()) else {
                    return;
                };
                let seed = crate::support::seed("IDEM_CRASH_SEED", "crash test");
                let log = super::generate(seed);
                let oracle = Oracle::of(&log);
                rt.block_on(db::write_log(&pool, &log, 1));
                let started = std::time::Instant::now();
                let kills = super::run_with_kills(stringify!($backend), &location, log.len(), seed);
                let elapsed = started.elapsed();
                rt.block_on(db::verify(&pool, &log, &oracle, 1, true));
                assert!(kills.random >= 20, "{kills:?}");
                assert_eq!(kills.after_commit, super::COMMIT_KILLS, "{kills:?}");
                assert!(
                    kills.redelivered >= kills.after_commit,
                    "every kill between commit and ack is followed by a redelivery: {kills:?}"
                );
                eprintln!(
                    "{}: {} log entries ({} distinct, {} redeliveries; oracle: {} duplicates, \
                     {} stale), {} lives: {} SIGKILLs at random moments, {} between commit and \
                     ack; {} committed but unacknowledged messages redelivered after a crash; \
                     {} applied, 0 lost, 0 doubled, in {elapsed:.1?}",
                    stringify!($backend),
                    log.len(),
                    log.iter().filter(|e| e.first_copy).count(),
                    log.iter().filter(|e| !e.first_copy).count(),
                    oracle.duplicates,
                    oracle.stale,
                    kills.lives,
                    kills.random,
                    kills.after_commit,
                    kills.redelivered,
                    oracle.applied.len(),
                );
                rt.block_on(db::release(pool, &location));
            }
        }
    };
}

#[cfg(feature = "sqlite")]
crash_test!(sqlite);
#[cfg(feature = "postgres")]
crash_test!(
    postgres,
    idem_no_postgres =
        "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
);

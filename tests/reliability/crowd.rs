//! Many consumers dying at once: 4 consumer processes (this test binary started again with
//! `IDEM_CROWD_CHILD` set) share one PostgreSQL schema and one durable log of deliveries (a
//! table), each taking every fourth entry, as competing consumers of one queue do, so the copies
//! of one message and the versions of one order meet in different processes at the same time.
//! Each consumer handles an entry through two `#[idempotent]` handlers (key only: a credit; key +
//! version + entity: an order's status), then acknowledges it (advances its own offset) in a
//! separate transaction after the handler committed. The test SIGKILLs all 4 together at random
//! moments, at least 10 times, restarts them, and lets the last generation run to the end.
//!
//! The log: 30% of its deliveries are copies of earlier ones, and about 20% of the status changes
//! arrive behind a newer version of their order. Asserted at the end: every offset at the end of
//! its share; every credit applied exactly once (0 lost, 0 doubled) and balances equal to the
//! oracle's; no status change applied twice, every order at its highest version (its newest
//! change applied, once), `idem_versions` at the highest; the records of each scope exactly the
//! messages whose effect is there. The status handler itself refuses, in its transaction, to move
//! an order to a version that is not newer, so an out-of-order apply fails the run.
//!
//! Size: 5,000 deliveries in CI, 100,000 with `IDEM_SOAK=1`. `IDEM_CROWD_SEED` replays a log
//! and its kill times (the seed is printed). The log and its consumer are `support/log.rs`.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use idem::RetryPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::log::{self, postgres as db, Entry, Msg, Oracle};
use crate::support::{child, killed_by, soak};

/// Set in a consumer process: which share of the log it takes (0 to 3).
const CHILD: &str = "IDEM_CROWD_CHILD";
/// Set in a consumer process: the PostgreSQL schema of the run.
const CHILD_SCHEMA: &str = "IDEM_CROWD_SCHEMA";
/// Consumer processes.
const CONSUMERS: i64 = 4;
/// Generations killed together before the last one runs to the end.
const KILLS: usize = 10;

/// Deliveries in the log: 100,000 with `IDEM_SOAK=1`, 5,000 in CI.
fn deliveries() -> usize {
    if soak() {
        100_000
    } else {
        5_000
    }
}

/// The consumer process: from its last acknowledged entry to the end of its share of the log
/// (entries with `seq % 4 == share`), one at a time: handle (through `idem::retry`, as a broker's
/// redelivery would), then acknowledge in a transaction of its own.
#[test]
fn consumer_child() {
    let Ok(share) = std::env::var(CHILD) else {
        return;
    };
    let share: i64 = share.parse().unwrap();
    let schema = std::env::var(CHILD_SCHEMA).expect("IDEM_CROWD_SCHEMA");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(db::consume(
        &schema,
        (share, CONSUMERS),
        RetryPolicy::default(),
        None,
    ));
}

/// The log: distinct messages (60% credits to 50 accounts, 40% status changes of 40 orders),
/// neighbouring status changes swapped until about 20% of them arrive behind a newer version,
/// then copies of earlier entries inserted up to 400 entries later until 30% of the deliveries
/// are copies.
fn generate(seed: u64, deliveries: usize) -> Vec<Entry> {
    let mut rng = StdRng::seed_from_u64(seed);
    let unique = deliveries * 7 / 10;
    let mut msgs = log::distinct(&mut rng, unique, 40);
    let statuses = msgs
        .iter()
        .filter(|m| matches!(m, Msg::Status { .. }))
        .count();
    // Swaps in rounds, each about half of what is missing, then counted again.
    loop {
        let missing = (statuses / 5).saturating_sub(log::behind_newer(&msgs));
        if missing == 0 {
            break;
        }
        log::swap_neighbours(&mut rng, &mut msgs, missing.div_ceil(2), 64);
    }
    log::with_copies(&mut rng, msgs, deliveries - unique)
}

/// Starts the 4 consumers.
fn spawn_consumers(schema: &str, logs: &[std::path::PathBuf]) -> Vec<Child> {
    (0..CONSUMERS)
        .map(|share| {
            child("crowd::consumer_child")
                .env(CHILD, share.to_string())
                .env(CHILD_SCHEMA, schema)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&logs[share as usize]).unwrap())
                .spawn()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn four_consumers_killed_together_lose_and_double_nothing() {
    let Some((pool, schema)) = db::database().await else {
        return;
    };
    let seed = crate::support::seed("IDEM_CROWD_SEED", "crowd");
    let log = generate(seed, deliveries());
    let oracle = Oracle::of(&log);
    db::write_log(&pool, &log, CONSUMERS).await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0ffee);
    let logs: Vec<_> = (0..CONSUMERS)
        .map(|i| std::env::temp_dir().join(crate::common::unique_name(&format!("idem_crowd_{i}"))))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(if soak() { 3_600 } else { 120 });
    // Spend about half the log on the generations that get killed.
    let per_kill = log.len() as i64 / (2 * KILLS as i64);
    let (mut kills, mut sigkills, mut in_window, mut progress) = (0, 0, 0, Vec::new());
    for generation in 0..=KILLS {
        let before = db::acked(&pool, CONSUMERS).await;
        let mut children = spawn_consumers(&schema, &logs);
        if generation == KILLS {
            for (i, child) in children.iter_mut().enumerate() {
                let status = child.wait().unwrap();
                let output = std::fs::read_to_string(&logs[i]).unwrap_or_default();
                assert!(status.success(), "consumer {i}: {status}\n{output}");
            }
            progress.push(db::acked(&pool, CONSUMERS).await - before);
            break;
        }
        // Kill when the generation has acknowledged a random share of the log, plus a random
        // fraction of a message; one generation in four at a random time after its start,
        // often before the consumers have connected.
        let target = before + rng.random_range(1..=2 * per_kill);
        if rng.random_ratio(1, 4) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        } else {
            while db::acked(&pool, CONSUMERS).await < target {
                assert!(Instant::now() < deadline, "the crowd test ran out of time");
                // A consumer that reached the end of its share before the kill: it must have
                // ended well.
                let mut exited = 0;
                for (i, child) in children.iter_mut().enumerate() {
                    if let Some(status) = child.try_wait().unwrap() {
                        let output = std::fs::read_to_string(&logs[i]).unwrap_or_default();
                        assert!(status.success(), "consumer {i}: {status}\n{output}");
                        exited += 1;
                    }
                }
                if exited == children.len() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tokio::time::sleep(Duration::from_micros(rng.random_range(0..2_000))).await;
        }
        // All four at once (those still running).
        let running: Vec<bool> = children
            .iter_mut()
            .map(|child| child.try_wait().unwrap().is_none())
            .collect();
        for (child, running) in children.iter_mut().zip(&running) {
            if *running {
                child.kill().unwrap();
            }
        }
        for (i, child) in children.iter_mut().enumerate() {
            let status = child.wait().unwrap();
            let output = std::fs::read_to_string(&logs[i]).unwrap_or_default();
            if running[i] {
                assert_eq!(
                    killed_by(status),
                    Some(libc::SIGKILL),
                    "generation {generation}, consumer {i} should have died of SIGKILL: {status}\n{output}"
                );
                sigkills += 1;
            } else {
                assert!(status.success(), "consumer {i}: {status}\n{output}");
            }
        }
        kills += 1;
        in_window += db::committed_unacked(&pool, CONSUMERS).await;
        progress.push(db::acked(&pool, CONSUMERS).await - before);
    }
    for path in &logs {
        let _ = std::fs::remove_file(path);
    }
    let elapsed = started.elapsed();
    db::verify(&pool, &log, &oracle, CONSUMERS, false).await;
    assert_eq!(kills, KILLS);
    let copies = log.iter().filter(|e| !e.first_copy).count();
    eprintln!(
        "{} deliveries ({copies} copies, {} status changes behind a newer version), {} generations \
         of {CONSUMERS} consumer processes, {kills} killed together ({sigkills} SIGKILLs, {in_window} of them at least between a commit and its ack); entries acknowledged \
         per generation: {progress:?}; 0 lost, 0 doubled, versions at the highest, in {elapsed:.1?}",
        log.len(),
        log::behind_newer(log.iter().map(|e| &e.msg)),
        kills + 1,
    );
    db::release(pool, &schema).await;
}

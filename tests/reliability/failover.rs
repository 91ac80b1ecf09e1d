//! A PostgreSQL primary fails over to its streaming replica under idem.
//!
//! A private primary and a hot standby made from it with `pg_basebackup -R` (each its own
//! folder and port; the machine's shared server is never touched). 8 consumers apply credits
//! with idem through a TCP endpoint that stands for a virtual IP: at the failover the primary
//! is stopped dead (`pg_ctl stop -m immediate`) while commits are in flight, the endpoint's
//! connections are severed, the replica is promoted, and the endpoint is moved to it. A new
//! replica is then made of the new primary for the next failover (2 in CI, 6 with
//! `IDEM_SOAK=1`). A consumer's first delivery of a message that fails is delivered again
//! through `idem::retry`, as a broker redelivers what was not acknowledged.
//!
//! The failovers alternate two faults just before the kill, to make both kinds of ambiguous
//! commit happen each run: for 150 ms the endpoint holds back the replies to the consumers'
//! `COMMIT`s (the transaction commits, and its acknowledgement is lost with the connection), or
//! the WAL the primary streams to the replica is held back (a replica behind its primary).
//!
//! Between the promotion and the move of the endpoint nothing can write to the new primary:
//! the test reads there which messages it holds, the truth each ambiguous commit is judged by.
//!
//! - **Synchronous replication** (`synchronous_standby_names` naming the replica's
//!   `application_name`): every commit acknowledged to a consumer before the failover is on
//!   the new primary; each delivery whose outcome the consumer could not know is decided by
//!   its redelivery: `Duplicate` when its commit reached the replica (never a second effect),
//!   `Applied` once when it did not. The ledger equals the oracle.
//! - **Asynchronous replication**: the same run; commits acknowledged while the replica was
//!   behind are lost with the old primary (record and effect together: the new primary has
//!   neither). Their redelivery (a broker replaying them) is `Applied` on the new primary,
//!   once, and the ledger equals the oracle again; the loss is the database's. The test asserts
//!   the loss happened, so that the difference between the two settings stays measured.
//!
//! Each run prints its figures: commits in flight at each kill, how each ambiguous one was
//! decided, the time from the kill until commits are acknowledged again, and what was lost.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::Outcome;
use idem_testkit::servers::PostgresServer;
use rand::Rng as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};

use crate::support::credits::{patient, postgres as credits, Credit, Stream};
use crate::support::endpoint::Endpoint;
use crate::support::proxy::Protocol;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_synchronous_replication_loses_no_acknowledged_commit() {
    let Some(run) = failover_run(true).await else {
        return;
    };
    assert_eq!(run.lost.len(), 0, "acknowledged, then lost: {:?}", run.lost);
    let decided_both_ways = run.failovers.iter().any(|f| f.duplicate > 0)
        && run.failovers.iter().any(|f| f.applied_again > 0);
    assert!(
        decided_both_ways,
        "the failovers must leave both kinds of ambiguous commit: {:?}",
        run.failovers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_asynchronous_replication_loses_acknowledged_commits_the_redelivery_applies_once(
) {
    let Some(run) = failover_run(false).await else {
        return;
    };
    assert!(
        !run.lost.is_empty(),
        "with the WAL held back, commits acknowledged meanwhile must be lost: {:?}",
        run.failovers
    );
}

/// One failover's figures.
#[derive(Debug, Default)]
struct Failover {
    fault: &'static str,
    /// First deliveries under way when the kill began.
    in_flight: usize,
    /// Of those, acknowledged anyway (their reply came before the connection was severed).
    in_flight_acked: usize,
    /// Failed first deliveries whose commit was on the new primary: redelivered as `Duplicate`.
    duplicate: usize,
    /// Failed first deliveries whose commit was not: redelivered as `Applied`.
    applied_again: usize,
    /// Of `applied_again`, those that started after the kill (they reached no server).
    during_outage: usize,
    /// Acknowledged before the failover and not on the new primary.
    lost: usize,
    /// From the kill until the first commit acknowledged by the new primary.
    to_flow_again: Duration,
    /// From the kill until the old primary was down (`pg_ctl stop -m immediate` returned).
    to_down: Duration,
    /// From the kill until the endpoint pointed at the promoted replica.
    to_switch: Duration,
}

/// A whole run's result.
struct Run {
    failovers: Vec<Failover>,
    /// Messages acknowledged and then lost at a failover.
    lost: Vec<String>,
}

/// One delivery of a message by a consumer (its redelivery included, if the first failed).
#[derive(Debug)]
struct Delivery {
    id: String,
    started: Duration,
    ended: Duration,
    /// The first delivery's outcome (`Applied`), or its error.
    first: Result<(), String>,
    /// When the first failed: the redelivery's outcome and when it ended.
    redelivered: Option<(Outcome<()>, Duration)>,
}

/// What the test knows of one failover: when, and what the new primary held.
struct Switch {
    fault: &'static str,
    kill_at: Duration,
    down_at: Duration,
    switched_at: Duration,
    /// The messages the new primary held before anything could write to it.
    truth: HashSet<String>,
}

async fn failover_run(synchronous: bool) -> Option<Run> {
    let mode = if synchronous {
        "synchronous"
    } else {
        "asynchronous"
    };
    let test = format!("PostgreSQL failover test ({mode} replication)");
    let (messages, failovers) = if crate::support::soak() {
        (20_000, 6)
    } else {
        (2_000, 2)
    };
    let began = Instant::now();
    let primary = tokio::task::block_in_place(|| PostgresServer::start("idem_pgfail", &test))?;
    let (mut replica, mut link) = add_replica(&primary, synchronous).await;
    let mut primary = Some(primary);
    let front = Endpoint::start(primary.as_ref().unwrap().port(), Some(Protocol::Postgres)).await;
    let through_front = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(front.port())
        .username("postgres")
        .database("postgres")
        .ssl_mode(PgSslMode::Disable);
    let pool = credits::crash_pool(through_front).await;
    let stream = Stream::distinct(messages);
    let clock = Instant::now();
    let pacing = Arc::new(AtomicBool::new(true));
    let acks = Arc::new(AtomicUsize::new(0));
    let consumers = consumers(&pool, &stream, &pacing, &acks, clock);

    let mut switches = Vec::new();
    let mut rng = rand::rng();
    for k in 0..failovers {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..800))).await;
        let fault = if k % 2 == 0 {
            // Transactions run to their COMMIT, which commits (and reaches the replica); the
            // acknowledgement waits here.
            front.hold_commit_replies(true);
            tokio::time::sleep(Duration::from_millis(150)).await;
            "replies to COMMIT held"
        } else {
            // Synchronous: commits wait for the replica. Asynchronous: they are acknowledged;
            // wait for a few (at most 2 s).
            link.hold(true);
            let before = acks.load(Ordering::SeqCst);
            let until =
                Instant::now() + Duration::from_millis(if synchronous { 300 } else { 2_000 });
            while acks.load(Ordering::SeqCst) < before + 5 && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            "WAL to the replica held"
        };
        let kill_at = clock.elapsed();
        let old = primary.take().unwrap();
        tokio::task::block_in_place(|| old.crash());
        let down_at = clock.elapsed();
        // The virtual IP is down: its connections end, held replies with them.
        front.point(None);
        front.hold_commit_replies(false);
        link.point(None);
        drop(link);
        tokio::task::block_in_place(|| replica.promote());
        // Nothing writes to the new primary until the endpoint points at it: what it holds now
        // is what each ambiguous commit is judged by.
        let admin = admin(&replica).await;
        let truth = held(&admin).await;
        admin.close().await;
        front.point(Some(replica.port()));
        let switched_at = clock.elapsed();
        tokio::task::block_in_place(|| drop(old));
        switches.push(Switch {
            fault,
            kill_at,
            down_at,
            switched_at,
            truth,
        });
        let promoted = replica;
        if k + 1 == failovers {
            primary = Some(promoted);
            break;
        }
        (replica, link) = add_replica(&promoted, synchronous).await;
        primary = Some(promoted);
    }
    pacing.store(false, Ordering::SeqCst);
    let mut log = Vec::new();
    for consumer in consumers {
        log.extend(consumer.await.unwrap());
    }
    let primary = primary.unwrap();
    assert_eq!(log.len(), stream.total, "every message delivered");

    let run = judge(&log, &switches);
    // A redelivery of what was lost: the new primary has neither its record nor its effect.
    for id in &run.lost {
        let msg = credit_of(id, &stream);
        let again = idem::retry(patient(20), || credits::credit(&pool, &msg))
            .await
            .unwrap();
        assert_eq!(again, Outcome::Applied(()), "{id}: lost, so applied again");
    }
    let now = held(&pool).await;
    assert_eq!(now.len(), messages as usize, "every message applied once");
    let balances: HashMap<i64, i64> = sqlx::query_as("SELECT account, balance FROM balances")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(balances, stream.oracle, "the ledger equals the oracle");

    eprintln!(
        "{mode} replication: {messages} credits, 8 consumers, {failovers} failovers in {:.1} s \
         (the whole test {:.1} s); acknowledged then lost: {}",
        clock.elapsed().as_secs_f64(),
        began.elapsed().as_secs_f64(),
        run.lost.len()
    );
    for (k, f) in run.failovers.iter().enumerate() {
        eprintln!(
            "  failover {}: {}: {} in flight at the kill ({} acknowledged anyway); ambiguous: \
             {} on the new primary -> Duplicate, {} not -> Applied ({} of them started during \
             the outage); acknowledged then lost: {}; after the kill: primary down {} ms, \
             endpoint moved {} ms, commits acknowledged again {} ms",
            k + 1,
            f.fault,
            f.in_flight,
            f.in_flight_acked,
            f.duplicate,
            f.applied_again,
            f.during_outage,
            f.lost,
            f.to_down.as_millis(),
            f.to_switch.as_millis(),
            f.to_flow_again.as_millis(),
        );
    }
    pool.close().await;
    front.point(None);
    tokio::task::block_in_place(|| drop(primary));
    Some(run)
}

/// The credit of message `id`.
fn credit_of(id: &str, stream: &Stream) -> Credit {
    let i: u32 = id.trim_start_matches('m').parse().unwrap();
    assert!(i < stream.messages);
    Credit {
        id: id.to_string(),
        account: i64::from(i % 50),
        amount: i64::from(i % 9 + 1),
    }
}

/// 8 consumers taking the stream's messages one at a time. A failed first delivery is
/// delivered again through `idem::retry` (which waits out the failover). While `pacing` is set
/// they pace themselves, slower once 40% of the stream is left, so that the stream outlasts
/// the failovers.
fn consumers(
    pool: &PgPool,
    stream: &Stream,
    pacing: &Arc<AtomicBool>,
    acks: &Arc<AtomicUsize>,
    clock: Instant,
) -> Vec<tokio::task::JoinHandle<Vec<Delivery>>> {
    (0..8)
        .map(|_| {
            let (pool, queue, total) = (pool.clone(), stream.queue.clone(), stream.total);
            let (pacing, acks) = (pacing.clone(), acks.clone());
            tokio::spawn(async move {
                let mut log = Vec::new();
                loop {
                    if pacing.load(Ordering::SeqCst) {
                        let tail = queue.lock().unwrap().len() <= total * 2 / 5;
                        let pause = if tail { 100 } else { 5 };
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    let Some(msg) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    let started = clock.elapsed();
                    let first = credits::credit(&pool, &msg).await;
                    let ended = clock.elapsed();
                    let (first, redelivered) = match first {
                        Ok(Outcome::Applied(())) => {
                            acks.fetch_add(1, Ordering::SeqCst);
                            (Ok(()), None)
                        }
                        Ok(other) => panic!("{}: a first delivery was {other:?}", msg.id),
                        Err(err) => {
                            let again = idem::retry(patient(100), || credits::credit(&pool, &msg))
                                .await
                                .unwrap_or_else(|e| panic!("{}: redelivery failed: {e}", msg.id));
                            (Err(err.to_string()), Some((again, clock.elapsed())))
                        }
                    };
                    log.push(Delivery {
                        id: msg.id.clone(),
                        started,
                        ended,
                        first,
                        redelivered,
                    });
                }
                log
            })
        })
        .collect()
}

/// Judges the deliveries against what each new primary held: every failed first delivery is
/// attributed to the first failover that ended after it started, and its redelivery must be
/// `Duplicate` exactly when the new primary held its commit.
fn judge(log: &[Delivery], switches: &[Switch]) -> Run {
    let mut failovers = Vec::new();
    let mut lost_before: HashSet<String> = HashSet::new();
    let mut lost = Vec::new();
    for (k, s) in switches.iter().enumerate() {
        let mut f = Failover {
            fault: s.fault,
            to_down: s.down_at - s.kill_at,
            to_switch: s.switched_at - s.kill_at,
            ..Failover::default()
        };
        let mut flowing_at = None::<Duration>;
        for d in log {
            let acked_at = match (&d.first, &d.redelivered) {
                (Ok(()), _) => Some(d.ended),
                (Err(_), Some((_, at))) => Some(*at),
                (Err(_), None) => None,
            };
            if let Some(at) = acked_at {
                if at < s.switched_at
                    && !s.truth.contains(&d.id)
                    && lost_before.insert(d.id.clone())
                {
                    f.lost += 1;
                    lost.push(d.id.clone());
                }
                if at > s.switched_at {
                    flowing_at = Some(flowing_at.map_or(at, |t| t.min(at)));
                }
            }
            if d.started < s.kill_at && d.ended > s.kill_at {
                f.in_flight += 1;
                f.in_flight_acked += usize::from(d.first.is_ok());
            }
            let Err(err) = &d.first else {
                continue;
            };
            let attributed = switches.iter().position(|s| s.switched_at > d.started);
            let Some(which) = attributed else {
                panic!("{}: failed after the last failover: {err}", d.id);
            };
            if which != k {
                continue;
            }
            let (outcome, _) = d.redelivered.as_ref().unwrap();
            if s.truth.contains(&d.id) {
                assert_eq!(
                    *outcome,
                    Outcome::Duplicate,
                    "{}: its commit was on the new primary ({err})",
                    d.id
                );
                f.duplicate += 1;
            } else {
                assert_eq!(
                    *outcome,
                    Outcome::Applied(()),
                    "{}: its commit was not on the new primary ({err})",
                    d.id
                );
                f.applied_again += 1;
                f.during_outage += usize::from(d.started >= s.kill_at);
            }
        }
        let flowing_at =
            flowing_at.unwrap_or_else(|| panic!("nothing acknowledged after failover {}", k + 1));
        f.to_flow_again = flowing_at - s.kill_at;
        failovers.push(f);
    }
    Run { failovers, lost }
}

/// A replica of `primary` streaming through a link of its own (an [`Endpoint`] the test can
/// hold back or cut), in the mode asked, and once it streams in that mode.
async fn add_replica(primary: &PostgresServer, synchronous: bool) -> (PostgresServer, Endpoint) {
    let link = Endpoint::start(primary.port(), None).await;
    let replica = tokio::task::block_in_place(|| {
        PostgresServer::replica_of(primary, "idem_pgfail", link.port())
    });
    let admin = admin(primary).await;
    if synchronous {
        let names = format!(
            "ALTER SYSTEM SET synchronous_standby_names = '\"{}\"'",
            replica.application_name()
        );
        sqlx::query(sqlx::AssertSqlSafe(names))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&admin)
            .await
            .unwrap();
    }
    let want = if synchronous { "sync" } else { "async" };
    let state = "SELECT sync_state::text FROM pg_stat_replication \
                 WHERE application_name = $1 AND state = 'streaming'";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: Option<String> = sqlx::query_scalar(state)
            .bind(replica.application_name())
            .fetch_optional(&admin)
            .await
            .unwrap();
        if now.as_deref() == Some(want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica is not streaming as {want} after 60 s (now {now:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin.close().await;
    (replica, link)
}

/// A connection of its own to `server`.
async fn admin(server: &PostgresServer) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with(server.options())
        .await
        .unwrap()
}

/// The messages `pool`'s server holds: the keys of idem's records, which must be exactly the
/// messages whose effect it holds (the record goes with the effect).
async fn held(pool: &PgPool) -> HashSet<String> {
    let keys: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT msg_key FROM idem_records WHERE scope = 'credits::credit'")
            .fetch_all(pool)
            .await
            .unwrap();
    let records: HashSet<String> = keys
        .into_iter()
        .map(|k| String::from_utf8(k).unwrap())
        .collect();
    let effects: Vec<String> = sqlx::query_scalar("SELECT msg_id FROM applied")
        .fetch_all(pool)
        .await
        .unwrap();
    let effects_set: HashSet<String> = effects.iter().cloned().collect();
    assert_eq!(effects.len(), effects_set.len(), "an effect applied twice");
    assert!(
        records == effects_set,
        "records and effects differ: {} records, {} effects",
        records.len(),
        effects_set.len()
    );
    records
}

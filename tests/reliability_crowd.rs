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
//! and its kill times (the seed is printed).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::{idempotent, RetryPolicy, Tx};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, QueryBuilder};

/// Set in a consumer process: which share of the log it takes (0 to 3).
const CHILD: &str = "IDEM_CROWD_CHILD";
/// Set in a consumer process: the PostgreSQL schema of the run.
const CHILD_SCHEMA: &str = "IDEM_CROWD_SCHEMA";
/// Consumer processes.
const CONSUMERS: i64 = 4;
/// Generations killed together before the last one runs to the end.
const KILLS: usize = 10;

fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v == "1")
}

/// Deliveries in the log: 100,000 with `IDEM_SOAK=1`, 5,000 in CI.
fn deliveries() -> usize {
    if soak() {
        100_000
    } else {
        5_000
    }
}

/// One row of the log: `a` is the account or the order, `b` the amount or the version.
#[derive(Debug, Clone, sqlx::FromRow)]
struct LogRow {
    seq: i64,
    kind: String,
    msg_id: String,
    a: i64,
    b: i64,
}

/// Key only: one ledger line and the credit.
#[idempotent(key = "msg.msg_id", scope = "crowd::credit")]
async fn on_credit(tx: &mut Tx<'_, Postgres>, msg: &LogRow) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (msg_id) VALUES ($1)")
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
    )
    .bind(msg.a)
    .bind(msg.b)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Key + version + entity: one ledger line and the order's new status, refused (an error, so
/// the run fails) if the order is already at this version or a newer one.
#[idempotent(
    key = "msg.msg_id",
    version = "msg.b",
    entity = "msg.a",
    scope = "crowd::status"
)]
async fn on_status(tx: &mut Tx<'_, Postgres>, msg: &LogRow) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (msg_id) VALUES ($1)")
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    let moved = sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version \
         WHERE orders.version < excluded.version",
    )
    .bind(msg.a)
    .bind(format!("v{}", msg.b))
    .bind(msg.b)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved != 1 {
        return Err(sqlx::Error::Protocol(format!(
            "{} applied out of order: order {} is already at version {} or newer",
            msg.msg_id, msg.a, msg.b
        )));
    }
    Ok(())
}

async fn connect(schema: &str, connections: u32) -> PgPool {
    let options: PgConnectOptions = common::postgres_url().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(options.options([("search_path", schema)]))
        .await
        .unwrap()
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
    rt.block_on(async {
        let pool = connect(&schema, 2).await;
        loop {
            let pos: i64 = sqlx::query_scalar("SELECT pos FROM offsets WHERE consumer = $1")
                .bind(share)
                .fetch_one(&pool)
                .await
                .unwrap();
            let batch: Vec<LogRow> = sqlx::query_as(
                "SELECT seq, kind, msg_id, a, b FROM log WHERE seq > $1 AND seq % $2 = $3 \
                 ORDER BY seq LIMIT 100",
            )
            .bind(pos)
            .bind(CONSUMERS)
            .bind(share)
            .fetch_all(&pool)
            .await
            .unwrap();
            if batch.is_empty() {
                pool.close().await;
                return;
            }
            for row in batch {
                let result = match row.kind.as_str() {
                    "credit" => {
                        idem::retry(RetryPolicy::default(), || on_credit(&pool, &row)).await
                    }
                    _ => idem::retry(RetryPolicy::default(), || on_status(&pool, &row)).await,
                };
                if let Err(err) = result {
                    panic!("seq {}: {err:?}", row.seq);
                }
                // The ack: exactly the entry after the last one acknowledged.
                let acked =
                    sqlx::query("UPDATE offsets SET pos = $1 WHERE consumer = $2 AND pos = $3")
                        .bind(row.seq)
                        .bind(share)
                        .bind(row.seq - CONSUMERS)
                        .execute(&pool)
                        .await
                        .unwrap()
                        .rows_affected();
                assert_eq!(acked, 1, "ack of seq {}", row.seq);
            }
        }
    });
}

/// A message of the log.
#[derive(Clone, Debug)]
enum Msg {
    Credit {
        id: String,
        account: i64,
        amount: i64,
    },
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

/// The log: distinct messages (60% credits to 50 accounts, 40% status changes of 40 orders),
/// neighbouring status changes swapped until about 20% of them arrive behind a newer version,
/// then copies of earlier entries inserted up to 400 entries later until 30% of the deliveries
/// are copies.
fn generate(seed: u64, deliveries: usize) -> Vec<Msg> {
    let mut rng = StdRng::seed_from_u64(seed);
    let unique = deliveries * 7 / 10;
    let mut next_version: BTreeMap<i64, i64> = BTreeMap::new();
    let mut msgs: Vec<Msg> = (0..unique)
        .map(|i| {
            if rng.random_bool(0.6) {
                Msg::Credit {
                    id: format!("c{i}"),
                    account: rng.random_range(0..50),
                    amount: rng.random_range(1..1_000),
                }
            } else {
                let order = rng.random_range(0..40);
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
    let statuses = msgs
        .iter()
        .filter(|m| matches!(m, Msg::Status { .. }))
        .count();
    // Swaps in rounds, each about half of what is missing, then counted again.
    loop {
        let missing = (statuses / 5).saturating_sub(behind_newer(&msgs));
        if missing == 0 {
            break;
        }
        for _ in 0..missing.div_ceil(2) {
            let i = rng.random_range(0..msgs.len() - 64);
            let j = i + rng.random_range(1..=64);
            msgs.swap(i, j);
        }
    }
    // Each copy goes in before the entry at index `j` of the distinct messages (or at the end).
    let mut copies: Vec<(usize, Msg)> = (unique..deliveries)
        .map(|_| {
            let i = rng.random_range(0..msgs.len());
            let j = rng.random_range(i + 1..=(i + 400).min(msgs.len()));
            (j, msgs[i].clone())
        })
        .collect();
    copies.sort_by_key(|(j, _)| *j);
    let mut copies = copies.into_iter().peekable();
    let mut log = Vec::with_capacity(deliveries);
    for (at, msg) in msgs.into_iter().enumerate() {
        while let Some((_, copy)) = copies.next_if(|(j, _)| *j == at) {
            log.push(copy);
        }
        log.push(msg);
    }
    log.extend(copies.map(|(_, copy)| copy));
    log
}

/// Status changes that arrive after a newer version of their order.
fn behind_newer(msgs: &[Msg]) -> usize {
    let mut newest: BTreeMap<i64, i64> = BTreeMap::new();
    let mut behind = 0;
    for msg in msgs {
        if let Msg::Status { order, version, .. } = msg {
            let at = newest.entry(*order).or_default();
            if *version < *at {
                behind += 1;
            }
            *at = (*at).max(*version);
        }
    }
    behind
}

async fn write_log(pool: &PgPool, log: &[Msg]) {
    for sql in [
        "CREATE TABLE log (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL, msg_id TEXT NOT NULL, \
         a BIGINT NOT NULL, b BIGINT NOT NULL)",
        "CREATE INDEX log_msg_id ON log (msg_id)",
        "CREATE TABLE offsets (consumer BIGINT PRIMARY KEY, pos BIGINT NOT NULL)",
        // No unique constraint: a message applied twice leaves two lines.
        "CREATE TABLE ledger (msg_id TEXT NOT NULL)",
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
    // Offsets start one step below each share's first entry (seq is 1-based: share 0 takes 4,
    // 8, ..., share 1 takes 1, 5, ...).
    for share in 0..CONSUMERS {
        let first = (share + CONSUMERS - 1) % CONSUMERS + 1;
        sqlx::query("INSERT INTO offsets (consumer, pos) VALUES ($1, $2)")
            .bind(share)
            .bind(first - CONSUMERS)
            .execute(pool)
            .await
            .unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    for (n, chunk) in log.chunks(1_000).enumerate() {
        let mut insert = QueryBuilder::new("INSERT INTO log (seq, kind, msg_id, a, b) ");
        insert.push_values(chunk.iter().enumerate(), |mut row, (i, msg)| {
            let (kind, a, b) = match msg {
                Msg::Credit {
                    account, amount, ..
                } => ("credit", *account, *amount),
                Msg::Status { order, version, .. } => ("status", *order, *version),
            };
            row.push_bind((n * 1_000 + i + 1) as i64)
                .push_bind(kind)
                .push_bind(msg.id().to_string())
                .push_bind(a)
                .push_bind(b);
        });
        insert.build().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Starts the 4 consumers.
fn spawn_consumers(schema: &str, logs: &[std::path::PathBuf]) -> Vec<Child> {
    (0..CONSUMERS)
        .map(|share| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "consumer_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, share.to_string())
                .env(CHILD_SCHEMA, schema)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&logs[share as usize]).unwrap())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Consumers whose next entry is a message delivered once in the whole log whose effect is
/// already there: it committed and was killed before its ack (a lower bound of such kills).
async fn committed_unacked(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM offsets o JOIN log l ON l.seq = o.pos + $1 \
         WHERE EXISTS (SELECT 1 FROM ledger g WHERE g.msg_id = l.msg_id) \
         AND (SELECT COUNT(*) FROM log c WHERE c.msg_id = l.msg_id) = 1",
    )
    .bind(CONSUMERS)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Entries acknowledged over all shares: each offset counts its share's entries up to it.
async fn acked(pool: &PgPool) -> i64 {
    let offsets: Vec<i64> = sqlx::query_scalar("SELECT pos FROM offsets ORDER BY consumer")
        .fetch_all(pool)
        .await
        .unwrap();
    offsets
        .iter()
        .map(|pos| {
            if *pos <= 0 {
                0
            } else {
                (pos + CONSUMERS - 1) / CONSUMERS
            }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_consumers_killed_together_lose_and_double_nothing() {
    let Some(pool) = common::postgres().await else {
        return;
    };
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let seed = std::env::var("IDEM_CROWD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("crowd seed: IDEM_CROWD_SEED={seed}");
    let log = generate(seed, deliveries());
    write_log(&pool, &log).await;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0ffee);

    let logs: Vec<_> = (0..CONSUMERS)
        .map(|i| std::env::temp_dir().join(common::unique_name(&format!("idem_crowd_{i}"))))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(if soak() { 3_600 } else { 120 });
    // Spend about half the log on the generations that get killed.
    let per_kill = log.len() as i64 / (2 * KILLS as i64);
    let (mut kills, mut sigkills, mut in_window, mut progress) = (0, 0, 0, Vec::new());
    for generation in 0..=KILLS {
        let before = acked(&pool).await;
        let mut children = spawn_consumers(&schema, &logs);
        if generation == KILLS {
            for (i, child) in children.iter_mut().enumerate() {
                let status = child.wait().unwrap();
                let output = std::fs::read_to_string(&logs[i]).unwrap_or_default();
                assert!(status.success(), "consumer {i}: {status}\n{output}");
            }
            progress.push(acked(&pool).await - before);
            break;
        }
        // Kill when the generation has acknowledged a random share of the log, plus a random
        // fraction of a message; one generation in four at a random time after its start,
        // often before the consumers have connected.
        let target = before + rng.random_range(1..=2 * per_kill);
        if rng.random_ratio(1, 4) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        } else {
            while acked(&pool).await < target {
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
                    std::os::unix::process::ExitStatusExt::signal(&status),
                    Some(libc::SIGKILL),
                    "generation {generation}, consumer {i} should have died of SIGKILL: {status}\n{output}"
                );
                sigkills += 1;
            } else {
                assert!(status.success(), "consumer {i}: {status}\n{output}");
            }
        }
        kills += 1;
        in_window += committed_unacked(&pool).await;
        progress.push(acked(&pool).await - before);
    }
    for path in &logs {
        let _ = std::fs::remove_file(path);
    }
    let elapsed = started.elapsed();
    verify(&pool, &log).await;
    assert_eq!(kills, KILLS);
    let copies = log.len() - log.iter().map(Msg::id).collect::<BTreeSet<_>>().len();
    eprintln!(
        "{} deliveries ({copies} copies, {} status changes behind a newer version), {} generations \
         of {CONSUMERS} consumer processes, {kills} killed together ({sigkills} SIGKILLs, {in_window} of them at least between a commit and its ack); entries acknowledged \
         per generation: {progress:?}; 0 lost, 0 doubled, versions at the highest, in {elapsed:.1?}",
        log.len(),
        behind_newer(&log),
        kills + 1,
    );
    common::drop_postgres(pool).await;
}

/// Shows at most a few items of a set that should be empty.
fn few<T: std::fmt::Debug>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    items.into_iter().take(5).collect()
}

async fn verify(pool: &PgPool, log: &[Msg]) {
    // Every share acknowledged to its end.
    let offsets: Vec<(i64, i64)> = sqlx::query_as("SELECT consumer, pos FROM offsets")
        .fetch_all(pool)
        .await
        .unwrap();
    for (share, pos) in offsets {
        let last = (1..=log.len() as i64)
            .rev()
            .find(|seq| seq % CONSUMERS == share)
            .unwrap();
        assert_eq!(pos, last, "consumer {share} acknowledged its whole share");
    }

    // The oracle: every credit once; each order at its highest version.
    let mut credits = BTreeSet::new();
    let mut balances: BTreeMap<i64, i64> = BTreeMap::new();
    let mut highest: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    let mut statuses = BTreeSet::new();
    for msg in log {
        match msg {
            Msg::Credit {
                id,
                account,
                amount,
            } => {
                if credits.insert(id.clone()) {
                    *balances.entry(*account).or_default() += amount;
                }
            }
            Msg::Status { id, order, version } => {
                statuses.insert(id.clone());
                let at = highest.entry(*order).or_insert((0, String::new()));
                if *version > at.0 {
                    *at = (*version, id.clone());
                }
            }
        }
    }

    let lines: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg_id, COUNT(*) FROM ledger GROUP BY msg_id")
            .fetch_all(pool)
            .await
            .unwrap();
    let lines: BTreeMap<String, i64> = lines.into_iter().collect();
    let doubled: Vec<_> = lines.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        doubled.is_empty(),
        "{} doubled, e.g. {:?}",
        doubled.len(),
        few(doubled.iter())
    );
    let lost: Vec<_> = credits
        .iter()
        .filter(|id| !lines.contains_key(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} credits lost, e.g. {:?}",
        lost.len(),
        few(lost.iter())
    );
    let newest_lost: Vec<_> = highest
        .values()
        .filter(|(_, id)| !lines.contains_key(id))
        .collect();
    assert!(
        newest_lost.is_empty(),
        "{} newest status changes lost, e.g. {:?}",
        newest_lost.len(),
        few(newest_lost.iter())
    );
    let unknown: Vec<_> = lines
        .keys()
        .filter(|id| !credits.contains(*id) && !statuses.contains(*id))
        .collect();
    assert!(unknown.is_empty(), "{unknown:?}");

    let stored: Vec<(i64, i64)> = sqlx::query_as("SELECT id, balance FROM accounts")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(
        stored.into_iter().collect::<BTreeMap<_, _>>(),
        balances,
        "balances"
    );
    let orders: Vec<(i64, String, i64)> = sqlx::query_as("SELECT id, status, version FROM orders")
        .fetch_all(pool)
        .await
        .unwrap();
    let expected: BTreeMap<i64, (String, i64)> = highest
        .iter()
        .map(|(order, (version, _))| (*order, (format!("v{version}"), *version)))
        .collect();
    let orders: BTreeMap<i64, (String, i64)> =
        orders.into_iter().map(|(id, s, v)| (id, (s, v))).collect();
    assert_eq!(orders, expected, "every order at its highest version");
    let versions: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT entity, version FROM idem_versions WHERE scope = 'crowd::status'")
            .fetch_all(pool)
            .await
            .unwrap();
    let versions: BTreeMap<i64, i64> = versions
        .into_iter()
        .map(|(entity, v)| (String::from_utf8(entity).unwrap().parse().unwrap(), v))
        .collect();
    let expected: BTreeMap<i64, i64> = highest.iter().map(|(o, (v, _))| (*o, *v)).collect();
    assert_eq!(versions, expected, "idem_versions at the highest");

    // Records and effects agree, scope by scope: no record without its effect, and the reverse.
    for (scope, prefix) in [("crowd::credit", "c"), ("crowd::status", "s")] {
        let keys: Vec<Vec<u8>> =
            sqlx::query_scalar("SELECT msg_key FROM idem_records WHERE scope = $1")
                .bind(scope)
                .fetch_all(pool)
                .await
                .unwrap();
        let keys: BTreeSet<String> = keys
            .into_iter()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        let applied: BTreeSet<String> = lines
            .keys()
            .filter(|id| id.starts_with(prefix))
            .cloned()
            .collect();
        assert_eq!(keys, applied, "records of {scope}");
    }
}

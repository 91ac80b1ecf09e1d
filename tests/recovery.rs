//! Recovery on the consumer loop (`Consumer::recovery`), on the in-memory broker and a real
//! SQLite database: durable retries parked in `idem_parked` while the queue keeps flowing, and
//! dead letters kept in `idem_dead_letters`. Every test asserts the tables and the queue after
//! the run. (The tables' SQL is checked on every database by the test kit's recovery rules;
//! each broker's own test runs a durable retry through its real server.)

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::consume::{memory::MemoryQueue, Consumer, Counts, DeadLetters, Recovery};
use idem::sqlx::{Sqlite, SqlitePool};
use idem::{idempotent, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    id: String,
    account: i64,
    version: i64,
    amount: i64,
    /// The handler fails this message's first `fail_first` deliveries.
    fail_first: u32,
}

/// How many times each message id's body ran. A delivery that fails in a batch runs its body
/// twice: in the batch, then alone (where its error is reported); so a message fails its first
/// `fail_first` deliveries by failing its first `2 × fail_first` runs.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<String, u32>>>);

impl Runs {
    /// Counts a run of `id`; true when this run must fail.
    fn fails(&self, msg: &Credit) -> bool {
        let mut runs = self.0.lock().unwrap();
        let n = runs.entry(msg.id.clone()).or_default();
        *n += 1;
        *n <= msg.fail_first.saturating_mul(2)
    }

    fn of(&self, id: &str) -> u32 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

async fn add(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), String> {
    sqlx::query(
        "INSERT INTO balances (account, balance, applied) VALUES (?1, ?2, 1) \
         ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance, \
         applied = applied + 1",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

#[idempotent(key = "msg.id", scope = "recovery::credit")]
async fn credit(tx: &mut Tx<'_, Sqlite>, msg: &Credit, runs: &Runs) -> Result<(), String> {
    if runs.fails(msg) {
        return Err(format!("account {} is locked", msg.account));
    }
    add(tx, msg).await
}

#[idempotent(key = "msg.id", scope = "recovery::poisoned", max_attempts = 2)]
async fn bounded(tx: &mut Tx<'_, Sqlite>, msg: &Credit, runs: &Runs) -> Result<(), String> {
    if runs.fails(msg) {
        return Err(format!("order {} not found", msg.id));
    }
    add(tx, msg).await
}

#[idempotent(
    key = "msg.id",
    entity = "msg.account",
    version = "msg.version",
    scope = "recovery::versioned"
)]
async fn versioned(tx: &mut Tx<'_, Sqlite>, msg: &Credit, runs: &Runs) -> Result<(), String> {
    if runs.fails(msg) {
        return Err("try later".into());
    }
    sqlx::query(
        "INSERT INTO balances (account, balance, applied) VALUES (?1, ?2, 1) \
         ON CONFLICT (account) DO UPDATE SET balance = excluded.balance, applied = applied + 1",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// consumer, reason, scope, msg_key, error, error_shape, attempts, state
type DeadRow = (
    String,
    String,
    Option<String>,
    Option<Vec<u8>>,
    String,
    String,
    i64,
    String,
);

/// reason, scope, error, error_shape, payload
type ShortDeadRow = (String, Option<String>, String, String, Vec<u8>);

fn msg(id: &str, account: i64, amount: i64, fail_first: u32) -> Credit {
    Credit {
        id: id.into(),
        account,
        version: 1,
        amount,
        fail_first,
    }
}

async fn database() -> SqlitePool {
    common::sqlite_with(&[
        "CREATE TABLE balances (account INTEGER PRIMARY KEY, balance INTEGER NOT NULL, \
         applied INTEGER NOT NULL)",
    ])
    .await
}

fn publish(queue: &MemoryQueue, msg: &Credit) {
    queue.publish(serde_json::to_vec(msg).unwrap());
}

async fn scalar(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn balance(pool: &SqlitePool, account: i64) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT balance, applied FROM balances WHERE account = ?1")
        .bind(account)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Completes once `done` holds of the database (checked every 10 ms), or after 20 s.
async fn until(pool: SqlitePool, done: impl AsyncFn(&SqlitePool) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        if done(&pool).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn fast(name: &str, attempts: u32) -> Recovery {
    Recovery::new(name)
        .durable_retries(
            attempts,
            Duration::from_millis(40),
            Duration::from_millis(160),
        )
        .poll(Duration::from_millis(10))
}

#[tokio::test]
async fn a_delivery_that_fails_four_times_is_parked_and_applied_once_while_the_queue_flows() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    publish(&queue, &msg("slow", 1, 100, 4));
    for i in 0..20 {
        publish(&queue, &msg(&format!("ok-{i}"), 2, 1, 0));
    }
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| credit(b, m, &runs).await
    };
    let consumer = Consumer::new(pool.clone()).recovery(fast("recovery-flows", 8));
    let watched = pool.clone();
    let run = tokio::spawn(consumer.run(
        queue.deliveries(),
        idem::consume::json::<Credit>,
        handler,
        until(pool.clone(), async |p| balance(p, 1).await.is_some()),
    ));
    // The queue flows: all 21 deliveries are acked (the failing one once parked) while the
    // failing one is still waiting in the database.
    until(watched.clone(), async |p| {
        balance(p, 2).await == Some((20, 20))
    })
    .await;
    assert_eq!(
        queue.open(),
        0,
        "every delivery was settled with the broker"
    );
    assert_eq!(queue.acked(), 21);
    let counts: Counts = run.await.unwrap();
    assert_eq!(
        balance(&pool, 1).await,
        Some((100, 1)),
        "applied exactly once"
    );
    assert_eq!(
        runs.of("slow"),
        9,
        "four failed deliveries (two runs each), then the one that applied"
    );
    assert_eq!(counts.parked, 1);
    assert_eq!(counts.failed, 4);
    assert_eq!(counts.applied, 21);
    let parked = scalar(&pool, "SELECT COUNT(*) FROM idem_parked").await;
    let dead = scalar(&pool, "SELECT COUNT(*) FROM idem_dead_letters").await;
    assert_eq!((parked, dead), (0, 0), "the applied retry's row is gone");
    assert!(queue.dead_letters().is_empty());
}

/// Writes, then holds its transaction (and SQLite's write lock) for a 150 ms sleep, noting in
/// `woke` the longest time one such sleep took to resume.
#[idempotent(key = "msg.id", scope = "recovery::held")]
async fn held(tx: &mut Tx<'_, Sqlite>, msg: &Credit, woke: &Mutex<Duration>) -> Result<(), String> {
    add(tx, msg).await?;
    let slept = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let took = slept.elapsed();
    let mut longest = woke.lock().unwrap();
    *longest = (*longest).max(took);
    Ok(())
}

/// The loop's look for due retries runs beside the batches in flight, never instead of them.
/// On SQLite (one writer) the look waits for the write lock a batch holds until its commit;
/// were the batch not polled meanwhile, it could not commit, and both would wait out the
/// database's busy time-out (30 s here) before anything moved: on a loaded machine the batch
/// then ran over its handler time-out, rolled back and parked though nothing failed. The
/// handler's 150 ms sleeps must resume long before that time-out.
#[tokio::test]
async fn a_look_for_due_retries_waits_beside_the_batch_holding_the_write_lock() {
    let pool = database().await; // a file, WAL, writers waiting up to 30 s for the lock
    let queue = MemoryQueue::new();
    for i in 0..6 {
        publish(&queue, &msg(&format!("m{i}"), i, 1, 0));
    }
    let woke = Mutex::new(Duration::ZERO);
    let handler = async |b: &mut idem::Batch<Sqlite>, m: &Credit| held(b, m, &woke).await;
    let consumer = Consumer::new(pool.clone())
        .batch(1)
        .concurrency(2)
        .handler_timeout(Duration::from_secs(2))
        .recovery(fast("recovery-beside", 3));
    let counts = consumer
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            until(pool.clone(), async |p| {
                scalar(p, "SELECT COUNT(*) FROM balances").await == 6
            }),
        )
        .await;
    assert_eq!(
        (counts.applied, counts.failed, counts.parked),
        (6, 0, 0),
        "{counts:?}"
    );
    let longest = *woke.lock().unwrap();
    assert!(
        longest < Duration::from_secs(10),
        "a batch was left unpolled for {longest:?} while the loop looked for retries"
    );
    let applied = scalar(&pool, "SELECT SUM(applied) FROM balances").await;
    let parked = scalar(&pool, "SELECT COUNT(*) FROM idem_parked").await;
    assert_eq!((applied, parked), (6, 0), "each applied once, none parked");
    assert_eq!((queue.open(), queue.acked()), (0, 6));
}

#[tokio::test]
async fn a_parked_retry_out_of_runs_is_a_dead_letter_with_its_handler_key_and_error() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    publish(&queue, &msg("never", 7, 5, u32::MAX));
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| credit(b, m, &runs).await
    };
    let counts = Consumer::new(pool.clone())
        .recovery(fast("recovery-exhausted", 3))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            until(pool.clone(), async |p| {
                scalar(p, "SELECT COUNT(*) FROM idem_dead_letters").await == 1
            }),
        )
        .await;
    assert_eq!(
        runs.of("never"),
        6,
        "three failed deliveries, two runs each"
    );
    assert_eq!((counts.parked, counts.dead_letters_stored), (1, 1));
    let row: DeadRow = sqlx::query_as(
        "SELECT consumer, reason, scope, msg_key, error, error_shape, attempts, state \
             FROM idem_dead_letters",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.0, "recovery-exhausted");
    assert_eq!(row.1, "retries_exhausted");
    assert_eq!(row.2.as_deref(), Some("recovery::credit"));
    assert!(row.3.is_some(), "the key is kept");
    assert_eq!(row.4, "account 7 is locked");
    assert_eq!(row.5, "account # is locked");
    assert_eq!(row.6, 3);
    assert_eq!(row.7, "dead");
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM idem_parked").await, 0);
    assert_eq!(balance(&pool, 7).await, None, "never applied");
    assert_eq!(queue.open(), 0, "acked once parked");
    assert!(
        queue.dead_letters().is_empty(),
        "a parked retry gives up in the database only"
    );
}

#[tokio::test]
async fn poisoned_and_undecodable_deliveries_go_to_the_database_and_the_broker() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    publish(&queue, &msg("17", 3, 5, u32::MAX));
    queue.publish(b"{not json".to_vec());
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| bounded(b, m, &runs).await
    };
    // No durable retries: the failures are retried in place until max_attempts poisons it.
    let counts = Consumer::new(pool.clone())
        .retry_delay(Duration::from_millis(1), Duration::from_millis(5))
        .recovery(Recovery::new("recovery-poison"))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            queue.idle(),
        )
        .await;
    assert_eq!(
        runs.of("17"),
        4,
        "max_attempts = 2: two failed deliveries, two runs each"
    );
    assert_eq!(counts.dead_letters_stored, 2);
    let rows: Vec<ShortDeadRow> = sqlx::query_as(
        "SELECT reason, scope, error, error_shape, payload FROM idem_dead_letters ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    let undecodable = rows.iter().find(|r| r.0 == "undecodable").unwrap();
    assert_eq!(undecodable.1, None, "no handler saw it");
    assert_eq!(undecodable.4, b"{not json");
    let poisoned = rows.iter().find(|r| r.0 == "poisoned").unwrap();
    assert_eq!(poisoned.1.as_deref(), Some("recovery::poisoned"));
    assert_eq!(poisoned.2, "order 17 not found", "the last counted error");
    assert_eq!(poisoned.3, "order # not found");
    let broker: Vec<_> = queue.dead_letters().into_iter().map(|d| d.1).collect();
    assert_eq!(
        broker.len(),
        2,
        "and the broker's dead-letter place: {broker:?}"
    );
}

#[tokio::test]
async fn dead_letters_in_the_database_only_ack_the_broker() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    queue.publish(b"[]".to_vec());
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| credit(b, m, &runs).await
    };
    Consumer::new(pool.clone())
        .recovery(Recovery::new("recovery-db-only").dead_letters(DeadLetters::Database))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            queue.idle(),
        )
        .await;
    assert_eq!(
        scalar(
            &pool,
            "SELECT COUNT(*) FROM idem_dead_letters WHERE reason = 'undecodable'"
        )
        .await,
        1
    );
    assert!(queue.dead_letters().is_empty());
    assert_eq!((queue.acked(), queue.open()), (1, 0));
}

#[tokio::test]
async fn a_parked_message_overtaken_by_a_later_version_is_stale_when_retried() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    let mut v1 = msg("v1", 9, 10, 1);
    v1.version = 1;
    let mut v2 = msg("v2", 9, 20, 0);
    v2.version = 2;
    publish(&queue, &v1);
    publish(&queue, &v2);
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| versioned(b, m, &runs).await
    };
    let counts = Consumer::new(pool.clone())
        .recovery(fast("recovery-versions", 5))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            until(pool.clone(), async |p| {
                scalar(p, "SELECT COUNT(*) FROM idem_parked").await == 0
                    && balance(p, 9).await.is_some()
            }),
        )
        .await;
    assert_eq!(
        runs.of("v1"),
        2,
        "the retry was stale: its body did not run again"
    );
    assert_eq!(counts.stale, 1);
    assert_eq!(balance(&pool, 9).await, Some((20, 1)), "version 2 stands");
    let dead = scalar(&pool, "SELECT COUNT(*) FROM idem_dead_letters").await;
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn a_retry_held_by_a_consumer_that_died_is_taken_back_after_its_lease_and_applied_once() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    publish(&queue, &msg("orphan", 4, 50, 1));
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| credit(b, m, &runs).await
    };
    // A first consumer parks the failure and stops before it is due.
    Consumer::new(pool.clone())
        .recovery(fast("recovery-orphan", 5))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            &handler,
            queue.idle(),
        )
        .await;
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM idem_parked").await, 1);
    // A consumer that died holding it: the row is leased to a token nobody runs.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    sqlx::query("UPDATE idem_parked SET due_at = 0, lease_token = 42, lease_until = ?1")
        .bind(now_ms + 300)
        .execute(&pool)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    Consumer::new(pool.clone())
        .recovery(fast("recovery-orphan", 5))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            &handler,
            until(pool.clone(), async |p| balance(p, 4).await.is_some()),
        )
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "not before the lease ran out"
    );
    assert_eq!(balance(&pool, 4).await, Some((50, 1)));
    assert_eq!(runs.of("orphan"), 3);
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM idem_parked").await, 0);
}

/// A job of one of two handlers, failing with one of three causes until its cause is fixed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    id: String,
    cause: usize,
    n: i64,
}

/// Which causes are fixed (the handler no longer fails on them).
#[derive(Clone, Default)]
struct Fixed(Arc<Mutex<[bool; 3]>>);

impl Fixed {
    fn check(&self, job: &Job) -> Result<(), String> {
        if self.0.lock().unwrap()[job.cause] {
            return Ok(());
        }
        Err(match job.cause {
            0 => format!("order {} not found", job.n),
            1 => format!("card ending {} declined", job.n),
            _ => format!("refund {} is past its window", job.n),
        })
    }
}

async fn record(tx: &mut Tx<'_, Sqlite>, job: &Job) -> Result<(), String> {
    sqlx::query("INSERT INTO jobs (id) VALUES (?1)")
        .bind(&job.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[idempotent(key = "job.id", scope = "recovery::orders", max_attempts = 1)]
async fn on_order(tx: &mut Tx<'_, Sqlite>, job: &Job, fixed: &Fixed) -> Result<(), String> {
    fixed.check(job)?;
    record(tx, job).await
}

#[idempotent(key = "job.id", scope = "recovery::refunds", max_attempts = 1)]
async fn on_refund(tx: &mut Tx<'_, Sqlite>, job: &Job, fixed: &Fixed) -> Result<(), String> {
    fixed.check(job)?;
    record(tx, job).await
}

/// The outbox's publisher into an in-memory queue, for a replay to come back to it.
struct IntoQueue(MemoryQueue);

impl idem::outbox::Publisher for IntoQueue {
    async fn publish(
        &self,
        batch: &[idem::outbox::Message],
    ) -> Result<(), idem::outbox::PublishError> {
        for message in batch {
            if message.destination != self.0.name() {
                return Err(format!("no queue {}", message.destination).into());
            }
            self.0
                .publish_with_headers(message.payload.clone(), message.headers.clone());
        }
        Ok(())
    }
}

/// Runs the jobs consumer on `queue` until `done` holds of the database.
async fn run_jobs(
    pool: &SqlitePool,
    queue: &MemoryQueue,
    fixed: &Fixed,
    done: impl AsyncFn(&SqlitePool) -> bool,
) -> Counts {
    let handler = {
        let fixed = fixed.clone();
        async move |b: &mut idem::Batch<Sqlite>, job: &Job| {
            if job.cause == 2 {
                on_refund(b, job, &fixed).await
            } else {
                on_order(b, job, &fixed).await
            }
        }
    };
    Consumer::new(pool.clone())
        .batch(50)
        .retry_delay(Duration::from_millis(1), Duration::from_millis(1))
        .recovery(Recovery::new("recovery-jobs").dead_letters(DeadLetters::Database))
        .run(
            queue.deliveries(),
            idem::consume::json::<Job>,
            handler,
            until(pool.clone(), done),
        )
        .await
}

/// 300 poison messages of three causes across two scopes (MassTransit #146's trap included: a
/// replayed message whose failures were counted must not be poisoned again at once). The
/// summary shows three groups of 100; after one cause is fixed, replaying its group through
/// the outbox applies exactly those 100 (none twice, the other 200 still dead); discarding
/// another group takes it out of the summary, recorded.
#[tokio::test]
async fn three_hundred_dead_letters_group_by_cause_and_a_fixed_group_replays_exactly_once() {
    use idem::admin::{DeadLetterAdmin, DeadLetterFilter, DeadLetterState, Page, ReplayOutcome};

    let pool = database().await;
    sqlx::query("CREATE TABLE jobs (id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let queue = MemoryQueue::named("jobs");
    for i in 0..300_i64 {
        let job = Job {
            id: format!("job-{i}"),
            cause: (i % 3) as usize,
            n: 1000 + i,
        };
        queue.publish(serde_json::to_vec(&job).unwrap());
    }
    let fixed = Fixed::default();
    let counts = run_jobs(&pool, &queue, &fixed, async |p| {
        scalar(p, "SELECT COUNT(*) FROM idem_dead_letters").await == 300
    })
    .await;
    assert_eq!(counts.dead_letters_stored, 300, "{counts:?}");
    assert_eq!(scalar(&pool, "SELECT COUNT(*) FROM jobs").await, 0);

    let open = DeadLetterFilter::default();
    let groups = Sqlite::groups(&pool, &open).await.unwrap();
    let mut shapes: Vec<(Option<String>, String, u64)> = groups
        .iter()
        .map(|g| (g.scope.clone(), g.shape.clone(), g.count))
        .collect();
    shapes.sort();
    let scope = |s: &str| Some(s.to_string());
    assert_eq!(
        shapes,
        [
            (
                scope("recovery::orders"),
                "card ending # declined".into(),
                100
            ),
            (scope("recovery::orders"), "order # not found".into(), 100),
            (
                scope("recovery::refunds"),
                "refund # is past its window".into(),
                100
            ),
        ]
    );
    let group = |shape: &str| {
        let g = groups.iter().find(|g| g.shape == shape).unwrap();
        DeadLetterFilter {
            group: Some(g.group.clone()),
            ..DeadLetterFilter::default()
        }
    };

    // The cause of "order # not found" is fixed; its group is replayed through the outbox.
    fixed.0.lock().unwrap()[0] = true;
    let page = Page {
        after: None,
        limit: 1000,
    };
    let ids: Vec<i64> = Sqlite::list(&pool, &group("order # not found"), page)
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids.len(), 100);
    let replays = Sqlite::replay(&pool, &ids).await.unwrap();
    assert!(replays
        .iter()
        .all(|r| matches!(r.outcome, ReplayOutcome::Replayed { .. })));
    // A replay run again (the operator's second try) sends nothing more.
    let again = Sqlite::replay(&pool, &ids).await.unwrap();
    assert!(again
        .iter()
        .all(|r| r.outcome == ReplayOutcome::NotDead(DeadLetterState::Replayed)));
    let mut relay = idem::outbox::Relay::new(pool.clone(), IntoQueue(queue.clone()));
    while relay.step().await.unwrap() > 0 {}
    let counts = run_jobs(&pool, &queue, &fixed, async |p| {
        scalar(p, "SELECT COUNT(*) FROM jobs").await == 100
    })
    .await;
    assert_eq!(
        counts.applied, 100,
        "applied, not poisoned again: {counts:?}"
    );
    assert_eq!(counts.dead_lettered, 0, "{counts:?}");
    let doubled = scalar(
        &pool,
        "SELECT COUNT(*) FROM (SELECT id FROM jobs GROUP BY id HAVING COUNT(*) > 1)",
    )
    .await;
    assert_eq!(doubled, 0);
    let applied_causes = scalar(
        &pool,
        "SELECT COUNT(*) FROM jobs WHERE CAST(SUBSTR(id, 5) AS INTEGER) % 3 = 0",
    )
    .await;
    assert_eq!(applied_causes, 100, "exactly the fixed group");
    let still_dead = scalar(
        &pool,
        "SELECT COUNT(*) FROM idem_dead_letters WHERE state = 'dead'",
    )
    .await;
    assert_eq!(still_dead, 200, "the other two groups are untouched");

    // The refunds' group is given up on: discarded, recorded, out of the summary.
    let refunds = group("refund # is past its window");
    let ids: Vec<i64> = Sqlite::list(&pool, &refunds, page)
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(Sqlite::discard(&pool, &ids).await.unwrap(), 100);
    let left = Sqlite::groups(&pool, &open).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].shape, "card ending # declined");
    let discarded = scalar(
        &pool,
        "SELECT COUNT(*) FROM idem_dead_letters WHERE state = 'discarded'",
    )
    .await;
    assert_eq!(discarded, 100);
}

/// The recovery counters equal what the run did: one failure parked, one retry taken, one
/// dead letter stored (by scope and reason).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_recovery_metrics_count_what_was_parked_taken_and_stored() {
    use idem::metrics::{
        CONSUMER_DEAD_LETTERS_STORED_TOTAL, CONSUMER_PARKED_TOTAL, CONSUMER_RETRIES_TAKEN_TOTAL,
    };
    use idem_testkit::rules::metrics::TestRecorder;

    let recorder = TestRecorder::default();
    // Thread-local: the test's runtime runs on this thread, and so does the consumer.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let pool = database().await;
    let queue = MemoryQueue::new();
    let runs = Runs::default();
    publish(&queue, &msg("once", 5, 10, 1));
    queue.publish(b"[]".to_vec());
    let handler = {
        let runs = runs.clone();
        async move |b: &mut idem::Batch<Sqlite>, m: &Credit| credit(b, m, &runs).await
    };
    Consumer::new(pool.clone())
        .recovery(fast("recovery-metrics", 5).dead_letters(DeadLetters::Database))
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            until(pool.clone(), async |p| balance(p, 5).await.is_some()),
        )
        .await;
    assert_eq!(recorder.get(&format!("{CONSUMER_PARKED_TOTAL}{{}}")), 1);
    assert!(recorder.get(&format!("{CONSUMER_RETRIES_TAKEN_TOTAL}{{}}")) >= 1);
    let stored = format!("{CONSUMER_DEAD_LETTERS_STORED_TOTAL}{{reason=undecodable,scope=}}");
    assert_eq!(recorder.get(&stored), 1);
    // Replays count where they run, by where they go.
    use idem::admin::{DeadLetterAdmin, ReplayTo};
    let id: i64 = sqlx::query_scalar("SELECT id FROM idem_dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    Sqlite::replay_to(&pool, &[id], ReplayTo::Consumer)
        .await
        .unwrap();
    let replayed = format!(
        "{}{{to=consumer}}",
        idem::metrics::DEAD_LETTERS_REPLAYED_TOTAL
    );
    assert_eq!(recorder.get(&replayed), 1);
}

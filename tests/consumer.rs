//! The broker-neutral consumer loop on the in-memory broker and a real SQLite database: every
//! test asserts the database and the queue after the run (what was applied, what was acked,
//! what was dead-lettered, what is still open).

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::consume::{memory::MemoryQueue, Consumer, Counts, DeadLetterReason};
use idem::sqlx::{Sqlite, SqlitePool};
use idem::{idempotent, Batch, Outcome, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    id: String,
    account: i64,
    amount: i64,
    #[serde(default)]
    fail: bool,
    #[serde(default)]
    sleep_ms: u64,
}

fn credit(id: &str, account: i64, amount: i64) -> Credit {
    Credit {
        id: id.into(),
        account,
        amount,
        fail: false,
        sleep_ms: 0,
    }
}

#[idempotent(key = "msg.id", scope = "consumer::credit")]
async fn apply(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), String> {
    if msg.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(msg.sleep_ms)).await;
    }
    if msg.fail {
        return Err(format!("{} always fails", msg.id));
    }
    sqlx::query(
        "INSERT INTO balances (account, balance) VALUES (?1, ?2) \
         ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

async fn database() -> SqlitePool {
    common::sqlite_with(&[
        "CREATE TABLE balances (account INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    ])
    .await
}

async fn balances(pool: &SqlitePool) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT account, balance FROM balances ORDER BY account")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn records(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE scope = 'consumer::credit'")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn publish(queue: &MemoryQueue, msg: &Credit) {
    queue.publish(serde_json::to_vec(msg).unwrap());
}

/// What a run must leave: these balances, and this many records of `consumer::credit`.
async fn assert_state(pool: &SqlitePool, expected: &[(i64, i64)], expected_records: i64) {
    assert_eq!(balances(pool).await, expected, "balances");
    assert_eq!(records(pool).await, expected_records, "records");
}

/// Runs `consumer` on the queue's `Credit`s through [`apply`], in batches, until the queue is
/// idle.
async fn drain(consumer: Consumer<Sqlite>, queue: &MemoryQueue) -> Counts {
    drain_with(consumer, queue, async |b, msg| apply(b, msg).await).await
}

/// Runs `consumer` on the queue's `Credit`s through `handler`, in batches, until the queue is
/// idle.
async fn drain_with(
    consumer: Consumer<Sqlite>,
    queue: &MemoryQueue,
    handler: impl AsyncFn(&mut Batch<Sqlite>, &Credit) -> Result<Outcome<()>, idem::Error<String>>,
) -> Counts {
    consumer
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            queue.idle(),
        )
        .await
}

/// Runs `consumer` on the queue's `Credit`s through [`leased`], one at a time, until the queue
/// is idle.
async fn drain_leased(consumer: Consumer<Sqlite>, queue: &MemoryQueue) -> Counts {
    consumer
        .run_each(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            async |pool, msg| leased(pool, msg).await,
            queue.idle(),
        )
        .await
}

/// A consumer that gives up quickly, so tests end fast.
fn consumer(pool: &SqlitePool) -> Consumer<Sqlite> {
    Consumer::new(pool.clone())
        .retry_delay(Duration::from_millis(1), Duration::from_millis(5))
        .linger(Duration::from_millis(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_with_duplicates_apply_each_message_once_and_ack_every_delivery() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let mut expected = std::collections::BTreeMap::new();
    let mut deliveries = 0;
    for i in 0..300 {
        let msg = credit(&format!("c{i}"), i % 7, i + 1);
        *expected.entry(msg.account).or_insert(0) += msg.amount;
        // Every third message is delivered twice, some far apart.
        publish(&queue, &msg);
        deliveries += 1;
        if i % 3 == 0 {
            publish(&queue, &msg);
            deliveries += 1;
        }
    }
    let counts = drain(consumer(&pool).batch(25).concurrency(4), &queue).await;
    assert_eq!(counts.applied, 300);
    assert_eq!(counts.duplicate, deliveries - 300);
    assert_eq!(queue.acked(), deliveries);
    assert_eq!(queue.open(), 0);
    assert!(queue.dead_letters().is_empty());
    assert_state(&pool, &expected.into_iter().collect::<Vec<_>>(), 300).await;
}

#[tokio::test]
async fn undecodable_payloads_and_bad_keys_are_dead_lettered_at_once_and_the_rest_apply() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    publish(&queue, &credit("ok-1", 1, 10));
    queue.publish(b"{not json".to_vec());
    publish(&queue, &credit("", 1, 1000)); // an empty key: refused before any write
    publish(&queue, &credit("ok-2", 1, 5));
    let counts = drain(consumer(&pool).batch(10), &queue).await;
    let dead = queue.dead_letters();
    assert_eq!(dead.len(), 2);
    assert!(matches!(dead[0].1, DeadLetterReason::Undecodable(_)));
    assert_eq!(dead[0].0, b"{not json");
    assert!(matches!(dead[1].1, DeadLetterReason::BadKey(_)));
    assert_eq!((counts.applied, counts.dead_lettered), (2, 2));
    assert_state(&pool, &[(1, 15)], 2).await;
}

#[tokio::test]
async fn a_message_that_always_fails_is_retried_then_dead_lettered_and_the_others_are_unaffected() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let poison = Credit {
        fail: true,
        ..credit("poison", 2, 99)
    };
    publish(&queue, &credit("a", 1, 1));
    publish(&queue, &poison);
    publish(&queue, &credit("b", 1, 2));
    let counts = drain(consumer(&pool).batch(3).max_deliveries(4), &queue).await;
    // Tried four times (each a failure, requeued), dead-lettered on the fifth delivery.
    assert_eq!(counts.failed, 4);
    let dead = queue.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].1,
        DeadLetterReason::TooManyDeliveries { deliveries: 5 }
    );
    assert_eq!(counts.applied, 2);
    assert_state(&pool, &[(1, 3)], 2).await;
}

#[tokio::test]
async fn a_batch_over_the_handler_timeout_is_rolled_back_and_its_redelivery_applies_once() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let slow_calls = Arc::new(AtomicU32::new(0));
    publish(&queue, &credit("slow", 1, 7));
    let calls = slow_calls.clone();
    let counts = drain_with(
        consumer(&pool).handler_timeout(Duration::from_millis(200)),
        &queue,
        async |b, msg| {
            // The first delivery hangs past the time-out (inside its transaction).
            let mut msg = msg.clone();
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                msg.sleep_ms = 5_000;
            }
            apply(b, &msg).await
        },
    )
    .await;
    assert_eq!((counts.failed, counts.applied), (1, 1));
    assert_eq!(queue.acked(), 1);
    assert_state(&pool, &[(1, 7)], 1).await;
}

#[tokio::test]
async fn a_panicking_handler_rolls_back_its_batch_which_is_requeued() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    let panics = Arc::new(AtomicU32::new(0));
    publish(&queue, &credit("p1", 1, 1));
    publish(&queue, &credit("p2", 1, 2));
    let seen = panics.clone();
    let counts = drain_with(consumer(&pool).batch(2), &queue, async |b, msg| {
        let result = apply(b, msg).await;
        // Panics in the second pass of the first batch, after p1's body wrote.
        if msg.id == "p2" && result.is_ok() && seen.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("handler bug");
        }
        result
    })
    .await;
    assert_eq!(counts.failed, 2);
    assert_eq!(counts.applied, 2);
    assert_state(&pool, &[(1, 3)], 2).await;
}

#[tokio::test]
async fn a_store_outage_pauses_the_batch_which_applies_once_the_store_is_back_and_burns_no_delivery(
) {
    let pool = database().await;
    let queue = MemoryQueue::new();
    publish(&queue, &credit("o1", 1, 4));
    // The store is down: its tables are gone, so every claim fails with a store error.
    sqlx::query("ALTER TABLE idem_records RENAME TO idem_records_away")
        .execute(&pool)
        .await
        .unwrap();
    let repair = {
        let pool = pool.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            sqlx::query("ALTER TABLE idem_records_away RENAME TO idem_records")
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let run = drain(consumer(&pool).max_deliveries(1), &queue);
    let (counts, ()) = tokio::join!(run, repair);
    assert!(counts.store_pauses >= 1, "{counts:?}");
    // Ran again in place: never requeued, so max_deliveries(1) did not dead-letter it.
    assert_eq!(
        (counts.applied, counts.failed, counts.dead_lettered),
        (1, 0, 0)
    );
    assert!(queue.dead_letters().is_empty());
    assert_state(&pool, &[(1, 4)], 1).await;
}

#[tokio::test]
async fn shutdown_mid_stream_leaves_nothing_in_flight_and_a_second_run_finishes_exactly_once() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    for i in 0..40 {
        let mut msg = credit(&format!("s{i}"), 1, 1);
        msg.sleep_ms = 5;
        publish(&queue, &msg);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopper = async move {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _ = stop.send(());
    };
    let first = consumer(&pool).batch(4).run(
        queue.deliveries(),
        idem::consume::json::<Credit>,
        async |b, msg| apply(b, msg).await,
        async move {
            let _ = stopped.await;
        },
    );
    let (counts, ()) = tokio::join!(first, stopper);
    let applied_first = balances(&pool).await.first().map_or(0, |b| b.1);
    assert!(
        counts.applied < 40,
        "stopped too late to test anything: {counts:?}"
    );
    assert_eq!(applied_first as u64, counts.applied);
    // Every message not applied is back in the queue, none stuck as delivered.
    assert_eq!(queue.open() as u64, 40 - counts.applied);
    let second = drain(consumer(&pool).batch(4), &queue).await;
    assert_eq!(counts.applied + second.applied, 40);
    assert_state(&pool, &[(1, 40)], 40).await;
    assert_eq!(queue.open(), 0);
}

#[idempotent(
    key = "msg.id",
    scope = "consumer::leased",
    mode = "lease",
    lease = "10s"
)]
async fn leased(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), String> {
    sqlx::query("INSERT INTO balances (account, balance) VALUES (?1, ?2)")
        .bind(msg.account)
        .bind(msg.amount)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test]
async fn a_lease_held_elsewhere_is_requeued_after_the_delay_not_spun_on() {
    let pool = database().await;
    // Another consumer holds the lease on "l1" (a claim committed, its body still running).
    sqlx::query(
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) \
         VALUES ('consumer::leased', CAST('l1' AS BLOB), 9e15, \
                 CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 300, 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let queue = MemoryQueue::new();
    publish(&queue, &credit("l1", 1, 3));
    let counts = drain_leased(
        consumer(&pool).in_progress_delay(Duration::from_millis(100)),
        &queue,
    )
    .await;
    // About 300 ms of lease at 100 ms a requeue: a few tries, not a spin.
    assert!(
        (1..=6).contains(&counts.in_progress),
        "requeued {} times",
        counts.in_progress
    );
    assert_eq!(counts.applied, 1);
    assert_eq!(balances(&pool).await, [(1, 3)]);
}

/// A delivery whose broker may have taken it back (a revoked Kafka partition).
struct Revocable {
    inner: idem::consume::memory::MemoryDelivery,
    revoked: bool,
}

impl idem::consume::Delivery for Revocable {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }

    fn revoked(&self) -> bool {
        self.revoked
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn settle(self, settle: idem::consume::Settle) -> Result<(), idem::consume::SettleError> {
        self.inner.settle(settle).await
    }
}

#[tokio::test]
async fn a_revoked_delivery_is_dropped_unrun_and_unsettled() {
    use futures_util::StreamExt as _;
    use idem::consume::Delivery as _;
    let pool = database().await;
    let queue = MemoryQueue::new();
    publish(&queue, &credit("kept", 1, 10));
    publish(&queue, &credit("revoked", 2, 20));
    queue.close();
    let deliveries = queue.deliveries().map(|d| {
        d.map(|inner| {
            let revoked = inner.payload().windows(7).any(|w| w == b"revoked");
            Revocable { inner, revoked }
        })
    });
    let counts = consumer(&pool)
        .batch(2)
        .run(
            deliveries,
            idem::consume::json::<Credit>,
            async |b, msg| apply(b, msg).await,
            std::future::pending(),
        )
        .await;
    assert_eq!((counts.applied, counts.requeued), (1, 1));
    assert_state(&pool, &[(1, 10)], 1).await;
    // Neither acked nor requeued here: its new owner delivers it again.
    assert_eq!((queue.acked(), queue.open()), (1, 1));
}

/// One message of a batch fails on the store while the others commit: the others are acked at
/// once, and only the failed one waits (in place, never an attempt) and runs again.
#[tokio::test]
async fn a_store_error_on_one_message_settles_the_rest_of_its_batch_and_runs_only_that_one_again() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    for i in 0..5 {
        publish(&queue, &credit(&format!("s{i}"), 1, 1 << i));
    }
    // "s2"'s store fails on its first two runs (each run calls the closure twice: the batch's
    // gathering pass and its applying pass).
    let store_calls = AtomicU32::new(0);
    let others_calls = AtomicU32::new(0);
    let acked_at_rerun = std::sync::Mutex::new(Vec::new());
    let counts = drain_with(
        consumer(&pool).batch(5).max_deliveries(1),
        &queue,
        async |b, msg| {
            if msg.id != "s2" {
                others_calls.fetch_add(1, Ordering::SeqCst);
                return apply(b, msg).await;
            }
            let call = store_calls.fetch_add(1, Ordering::SeqCst);
            if call >= 2 {
                acked_at_rerun.lock().unwrap().push(queue.acked());
            }
            if call < 4 {
                return Err(idem::Error::Store(sqlx::Error::PoolTimedOut));
            }
            apply(b, msg).await
        },
    )
    .await;
    // Three runs of "s2" alone after the first batch; the other four ran once (two passes).
    assert_eq!(store_calls.load(Ordering::SeqCst), 6);
    assert_eq!(others_calls.load(Ordering::SeqCst), 8);
    // Every rerun of "s2" saw the four others already acked.
    assert_eq!(*acked_at_rerun.lock().unwrap(), [4, 4, 4, 4]);
    assert_eq!(counts.store_pauses, 2);
    assert_eq!(
        (
            counts.applied,
            counts.duplicate,
            counts.failed,
            counts.dead_lettered
        ),
        (5, 0, 0, 0)
    );
    assert_eq!(queue.acked(), 5);
    assert_eq!(queue.open(), 0);
    assert!(queue.dead_letters().is_empty());
    assert_state(&pool, &[(1, 31)], 5).await;
}

#[cfg(feature = "metrics")]
mod metrics_recorder {
    //! A recorder that sums what is recorded under each name and labels
    //! (`name{label=value,...}`); gauges keep their value and the highest it reached.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    type Values = Arc<Mutex<HashMap<String, f64>>>;

    #[derive(Default, Clone)]
    pub struct TestRecorder(Values);

    struct Slot(Values, String);

    impl Slot {
        fn add(&self, n: f64) {
            let mut values = self.0.lock().unwrap();
            let value = values.entry(self.1.clone()).or_default();
            *value += n;
            let value = *value;
            let high = values.entry(format!("{}:max", self.1)).or_default();
            *high = high.max(value);
        }
    }

    impl metrics::CounterFn for Slot {
        fn increment(&self, n: u64) {
            self.add(n as f64);
        }
        fn absolute(&self, _: u64) {}
    }

    impl metrics::GaugeFn for Slot {
        fn increment(&self, n: f64) {
            self.add(n);
        }
        fn decrement(&self, n: f64) {
            self.add(-n);
        }
        fn set(&self, _: f64) {}
    }

    impl metrics::HistogramFn for Slot {
        fn record(&self, _: f64) {
            self.add(1.0);
        }
    }

    impl TestRecorder {
        fn slot(&self, key: &metrics::Key) -> Arc<Slot> {
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            Arc::new(Slot(self.0.clone(), name))
        }

        pub fn get(&self, name: &str) -> f64 {
            self.0.lock().unwrap().get(name).copied().unwrap_or(0.0)
        }
    }

    impl metrics::Recorder for TestRecorder {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            metrics::Counter::from_arc(self.slot(key))
        }
        fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::from_arc(self.slot(key))
        }
        fn register_histogram(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::from_arc(self.slot(key))
        }
    }
}

/// The consumer's metrics equal what the run's deliveries produced: per outcome, per
/// dead-letter reason, no settle failure, and nothing left in flight.
#[cfg(feature = "metrics")]
#[tokio::test] // one thread: the recorder is this thread's own
async fn consumer_metrics_count_what_the_deliveries_produced() {
    let recorder = metrics_recorder::TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    idem::metrics::describe();
    let pool = database().await;
    let queue = MemoryQueue::new();
    for i in 0..6 {
        publish(&queue, &credit(&format!("m{i}"), 1, 1));
    }
    publish(&queue, &credit("m1", 1, 1)); // duplicates
    publish(&queue, &credit("m4", 1, 1));
    queue.publish(b"[1,".to_vec()); // undecodable
    publish(&queue, &credit("", 1, 1)); // a bad key
    let poison = Credit {
        fail: true,
        ..credit("poison", 2, 1)
    };
    publish(&queue, &poison); // fails 3 times, dead-lettered on its 4th delivery
    let counts = drain(consumer(&pool).batch(4).max_deliveries(3), &queue).await;
    assert_eq!(
        (
            counts.applied,
            counts.duplicate,
            counts.failed,
            counts.dead_lettered
        ),
        (6, 2, 3, 3)
    );
    let settled =
        |outcome: &str| recorder.get(&format!("idem_consumer_settled_total{{outcome={outcome}}}"));
    assert_eq!(settled("applied"), 6.0);
    assert_eq!(settled("duplicate"), 2.0);
    assert_eq!(settled("failed"), 3.0);
    assert_eq!(settled("dead_lettered"), 3.0);
    assert_eq!(settled("requeued"), 0.0);
    let dead = |reason: &str| {
        recorder.get(&format!(
            "idem_consumer_dead_lettered_total{{reason={reason}}}"
        ))
    };
    assert_eq!(dead("undecodable"), 1.0);
    assert_eq!(dead("bad_key"), 1.0);
    assert_eq!(dead("too_many_deliveries"), 1.0);
    assert_eq!(recorder.get("idem_consumer_settle_failures_total{}"), 0.0);
    assert_eq!(recorder.get("idem_consumer_store_pauses_total{}"), 0.0);
    // 11 deliveries taken in batches of up to 4: some were in flight at once, none is left.
    assert_eq!(recorder.get("idem_consumer_in_flight{}"), 0.0);
    assert!(recorder.get("idem_consumer_in_flight{}:max") >= 2.0);
    // The broker agrees.
    assert_eq!(queue.acked(), 8);
    assert_eq!(queue.dead_letters().len(), 3);
    assert_state(&pool, &[(1, 6)], 6).await;
}

/// A run whose future is dropped mid-batch (here by a time-out; a `select!` does the same)
/// takes what it had taken off the in-flight gauge: the gauge counts deliveries, not runs
/// that ended badly. Nothing of the dropped batch committed.
#[cfg(feature = "metrics")]
#[tokio::test] // one thread: the recorder is this thread's own
async fn a_dropped_run_leaves_nothing_in_the_in_flight_gauge() {
    let recorder = metrics_recorder::TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    idem::metrics::describe();
    let pool = database().await;
    let queue = MemoryQueue::new();
    for i in 0..6 {
        let slow = Credit {
            sleep_ms: 60_000,
            ..credit(&format!("s{i}"), 1, 1)
        };
        publish(&queue, &slow);
    }
    let run = drain(consumer(&pool).batch(2).concurrency(2), &queue);
    let ended = tokio::time::timeout(Duration::from_millis(300), run).await;
    assert!(
        ended.is_err(),
        "the handlers sleep a minute: the run was cut"
    );
    assert!(
        recorder.get("idem_consumer_in_flight{}:max") >= 4.0,
        "two batches of two were in flight"
    );
    assert_eq!(recorder.get("idem_consumer_in_flight{}"), 0.0);
    assert_eq!(queue.acked(), 0);
    assert_eq!(records(&pool).await, 0);
    assert!(balances(&pool).await.is_empty());
}

/// `tokio::spawn` needs the loop's future to be `Send`: this one runs a consumer on a spawned
/// task and checks what it did; [`spawnable`] checks the same of every broker's deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_runs_on_a_spawned_task() {
    let pool = database().await;
    let queue = MemoryQueue::new();
    for i in 0..20 {
        publish(&queue, &credit(&format!("s{i}"), 1, 1));
        if i % 4 == 0 {
            publish(&queue, &credit(&format!("s{i}"), 1, 1));
        }
    }
    let batched = tokio::spawn({
        let (pool, queue) = (pool.clone(), queue.clone());
        async move { drain(consumer(&pool).batch(5), &queue).await }
    });
    let counts = batched.await.unwrap();
    assert_eq!((counts.applied, counts.duplicate), (20, 5));
    assert_state(&pool, &[(1, 20)], 20).await;
    assert_eq!((queue.acked(), queue.open()), (25, 0));

    // Lease mode (`run_each`), on a spawned task too.
    let leased_queue = MemoryQueue::new();
    publish(&leased_queue, &credit("l1", 2, 7));
    publish(&leased_queue, &credit("l1", 2, 7));
    let each = tokio::spawn({
        let (pool, queue) = (pool.clone(), leased_queue.clone());
        async move { drain_leased(consumer(&pool), &queue).await }
    });
    let counts = each.await.unwrap();
    assert_eq!((counts.applied, counts.duplicate), (1, 1));
    assert_eq!(balances(&pool).await, vec![(1, 20), (2, 7)]);
    assert_eq!((leased_queue.acked(), leased_queue.open()), (2, 0));
}

/// Compile-time checks: `idem::batch`, a consumer on each broker's deliveries, and an outbox
/// relay to each broker can be `tokio::spawn`ed (as the README shows). These functions are never called; the
/// test binary does not build if one of them stops compiling.
#[allow(dead_code)]
mod spawnable {
    use super::*;

    fn spawn_on<S, D, SE>(pool: SqlitePool, deliveries: S)
    where
        S: futures_util::Stream<Item = Result<D, SE>> + Send + 'static,
        D: idem::consume::Delivery + Send + 'static,
        SE: std::fmt::Display + Send + 'static,
    {
        tokio::spawn(async move {
            consumer(&pool)
                .run(
                    deliveries,
                    idem::consume::json::<Credit>,
                    async |b, msg| apply(b, msg).await,
                    std::future::pending(),
                )
                .await
        });
    }

    fn batch_alone(pool: SqlitePool, messages: Vec<Credit>) {
        tokio::spawn(async move {
            idem::batch(&pool, &messages, async |b, msg| apply(b, msg).await).await
        });
    }

    fn relay_to<P: idem::outbox::Publisher + Send + 'static>(pool: SqlitePool, publisher: P) {
        let relay = idem::outbox::Relay::new(pool, publisher);
        tokio::spawn(relay.run(std::future::pending()));
    }

    /// Any adapter's deliveries, and its `close`, run on tasks of their own.
    fn spawn_source<S: idem::consume::Source>(pool: SqlitePool, source: S) {
        spawn_on(pool, source.deliveries());
        tokio::spawn(source.close());
    }

    #[cfg(feature = "rabbitmq")]
    fn rabbitmq(
        pool: SqlitePool,
        source: idem::rabbitmq::Source,
        publisher: idem::rabbitmq::OutboxPublisher,
    ) {
        spawn_source(pool.clone(), source);
        relay_to(pool, publisher);
    }

    #[cfg(feature = "nats")]
    fn nats(pool: SqlitePool, source: idem::nats::Source, publisher: idem::nats::OutboxPublisher) {
        spawn_source(pool.clone(), source);
        relay_to(pool, publisher);
    }

    #[cfg(feature = "redis")]
    fn redis(
        pool: SqlitePool,
        source: idem::redis::Source,
        publisher: idem::redis::OutboxPublisher,
    ) {
        spawn_source(pool.clone(), source);
        relay_to(pool, publisher);
    }

    #[cfg(feature = "kafka")]
    fn kafka(
        pool: SqlitePool,
        source: idem::kafka::Source,
        publisher: idem::kafka::OutboxPublisher,
    ) {
        spawn_source(pool.clone(), source);
        relay_to(pool, publisher);
    }

    fn memory(pool: SqlitePool, queue: idem::consume::memory::MemoryQueue) {
        spawn_source(pool, queue);
    }
}

/// Health: a handler stuck in one batch past the bound (`stuck_after`) makes the consumer not
/// live, saying for how long; it is live again once the handler returns, and ready all the
/// while (its database answers; the memory queue is always connected). Every message is
/// applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stuck_past_the_bound_is_not_live_until_it_returns() {
    use idem::consume::{NotLive, NotReady};
    use tokio::sync::{watch, Notify};

    let pool = database().await;
    let queue = MemoryQueue::new();
    for (id, amount) in [("before", 1), ("stuck", 10), ("after", 100)] {
        publish(&queue, &credit(id, 7, amount));
    }
    let bound = Duration::from_millis(300);
    let consumer = Consumer::new(pool.clone())
        .health_of(&queue)
        .health_every(Duration::from_millis(100))
        .stuck_after(bound);
    let health = consumer.health();
    assert_eq!(health.ready(), Err(NotReady::NotStarted));
    assert_eq!(health.live(), Ok(()), "nothing is stuck before the run");

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let entered = Arc::new(Notify::new());
    let (release, released) = watch::channel(false);
    let handler = {
        let entered = entered.clone();
        async move |b: &mut Batch<Sqlite>, msg: &Credit| {
            if msg.id == "stuck" {
                entered.notify_one();
                let _ = released.clone().wait_for(|go| *go).await;
            }
            apply(b, msg).await
        }
    };
    let run = tokio::spawn(consumer.run(
        queue.deliveries(),
        idem::consume::json::<Credit>,
        handler,
        async {
            let _ = stopped.await;
        },
    ));
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the stuck message's handler runs");

    let stuck = wait_for(|| health.live().err()).await;
    match stuck {
        NotLive::Stuck { running, bound: b } => {
            assert_eq!(b, bound);
            assert!(running > bound, "{running:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stuck.to_string().starts_with("stuck: a batch has run for"));
    wait_for(|| health.ready().ok()).await;

    release.send(true).unwrap();
    queue.idle().await;
    wait_for(|| health.live().ok()).await;
    let _ = stop.send(());
    let counts = run.await.unwrap();
    assert_eq!((counts.applied, counts.failed), (3, 0), "{counts:?}");
    assert_eq!(balances(&pool).await, vec![(7, 111)]);
    assert_eq!(records(&pool).await, 3);
    assert_eq!(queue.acked(), 3);
    assert_eq!(health.live(), Err(NotLive::Stopped));
    assert_eq!(health.ready(), Err(NotReady::Stopped));
}

/// Polls `check` every 10 ms until it gives a value (at most 30 s: a bug fails, not hangs).
async fn wait_for<T>(mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up after 30 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

//! The metrics (feature `metrics`), recorded with a test recorder: the counters equal the
//! outcomes the rule's deliveries returned, by scope and outcome; the gauges
//! (`idem::gauges::Gauges`) equal what waits in the database and in a queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use idem::admin::{Admin, DeadLetterAdmin, OutboxAdmin};
use idem::consume::memory::MemoryQueue;
use idem::consume::{Delivery as _, Settle};
use idem::gauges::Gauges;
use idem::recover::RecoveryStore;
use idem::store::{Attempts, Leases, Stamps};
use idem::Outcome;

use crate::backends::unique_name;
use crate::options::{conflict, counted, fingerprinted, leased, msg, replayed, setup, Runs};
use crate::rules::gauges::{dead, failure, mark_sent, origin, outbox_row};
use crate::Backend;

type Totals = Arc<Mutex<HashMap<String, u64>>>;
type Values = Arc<Mutex<HashMap<String, f64>>>;

/// A recorder that keeps every counter's total, every histogram's number of samples and every
/// gauge's value, by name and sorted labels (`name{label=value,...}`).
#[derive(Default)]
pub struct TestRecorder(Totals, Values);

struct Slot(Totals, String);

/// A gauge's value.
struct Level(Values, String);

impl Level {
    fn change(&self, f: impl FnOnce(f64) -> f64) {
        let mut values = self.0.lock().unwrap();
        let value = values.entry(self.1.clone()).or_default();
        *value = f(*value);
    }
}

impl metrics::GaugeFn for Level {
    fn increment(&self, by: f64) {
        self.change(|v| v + by);
    }
    fn decrement(&self, by: f64) {
        self.change(|v| v - by);
    }
    fn set(&self, to: f64) {
        self.change(|_| to);
    }
}

impl Slot {
    fn add(&self, n: u64) {
        *self.0.lock().unwrap().entry(self.1.clone()).or_default() += n;
    }
}

impl metrics::CounterFn for Slot {
    fn increment(&self, n: u64) {
        self.add(n);
    }
    fn absolute(&self, _: u64) {}
}

impl metrics::HistogramFn for Slot {
    fn record(&self, _: f64) {
        self.add(1);
    }
}

/// `name{label=value,...}`, the labels sorted.
fn full_name(key: &metrics::Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl TestRecorder {
    fn slot(&self, key: &metrics::Key) -> Arc<Slot> {
        Arc::new(Slot(self.0.clone(), full_name(key)))
    }

    /// A counter's total, or a histogram's samples (0 if never recorded).
    pub fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    /// A gauge's value, if it was ever set.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.1.lock().unwrap().get(name).copied()
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
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(Level(self.1.clone(), full_name(key))))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.slot(key))
    }
}

/// Deliveries with known outcomes on four handlers; every `idem_messages_total` counter equals
/// the outcomes returned, each claim and each delivery is timed once, and `idem::retry` counts
/// its retries under the scope of the handler it retried.
pub async fn counts_equal_the_outcomes<B: Backend<Db: Stamps + Leases + Attempts>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let recorder = TestRecorder::default();
    // Thread-local: the rule runs on the test's thread (`block_on`), and so do its deliveries.
    let _guard = metrics::set_default_local_recorder(&recorder);
    idem::metrics::describe();
    let pool = &k.pool;
    assert!(fingerprinted(pool, &msg("k", "a"), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    let dup = fingerprinted(pool, &msg("k", "a"), &runs, &d).await;
    assert_eq!(dup.unwrap(), Outcome::Duplicate);
    conflict(fingerprinted(pool, &msg("k", "b"), &runs, &d).await);
    assert!(counted(pool, &msg("m", "a").failing(), &runs, &d)
        .await
        .is_err());
    assert!(counted(pool, &msg("m", "a"), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    assert!(replayed(pool, &msg("r", "a"), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    for _ in 0..2 {
        let again = replayed(pool, &msg("r", "a"), &runs, &d).await.unwrap();
        assert!(matches!(again, Outcome::Replayed(_)));
    }
    assert!(leased(pool, &msg("l", "a"), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    // `retry`: a transient failure (the pool timed out) once, then the duplicate.
    let mut calls = 0;
    let retried = idem::retry(idem::RetryPolicy::default(), || {
        calls += 1;
        let first = calls == 1;
        let (runs, d) = (runs.clone(), d);
        async move {
            let done = leased(pool, &msg("l", "a"), &runs, &d).await;
            if first {
                return Err(idem::Error::Store(sqlx::Error::PoolTimedOut));
            }
            done
        }
    })
    .await;
    assert!(matches!(retried.unwrap(), Outcome::Replayed(_)));

    let total = |scope: &str, outcome: &str| {
        recorder.get(&format!(
            "idem_messages_total{{outcome={outcome},scope=options::{scope}}}"
        ))
    };
    assert_eq!(total("fingerprinted", "applied"), 1);
    assert_eq!(total("fingerprinted", "duplicate"), 1);
    assert_eq!(total("fingerprinted", "conflict"), 1);
    assert_eq!(total("counted", "failed"), 1);
    assert_eq!(total("counted", "applied"), 1);
    assert_eq!(total("replayed", "applied"), 1);
    assert_eq!(total("replayed", "replayed"), 2);
    assert_eq!(total("leased", "applied"), 1);
    assert_eq!(
        total("leased", "replayed"),
        2,
        "both calls of `retry` delivered"
    );
    assert_eq!(
        recorder.get("idem_claim_duration_seconds{scope=options::fingerprinted}"),
        3
    );
    assert_eq!(
        recorder.get("idem_handle_duration_seconds{outcome=applied,scope=options::counted}"),
        1
    );
    assert_eq!(
        recorder.get("idem_retries_total{reason=store,scope=options::leased}"),
        1,
        "the retry is counted under the scope it retried"
    );
    // Nothing to purge: the counter is still reported, at 0.
    idem::retention::purge_expired(pool, 100).await.unwrap();
    assert_eq!(recorder.get("idem_purged_records_total{}"), 0);
    assert_eq!(runs.get(), 5);
    k.close().await;
}

/// A round of [`Gauges::update`] sets each gauge to what waits: the outbox's pending rows and
/// the age of the oldest per destination (between the database's now before and after the
/// round), parked retries per consumer, open dead letters per consumer, scope and reason, and
/// a watched queue's undelivered and unacked messages. After the backlog was sent, the dead
/// letter discarded and the queue consumed, the next round sets those gauges to 0 (not left at
/// their last value), and a part that keeps waiting keeps its value.
pub async fn gauges_publish_what_waits_and_zero_what_is_gone<
    B: Backend<Db: OutboxAdmin + DeadLetterAdmin + RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let recorder = TestRecorder::default();
    // Thread-local: the rule runs on the test's thread (`block_on`), and so does `update`.
    let _guard = metrics::set_default_local_recorder(&recorder);
    idem::metrics::describe();
    let run = unique_name("gauges");
    let consumer = unique_name("gauges-consumer");
    let origin = origin();
    let mut pending = Vec::new();
    for n in 0..3 {
        pending.push(outbox_row(&k, &format!("{run}-x{n}"), "payments").await);
    }
    outbox_row(&k, &format!("{run}-y"), "shipping").await;
    B::Db::park(
        &k.pool,
        &failure(&consumer, &origin, "e"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let letter = dead(
        failure(&consumer, &origin, "boom"),
        Some("billing"),
        "poisoned",
    );
    let dead_id = B::Db::bury(&k.pool, &letter, None).await.unwrap().unwrap();
    let queue = MemoryQueue::named("orders");
    for n in 0..5_u8 {
        queue.publish(vec![n]);
    }
    let mut deliveries = queue.deliveries();
    let taken = deliveries.next().await.unwrap().unwrap();

    let mut gauges = Gauges::new(k.pool.clone()).lag_of(&queue);
    let before = B::Db::now_ms(&k.pool).await.unwrap();
    gauges.update().await.unwrap();
    let after = B::Db::now_ms(&k.pool).await.unwrap();
    let gauge = |name: &str| {
        recorder
            .gauge(name)
            .unwrap_or_else(|| panic!("{name} was never set"))
    };
    let payments = "{destination=payments}";
    assert_eq!(gauge(&format!("idem_outbox_pending{payments}")), 3.0);
    assert_eq!(gauge("idem_outbox_pending{destination=shipping}"), 1.0);
    let backlog = B::Db::outbox_backlog(&k.pool).await.unwrap();
    let age = gauge(&format!("idem_outbox_oldest_pending_age_seconds{payments}"));
    let (least, most) = (
        backlog[0].age_ms(before) as f64 / 1000.0,
        backlog[0].age_ms(after) as f64 / 1000.0,
    );
    assert!((least..=most).contains(&age), "{age} in {least}..={most}");
    let parked = format!("idem_parked_retries{{consumer={consumer}}}");
    assert_eq!(gauge(&parked), 1.0);
    let dead_letters =
        format!("idem_dead_letters{{consumer={consumer},reason=poisoned,scope=billing}}");
    assert_eq!(gauge(&dead_letters), 1.0);
    let lag = "{broker=memory,group=,partition=,source=orders}";
    assert_eq!(gauge(&format!("idem_consumer_lag{lag}")), 4.0);
    assert_eq!(gauge(&format!("idem_consumer_unacked{lag}")), 1.0);

    mark_sent(&k, &pending).await;
    assert_eq!(B::Db::discard(&k.pool, &[dead_id]).await.unwrap(), 1);
    taken.settle(Settle::Ack).await.unwrap();
    for _ in 0..4 {
        let next = deliveries.next().await.unwrap().unwrap();
        next.settle(Settle::Ack).await.unwrap();
    }
    gauges.update().await.unwrap();
    assert_eq!(gauge(&format!("idem_outbox_pending{payments}")), 0.0);
    assert_eq!(
        gauge(&format!("idem_outbox_oldest_pending_age_seconds{payments}")),
        0.0
    );
    assert_eq!(gauge("idem_outbox_pending{destination=shipping}"), 1.0);
    assert_eq!(gauge(&parked), 1.0);
    assert_eq!(gauge(&dead_letters), 0.0);
    assert_eq!(gauge(&format!("idem_consumer_lag{lag}")), 0.0);
    assert_eq!(gauge(&format!("idem_consumer_unacked{lag}")), 0.0);
    assert_eq!(queue.acked(), 5);
    k.close().await;
}

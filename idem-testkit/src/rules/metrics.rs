//! The metrics (feature `metrics`), recorded with a test recorder: the counters equal the
//! outcomes the rule's deliveries returned, by scope and outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem::store::{Attempts, Leases, Stamps};
use idem::Outcome;

use crate::options::{conflict, counted, fingerprinted, leased, msg, replayed, setup, Runs};
use crate::Backend;

type Totals = Arc<Mutex<HashMap<String, u64>>>;

/// A recorder that keeps every counter's total and every histogram's number of samples, by
/// name and sorted labels (`name{label=value,...}`).
#[derive(Default)]
pub struct TestRecorder(Totals);

struct Slot(Totals, String);

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

    /// A counter's total, or a histogram's samples (0 if never recorded).
    pub fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
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
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
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

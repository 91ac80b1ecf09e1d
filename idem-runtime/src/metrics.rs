//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`). Nothing
//! is recorded until the application installs a recorder (a Prometheus exporter, say); call
//! [`describe`] once after installing it to register each metric's description and unit.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `idem_messages_total` | counter | `scope`, `outcome` |
//! | `idem_handle_duration_seconds` | histogram | `scope`, `outcome` |
//! | `idem_claim_duration_seconds` | histogram | `scope` |
//! | `idem_retries_total` | counter | `scope`, `reason` |
//! | `idem_purged_records_total` | counter | none |
//!
//! `outcome` is one of `applied`, `duplicate`, `stale`, `in_progress`, `replayed`, `poisoned`
//! ([`Outcome::as_str`](crate::Outcome::as_str)), `failed` (the handler's `Err`), `panicked`,
//! `conflict`, or `error` (a store, key or lease error). A key is never a label. In a batch
//! that splits around a failed body, the deliveries it runs again are counted again.
//! [`retry`](crate::retry)'s `scope` is the scope of the last delivery its failed attempt made
//! (empty if the attempt failed before any delivery began, or outside `#[idempotent]`).

use std::time::Duration;

use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};

/// Deliveries handled, by scope and outcome.
pub const MESSAGES_TOTAL: &str = "idem_messages_total";
/// Time from the start of a delivery to its outcome, by scope and outcome.
pub const HANDLE_DURATION_SECONDS: &str = "idem_handle_duration_seconds";
/// Time to claim a delivery (the decision in its transaction, or the lease), by scope.
pub const CLAIM_DURATION_SECONDS: &str = "idem_claim_duration_seconds";
/// Attempts [`retry`](crate::retry) made again, by scope (of the handler its failed attempt ran)
/// and reason (`store` or `handler`).
pub const RETRIES_TOTAL: &str = "idem_retries_total";
/// Records deleted by the retention purge.
pub const PURGED_RECORDS_TOTAL: &str = "idem_purged_records_total";

/// Registers the description and unit of every metric idem records, with the installed recorder.
///
/// ```
/// idem_runtime::metrics::describe(); // `idem::metrics::describe()`; without a recorder: nothing happens
/// ```
pub fn describe() {
    describe_counter!(
        MESSAGES_TOTAL,
        Unit::Count,
        "Deliveries handled by idempotent handlers, by scope and outcome"
    );
    describe_histogram!(
        HANDLE_DURATION_SECONDS,
        Unit::Seconds,
        "Time from the start of a delivery to its outcome"
    );
    describe_histogram!(
        CLAIM_DURATION_SECONDS,
        Unit::Seconds,
        "Time to claim a delivery in the database"
    );
    describe_counter!(
        RETRIES_TOTAL,
        Unit::Count,
        "Handler calls idem::retry made again after a transient error"
    );
    describe_counter!(
        PURGED_RECORDS_TOTAL,
        Unit::Count,
        "Idempotency records deleted by the retention purge"
    );
}

pub(crate) fn delivered(scope: &'static str, outcome: &'static str, took: Duration) {
    note_scope(scope);
    counter!(MESSAGES_TOTAL, "scope" => scope, "outcome" => outcome).increment(1);
    histogram!(HANDLE_DURATION_SECONDS, "scope" => scope, "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn claimed(scope: &'static str, took: Duration) {
    histogram!(CLAIM_DURATION_SECONDS, "scope" => scope).record(took.as_secs_f64());
}

tokio::task_local! {
    /// Within one attempt of [`retry`](crate::retry): the scope of the last delivery it made.
    static LAST_SCOPE: std::cell::Cell<&'static str>;
}

/// Notes `scope` as the last delivery's, for a [`retry`](crate::retry) around it.
fn note_scope(scope: &'static str) {
    let _ = LAST_SCOPE.try_with(|last| last.set(scope));
}

/// Runs one attempt of [`retry`](crate::retry), and gives the scope of the last delivery it made.
pub(crate) async fn attempt<F: std::future::Future>(call: F) -> (F::Output, &'static str) {
    LAST_SCOPE
        .scope(std::cell::Cell::new(""), async {
            let output = call.await;
            (output, LAST_SCOPE.with(std::cell::Cell::get))
        })
        .await
}

pub(crate) fn retried(scope: &'static str, reason: &'static str) {
    counter!(RETRIES_TOTAL, "scope" => scope, "reason" => reason).increment(1);
}

pub(crate) fn purged(records: u64) {
    counter!(PURGED_RECORDS_TOTAL).increment(records);
}

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
//! | `idem_consumer_settled_total` | counter | `outcome` |
//! | `idem_consumer_dead_lettered_total` | counter | `reason` |
//! | `idem_consumer_settle_failures_total` | counter | none |
//! | `idem_consumer_store_pauses_total` | counter | none |
//! | `idem_consumer_in_flight` | gauge | none |
//! | `idem_consumer_parked_total` | counter | none |
//! | `idem_consumer_retries_taken_total` | counter | none |
//! | `idem_dead_letters_replayed_total` | counter | `to` |
//! | `idem_consumer_dead_letters_stored_total` | counter | `scope`, `reason` |
//! | `idem_outbox_pending` | gauge | `destination` |
//! | `idem_outbox_oldest_pending_age_seconds` | gauge | `destination` |
//! | `idem_parked_retries` | gauge | `consumer` |
//! | `idem_dead_letters` | gauge | `consumer`, `scope`, `reason` |
//! | `idem_consumer_lag` | gauge | `broker`, `source`, `group`, `partition` |
//! | `idem_consumer_unacked` | gauge | `broker`, `source`, `group`, `partition` |
//!
//! `outcome` is one of `applied`, `duplicate`, `stale`, `in_progress`, `replayed`, `poisoned`
//! ([`Outcome::as_str`](crate::Outcome::as_str)), `failed` (the handler's `Err`), `panicked`,
//! `conflict`, or `error` (a store, key or lease error). A key is never a label. In a batch
//! that splits around a failed body, the deliveries it runs again are counted again.
//! [`retry`](crate::retry)'s `scope` is the scope of the last delivery its failed attempt made
//! (empty if the attempt failed before any delivery began, or outside `#[idempotent]`).
//!
//! The `idem_consumer_*` metrics come from [`Consumer`](crate::consume::Consumer) runs, summed
//! over every consumer of the process, as its [`Counts`](crate::consume::Counts) are per run:
//! settled `outcome` is one of `applied`, `duplicate`, `stale`, `replayed` (acked),
//! `in_progress`, `failed` (requeued with a delay), `dead_lettered`, `requeued` (put back at
//! shutdown); dead-letter `reason` is
//! [`DeadLetterReason::as_str`](crate::consume::DeadLetterReason::as_str). In flight counts
//! deliveries taken from the broker and not yet settled.
//!
//! The last six are gauges of what waits, read from the database and the brokers by
//! [`Gauges`](crate::gauges::Gauges) on an interval (15 s by default), not counted on the
//! message path: the outbox's pending rows and the age of the oldest one per destination
//! ([`OutboxAdmin::outbox_backlog`](crate::admin::OutboxAdmin::outbox_backlog)), parked
//! retries per consumer and open dead letters per consumer, scope (empty where unknown) and
//! reason ([`DeadLetterAdmin::recovery_counts`](crate::admin::DeadLetterAdmin::recovery_counts)),
//! and each watched source's [`Lag`](crate::consume::Lag) (`partition` empty but on Kafka;
//! `group` empty on RabbitMQ; `unacked` only where the broker tells it). A label set that has
//! nothing left (a destination whose backlog was sent) is set to 0, not left at its last value.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};

use crate::consume::Settle;

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

/// Deliveries a consumer settled (or tried to), by `outcome`.
pub const CONSUMER_SETTLED_TOTAL: &str = "idem_consumer_settled_total";
/// Deliveries a consumer dead-lettered, by `reason`.
pub const CONSUMER_DEAD_LETTERED_TOTAL: &str = "idem_consumer_dead_lettered_total";
/// Settlements that did not reach the broker (the redelivery will be a duplicate).
pub const CONSUMER_SETTLE_FAILURES_TOTAL: &str = "idem_consumer_settle_failures_total";
/// Times a consumer's batch paused for the store to come back (never an attempt).
pub const CONSUMER_STORE_PAUSES_TOTAL: &str = "idem_consumer_store_pauses_total";
/// Deliveries taken from the broker and not yet settled.
pub const CONSUMER_IN_FLIGHT: &str = "idem_consumer_in_flight";
/// Failed deliveries a consumer parked in the database for a durable retry.
pub const CONSUMER_PARKED_TOTAL: &str = "idem_consumer_parked_total";
/// Parked retries a consumer took to run again.
pub const CONSUMER_RETRIES_TAKEN_TOTAL: &str = "idem_consumer_retries_taken_total";
/// Dead letters replayed through [`DeadLetterAdmin`](crate::admin::DeadLetterAdmin) (`idem
/// dead-letters replay`, or a service that replays through the same API), by `to` (`outbox` or
/// `consumer`): counted where the replay runs.
pub const DEAD_LETTERS_REPLAYED_TOTAL: &str = "idem_dead_letters_replayed_total";
/// Dead letters a consumer wrote to the database, by `scope` (empty where unknown, as for an
/// undecodable payload) and `reason`.
pub const CONSUMER_DEAD_LETTERS_STORED_TOTAL: &str = "idem_consumer_dead_letters_stored_total";

/// Outbox rows waiting for the relay, by `destination` ([`Gauges`](crate::gauges::Gauges)).
pub const OUTBOX_PENDING: &str = "idem_outbox_pending";
/// How long the oldest pending outbox row has waited, in seconds, by `destination`.
pub const OUTBOX_OLDEST_PENDING_AGE_SECONDS: &str = "idem_outbox_oldest_pending_age_seconds";
/// Failed deliveries parked for a durable retry, by `consumer`.
pub const PARKED_RETRIES: &str = "idem_parked_retries";
/// Open dead letters in the database (not replayed or discarded), by `consumer`, `scope` and
/// `reason`.
pub const DEAD_LETTERS: &str = "idem_dead_letters";
/// Messages of a source not yet given to its consumer, as the broker tells it
/// ([`Lag::undelivered`](crate::consume::Lag::undelivered)), by `broker`, `source`, `group` and
/// `partition`.
pub const CONSUMER_LAG: &str = "idem_consumer_lag";
/// Messages given to a source's consumer and not settled yet, where the broker tells it
/// ([`Lag::unacked`](crate::consume::Lag::unacked)), by `broker`, `source`, `group` and
/// `partition`.
pub const CONSUMER_UNACKED: &str = "idem_consumer_unacked";

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
    describe_counter!(
        CONSUMER_SETTLED_TOTAL,
        Unit::Count,
        "Deliveries a consumer settled with its broker, by outcome"
    );
    describe_counter!(
        CONSUMER_DEAD_LETTERED_TOTAL,
        Unit::Count,
        "Deliveries a consumer dead-lettered, by reason"
    );
    describe_counter!(
        CONSUMER_SETTLE_FAILURES_TOTAL,
        Unit::Count,
        "Settlements that did not reach the broker; the redelivery will be a duplicate"
    );
    describe_counter!(
        CONSUMER_STORE_PAUSES_TOTAL,
        Unit::Count,
        "Times a consumer paused a batch because the store did not answer"
    );
    describe_gauge!(
        CONSUMER_IN_FLIGHT,
        Unit::Count,
        "Deliveries taken from the broker and not yet settled"
    );
    describe_counter!(
        CONSUMER_PARKED_TOTAL,
        Unit::Count,
        "Failed deliveries parked in the database for a durable retry"
    );
    describe_counter!(
        CONSUMER_RETRIES_TAKEN_TOTAL,
        Unit::Count,
        "Parked retries taken to run again"
    );
    describe_counter!(
        DEAD_LETTERS_REPLAYED_TOTAL,
        Unit::Count,
        "Dead letters replayed, by where they were sent (outbox or consumer)"
    );
    describe_counter!(
        CONSUMER_DEAD_LETTERS_STORED_TOTAL,
        Unit::Count,
        "Dead letters written to the database, by scope and reason"
    );
    describe_gauge!(
        OUTBOX_PENDING,
        Unit::Count,
        "Outbox messages waiting for the relay, by destination"
    );
    describe_gauge!(
        OUTBOX_OLDEST_PENDING_AGE_SECONDS,
        Unit::Seconds,
        "How long the oldest outbox message waiting for the relay has waited, by destination"
    );
    describe_gauge!(
        PARKED_RETRIES,
        Unit::Count,
        "Failed deliveries parked in the database for a durable retry, by consumer"
    );
    describe_gauge!(
        DEAD_LETTERS,
        Unit::Count,
        "Open dead letters in the database, by consumer, scope and reason"
    );
    describe_gauge!(
        CONSUMER_LAG,
        Unit::Count,
        "Messages of a source not yet given to its consumer, as the broker tells it"
    );
    describe_gauge!(
        CONSUMER_UNACKED,
        Unit::Count,
        "Messages given to a consumer and not settled yet, as the broker tells it"
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

pub(crate) fn consumer_took() {
    gauge!(CONSUMER_IN_FLIGHT).increment(1.0);
}

pub(crate) fn consumer_left_flight(deliveries: usize) {
    gauge!(CONSUMER_IN_FLIGHT).decrement(deliveries as f64);
}

pub(crate) fn consumer_settled(outcome: &'static str, settle: &Settle) {
    counter!(CONSUMER_SETTLED_TOTAL, "outcome" => outcome).increment(1);
    if let Settle::DeadLetter { reason } = settle {
        counter!(CONSUMER_DEAD_LETTERED_TOTAL, "reason" => reason.as_str()).increment(1);
    }
}

pub(crate) fn consumer_settle_failed(settlements: u64) {
    counter!(CONSUMER_SETTLE_FAILURES_TOTAL).increment(settlements);
}

pub(crate) fn consumer_store_paused() {
    counter!(CONSUMER_STORE_PAUSES_TOTAL).increment(1);
}

pub(crate) fn consumer_parked() {
    counter!(CONSUMER_PARKED_TOTAL).increment(1);
}

pub(crate) fn consumer_retries_taken(rows: usize) {
    counter!(CONSUMER_RETRIES_TAKEN_TOTAL).increment(rows as u64);
}

pub(crate) fn dead_letter_replayed(to: &'static str) {
    counter!(DEAD_LETTERS_REPLAYED_TOTAL, "to" => to).increment(1);
}

pub(crate) fn consumer_dead_letter_stored(scope: Option<&'static str>, reason: &str) {
    let scope = scope.unwrap_or("");
    counter!(CONSUMER_DEAD_LETTERS_STORED_TOTAL, "scope" => scope, "reason" => reason.to_owned())
        .increment(1);
}

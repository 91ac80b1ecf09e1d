//! The consumer's side of [`Recovery`]: what it takes (a broker's delivery, or a parked retry
//! come due), how it takes due retries, and how a failed or given-up one is parked, put back
//! or kept as a dead letter before the broker is told. The loop (`consumer.rs`) calls these
//! only when recovery is on.

use std::sync::Arc;
use std::time::Duration;

use futures_core::future::BoxFuture;
use sqlx::Pool;
use tokio::time::Instant;

use crate::claim::Seen;
use crate::recover::{group_of, shape, Failure, NewDeadLetter, Origin, Parked, RecoveryStore};

use super::counts::Counts;
use super::delivery::Delivery;
use super::recovery::Recovery;
use super::settle::{Counted, DeadLetterReason, Settle};

/// One thing the consumer took: a delivery from the broker, or a parked retry.
pub(crate) enum Taken<D> {
    Broker(D),
    Parked(Parked),
}

impl<D: Delivery> Taken<D> {
    pub(crate) fn payload(&self) -> &[u8] {
        match self {
            Taken::Broker(delivery) => delivery.payload(),
            Taken::Parked(parked) => &parked.payload,
        }
    }

    /// The broker's delivery count (`max_deliveries`); a parked retry has its own bound.
    pub(crate) fn deliveries(&self) -> Option<u32> {
        match self {
            Taken::Broker(delivery) => delivery.deliveries(),
            Taken::Parked(_) => None,
        }
    }

    pub(crate) fn revoked(&self) -> bool {
        match self {
            Taken::Broker(delivery) => delivery.revoked(),
            Taken::Parked(_) => false,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Taken::Broker(delivery) => delivery.describe(),
            Taken::Parked(parked) => format!(
                "parked retry {} ({} {})",
                parked.id, parked.origin.source, parked.origin.coordinates
            ),
        }
    }
}

/// Why a delivery failed, as the loop saw it: the error's text and what its claim noted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Failed {
    pub(crate) error: String,
    pub(crate) seen: Option<Seen>,
}

/// The database's part of recovery, behind one object so that the loop needs no bound beyond
/// [`Store`](crate::store::Store) when recovery is off.
pub(crate) trait RecoveryOps<DB: sqlx::Database>: Send + Sync {
    fn park<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        failure: Failure<'a>,
        due_in: Duration,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;

    fn take_due<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Parked>, sqlx::Error>>;

    fn unpark<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        id: i64,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    fn unpark_in<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        id: i64,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    fn repark<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        parked: &'a Parked,
        attempts: u32,
        error: &'a str,
        due_in: Duration,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    fn release<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        parked: &'a Parked,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    fn bury<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        dead: NewDeadLetter<'a>,
        parked: Option<(i64, i64)>,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;

    fn last_error<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        scope: &'a str,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<String>, sqlx::Error>>;
}

/// [`RecoveryOps`] on a database's [`RecoveryStore`].
pub(crate) struct OnStore;

impl<DB: RecoveryStore> RecoveryOps<DB> for OnStore {
    fn park<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        failure: Failure<'a>,
        due_in: Duration,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move { DB::park(pool, &failure, due_in).await })
    }

    fn take_due<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        consumer: &'a str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> BoxFuture<'a, Result<Vec<Parked>, sqlx::Error>> {
        Box::pin(DB::take_due(pool, consumer, limit, lease, token))
    }

    fn unpark<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        id: i64,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = pool.acquire().await?;
            DB::unpark(&mut conn, id, token).await
        })
    }

    fn unpark_in<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        id: i64,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(DB::unpark(conn, id, token))
    }

    fn repark<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        parked: &'a Parked,
        attempts: u32,
        error: &'a str,
        due_in: Duration,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(DB::repark(
            pool,
            parked.id,
            parked.token,
            attempts,
            error,
            due_in,
        ))
    }

    fn release<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        parked: &'a Parked,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(DB::release_parked(pool, parked.id, parked.token))
    }

    fn bury<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        dead: NewDeadLetter<'a>,
        parked: Option<(i64, i64)>,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move { DB::bury(pool, &dead, parked).await })
    }

    fn last_error<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        scope: &'a str,
        key: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<String>, sqlx::Error>> {
        Box::pin(DB::last_error(pool, scope, key))
    }
}

/// A consumer's recovery: its settings, the database's part, and the token its takes hold
/// parked retries with.
#[derive(Clone)]
pub(crate) struct Recovering<DB: sqlx::Database> {
    pub(crate) settings: Recovery,
    pub(crate) ops: Arc<dyn RecoveryOps<DB>>,
    pub(crate) token: i64,
}

impl<DB: sqlx::Database> std::fmt::Debug for Recovering<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovering")
            .field("settings", &self.settings)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// What a failed message is, for a parked row or a dead letter: its bytes, headers, origin.
pub(crate) struct Described {
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) origin: Origin,
    pub(crate) first_failed_ms: Option<i64>,
}

impl Described {
    pub(crate) fn of_delivery<D: Delivery>(delivery: &D) -> Self {
        Described {
            payload: delivery.payload().to_vec(),
            headers: delivery.headers(),
            origin: delivery.origin(),
            first_failed_ms: None,
        }
    }

    pub(crate) fn of_parked(parked: &Parked) -> Self {
        Described {
            payload: parked.payload.clone(),
            headers: parked.headers.clone(),
            origin: parked.origin.clone(),
            first_failed_ms: Some(parked.first_failed_ms),
        }
    }

    pub(crate) fn failure<'a>(
        &'a self,
        consumer: &'a str,
        attempts: u32,
        error: &'a str,
    ) -> Failure<'a> {
        Failure {
            consumer,
            payload: &self.payload,
            headers: &self.headers,
            origin: &self.origin,
            attempts,
            error,
            first_failed_ms: self.first_failed_ms,
        }
    }
}

impl<DB: sqlx::Database> Recovering<DB> {
    /// Writes a dead letter of `described`; with `parked`, deletes that held row with it.
    /// `Ok(false)`: the parked row was no longer held (another consumer has it now).
    pub(crate) async fn bury(
        &self,
        pool: &Pool<DB>,
        described: &Described,
        reason: &str,
        failed: &Failed,
        attempts: u32,
        parked: Option<&Parked>,
    ) -> Result<bool, sqlx::Error> {
        let seen = failed.seen.as_ref();
        let scope = seen.map(|seen| seen.scope);
        let key = seen.map(|seen| seen.key.as_slice());
        // A poisoned message did not run this time: its last counted error says why it failed.
        let mut error = failed.error.clone();
        if let (Some(scope), Some(key)) = (scope, key) {
            if error.is_empty() || seen.is_some_and(|s| s.error.is_none()) {
                if let Ok(Some(last)) = self.ops.last_error(pool, scope, key).await {
                    error = last;
                }
            }
        }
        let shape = shape(&error);
        let group = group_of(&self.settings.name, scope, reason, &shape);
        let dead = NewDeadLetter {
            failure: described.failure(&self.settings.name, attempts, &error),
            reason,
            scope,
            key,
            shape: &shape,
            group: &group,
        };
        let held = parked.map(|p| (p.id, p.token));
        let buried = self.ops.bury(pool, dead, held).await?;
        #[cfg(feature = "metrics")]
        if buried.is_some() {
            crate::metrics::consumer_dead_letter_stored(scope, reason);
        }
        Ok(buried.is_some())
    }
}

impl<DB: sqlx::Database> Recovering<DB> {
    /// Takes up to `room` due parked retries (and at most the recovery's `take`); returns them
    /// and when to look again: at once after a full take, else after the poll interval.
    pub(crate) async fn take(&self, pool: &Pool<DB>, room: usize) -> (Vec<Parked>, Instant) {
        let recovery = self;
        let settings = &recovery.settings;
        let later = Instant::now() + settings.poll;
        let limit = (settings.take as usize).min(room).max(1) as u32;
        let taken = recovery
            .ops
            .take_due(pool, &settings.name, limit, settings.lease, recovery.token)
            .await;
        match taken {
            Ok(rows) => {
                #[cfg(feature = "metrics")]
                crate::metrics::consumer_retries_taken(rows.len());
                let again = if rows.len() as u32 >= limit {
                    Instant::now()
                } else {
                    later
                };
                (rows, again)
            }
            Err(err) => {
                tracing::warn!(error = %err, "taking due parked retries failed; trying again later");
                (Vec::new(), later)
            }
        }
    }

    /// Deletes a decided parked retry after its run committed, within `timeout`; `false`
    /// when that failed (its lease runs out, it runs again, and is a duplicate then).
    pub(crate) async fn unpark(&self, pool: &Pool<DB>, row: &Parked, timeout: Duration) -> bool {
        let deleted = tokio::time::timeout(timeout, self.ops.unpark(pool, row.id, row.token)).await;
        match deleted {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) => {
                tracing::warn!(parked = row.id, "a decided parked retry was taken over by another consumer before it was deleted");
                true
            }
            Ok(Err(err)) => {
                tracing::warn!(parked = row.id, error = %err, "deleting a decided parked retry failed; it runs again as a duplicate");
                false
            }
            Err(_) => {
                tracing::warn!(
                    parked = row.id,
                    "deleting a decided parked retry timed out; it runs again as a duplicate"
                );
                false
            }
        }
    }

    /// With recovery, what a broker's delivery settles as: a failure parked in the database
    /// is acked; a dead letter kept in the database is acked, or also sent to the broker's
    /// dead-letter place ([`DeadLetters::Both`](super::DeadLetters::Both)). When the database
    /// write fails, the broker keeps the message (requeued, or dead-lettered there).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn recover(
        &self,
        pool: &Pool<DB>,
        described: Described,
        deliveries: Option<u32>,
        name: &str,
        settle: Settle,
        counted: Counted,
        failed: &Failed,
        counts: &mut Counts,
        requeue_delay: Duration,
    ) -> Settle {
        let recovery = self;
        let settings = &recovery.settings;
        match settle {
            Settle::Requeue { delay } if counted == Counted::Failed => {
                let Some(backoff) = settings.retries else {
                    return Settle::Requeue { delay };
                };
                if !backoff.runs_left(1) {
                    let buried = recovery
                        .bury(pool, &described, "retries_exhausted", failed, 1, None)
                        .await;
                    return match buried {
                        Ok(_) => {
                            counts.dead_letters_stored += 1;
                            Settle::Ack
                        }
                        Err(err) => {
                            tracing::warn!(delivery = %name, error = %err, "keeping a dead letter failed; requeued");
                            Settle::Requeue { delay }
                        }
                    };
                }
                let due_in = backoff.delay(1, jitter());
                let failure = described.failure(&settings.name, 1, &failed.error);
                match recovery.ops.park(pool, failure, due_in).await {
                    Ok(_) => {
                        counts.parked += 1;
                        #[cfg(feature = "metrics")]
                        crate::metrics::consumer_parked();
                        Settle::Ack
                    }
                    Err(err) => {
                        tracing::warn!(delivery = %name, error = %err, "parking a failed delivery failed; requeued in place");
                        Settle::Requeue { delay }
                    }
                }
            }
            Settle::DeadLetter { reason } if settings.dead_letters.in_database() => {
                let attempts = match reason {
                    DeadLetterReason::Poisoned { attempts } => attempts,
                    DeadLetterReason::TooManyDeliveries { deliveries } => deliveries,
                    _ => deliveries.unwrap_or(1),
                };
                let buried = recovery
                    .bury(pool, &described, reason.as_str(), failed, attempts, None)
                    .await;
                match buried {
                    Ok(_) => {
                        counts.dead_letters_stored += 1;
                        if settings.dead_letters.in_broker() {
                            Settle::DeadLetter { reason }
                        } else {
                            Settle::Ack
                        }
                    }
                    Err(err) if settings.dead_letters.in_broker() => {
                        tracing::warn!(delivery = %name, error = %err, "keeping a dead letter in the database failed; the broker's dead-letter place has it");
                        Settle::DeadLetter { reason }
                    }
                    Err(err) => {
                        tracing::warn!(delivery = %name, error = %err, "keeping a dead letter in the database failed; requeued");
                        Settle::Requeue {
                            delay: requeue_delay,
                        }
                    }
                }
            }
            other => other,
        }
    }

    /// A parked retry after its run: a failure is parked again with the next backoff (or is
    /// a dead letter once its runs are used up), a lease held elsewhere comes back after the
    /// in-progress delay, a run cut short gives the row back, and a dead letter is kept in the
    /// database (deleting the row with it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn settle_parked(
        &self,
        pool: &Pool<DB>,
        row: Parked,
        settle: Settle,
        counted: Counted,
        failed: Failed,
        counts: &mut Counts,
        timeout: Duration,
    ) {
        let recovery = self;
        let ops = &recovery.ops;
        let failures = row.attempts.saturating_add(1);
        let outcome = match (settle, counted) {
            (Settle::Requeue { .. }, Counted::Failed) => {
                let backoff = recovery.settings.retries;
                match backoff.filter(|b| b.runs_left(failures)) {
                    Some(backoff) => {
                        let due_in = backoff.delay(failures, jitter());
                        ops.repark(pool, &row, failures, &failed.error, due_in)
                            .await
                            .map(drop)
                    }
                    None => {
                        let described = Described::of_parked(&row);
                        let reason = "retries_exhausted";
                        let buried = recovery
                            .bury(pool, &described, reason, &failed, failures, Some(&row))
                            .await;
                        if matches!(buried, Ok(true)) {
                            counts.dead_letters_stored += 1;
                        }
                        buried.map(drop)
                    }
                }
            }
            (Settle::Requeue { delay }, Counted::InProgress) => {
                let error = row.last_error.clone().unwrap_or_default();
                ops.repark(pool, &row, row.attempts, &error, delay)
                    .await
                    .map(drop)
            }
            (Settle::DeadLetter { reason }, _) => {
                let described = Described::of_parked(&row);
                let attempts = match reason {
                    DeadLetterReason::Poisoned { attempts } => attempts,
                    _ => failures,
                };
                let buried = recovery
                    .bury(
                        pool,
                        &described,
                        reason.as_str(),
                        &failed,
                        attempts,
                        Some(&row),
                    )
                    .await;
                if matches!(buried, Ok(true)) {
                    counts.dead_letters_stored += 1;
                }
                buried.map(drop)
            }
            (Settle::Ack, _) => {
                if !self.unpark(pool, &row, timeout).await {
                    counts.settle_failures += 1;
                }
                Ok(())
            }
            // Untried (shutdown, a cancelled batch, a store outage's time-out): back at once.
            _ => ops.release(pool, &row).await.map(drop),
        };
        if let Err(err) = outcome {
            counts.settle_failures += 1;
            tracing::warn!(parked = row.id, error = %err, "settling a parked retry failed; its lease runs out and it runs again");
        }
    }
}

/// A number from 0.0 to 1.0 for the backoff's jitter.
fn jitter() -> f64 {
    (crate::claim::random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

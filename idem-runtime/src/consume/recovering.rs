//! The consumer's side of [`Recovery`]: what it takes (a broker's delivery, or a parked retry
//! come due), and how a failed or given-up one is parked or kept as a dead letter before the
//! broker is told.

use std::sync::Arc;
use std::time::Duration;

use futures_core::future::BoxFuture;
use sqlx::Pool;

use crate::claim::Seen;
use crate::recover::{group_of, shape, Failure, NewDeadLetter, Origin, Parked, RecoveryStore};

use super::delivery::Delivery;
use super::recovery::Recovery;

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

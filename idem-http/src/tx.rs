//! [`RequestTx`]: the transaction an idempotent endpoint writes through, which commits with the
//! stored response.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;
use sqlx::{Database, Transaction};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

/// Where the layer keeps the request's transaction while the handler runs.
pub(crate) struct Slot<DB: Database>(pub(crate) Arc<Mutex<Option<Transaction<'static, DB>>>>);

impl<DB: Database> Clone for Slot<DB> {
    fn clone(&self) -> Self {
        Slot(Arc::clone(&self.0))
    }
}

impl<DB: Database> Slot<DB> {
    pub(crate) fn new(tx: Transaction<'static, DB>) -> Self {
        Slot(Arc::new(Mutex::new(Some(tx))))
    }

    /// The transaction back, once the handler has let go of it (`None` if a task it spawned
    /// still holds it).
    pub(crate) fn take(self) -> Option<Transaction<'static, DB>> {
        self.0.try_lock().ok()?.take()
    }
}

/// The request's transaction, for an axum handler behind an
/// [`IdempotencyLayer`](crate::IdempotencyLayer): what the handler writes here commits in one
/// transaction with the record of the `Idempotency-Key` and the response, or not at all.
///
/// Derefs to the database's connection, so queries run on `&mut *tx` as on an `sqlx`
/// transaction. The layer commits: a handler cannot commit or roll back itself, and must not
/// keep the value past its return (a task spawned with it makes the request fail with 500).
///
/// ```
/// use axum::Json;
/// use idem::http::RequestTx;
/// use sqlx::Sqlite;
///
/// async fn create(mut tx: RequestTx<Sqlite>, Json(amount): Json<i64>) -> Result<String, String> {
///     sqlx::query("INSERT INTO payments (amount) VALUES (?)")
///         .bind(amount)
///         .execute(&mut *tx)
///         .await
///         .map_err(|err| err.to_string())?;
///     Ok("created".into())
/// }
/// ```
pub struct RequestTx<DB: Database>(
    OwnedMappedMutexGuard<Option<Transaction<'static, DB>>, Transaction<'static, DB>>,
);

impl<DB: Database> Deref for RequestTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<DB: Database> DerefMut for RequestTx<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<DB: Database> std::fmt::Debug for RequestTx<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTx").finish_non_exhaustive()
    }
}

/// Why a handler could not have the request's transaction (500: a mistake in the server's code).
#[derive(Debug)]
pub enum RequestTxRejection {
    /// The route has no [`IdempotencyLayer`](crate::IdempotencyLayer) of this database.
    NoLayer,
    /// The handler asked for it twice.
    Taken,
}

impl std::fmt::Display for RequestTxRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestTxRejection::NoLayer => f.write_str(
                "RequestTx is extracted on a route without an IdempotencyLayer of the same database",
            ),
            RequestTxRejection::Taken => f.write_str("RequestTx is extracted twice in one request"),
        }
    }
}

impl std::error::Error for RequestTxRejection {}

impl IntoResponse for RequestTxRejection {
    fn into_response(self) -> Response {
        tracing::error!("{self}");
        crate::problem::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal server error",
            &self.to_string(),
        )
    }
}

impl<S: Send + Sync, DB: Database> FromRequestParts<S> for RequestTx<DB> {
    type Rejection = RequestTxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let slot = parts
            .extensions
            .get::<Slot<DB>>()
            .ok_or(RequestTxRejection::NoLayer)?;
        let guard: OwnedMutexGuard<_> = Arc::clone(&slot.0)
            .try_lock_owned()
            .map_err(|_| RequestTxRejection::Taken)?;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map(RequestTx)
            .map_err(|_| RequestTxRejection::Taken)
    }
}

//! One request through an [`IdempotencyLayer`](crate::IdempotencyLayer): key, principal and
//! fingerprint; the claim; the handler on the request's transaction; the stored response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::__private::{replayed, Begun, Claim, Held, Run};
use idem_runtime::store::{Leases, Stamps, Store};
use idem_runtime::{Error, Outcome};
use sqlx::Transaction;
use tower_service::Service;

use crate::key::{self, KeyProblem};
use crate::problem::{in_flight, problem};
use crate::settings::Settings;
use crate::stored::StoredResponse;
use crate::tx::Slot;

/// Why a handler's response was not kept (the claim's `Err`: its writes roll back, and in lease
/// mode the lease is given back).
#[derive(Debug)]
enum NotKept {
    /// A status the route does not store (5xx, by default).
    Status(StatusCode),
    /// A body over the route's limit, or one that failed while read.
    Body(String),
    /// A task the handler spawned still holds the request's transaction.
    TxHeld,
}

impl std::fmt::Display for NotKept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotKept::Status(status) => {
                write!(f, "the handler answered {status}, which is not stored")
            }
            NotKept::Body(why) => f.write_str(why),
            NotKept::TxHeld => {
                f.write_str("the handler kept the request's transaction past its return")
            }
        }
    }
}

type Done = Result<Outcome<StoredResponse>, Error<NotKept>>;

/// Where a claim left the request: the handler to run on this transaction, or an answer.
enum Started<DB: Store> {
    Run(Transaction<'static, DB>, Run<DB>),
    Done(Done),
}

impl<DB: Store> Started<DB> {
    fn from(begun: Begun<'_, 'static, DB, StoredResponse, NotKept>) -> Self {
        match begun {
            Begun::Run(Held::Own(tx), run) => Started::Run(tx, run),
            // A pool never claims in a batch's transaction.
            Begun::Run(Held::Batch { .. }, _) => Started::Done(Err(Error::Deferred)),
            Begun::Done(done) => Started::Done(done),
        }
    }
}

/// One request: its key and client, its body and fingerprint, the claim, then the handler on
/// the request's transaction and what is kept of its response ([`keep`]).
pub(crate) async fn handle<S, DB>(
    settings: Arc<Settings<DB>>,
    mut inner: S,
    request: Request,
) -> Result<Response, S::Error>
where
    S: Service<Request, Response = Response>,
    DB: Stamps + Leases,
{
    let (mut parts, body) = request.into_parts();
    let key = match key::parse(
        parts.headers.get_all(key::HEADER).iter(),
        settings.max_key_len,
    ) {
        Ok(Some(key)) => key,
        Ok(None) if !settings.required => {
            return plain(&settings, inner, Request::from_parts(parts, body)).await
        }
        Ok(None) => return Ok(bad_key(&KeyProblem::Missing)),
        Err(refused) => return Ok(bad_key(&refused)),
    };
    // After the key: a keyless request on a route where the key is optional needs no client.
    let Some(principal) = (settings.principal)(&parts) else {
        return Ok(problem(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "an idempotent endpoint scopes its keys by client, and this request names none",
        ));
    };
    let body = match read(Body::new(body), settings.max_request_bytes).await {
        Ok(body) => body,
        Err(failed) => return Ok(unreadable_request(failed)),
    };
    let claim = Claim::<DB>::new(settings.scope)
        .key(&(principal.as_str(), key.as_str()))
        .fingerprint(&(settings.fingerprint)(&parts, &body))
        .replay()
        .retention(settings.retention);
    let started = match settings.lease {
        Some(lease) => Started::from(
            claim
                .lease_mode()
                .lease(lease)
                .begin_lease(&settings.pool)
                .await,
        ),
        None => Started::from(claim.begin(settings.pool.clone()).await),
    };
    let (tx, run) = match started {
        Started::Run(tx, run) => (tx, run),
        Started::Done(done) => {
            let done = replayed::<Result<StoredResponse, NotKept>>(done);
            return Ok(answer::<DB>(&settings, done));
        }
    };
    let slot = Slot::new(tx);
    parts.extensions.insert(slot.clone());
    parts.extensions.insert(run.context().clone());
    let response = inner
        .call(Request::from_parts(parts, Body::from(body)))
        .await;
    let Some(tx) = slot.take() else {
        // The handler's task still holds the transaction: it rolls back when that task drops
        // it; a lease is left to expire.
        tracing::error!(scope = settings.scope, "{}", NotKept::TxHeld);
        return Ok(internal(&NotKept::TxHeld.to_string()));
    };
    match response {
        Ok(response) => Ok(keep(&settings, run, tx, response).await),
        Err(err) => {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            let not_kept = Err::<StoredResponse, _>(NotKept::Status(status));
            let _ = run.finish(Held::Own(tx), not_kept).await;
            Err(err)
        }
    }
}

/// After the handler: its response stored with its writes in one commit, or (a status the route
/// does not store, a body over the limit) both rolled back.
async fn keep<DB: Stamps + Leases>(
    settings: &Settings<DB>,
    mut run: Run<DB>,
    tx: Transaction<'static, DB>,
    response: Response,
) -> Response {
    let (head, body) = response.into_parts();
    if !(settings.store_when)(head.status) {
        let not_kept = Err::<StoredResponse, _>(NotKept::Status(head.status));
        let _ = run.finish(Held::Own(tx), not_kept).await;
        return Response::from_parts(head, body);
    }
    let body = match read(body, settings.max_response_bytes).await {
        Ok(body) => body,
        Err(limit) => {
            let why = match limit {
                Some(limit) => format!(
                    "the response body is over the {limit} bytes this endpoint stores for a retry; the request's writes were rolled back and nothing was stored"
                ),
                None => "the response body failed while it was read; the request's writes were rolled back and nothing was stored".to_owned(),
            };
            let not_kept = Err::<StoredResponse, _>(NotKept::Body(why.clone()));
            let _ = run.finish(Held::Own(tx), not_kept).await;
            tracing::error!(scope = settings.scope, "{why}");
            return internal(&why);
        }
    };
    let stored = StoredResponse::capture(head.status, &head.headers, &body, &settings.kept_headers);
    let stored = Ok::<_, NotKept>(stored);
    run.encode(&stored);
    match run.finish(Held::Own(tx), stored).await {
        Ok(_) => Response::from_parts(head, Body::from(body)),
        Err(err) => answer::<DB>(settings, Err(err)),
    }
}

/// A request without a key on a route where it is optional: the handler on a transaction of its
/// own, committed when its response would have been stored.
async fn plain<S, DB>(
    settings: &Settings<DB>,
    mut inner: S,
    mut request: Request,
) -> Result<Response, S::Error>
where
    S: Service<Request, Response = Response>,
    DB: Store,
{
    let tx = match settings.pool.begin().await {
        Ok(tx) => tx,
        Err(err) => return Ok(store_failed::<DB>(&err)),
    };
    let slot = Slot::new(tx);
    request.extensions_mut().insert(slot.clone());
    let response = inner.call(request).await?;
    let Some(tx) = slot.take() else {
        return Ok(internal(&NotKept::TxHeld.to_string()));
    };
    if (settings.store_when)(response.status()) {
        if let Err(err) = tx.commit().await {
            return Ok(store_failed::<DB>(&err));
        }
    }
    Ok(response)
}

/// Reads a body up to `limit` bytes: `Err(Some(limit))` when it is longer, `Err(None)` when it
/// fails.
async fn read(body: Body, limit: usize) -> Result<Bytes, Option<usize>> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(Some(limit)),
        Err(_) => Err(None),
    }
}

/// The response to a request that did not run the handler, or whose commit failed.
fn answer<DB: Store>(settings: &Settings<DB>, done: Done) -> Response {
    match done {
        Ok(Outcome::Replayed(stored)) => stored.replay().unwrap_or_else(|| {
            internal("the stored response of this key no longer makes a response")
        }),
        Ok(Outcome::InProgress) | Err(Error::LeaseLost) => in_flight(settings.retry_after),
        Ok(Outcome::Duplicate) => problem(
            StatusCode::CONFLICT,
            "This Idempotency-Key was used before",
            "its response was not kept; send the request with a new key",
        ),
        Err(Error::Conflict { .. }) => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "This Idempotency-Key was used with another request",
            "the key was first sent with another method, path or body; a new request needs a new key",
        ),
        Err(Error::Key(refused)) => problem(StatusCode::BAD_REQUEST, "Invalid Idempotency-Key", &refused.to_string()),
        Err(Error::Store(err)) => store_failed::<DB>(&err),
        Err(Error::Replay { problem: why, .. }) => {
            tracing::error!(scope = settings.scope, "{why}");
            internal(&format!("{why}; the request's writes were rolled back and nothing was stored"))
        }
        Err(Error::Handler(not_kept)) => internal(&not_kept.to_string()),
        Ok(other) => internal(&format!("unexpected outcome `{}`", other.as_str())),
        Err(other) => internal(&format!("{other}")),
    }
}

/// A request body over the route's limit (413), or one that failed while read (400).
fn unreadable_request(failed: Option<usize>) -> Response {
    match failed {
        Some(limit) => problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large",
            &format!("this endpoint reads at most {limit} bytes of a request body"),
        ),
        None => problem(
            StatusCode::BAD_REQUEST,
            "Unreadable request body",
            "the request body could not be read",
        ),
    }
}

fn bad_key(refused: &KeyProblem) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "Invalid Idempotency-Key",
        &refused.to_string(),
    )
}

fn internal(detail: &str) -> Response {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Internal server error",
        detail,
    )
}

/// The database failed: 503 with `Retry-After` when the backend calls the error transient (a
/// retry may succeed), else 500. Either way nothing was committed, or the commit's result is
/// unknown and a retry finds out (the stored response, or a new run).
fn store_failed<DB: Store>(err: &sqlx::Error) -> Response {
    tracing::error!("idempotent endpoint: the database failed: {err}");
    if DB::is_transient(err) {
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Database unavailable",
            "the request was not completed; retry it with the same Idempotency-Key",
        );
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        response
    } else {
        internal("the database failed; retry the request with the same Idempotency-Key")
    }
}

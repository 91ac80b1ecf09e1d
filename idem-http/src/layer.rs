//! [`IdempotencyLayer`]: what a route adds to become idempotent, and how its settings are set.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderName, StatusCode};
use idem_runtime::store::{Leases, Stamps};
use sqlx::Pool;
use tower_layer::Layer;
use tower_service::Service;

use crate::key::DEFAULT_MAX_KEY_LEN;
use crate::settings::{
    Settings, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_RETENTION,
};
use crate::stored::DEFAULT_KEPT_HEADERS;

/// Makes the routes it wraps idempotent under the `Idempotency-Key` header
/// (draft-ietf-httpapi-idempotency-key-header), on the database of `pool`.
///
/// For a request with a new key, the handler runs on a [`RequestTx`](crate::RequestTx); its
/// writes, the record of the key and the response commit in one transaction. A retry with the
/// same key gets that response back without running the handler (`Idempotent-Replayed: true`);
/// the same key with another request (method, path or body) gets 422; a missing key 400 (unless
/// [`optional_key`](IdempotencyLayer::optional_key)); a malformed one 400. Which responses are
/// stored is in [`policy`](crate::policy).
///
/// Keys belong to a client: `principal` names who sent the request (from your authentication,
/// usually a request extension), and is part of the key's scope, so one client's key never
/// returns another's response. A request without a principal gets 401.
///
/// While the first request with a key runs, a second one waits on its row lock and then gets
/// its response. In [lease mode](IdempotencyLayer::lease) it gets 409 with `Retry-After` at once.
/// On SQLite the database has one writer: a request whose transaction has written (its claim,
/// in the transactional mode) holds it until its commit, and other requests wait for it
/// (`busy_timeout`); a database error that the backend calls transient is a 503 with
/// `Retry-After`, to be retried with the same key.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem::http::{IdempotencyLayer, RequestTx};
/// use sqlx::{Sqlite, SqlitePool};
///
/// async fn create(mut tx: RequestTx<Sqlite>, body: String) -> Result<String, String> {
///     sqlx::query("INSERT INTO notes (text) VALUES (?)")
///         .bind(&body)
///         .execute(&mut *tx)
///         .await
///         .map_err(|err| err.to_string())?;
///     Ok(format!("noted {body}"))
/// }
///
/// fn app(pool: SqlitePool) -> Router {
///     let client = |parts: &http::request::Parts| {
///         Some(parts.headers.get("x-client")?.to_str().ok()?.to_owned())
///     };
///     let idempotent = IdempotencyLayer::new(pool, "notes::create", client);
///     Router::new().route("/notes", post(create).layer(idempotent))
/// }
/// ```
pub struct IdempotencyLayer<DB: sqlx::Database> {
    settings: Arc<Settings<DB>>,
}

impl<DB: sqlx::Database> Clone for IdempotencyLayer<DB> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for IdempotencyLayer<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("scope", &s.scope)
            .field("required", &s.required)
            .field("lease", &s.lease)
            .field("retention", &s.retention)
            .field("max_key_len", &s.max_key_len)
            .field("max_request_bytes", &s.max_request_bytes)
            .field("max_response_bytes", &s.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl<DB: Stamps + Leases> IdempotencyLayer<DB> {
    /// A layer for the route(s) of `scope` (the name records are kept under, as a handler's
    /// scope: `idem show <scope> <key>` finds them), with keys scoped by `principal`.
    pub fn new(
        pool: Pool<DB>,
        scope: &'static str,
        principal: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                pool,
                scope,
                principal: Arc::new(principal),
                required: true,
                lease: None,
                retry_after: Duration::from_secs(1),
                retention: DEFAULT_RETENTION,
                fingerprint: Arc::new(crate::fingerprint::method_path_body),
                max_key_len: DEFAULT_MAX_KEY_LEN,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                kept_headers: DEFAULT_KEPT_HEADERS.to_vec(),
                store_when: crate::policy::stored_by_default,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings<DB>)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// A request without the header runs the handler as a plain request (its transaction
    /// commits when the response would be stored), instead of getting 400.
    pub fn optional_key(self) -> Self {
        self.with(|s| s.required = false)
    }

    /// Lease mode, for handlers with effects outside the database (a payment provider): the key
    /// is claimed and committed first with a lease of `lease`, so a concurrent request with the
    /// same key gets 409 at once; the handler's writes and the response commit when it returns.
    /// A server that dies mid-request leaves the lease to expire, then a retry runs the handler
    /// again: pass `idem::Context::derive` (an `Extension<idem::Context>`) to the provider as
    /// its idempotency key, so it does not charge twice.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|s| s.lease = Some(lease))
    }

    /// The `Retry-After` of a 409 (default 1 second, rounded up to whole seconds).
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|s| s.retry_after = after)
    }

    /// How long a key and its response are kept (default [`DEFAULT_RETENTION`]).
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|s| s.retention = retention)
    }

    /// What the fingerprint covers (default [`method_path_body`](crate::fingerprint::method_path_body)):
    /// a request with a stored key whose fingerprint differs gets 422. The bytes are hashed
    /// with SHA-256.
    pub fn fingerprint(
        self,
        fingerprint: impl Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.fingerprint = Arc::new(fingerprint))
    }

    /// The longest key accepted, in bytes (default 255).
    pub fn max_key_len(self, max: usize) -> Self {
        self.with(|s| s.max_key_len = max)
    }

    /// The largest request body read (default [`DEFAULT_MAX_REQUEST_BYTES`]); over it, 413.
    pub fn max_request_bytes(self, max: usize) -> Self {
        self.with(|s| s.max_request_bytes = max)
    }

    /// The largest response body stored (default [`DEFAULT_MAX_RESPONSE_BYTES`]). A handler
    /// whose response is larger gets its writes rolled back and the client a 500 that says so:
    /// nothing is half stored.
    pub fn max_response_bytes(self, max: usize) -> Self {
        self.with(|s| s.max_response_bytes = max)
    }

    /// Keeps this response header too (beyond `content-type`, `location`, `etag` and
    /// `content-language`).
    pub fn keep_header(self, name: HeaderName) -> Self {
        self.with(|s| s.kept_headers.push(name))
    }

    /// Which responses are stored (default [`stored_by_default`](crate::policy::stored_by_default)).
    /// The others roll the handler's writes back and are not stored.
    pub fn store_when(self, store: fn(StatusCode) -> bool) -> Self {
        self.with(|s| s.store_when = store)
    }
}

impl<S, DB: sqlx::Database> Layer<S> for IdempotencyLayer<DB> {
    type Service = Idempotent<S, DB>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service an [`IdempotencyLayer`] wraps around a route.
pub struct Idempotent<S, DB: sqlx::Database> {
    inner: S,
    settings: Arc<Settings<DB>>,
}

impl<S: Clone, DB: sqlx::Database> Clone for Idempotent<S, DB> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S, DB: sqlx::Database> std::fmt::Debug for Idempotent<S, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("scope", &self.settings.scope)
            .finish_non_exhaustive()
    }
}

impl<S, DB> Service<Request> for Idempotent<S, DB>
where
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    DB: Stamps + Leases,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone that was made ready is the one called (tower's documented pattern).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(crate::handle::handle(
            Arc::clone(&self.settings),
            inner,
            request,
        ))
    }
}

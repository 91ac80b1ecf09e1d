//! The settings of one idempotent route and their defaults, read by the request's path
//! (`handle`) and set by the layer's builder (`layer`).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, StatusCode};
use sqlx::Pool;

/// How long a stored response is kept by default: 24 hours, as Stripe keeps keys. Purge expired
/// ones with `idem::retention::purge_expired` (or `idem purge`), as for messages.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The largest request body read by default: 2 MiB, axum's own default limit.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// The largest response body stored by default: 32 KiB. A stored response is kept as JSON of at
/// most [`idem::MAX_REPLAY_LEN`](idem_runtime::MAX_REPLAY_LEN) (64 KiB) with its status and
/// headers; a binary body takes 4/3 of its size there (base64).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 32 * 1024;

/// Who is asking: the authenticated principal of a request, which scopes its key.
pub(crate) type Principal = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// What a request's fingerprint covers: bytes made from its head and body.
pub(crate) type Fingerprint = Arc<dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync>;

/// The settings of one idempotent route.
pub(crate) struct Settings<DB: sqlx::Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) scope: &'static str,
    pub(crate) principal: Principal,
    pub(crate) required: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) retry_after: Duration,
    pub(crate) retention: Duration,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) kept_headers: Vec<HeaderName>,
    pub(crate) store_when: fn(StatusCode) -> bool,
}

impl<DB: sqlx::Database> Clone for Settings<DB> {
    fn clone(&self) -> Self {
        Settings {
            pool: self.pool.clone(),
            scope: self.scope,
            principal: Arc::clone(&self.principal),
            required: self.required,
            lease: self.lease,
            retry_after: self.retry_after,
            retention: self.retention,
            fingerprint: Arc::clone(&self.fingerprint),
            max_key_len: self.max_key_len,
            max_request_bytes: self.max_request_bytes,
            max_response_bytes: self.max_response_bytes,
            kept_headers: self.kept_headers.clone(),
            store_when: self.store_when,
        }
    }
}

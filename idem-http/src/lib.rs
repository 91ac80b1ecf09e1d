//! Idempotent HTTP endpoints for [`idem`](https://docs.rs/idem) on axum: the `Idempotency-Key`
//! header (draft-ietf-httpapi-idempotency-key-header), with the handler's writes and the stored
//! response committed in **one** database transaction. Depend on `idem` with feature `http` and
//! use `idem::http`.
//!
//! Add an [`IdempotencyLayer`] to a route and write through a [`RequestTx`]:
//!
//! | request | answer |
//! |---|---|
//! | new key | the handler runs; its writes, the key and the response commit together |
//! | same key, same request, after it finished | the stored response, `Idempotent-Replayed: true`; the handler does not run |
//! | same key while the first runs | waits for it, then its response; in lease mode 409 with `Retry-After` |
//! | same key, another method, path or body | 422, nothing runs |
//! | no key / malformed key | 400 (or a plain run where the key is optional) |
//! | same key from another client | that client's own request: keys are scoped by the principal |
//!
//! A crash anywhere leaves either nothing (the retry runs the handler) or the writes *and* the
//! response (the retry gets the response): never one without the other. Which responses are
//! stored is in [`policy`]; records expire after the layer's retention and are purged as
//! message records are (`idem::retention`). Requests are counted and traced like deliveries:
//! `idem_messages_total{scope,outcome}` and a span per request with its scope and key.
#![warn(missing_docs)]

pub mod fingerprint;
mod handle;
pub mod key;
mod layer;
pub mod policy;
mod problem;
mod settings;
mod stored;
mod tx;

pub use layer::{IdempotencyLayer, Idempotent};
pub use settings::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_RETENTION};
pub use stored::{StoredResponse, DEFAULT_KEPT_HEADERS, REPLAYED_HEADER};
pub use tx::{RequestTx, RequestTxRejection};

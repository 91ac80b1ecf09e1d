//! Consumers: deliveries from a broker, decoded, handled in batches by `#[idempotent]`
//! handlers, and settled only after their transaction committed.
//!
//! This module knows no broker. A broker adapter (`idem::rabbitmq`, ...) turns the broker's
//! messages into a stream of [`Delivery`] values and translates each [`Settle`] into the
//! broker's own verbs; [`Consumer`] does the rest, the same for every broker:
//!
//! | result of the delivery | settles as |
//! |---|---|
//! | Applied, Duplicate, Stale, Replayed | [`Settle::Ack`] |
//! | InProgress (lease held elsewhere) | [`Settle::Requeue`] after `in_progress_delay` |
//! | handler `Err`, panic, over `handler_timeout` | [`Settle::Requeue`] with backoff |
//! | Poisoned (the handler's `max_attempts`) | [`Settle::DeadLetter`] |
//! | undecodable payload, `Error::Key`, `Error::Conflict`, over `max_deliveries` | [`Settle::DeadLetter`] |
//! | store or connection error | waits with backoff and runs again in place; never an attempt |
//!
//! When some deliveries of a batch fail on the store and the others were decided (committed),
//! the decided ones settle at once and only the failed ones wait and run again. A batch's acks
//! go out together through [`Delivery::ack_all`] (one `multiple` ack on RabbitMQ).
//!
//! With the feature `metrics`, the loop records the `idem_consumer_*` metrics of
//! `idem::metrics` (settled per outcome, dead-lettered per reason, settle failures, store
//! pauses, deliveries in flight).
//!
//! [`memory::MemoryQueue`] is a broker in memory for tests.

pub mod adapter;
mod consumer;
mod counts;
mod delivery;
mod flight;
pub mod memory;
mod runner;
mod settle;
mod source;

pub use consumer::Consumer;
pub use counts::Counts;
pub use delivery::{Delivery, SettleError};
pub use settle::{DeadLetterReason, Settle};
pub use source::Source;

/// Decodes a JSON payload: the default decoder of a consumer's messages.
///
/// ```
/// assert_eq!(idem::consume::json::<Vec<u8>>(b"[1,2]").unwrap(), vec![1, 2]);
/// ```
pub fn json<M: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<M, serde_json::Error> {
    serde_json::from_slice(payload)
}

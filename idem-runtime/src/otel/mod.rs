//! Trace context through the outbox and the consumers (feature `otel`), following the
//! OpenTelemetry messaging semantic conventions, on `tracing` spans bridged by
//! `tracing-opentelemetry`.
//!
//! - **Capture.** [`Context::publish`](crate::Context::publish) (and
//!   [`Outgoing::publish`](crate::outbox::Outgoing::publish)) injects the context of the
//!   current `tracing` span into the message's headers, as W3C [`TRACEPARENT`] and
//!   [`TRACESTATE`], when the handler publishes: the outbox row keeps the trace of the
//!   transaction that wrote it. A `traceparent` header set with
//!   [`Outgoing::header`](crate::outbox::Outgoing::header) is kept as given.
//! - **Send.** The [`Relay`](crate::outbox::Relay) sends each message in a span `send
//!   <destination>` (kind producer) whose parent is the context in the row's headers, with
//!   `messaging.system` ([`Publisher::broker`](crate::outbox::Publisher::broker)),
//!   `messaging.destination.name`, `messaging.operation.type` = `send` and
//!   `messaging.message.id`. A failed publish sets the span's status to error.
//! - **Process.** The [`Consumer`](crate::consume::Consumer) runs each group of deliveries in a
//!   span `process <source>` (kind consumer), with `messaging.system`,
//!   `messaging.destination.name`, `messaging.operation.type` = `process`,
//!   `messaging.consumer.group.name` where the adapter knows it, and idem's `idem.outcome`
//!   (the outcome of its deliveries, `mixed` when they differ). A delivery handled alone has
//!   the context of its headers as its parent (and `messaging.message.id`); a batch's span
//!   links every delivery's context instead (each link with its `messaging.message.id`), and
//!   has `messaging.batch.message_count`. Each handler's `idempotent` span (its scope, key and
//!   outcome) is a child of it.
//!
//! The spans are `INFO` `tracing` spans: install a `tracing-opentelemetry` layer to export
//! them. Without a subscriber that takes `INFO`, nothing is captured or extracted.
//! Without the feature, none of this is compiled.
//!
//! ```
//! // The two headers a message carries its trace context in (`idem::otel::…`).
//! assert_eq!(idem_runtime::otel::TRACEPARENT, "traceparent");
//! assert_eq!(idem_runtime::otel::TRACESTATE, "tracestate");
//! ```

mod propagate;
mod send;

pub(crate) use propagate::{capture, extract, header, parent};
pub use propagate::{TRACEPARENT, TRACESTATE};
pub(crate) use send::SendSpans;

/// The header (Redis: field) every broker crate's outbox publisher writes a message's id in
/// (`headers::MESSAGE_ID` of each broker crate).
pub(crate) const MESSAGE_ID: &str = "idem-message-id";

/// Whether a subscriber may take the `INFO` spans of this module.
pub(crate) fn enabled() -> bool {
    tracing::Level::INFO <= tracing::level_filters::LevelFilter::current()
}

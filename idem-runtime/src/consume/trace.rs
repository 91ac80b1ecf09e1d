//! The consumer's span of a group of deliveries (feature `otel`): `process <source>`, the
//! parent of each handler's `idempotent` span; a delivery handled alone is a child of the
//! context in its headers, a batch links every delivery's context.

use opentelemetry::KeyValue;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::batch::Results;
use crate::claim::span::outcome_name;
use crate::otel::{extract, header, parent, MESSAGE_ID};

use super::delivery::Delivery;
use super::recovering::Taken;

/// The span of `group` (runnable deliveries, in order); `Span::none()` when no subscriber
/// takes `INFO` spans or the group is empty.
pub(crate) fn process_span<D: Delivery>(group: &[Taken<D>]) -> tracing::Span {
    let Some(first) = group.first() else {
        return tracing::Span::none();
    };
    if !crate::otel::enabled() {
        return tracing::Span::none();
    }
    let (origin, consumer_group) = match first {
        Taken::Broker(delivery) => (delivery.origin(), delivery.consumer_group()),
        Taken::Parked(parked) => (parked.origin.clone(), None),
    };
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {}", origin.source),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = origin.broker.as_str(),
        messaging.destination.name = origin.source.as_str(),
        messaging.operation.type = "process",
        messaging.consumer.group.name = consumer_group.as_deref(),
        messaging.message.id = Empty,
        messaging.batch.message_count = Empty,
        idem.outcome = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let [alone] = group {
        let (context, id) = traced(alone);
        if let Some(sc) = context {
            let _ = span.set_parent(parent(sc));
        }
        if let Some(id) = id {
            span.record("messaging.message.id", id.as_str());
        }
        return span;
    }
    span.record("messaging.batch.message_count", group.len() as u64);
    for taken in group {
        if let (Some(sc), id) = traced(taken) {
            let attributes = id
                .map(|id| vec![KeyValue::new("messaging.message.id", id)])
                .unwrap_or_default();
            span.add_link_with_attributes(sc, attributes);
        }
    }
    span
}

/// The trace context and the message id a delivery carries.
fn traced<D: Delivery>(
    taken: &Taken<D>,
) -> (Option<opentelemetry::trace::SpanContext>, Option<String>) {
    match taken {
        Taken::Broker(delivery) => {
            let headers = delivery.headers();
            let id = header(&headers, MESSAGE_ID)
                .map(str::to_owned)
                .or_else(|| delivery.message_id());
            (extract(&headers), id)
        }
        Taken::Parked(parked) => (
            extract(&parked.headers),
            header(&parked.headers, MESSAGE_ID).map(str::to_owned),
        ),
    }
}

/// Writes how one run of the group ended into its span: the deliveries' outcome (`mixed` when
/// they differ), or why the run failed as a whole.
pub(crate) fn record_outcome<T, E, P, X>(
    span: &tracing::Span,
    run: &Result<Result<Results<T, E>, P>, X>,
) {
    if span.is_disabled() {
        return;
    }
    let outcome = match run {
        Ok(Ok(Ok(results))) => {
            let mut names = results.iter().map(outcome_name);
            let first = names.next().unwrap_or("none");
            if names.all(|name| name == first) {
                first
            } else {
                "mixed"
            }
        }
        Ok(Ok(Err(_))) => "error",
        Ok(Err(_)) => "panicked",
        Err(_) => "timed_out",
    };
    span.record("idem.outcome", outcome);
    if matches!(outcome, "error" | "panicked" | "timed_out" | "failed") {
        span.record("otel.status_code", "ERROR");
    }
}

//! The relay's spans: one `send <destination>` span per message of a batch, each a child of
//! the context its row kept.

use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::propagate::{extract, parent};
use crate::outbox::Message;

/// The send spans of one batch, open while the publisher publishes it, closed by
/// [`end`](SendSpans::end).
pub(crate) struct SendSpans(Vec<tracing::Span>);

impl SendSpans {
    /// One span per message of `batch`, published to `system`; none when no subscriber takes
    /// `INFO` spans.
    pub(crate) fn open(system: &str, batch: &[Message]) -> Self {
        if !super::enabled() {
            return SendSpans(Vec::new());
        }
        let spans = batch
            .iter()
            .map(|message| {
                let span = tracing::info_span!(
                    parent: None,
                    "send",
                    otel.name = %format_args!("send {}", message.destination),
                    otel.kind = "producer",
                    otel.status_code = Empty,
                    otel.status_description = Empty,
                    messaging.system = system,
                    messaging.destination.name = message.destination.as_str(),
                    messaging.operation.type = "send",
                    messaging.message.id = message.id.as_str(),
                );
                if let Some(sc) = extract(&message.headers) {
                    let _ = span.set_parent(parent(sc));
                }
                span
            })
            .collect();
        SendSpans(spans)
    }

    /// Ends every span of the batch: as failed, with `failure`, when the publish failed.
    pub(crate) fn end(self, failure: Option<&str>) {
        let Some(error) = failure else {
            return;
        };
        for span in &self.0 {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", error);
        }
    }
}

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, SubscriberExt as _};
    use tracing_subscriber::Layer;

    use super::*;

    /// Every field value recorded on a span, as text.
    #[derive(Clone, Default)]
    struct Fields(Arc<Mutex<Vec<(String, String)>>>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let value = format!("{value:?}");
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_string(), value));
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            let value = value.to_string();
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_string(), value));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Fields {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: Context<'_, S>,
        ) {
            attrs.record(&mut self.clone());
        }

        fn on_record(
            &self,
            _: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _: Context<'_, S>,
        ) {
            values.record(&mut self.clone());
        }
    }

    fn message(id: &str, headers: Vec<(String, String)>) -> Message {
        Message {
            id: id.to_string(),
            destination: "payments".to_string(),
            partition_key: String::new(),
            payload: b"{}".to_vec(),
            headers,
            attempts: 0,
        }
    }

    #[test]
    fn each_message_is_sent_in_a_child_of_its_stored_context_and_a_failure_is_an_error() {
        let fields = Fields::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(fields.clone());
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let batch = [
            message("idem-1", vec![("traceparent".into(), parent.into())]),
            message("idem-2", Vec::new()),
        ];
        tracing::subscriber::with_default(subscriber, || {
            let spans = SendSpans::open("nats", &batch);
            assert_eq!(spans.0.len(), 2);
            let traced = spans.0[0].context().span().span_context().clone();
            assert_eq!(
                traced.trace_id().to_string(),
                "0af7651916cd43dd8448eb211c80319c",
                "in the trace of its row"
            );
            let root = spans.0[1].context().span().span_context().clone();
            assert!(root.is_valid() && root.trace_id() != traced.trace_id());
            spans.end(Some("refused"));
        });
        let fields = fields.0.lock().unwrap().clone();
        let has = |name: &str, value: &str| {
            fields
                .iter()
                .filter(|(n, v)| n == name && v == value)
                .count()
        };
        assert_eq!(has("otel.name", "send payments"), 2, "{fields:?}");
        assert_eq!(has("otel.kind", "producer"), 2);
        assert_eq!(has("messaging.system", "nats"), 2);
        assert_eq!(has("messaging.destination.name", "payments"), 2);
        assert_eq!(has("messaging.operation.type", "send"), 2);
        assert_eq!(
            (
                has("messaging.message.id", "idem-1"),
                has("messaging.message.id", "idem-2")
            ),
            (1, 1)
        );
        assert_eq!(has("otel.status_code", "ERROR"), 2);
        assert_eq!(has("otel.status_description", "refused"), 2);
    }
}

//! W3C trace context in a message's headers: injected from the current span at publish time,
//! extracted from a row's or a delivery's headers.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The W3C header that carries a message's trace and parent span: `00-<trace id>-<span
/// id>-<flags>`.
pub const TRACEPARENT: &str = "traceparent";

/// The W3C header that carries vendor-specific trace state beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// Appends the context of the current `tracing` span to `headers` (as [`TRACEPARENT`] and,
/// when not empty, [`TRACESTATE`]), unless they already hold a `traceparent` (set by the
/// user, kept as given) or no span context is there to capture.
pub(crate) fn capture(headers: &mut Vec<(String, String)>) {
    if !super::enabled()
        || headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(TRACEPARENT))
    {
        return;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&cx, &mut Append(headers));
}

/// The span context in `headers` (names compared without case), when they hold a valid one.
pub(crate) fn extract(headers: &[(String, String)]) -> Option<SpanContext> {
    header(headers, TRACEPARENT)?;
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &Read(headers));
    let sc = cx.span().span_context().clone();
    (sc.is_valid() && sc.is_remote()).then_some(sc)
}

/// A context whose parent is the remote span `sc`, for `set_parent`.
pub(crate) fn parent(sc: SpanContext) -> Context {
    Context::new().with_remote_span_context(sc)
}

/// The value of header `name` (without case).
pub(crate) fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

struct Append<'a>(&'a mut Vec<(String, String)>);

impl Injector for Append<'_> {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACESTATE && value.is_empty() {
            return;
        }
        self.0.push((key.to_owned(), value));
    }
}

struct Read<'a>(&'a [(String, String)]);

impl Extractor for Read<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        header(self.0, key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_context_is_read_from_headers_whatever_their_case() {
        let headers = vec![
            ("kind".to_string(), "payment".to_string()),
            ("TraceParent".to_string(), PARENT.to_string()),
            ("tracestate".to_string(), "k=v".to_string()),
        ];
        let sc = extract(&headers).expect("a valid context");
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(sc.trace_state().header(), "k=v");
        assert_eq!(extract(&[]), None);
        let bad = vec![(TRACEPARENT.to_string(), "00-zz".to_string())];
        assert_eq!(extract(&bad), None);
    }

    /// Runs `work` with a subscriber that gives spans OpenTelemetry contexts.
    fn traced<R>(work: impl FnOnce() -> R) -> R {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, work)
    }

    #[test]
    fn the_current_span_is_captured_and_a_users_traceparent_kept() {
        traced(|| {
            let span = tracing::info_span!("handler");
            let _entered = span.enter();
            let sc = span.context().span().span_context().clone();
            assert!(sc.is_valid());

            let mut headers = vec![("kind".to_string(), "payment".to_string())];
            capture(&mut headers);
            let expected = format!("00-{}-{}-01", sc.trace_id(), sc.span_id());
            assert_eq!(
                headers,
                vec![
                    ("kind".to_string(), "payment".to_string()),
                    (TRACEPARENT.to_string(), expected)
                ],
                "no trace state: no `tracestate` header"
            );
            assert_eq!(
                extract(&headers),
                Some(SpanContext::new(
                    sc.trace_id(),
                    sc.span_id(),
                    sc.trace_flags(),
                    true,
                    sc.trace_state().clone(),
                ))
            );

            let mut given = vec![("TraceParent".to_string(), PARENT.to_string())];
            capture(&mut given);
            assert_eq!(given, vec![("TraceParent".to_string(), PARENT.to_string())]);
        });
        // Outside any span there is no context to capture.
        traced(|| {
            let mut none = Vec::new();
            capture(&mut none);
            assert!(none.is_empty(), "{none:?}");
        });
    }
}

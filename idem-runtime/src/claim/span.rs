//! The tracing span of a delivery and the outcome written into it, the same for every mode.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::Error;
use crate::key::KeyDisplay;
use crate::outcome::Outcome;

/// The span of one delivery: its scope and key now, its outcome when it ends.
///
/// `Span::none()` when nothing can see it: no tracing subscriber takes it and the `log` crate
/// is below `INFO`, the span's level, so tracing's `log` fallback would write none of it.
/// A disabled span still goes through that fallback's checks when it is made, recorded and
/// dropped; `Span::none()` skips them (78 instructions a batched message, 34 net of the check
/// here: docs/design/performance.md#the-first-pass).
pub(crate) fn delivery(scope: &'static str, key: &[u8]) -> tracing::Span {
    let unlogged = log::max_level() < log::LevelFilter::Info;
    if unlogged && tracing::Level::INFO > tracing::level_filters::LevelFilter::current() {
        // No subscriber takes `INFO` (none is set, or all are stricter).
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "idempotent",
        scope,
        key = %KeyDisplay(key),
        outcome = tracing::field::Empty,
    );
    if unlogged && span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

pin_project_lite::pin_project! {
    /// A future run inside a delivery's span, entered on every poll (as tracing's
    /// `Instrumented`), or run as is when no subscriber takes the span: a disabled span records
    /// nothing, yet entering and leaving it on every poll (tracing's `log` fallback, which sqlx
    /// turns on) cost ~2,000 instructions a batched message. One type, not an `Either` of the two:
    /// each wrapper deepens the types the compiler lays out for the caller's future.
    pub struct InSpan<F> {
        span: Option<tracing::Span>,
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.as_ref().map(tracing::Span::enter);
        this.future.poll(cx)
    }
}

/// `future` inside the delivery's span (see [`InSpan`]).
pub(crate) fn within<F: Future>(span: &tracing::Span, future: F) -> InSpan<F> {
    InSpan {
        span: (!span.is_disabled()).then(|| span.clone()),
        future,
    }
}

/// `work` inside the delivery's span, entered only when a subscriber takes it (see [`InSpan`]).
pub(crate) fn run_in<R>(span: &tracing::Span, work: impl FnOnce() -> R) -> R {
    let _entered = (!span.is_disabled()).then(|| span.enter());
    work()
}

/// When a delivery began, for its duration (feature `metrics`; nothing without it). The scope
/// is given where a duration is recorded, not kept: a `Run` holds its watch, and its scope
/// already (a `Run` over 128 bytes is moved by `memcpy`:
/// docs/design/performance.md#moves-over-128-bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl Watch {
    pub(crate) fn start() -> Self {
        Watch {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// The claim of a delivery of `scope` took from the start until now.
    pub(crate) fn claimed(&self, scope: &'static str) {
        #[cfg(feature = "metrics")]
        crate::metrics::claimed(scope, self.started.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = scope;
    }

    fn ended(&self, scope: &'static str, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        crate::metrics::delivered(scope, outcome, self.started.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = (scope, outcome);
    }
}

/// Writes how a delivery of `scope` ended into its span (and its metrics).
pub(crate) fn record_outcome<T, E>(
    span: &tracing::Span,
    watch: Watch,
    scope: &'static str,
    result: &Result<Outcome<T>, Error<E>>,
) {
    let name = outcome_name(result);
    span.record("outcome", name);
    watch.ended(scope, name);
}

/// Writes a handler body's panic into its delivery's span (and its metrics).
pub(crate) fn record_panic(span: &tracing::Span, watch: Watch, scope: &'static str) {
    span.record("outcome", "panicked");
    watch.ended(scope, "panicked");
}

/// The `outcome` field of a delivery's span.
pub(crate) fn outcome_name<T, E>(result: &Result<Outcome<T>, Error<E>>) -> &'static str {
    match result {
        Ok(outcome) => outcome.as_str(),
        Err(Error::Handler(_)) => "failed",
        Err(Error::Conflict { .. }) => "conflict",
        Err(Error::Stored { .. }) => "replayed",
        Err(_) => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps the `log` records whose text has `marker` (this test's key and outcome).
    struct Logged {
        marker: &'static str,
        lines: std::sync::Mutex<Vec<String>>,
    }

    impl log::Log for Logged {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }

        fn log(&self, record: &log::Record<'_>) {
            let line = record.args().to_string();
            if line.contains(self.marker) {
                self.lines.lock().unwrap().push(line);
            }
        }

        fn flush(&self) {}
    }

    static LOGGED: Logged = Logged {
        marker: "span-log-",
        lines: std::sync::Mutex::new(Vec::new()),
    };

    /// With no subscriber, a span is made only for tracing's `log` fallback, and only when the
    /// `log` crate takes its level: then its key and outcome are still logged. One test, since
    /// the `log` crate's logger and level are global to the process. (With a subscriber, the
    /// kit's span rule checks each delivery's span.)
    #[test]
    fn without_a_subscriber_a_span_is_made_only_for_a_log_logger_at_info() {
        log::set_max_level(log::LevelFilter::Warn);
        let unseen = delivery("span::test", b"span-log-key");
        assert!(
            unseen.is_none(),
            "no subscriber, `log` below INFO: {unseen:?}"
        );

        log::set_logger(&LOGGED).expect("no other test sets a logger");
        log::set_max_level(log::LevelFilter::Trace);
        let logged = delivery("span::test", b"span-log-key");
        assert!(!logged.is_none(), "the `log` fallback takes INFO");
        logged.record("outcome", "span-log-outcome");
        drop(logged);
        log::set_max_level(log::LevelFilter::Off);
        let lines = LOGGED.lines.lock().unwrap().clone();
        assert!(
            lines.iter().any(|l| l.contains("key=span-log-key")),
            "the span's key is logged: {lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("outcome=\"span-log-outcome\"")),
            "the span's outcome is logged: {lines:?}"
        );
    }

    #[test]
    fn outcomes_are_named() {
        let applied: Result<Outcome<()>, Error<()>> = Ok(Outcome::Applied(()));
        assert_eq!(outcome_name(&applied), "applied");
        let failed: Result<Outcome<()>, Error<()>> = Err(Error::Handler(()));
        assert_eq!(outcome_name(&failed), "failed");
        let lost: Result<Outcome<()>, Error<()>> = Err(Error::LeaseLost);
        assert_eq!(outcome_name(&lost), "error");
    }
}

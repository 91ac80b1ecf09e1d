//! The tracing span of a delivery and the outcome written into it, the same for every mode.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::Error;
use crate::key::KeyDisplay;
use crate::outcome::Outcome;

/// The span of one delivery: its scope and key now, its outcome when it ends.
pub(crate) fn delivery(scope: &'static str, key: &[u8]) -> tracing::Span {
    tracing::info_span!(
        "idempotent",
        scope,
        key = %KeyDisplay(key),
        outcome = tracing::field::Empty,
    )
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
/// already (BENCHMARKS.md, "The batch's moves": a `Run` over 128 bytes is moved by `memcpy`).
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
fn outcome_name<T, E>(result: &Result<Outcome<T>, Error<E>>) -> &'static str {
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

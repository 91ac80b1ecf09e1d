//! Counting statements and pool pings (round trips), through a minimal tracing subscriber that
//! only listens to sqlx's statement log while `COUNTING` is set. `run` installs it in every bench,
//! so every bench runs with the same subscriber; only `modes` turns counting on.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static PINGS: AtomicU64 = AtomicU64::new(0);
static CAPTURE: Mutex<Option<Vec<String>>> = Mutex::new(None);

pub struct StatementCounter;

struct Summary(String);

impl tracing::field::Visit for Summary {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            self.0 = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for StatementCounter {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if metadata.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query" && COUNTING.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = CAPTURE.lock().unwrap().as_mut() {
            let mut summary = Summary(String::new());
            event.record(&mut summary);
            log.push(summary.0);
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Counts a pool acquire of an idle connection: sqlx pings it first (`test_before_acquire`,
/// on by default), which on PostgreSQL is one round trip.
pub fn count_acquire() {
    if COUNTING.load(Ordering::Relaxed) {
        PINGS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The statements (and pings) one run of `f` makes.
pub async fn count<F: Future<Output = anyhow::Result<(u64, u64)>>>(
    capture: bool,
    f: F,
) -> anyhow::Result<(u64, u64, Vec<String>)> {
    STATEMENTS.store(0, Ordering::Relaxed);
    PINGS.store(0, Ordering::Relaxed);
    *CAPTURE.lock().unwrap() = capture.then(Vec::new);
    COUNTING.store(true, Ordering::Relaxed);
    let result = f.await;
    COUNTING.store(false, Ordering::Relaxed);
    result?;
    let log = CAPTURE.lock().unwrap().take().unwrap_or_default();
    Ok((
        STATEMENTS.load(Ordering::Relaxed),
        PINGS.load(Ordering::Relaxed),
        log,
    ))
}

/// "INSERT INTO idem_records …; UPDATE … ×100; COMMIT": consecutive repeats of one statement or
/// of a group of up to four statements folded.
pub fn fold(log: &[String]) -> String {
    let log: Vec<&str> = log.iter().map(|s| s.trim_end_matches(" …")).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < log.len() {
        // The period (1..=4) whose consecutive repeats from `i` cover the most statements.
        let mut best = (1, 1);
        for period in 1..=4.min(log.len() - i) {
            let mut reps = 1;
            while i + (reps + 1) * period <= log.len()
                && log[i..i + period] == log[i + reps * period..i + (reps + 1) * period]
            {
                reps += 1;
            }
            if reps > 1 && reps * period > best.0 * best.1 {
                best = (period, reps);
            }
        }
        let (period, reps) = best;
        let group = log[i..i + period].join("; ");
        out.push(match (period, reps) {
            (_, 1) => group,
            (1, n) => format!("{group} ×{n}"),
            (_, n) => format!("({group}) ×{n}"),
        });
        i += period * reps;
    }
    out.join("; ")
}

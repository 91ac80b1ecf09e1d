//! The tracing span of each delivery, seen by a test subscriber: one span per delivery (none for
//! a batch's first pass), named `idempotent`, with its scope, its key and the outcome it ended
//! with, and the handler body's own events inside it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use idem::{idempotent, Outcome, Tx};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use crate::backend::KitDb;
use crate::options::{effect, msg, setup, Msg, Runs};
use crate::{Backend, Dialect};

/// A span as the subscriber saw it: its name, its fields as text, how often it was entered.
#[derive(Clone, Debug, Default)]
pub struct SeenSpan {
    /// The span's name.
    pub name: String,
    /// Every field recorded, at creation or later, as text.
    pub fields: HashMap<String, String>,
    /// How many times it was entered.
    pub entered: u32,
}

/// What the subscriber saw: spans by id, and each event's message with the span it was in.
#[derive(Default)]
struct Seen {
    spans: HashMap<u64, SeenSpan>,
    events: Vec<(String, Option<u64>)>,
    stack: Vec<u64>,
}

/// A subscriber that keeps every span and event of the thread it is the default of.
#[derive(Clone, Default)]
pub struct SpanLog {
    seen: Arc<Mutex<Seen>>,
    next: Arc<AtomicU64>,
}

impl SpanLog {
    /// The spans named `name`, in creation order.
    pub fn spans(&self, name: &str) -> Vec<SeenSpan> {
        let seen = self.seen.lock().unwrap();
        let mut ids: Vec<_> = seen
            .spans
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.iter().map(|id| seen.spans[id].clone()).collect()
    }

    /// Forgets every span and event seen so far.
    pub fn clear(&self) {
        let mut seen = self.seen.lock().unwrap();
        seen.spans.clear();
        seen.events.clear();
    }

    /// Each event with this message, with the span it was emitted in.
    pub fn events(&self, message: &str) -> Vec<Option<SeenSpan>> {
        let seen = self.seen.lock().unwrap();
        seen.events
            .iter()
            .filter(|(m, _)| m == message)
            .map(|(_, span)| span.map(|id| seen.spans[&id].clone()))
            .collect()
    }
}

/// Writes fields as text into a map.
struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

impl Subscriber for SpanLog {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, SeqCst) + 1;
        let mut seen = SeenSpan {
            name: span.metadata().name().into(),
            ..SeenSpan::default()
        };
        span.record(&mut Fields(&mut seen.fields));
        self.seen.lock().unwrap().spans.insert(id, seen);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(seen) = self.seen.lock().unwrap().spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut seen = self.seen.lock().unwrap();
        let current = seen.stack.last().copied();
        let message = fields.remove("message").unwrap_or_default();
        seen.events.push((message, current));
    }

    fn enter(&self, span: &Id) {
        let mut seen = self.seen.lock().unwrap();
        seen.stack.push(span.into_u64());
        if let Some(s) = seen.spans.get_mut(&span.into_u64()) {
            s.entered += 1;
        }
    }

    fn exit(&self, _: &Id) {
        self.seen.lock().unwrap().stack.pop();
    }
}

/// The message a traced body logs.
const BODY_RAN: &str = "body ran";

/// Key only; the body logs an event before its write.
#[idempotent(key = "msg.id", scope = "spans::traced")]
pub async fn traced<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Msg,
    runs: &Runs,
    d: &Dialect,
) -> Result<String, sqlx::Error> {
    tracing::info!(key = %msg.id, "body ran");
    effect(tx, msg, runs, d).await
}

/// A delivery with nothing to do, whose span shows that idem's spans reach the subscriber.
#[idempotent(key = "key", scope = "spans::probe")]
async fn probe<DB: KitDb>(tx: &mut Tx<'_, DB>, key: &str) -> Result<(), sqlx::Error> {
    let _ = (tx, key);
    Ok(())
}

/// Makes this thread's subscriber see idem's delivery spans, then forgets the probes.
///
/// Other rules run at the same time on threads without this subscriber. One of them may
/// register the delivery span's callsite while this subscriber is being added, and tracing then
/// caches "never" for it: the span would be disabled here too (CI saw no span at all, twice).
/// Asking every callsite again (`rebuild_interest_cache`) settles it, unless that registration
/// was still in flight and stored its "never" after the rebuild: so rebuild until a probe
/// delivery's span is seen.
async fn see_delivery_spans<B: Backend>(k: &crate::Kit<B>, log: &SpanLog) {
    for attempt in 0..20 {
        tracing::callsite::rebuild_interest_cache();
        let key = format!("probe-{attempt}");
        probe(&k.pool, key.as_str())
            .await
            .expect("a probe delivery");
        if !log.spans("idempotent").is_empty() {
            log.clear();
            return;
        }
    }
    panic!("idem's delivery span never reached this thread's subscriber");
}

/// Alone and in a batch, each delivery has one span with its scope, key and outcome; the
/// batch's first pass makes none; each body's event is inside its own delivery's span.
pub async fn each_delivery_has_one_span_with_its_outcome<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let log = SpanLog::default();
    // Thread-local: the rule runs on the test's thread (`block_on`), and so do its deliveries.
    let _guard = tracing::subscriber::set_default(log.clone());
    see_delivery_spans(&k, &log).await;

    let first = traced(&k.pool, &msg("a", "x"), &runs, &d).await.unwrap();
    assert!(first.is_applied());
    let again = traced(&k.pool, &msg("a", "x"), &runs, &d).await.unwrap();
    assert_eq!(again, Outcome::Duplicate);
    let messages = [msg("b", "x"), msg("a", "x"), msg("c", "x"), msg("b", "x")];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        traced(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    let outcomes: Vec<&str> = results
        .iter()
        .map(|r| r.as_ref().unwrap().as_str())
        .collect();
    assert_eq!(outcomes, ["applied", "duplicate", "applied", "duplicate"]);

    let spans = log.spans("idempotent");
    let seen: Vec<(&str, &str, &str)> = spans
        .iter()
        .map(|s| {
            let field = |name: &str| s.fields.get(name).map_or("", String::as_str);
            (field("scope"), field("key"), field("outcome"))
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("spans::traced", "a", "applied"),
            ("spans::traced", "a", "duplicate"),
            ("spans::traced", "b", "applied"),
            ("spans::traced", "a", "duplicate"),
            ("spans::traced", "c", "applied"),
            ("spans::traced", "b", "duplicate"),
        ],
        "one span per delivery, in order, none for the batch's first pass"
    );
    assert!(
        spans.iter().all(|s| s.entered > 0),
        "every delivery ran inside its span: {spans:?}"
    );

    let bodies = log.events(BODY_RAN);
    assert_eq!(bodies.len(), 3, "three bodies ran: {bodies:?}");
    let keys: Vec<&str> = bodies
        .iter()
        .map(|span| {
            let span = span.as_ref().expect("a body's event is inside a span");
            assert_eq!(span.name, "idempotent");
            span.fields["key"].as_str()
        })
        .collect();
    assert_eq!(keys, ["a", "b", "c"]);
    assert_eq!(runs.get(), 3);
    assert_eq!(crate::options::effects(&k).await, 3);
    k.close().await;
}

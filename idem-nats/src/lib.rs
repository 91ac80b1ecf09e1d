//! NATS JetStream for idem's consumer loop: a durable pull consumer on a stream, whose
//! deliveries [`idem::consume::Consumer`](idem_runtime::consume::Consumer) runs through
//! `#[idempotent]` handlers and settles only after their transaction committed.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(serde::Deserialize)] struct Event;
//! # async fn on_event(_: &mut idem_runtime::Batch<sqlx::Sqlite>, _: &Event)
//! #     -> Result<idem_runtime::Outcome<()>, idem_runtime::Error<String>> { todo!() }
//! use idem_runtime::consume::{json, Consumer};
//! use idem_nats::Source;
//!
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let jetstream = async_nats::jetstream::new(client);
//! // An existing stream and durable pull consumer (explicit acks).
//! let deliveries = Source::new(jetstream, "ORDERS", "billing")
//!     .fetch(100)
//!     .deliveries()
//!     .await?;
//! let counts = Consumer::new(pool)
//!     .batch(100)
//!     .run(deliveries, json::<Event>, async |b, e| on_event(b, e).await,
//!          std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! Every settlement is sent with a reply subject and waits for the server's answer
//! (`double_ack_with`), so one the server never received is an error the loop logs and counts
//! (`Counts::settle_failures`); the server then redelivers the message after `ack_wait`, and idem
//! sees a `Duplicate`.
//!
//! | [`Settle`] | JetStream |
//! |---|---|
//! | `Ack` | `+ACK`, confirmed |
//! | `Requeue { delay }` | `-NAK {"delay": ..}` (a delayed redelivery, not a spin), confirmed |
//! | `DeadLetter { reason }` | publish to the dead-letter subject, wait for its confirmation, then `+TERM`, confirmed |
//!
//! The price is a round trip per settlement (async-nats opens an inbox for each confirmed
//! ack); the loop settles the deliveries of a batch one after another, after its one commit.
//!
//! A confirmed ack does not prove the ack counted: an ack that reaches the server after the
//! message's `ack_wait` expired is answered like any other, and the message is redelivered all
//! the same ([nats-server issue 4786](https://github.com/nats-io/nats-server/issues/4786)). That
//! redelivery is a `Duplicate` for idem, acked again; nothing is applied twice. Heartbeats (below)
//! keep `ack_wait` from expiring while idem is still working on a delivery.
//!
//! # Dead letters
//!
//! A dead letter is the original payload and headers, published to the dead-letter subject with
//! these headers: `Idem-Reason` (`undecodable`, `bad_key`, `too_many_deliveries`, ...),
//! `Idem-Reason-Detail` (the error text), `Idem-Deliveries` (JetStream's delivery count),
//! `Idem-Source-Stream`, `Idem-Source-Consumer`, `Idem-Source-Sequence` and
//! `Idem-Source-Subject`, and `Nats-Msg-Id: idem-dlq.<stream>.<sequence>`, so a dead letter
//! published twice (its `+TERM` lost) is stored once by a dead-letter stream's duplicate window.
//!
//! The subject must lie **outside the source stream's subjects**, else the dead letter is stored
//! in the same stream and loops back into the consumer: [`Source::deliveries`] checks this and
//! fails if the stream would capture it. The default, `idem.dead-letter.<stream>.<consumer>`,
//! is checked the same way.
//!
//! How the publish is confirmed depends on who stores the subject, found once at start:
//! - **another stream captures it** (recommended: a stream on `idem.dead-letter.>`): a JetStream
//!   publish, and idem waits for the stream's publish ack, so the dead letter is stored before
//!   the original is terminated: at least once, never lost.
//! - **no stream captures it**: a core NATS publish followed by a flush (a PING/PONG round trip),
//!   which confirms that the server received the publish and handed it to the subject's current
//!   subscribers, but nothing stores it: with no subscriber listening it is gone. A warning says
//!   so at start; create a stream on the subject to keep dead letters.
//!
//! # `max_deliver`
//!
//! When the JetStream consumer has `max_deliver` set, the server stops redelivering a message at
//! that count and leaves it unacked for ever (only an advisory on
//! `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>` says so). So that nothing is
//! stranded silently, a delivery that idem would requeue (a failure, a lease held elsewhere, a
//! shutdown) on the **last allowed delivery** is dead-lettered instead, with the reason
//! `too_many_deliveries`. A process that crashes during the last allowed delivery still leaves
//! the message to that advisory. To close that gap too, set the loop's `max_deliveries` to
//! `max_deliver - 1`: the last allowed delivery then only dead-letters (without running the
//! handler), so a crash during any earlier one is followed by a delivery that does.
//!
//! # Heartbeats
//!
//! Each delivery, from the moment the stream yields it until it is settled (or dropped), has a
//! ticker that sends `+WPI` (`AckKind::Progress`) every `ack_wait / 3`, so the server does not
//! redeliver a message that a long batch or a slow lease-mode handler is still working on. Like
//! every settlement here, the progress is sent with a reply subject and its answer awaited; a
//! heartbeat that fails is logged, and the next tick tries again (two more before `ack_wait`
//! runs out). Messages are pulled with `max_messages = fetch(n)` and the next pull is requested
//! only once the loop has taken every message of the previous one, so at most one pull's worth
//! of messages waits in the client before its ticker starts.
//!
//! # Producers: `Nats-Msg-Id`
//!
//! Publish with a `Nats-Msg-Id` header (the message's own id): JetStream then drops a publish
//! whose id it stored within the stream's duplicate window (2 minutes by default), which is the
//! first line of defence against a producer's retries. idem is still needed behind it: the window
//! ends (a retry after it is stored again), redeliveries to the consumer (`ack_wait` expired, a
//! crash before the ack, a lost ack) are not publishes and are never deduplicated, and neither
//! are replays of a stream or a message published twice under two ids.

#![warn(missing_docs)]

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures_util::stream::{self, BoxStream, Stream, StreamExt as _};
use idem_runtime::consume::{DeadLetterReason, Delivery, Settle, SettleError};
use tokio::task::AbortHandle;

pub use async_nats;

mod outbox;
pub use outbox::{OutboxPublisher, HEADER_PARTITION_KEY};

/// Header of a dead letter: why it was dead-lettered (`DeadLetterReason::as_str`).
pub const HEADER_REASON: &str = "Idem-Reason";
/// Header of a dead letter: the reason in words (the decoder's error, ...).
pub const HEADER_REASON_DETAIL: &str = "Idem-Reason-Detail";
/// Header of a dead letter: how many times JetStream had delivered the message.
pub const HEADER_DELIVERIES: &str = "Idem-Deliveries";
/// Header of a dead letter: the stream it came from.
pub const HEADER_SOURCE_STREAM: &str = "Idem-Source-Stream";
/// Header of a dead letter: the consumer it came from.
pub const HEADER_SOURCE_CONSUMER: &str = "Idem-Source-Consumer";
/// Header of a dead letter: its sequence in the source stream.
pub const HEADER_SOURCE_SEQUENCE: &str = "Idem-Source-Sequence";
/// Header of a dead letter: the subject it was published on.
pub const HEADER_SOURCE_SUBJECT: &str = "Idem-Source-Subject";

/// Why the consumer could not start, or a pull failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The server did not answer, or refused a request.
    Nats(async_nats::Error),
    /// The configuration cannot work (a dead-letter subject the stream captures, ...).
    Config(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Nats(err) => write!(f, "NATS: {err}"),
            Error::Config(why) => write!(f, "idem-nats configuration: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Nats(err) => Some(err.as_ref()),
            Error::Config(_) => None,
        }
    }
}

fn nats(err: impl Into<async_nats::Error>) -> Error {
    Error::Nats(err.into())
}

/// A durable pull consumer on a JetStream stream, as a source of deliveries for
/// [`Consumer::run`](idem_runtime::consume::Consumer::run). Build it, then call
/// [`deliveries`](Source::deliveries).
#[derive(Debug, Clone)]
pub struct Source {
    jetstream: jetstream::Context,
    stream: String,
    consumer: String,
    fetch: usize,
    expires: Duration,
    dead_letter_subject: Option<String>,
    heartbeat: Option<Duration>,
}

impl Source {
    /// The existing durable pull consumer `consumer` of the stream `stream` (its ack policy
    /// must be explicit, JetStream's default for pull consumers).
    pub fn new(
        jetstream: jetstream::Context,
        stream: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        Source {
            jetstream,
            stream: stream.into(),
            consumer: consumer.into(),
            fetch: 100,
            expires: Duration::from_secs(5),
            dead_letter_subject: None,
            heartbeat: None,
        }
    }

    /// Messages asked for per pull request (default 100; at least 1). Set it to the loop's
    /// `batch(n)`: the next pull is requested only once the loop took every message of the last.
    pub fn fetch(mut self, n: usize) -> Self {
        self.fetch = n.max(1);
        self
    }

    /// How long a pull request waits on the server for messages (default 5 s). A pull still
    /// open when the consumer stops can hand messages to a connection that no longer reads
    /// them; those come back after `ack_wait`, so a short `expires` narrows that window.
    pub fn expires(mut self, expires: Duration) -> Self {
        self.expires = expires.max(Duration::from_millis(100));
        self
    }

    /// Where dead letters go (default `idem.dead-letter.<stream>.<consumer>`): a subject
    /// without wildcards, outside the stream's subjects.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// How often a delivery in progress sends `Progress` (default: a third of the consumer's
    /// `ack_wait`).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every.max(Duration::from_millis(10)));
        self
    }

    /// The default dead-letter subject of a stream and consumer.
    pub fn default_dead_letter_subject(stream: &str, consumer: &str) -> String {
        format!("idem.dead-letter.{stream}.{consumer}")
    }

    /// Looks the consumer up, checks the dead-letter subject, and returns the stream of its
    /// deliveries (endless: it pulls again after every pull request ends).
    pub async fn deliveries(self) -> Result<Deliveries, Error> {
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .map_err(nats)?;
        let stream_subjects = stream.info().await.map_err(nats)?.config.subjects.clone();
        let consumer: PullConsumer = stream.get_consumer(&self.consumer).await.map_err(nats)?;
        let config = &consumer.cached_info().config;
        if config.ack_policy != jetstream::consumer::AckPolicy::Explicit {
            return Err(Error::Config(format!(
                "consumer {} of stream {} must use AckPolicy::Explicit (it has {:?})",
                self.consumer, self.stream, config.ack_policy
            )));
        }
        let ack_wait = if config.ack_wait.is_zero() {
            Duration::from_secs(30) // the server's default
        } else {
            config.ack_wait
        };
        let max_deliver = u32::try_from(config.max_deliver).ok().filter(|n| *n > 0);

        let subject = self
            .dead_letter_subject
            .clone()
            .unwrap_or_else(|| Self::default_dead_letter_subject(&self.stream, &self.consumer));
        let dead_letter = self.dead_letter_target(&subject, &stream_subjects).await?;

        let shared = Arc::new(Shared {
            client: self.jetstream.client(),
            jetstream: self.jetstream.clone(),
            stream: self.stream.clone(),
            consumer: self.consumer.clone(),
            dead_letter,
            heartbeat: self.heartbeat.unwrap_or(ack_wait / 3),
            max_deliver,
        });
        let pulls = Pulls {
            consumer,
            fetch: self.fetch,
            expires: self.expires,
            batch: None,
            shared: shared.clone(),
        };
        let inner = stream::unfold(pulls, Pulls::next).boxed();
        Ok(Deliveries { inner, shared })
    }

    /// Where dead letters go and how their publish is confirmed (see the crate docs).
    async fn dead_letter_target(
        &self,
        subject: &str,
        stream_subjects: &[String],
    ) -> Result<DeadLetter, Error> {
        if subject.is_empty()
            || subject
                .split('.')
                .any(|t| t.is_empty() || t == "*" || t == ">" || t.contains(char::is_whitespace))
        {
            return Err(Error::Config(format!(
                "the dead-letter subject {subject:?} must be a subject without wildcards"
            )));
        }
        if let Some(pattern) = stream_subjects.iter().find(|p| subject_matches(p, subject)) {
            return Err(Error::Config(format!(
                "the dead-letter subject {subject} is captured by the stream {} itself (its \
                 subject {pattern}), so dead letters would loop back into the consumer; choose \
                 a subject outside the stream's subjects",
                self.stream
            )));
        }
        use jetstream::context::GetStreamByNameErrorKind as Kind;
        match self.jetstream.stream_by_subject(subject).await {
            Ok(name) if name == self.stream => Err(Error::Config(format!(
                "the dead-letter subject {subject} is captured by the stream {name} itself"
            ))),
            Ok(name) => Ok(DeadLetter {
                subject: subject.to_string(),
                stream: Some(name),
            }),
            Err(err) if matches!(err.kind(), Kind::NotFound) => {
                tracing::warn!(
                    subject,
                    "no stream stores the dead-letter subject: dead letters are published on \
                     core NATS (confirmed by a flush) and are lost unless something subscribes; \
                     create a stream on that subject to keep them"
                );
                Ok(DeadLetter {
                    subject: subject.to_string(),
                    stream: None,
                })
            }
            Err(err) => Err(nats(err)),
        }
    }
}

/// Whether the NATS subject pattern `pattern` (with `*` and `>` wildcards) matches `subject`.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// What every delivery of a [`Source`] shares.
#[derive(Debug)]
struct Shared {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    stream: String,
    consumer: String,
    dead_letter: DeadLetter,
    heartbeat: Duration,
    max_deliver: Option<u32>,
}

#[derive(Debug)]
struct DeadLetter {
    subject: String,
    /// The stream that stores the subject (publish acked by JetStream), or none (core NATS).
    stream: Option<String>,
}

/// The state of the deliveries stream: the pull request in progress, if any.
struct Pulls {
    consumer: PullConsumer,
    fetch: usize,
    expires: Duration,
    batch: Option<jetstream::consumer::pull::Batch>,
    shared: Arc<Shared>,
}

impl Pulls {
    async fn next(mut self) -> Option<(Result<NatsDelivery, Error>, Self)> {
        loop {
            let batch = match self.batch.as_mut() {
                Some(batch) => batch,
                None => {
                    // Pulled only now that the loop took every message of the last pull.
                    let pulled = self
                        .consumer
                        .batch()
                        .max_messages(self.fetch)
                        .expires(self.expires)
                        .messages()
                        .await;
                    match pulled {
                        Ok(batch) => self.batch.insert(batch),
                        Err(err) => {
                            // Do not spin on a server that is away.
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            return Some((Err(nats(err)), self));
                        }
                    }
                }
            };
            match batch.next().await {
                Some(Ok(message)) => {
                    let delivery = NatsDelivery::new(message, self.shared.clone());
                    return Some((Ok(delivery), self));
                }
                Some(Err(err)) => {
                    self.batch = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return Some((Err(Error::Nats(err)), self));
                }
                None => self.batch = None,
            }
        }
    }
}

impl Drop for Pulls {
    /// The last pull request may still be open on the server when the loop stops taking: the
    /// messages it brings (and those the loop gave back, which JetStream redelivers into it)
    /// would reach a connection that no longer reads them, and come back only after
    /// `ack_wait`. So a task reads that pull to its end and gives each message back with a
    /// delay of `expires`, so that it cannot land in the same pull again.
    fn drop(&mut self) {
        let (Some(mut batch), Ok(runtime)) =
            (self.batch.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let expires = self.expires;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(expires + Duration::from_secs(1), async {
                while let Some(message) = batch.next().await {
                    let Ok(message) = message else { continue };
                    if let Err(err) = message.double_ack_with(AckKind::Nak(Some(expires))).await {
                        tracing::debug!(error = %err, "could not give back an unused message; it comes back after ack_wait");
                    }
                }
            })
            .await;
        });
    }
}

/// The deliveries of a [`Source`]: an endless stream for the consumer loop.
pub struct Deliveries {
    inner: BoxStream<'static, Result<NatsDelivery, Error>>,
    shared: Arc<Shared>,
}

impl Deliveries {
    /// The dead-letter subject in use.
    pub fn dead_letter_subject(&self) -> &str {
        &self.shared.dead_letter.subject
    }

    /// The stream that stores dead letters, if one does (else they go out on core NATS).
    pub fn dead_letter_stream(&self) -> Option<&str> {
        self.shared.dead_letter.stream.as_deref()
    }

    /// The interval of the `Progress` heartbeats.
    pub fn heartbeat(&self) -> Duration {
        self.shared.heartbeat
    }

    /// The consumer's `max_deliver`, if it has one.
    pub fn max_deliver(&self) -> Option<u32> {
        self.shared.max_deliver
    }
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("stream", &self.shared.stream)
            .field("consumer", &self.shared.consumer)
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Result<NatsDelivery, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// A JetStream message delivered and not yet settled. While it lives, it sends `Progress`
/// heartbeats; settling or dropping it stops them.
pub struct NatsDelivery {
    message: jetstream::Message,
    shared: Arc<Shared>,
    delivered: u32,
    stream_sequence: u64,
    ticker: AbortHandle,
}

impl fmt::Debug for NatsDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDelivery")
            .field("stream", &self.shared.stream)
            .field("sequence", &self.stream_sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl NatsDelivery {
    fn new(message: jetstream::Message, shared: Arc<Shared>) -> Self {
        let (delivered, stream_sequence) = match message.info() {
            Ok(info) => (
                u32::try_from(info.delivered).unwrap_or(u32::MAX),
                info.stream_sequence,
            ),
            Err(_) => (1, 0),
        };
        let ticker = tokio::spawn(heartbeats(message.clone(), shared.heartbeat)).abort_handle();
        NatsDelivery {
            message,
            shared,
            delivered,
            stream_sequence,
            ticker,
        }
    }

    /// The message as async-nats gives it (subject, headers, payload).
    pub fn message(&self) -> &jetstream::Message {
        &self.message
    }

    /// Its sequence in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }

    /// Whether JetStream will not deliver it again (the consumer's `max_deliver` reached).
    fn last_allowed(&self) -> bool {
        self.shared
            .max_deliver
            .is_some_and(|max| self.delivered >= max)
    }

    /// Publishes the dead letter and waits for its confirmation.
    async fn publish_dead_letter(&self, reason: &DeadLetterReason) -> Result<(), SettleError> {
        let shared = &self.shared;
        let mut headers = self.message.headers.clone().unwrap_or_default();
        headers.insert(HEADER_REASON, reason.as_str());
        headers.insert(HEADER_REASON_DETAIL, one_line(&reason.to_string()).as_str());
        headers.insert(HEADER_DELIVERIES, self.delivered.to_string().as_str());
        headers.insert(HEADER_SOURCE_STREAM, shared.stream.as_str());
        headers.insert(HEADER_SOURCE_CONSUMER, shared.consumer.as_str());
        headers.insert(
            HEADER_SOURCE_SEQUENCE,
            self.stream_sequence.to_string().as_str(),
        );
        headers.insert(HEADER_SOURCE_SUBJECT, self.message.subject.as_str());
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("idem-dlq.{}.{}", shared.stream, self.stream_sequence).as_str(),
        );
        let subject = shared.dead_letter.subject.clone();
        let payload = self.message.payload.clone();
        match &shared.dead_letter.stream {
            Some(_) => {
                let ack = shared
                    .jetstream
                    .publish_with_headers(subject, headers, payload)
                    .await?;
                ack.await?;
            }
            None => {
                shared
                    .client
                    .publish_with_headers(subject, headers, payload)
                    .await?;
                shared.client.flush().await?;
            }
        }
        Ok(())
    }
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect()
}

impl Drop for NatsDelivery {
    fn drop(&mut self) {
        self.ticker.abort();
    }
}

/// Sends `Progress` every `every` until aborted.
async fn heartbeats(message: jetstream::Message, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(err) = message.double_ack_with(AckKind::Progress).await {
            tracing::warn!(subject = %message.subject, error = %err, "a Progress heartbeat failed; trying again at the next tick");
        }
    }
}

impl Delivery for NatsDelivery {
    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn deliveries(&self) -> Option<u32> {
        Some(self.delivered)
    }

    fn describe(&self) -> String {
        format!(
            "nats {}/{} #{} (delivery {})",
            self.shared.stream, self.shared.consumer, self.stream_sequence, self.delivered
        )
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.ticker.abort();
        let settle = match settle {
            // JetStream will not deliver it again: dead-letter it rather than strand it.
            Settle::Requeue { .. } if self.last_allowed() => {
                tracing::warn!(delivery = %self.describe(), "the consumer's max_deliver is reached: dead-lettering instead of requeueing");
                Settle::DeadLetter {
                    reason: DeadLetterReason::TooManyDeliveries {
                        deliveries: self.delivered,
                    },
                }
            }
            other => other,
        };
        match settle {
            Settle::Ack => self.message.double_ack().await?,
            Settle::Requeue { delay } => {
                let delay = (!delay.is_zero()).then_some(delay);
                self.message.double_ack_with(AckKind::Nak(delay)).await?
            }
            Settle::DeadLetter { reason } => {
                self.publish_dead_letter(&reason).await?;
                self.message.double_ack_with(AckKind::Term).await?
            }
            other => return Err(format!("idem-nats does not know the settlement {other:?}").into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn subjects_match_like_nats() {
        assert!(subject_matches("orders.>", "orders.created"));
        assert!(subject_matches("orders.>", "orders.a.b"));
        assert!(!subject_matches("orders.>", "orders"));
        assert!(subject_matches("orders.*", "orders.x"));
        assert!(!subject_matches("orders.*", "orders.x.y"));
        assert!(subject_matches(">", "idem.dead-letter.S.C"));
        assert!(!subject_matches("orders.*", "idem.dead-letter.orders.c"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.b.c"));
    }
}

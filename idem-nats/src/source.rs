//! [`Source`]: a durable pull consumer of a JetStream stream, from [`SourceBuilder::connect`];
//! its [`Deliveries`] for the consumer loop.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::stream::{self, BoxStream, Stream, StreamExt as _};
use idem_runtime::consume::adapter::{Lifecycle, CLOSE_TIMEOUT};

use crate::delivery::{DeadLetter, Delivery, Shared};
use crate::error::Error;
use crate::pull::Pulls;

/// The settings of a [`Source`], from [`Source::builder`]; nothing connects until
/// [`connect`](SourceBuilder::connect).
#[derive(Clone)]
pub struct SourceBuilder {
    url: String,
    stream: String,
    consumer: String,
    prefetch: usize,
    expires: Duration,
    dead_letters: Option<String>,
    heartbeat: Option<Duration>,
    options: Option<async_nats::ConnectOptions>,
    request_timeout: Option<Duration>,
}

/// The URL without its password or token.
impl std::fmt::Debug for SourceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceBuilder")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("prefetch", &self.prefetch)
            .field("expires", &self.expires)
            .field("dead_letters", &self.dead_letters)
            .field("heartbeat", &self.heartbeat)
            .field("options", &self.options)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl SourceBuilder {
    /// How many messages one pull request asks for (`max_messages`; default 100, at least 1).
    /// The next pull is requested only once the loop took every message of the last, so set
    /// it to the consumer's `batch`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Where dead letters go (default `idem.dead-letter.<stream>.<consumer>`): a subject
    /// without wildcards, outside the stream's subjects. [`connect`](SourceBuilder::connect)
    /// checks both.
    pub fn dead_letters(mut self, subject: impl Into<String>) -> Self {
        self.dead_letters = Some(subject.into());
        self
    }

    /// How long a pull request waits on the server for messages (default 5 s). A pull still
    /// open when the consumer stops is read to its end and its messages given back, with a
    /// delay of `expires` so that they cannot land in the same pull again.
    pub fn expires(mut self, expires: Duration) -> Self {
        self.expires = expires.max(Duration::from_millis(100));
        self
    }

    /// How often a delivery in progress sends `Progress` (default: a third of the consumer's
    /// `ack_wait`).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every.max(Duration::from_millis(10)));
        self
    }

    /// async-nats' connection options (credentials, TLS, a name, reconnect policy, ...);
    /// default `ConnectOptions::new()`.
    pub fn options(mut self, options: async_nats::ConnectOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// How long a JetStream request, and a settlement's confirmation, waits for the server's
    /// answer (default async-nats' 5 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Connects ([`Error::Connect`], or [`Error::Tls`] when the TLS handshake fails), checks
    /// that the stream and its durable consumer exist
    /// ([`Error::StreamMissing`], [`Error::ConsumerMissing`]) and that the consumer acks
    /// explicitly ([`Error::AckPolicy`]), and checks the dead-letter subject: without wildcards
    /// ([`Error::DeadLetterSubjectInvalid`]), outside the stream's subjects
    /// ([`Error::DeadLetterCaptured`]), and which stream (if any) stores it, which decides how
    /// a dead letter's publish is confirmed (see the crate docs).
    pub async fn connect(self) -> Result<Source, Error> {
        let options = self.options.unwrap_or_default();
        let client = crate::connect::connect(&self.url, options).await?;
        let mut context = jetstream::ContextBuilder::new();
        if let Some(timeout) = self.request_timeout {
            context = context.timeout(timeout);
        }
        let jetstream = context.build(client.clone());

        let stream_name = self.stream.clone();
        let mut stream = jetstream.get_stream(&self.stream).await.map_err(|err| {
            use jetstream::context::GetStreamErrorKind as Kind;
            match err.kind() {
                Kind::JetStream(e) if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND => {
                    Error::StreamMissing {
                        stream: stream_name.clone(),
                        source: err.into(),
                    }
                }
                _ => Error::Request {
                    what: format!("reading the stream {stream_name:?}"),
                    source: err.into(),
                },
            }
        })?;
        let stream_subjects = stream
            .info()
            .await
            .map_err(|err| Error::Request {
                what: format!("reading the stream {:?}'s info", self.stream),
                source: err.into(),
            })?
            .config
            .subjects
            .clone();
        if let Err(err) = stream.consumer_info(&self.consumer).await {
            use jetstream::context::ConsumerInfoErrorKind as Kind;
            return Err(match err.kind() {
                Kind::NotFound | Kind::InvalidName => Error::ConsumerMissing {
                    stream: self.stream,
                    consumer: self.consumer,
                    source: err.into(),
                },
                Kind::JetStream(e)
                    if e.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND =>
                {
                    Error::ConsumerMissing {
                        stream: self.stream,
                        consumer: self.consumer,
                        source: err.into(),
                    }
                }
                _ => Error::Request {
                    what: format!(
                        "reading the consumer {:?} of the stream {:?}",
                        self.consumer, self.stream
                    ),
                    source: err.into(),
                },
            });
        }
        let consumer: PullConsumer =
            stream
                .get_consumer(&self.consumer)
                .await
                .map_err(|source| Error::Request {
                    what: format!(
                        "loading the consumer {:?} of the stream {:?}",
                        self.consumer, self.stream
                    ),
                    source,
                })?;
        let config = &consumer.cached_info().config;
        if config.ack_policy != jetstream::consumer::AckPolicy::Explicit {
            return Err(Error::AckPolicy {
                stream: self.stream,
                consumer: self.consumer,
                policy: format!("{:?}", config.ack_policy),
            });
        }
        let ack_wait = if config.ack_wait.is_zero() {
            Duration::from_secs(30) // the server's default
        } else {
            config.ack_wait
        };
        let max_deliver = u32::try_from(config.max_deliver).ok().filter(|n| *n > 0);

        let subject = self
            .dead_letters
            .clone()
            .unwrap_or_else(|| Source::default_dead_letter_subject(&self.stream, &self.consumer));
        let dead_letter =
            dead_letter_target(&jetstream, &self.stream, &subject, &stream_subjects).await?;

        Ok(Source {
            consumer,
            prefetch: self.prefetch,
            expires: self.expires,
            shared: Arc::new(Shared {
                client,
                jetstream,
                stream: self.stream,
                consumer: self.consumer,
                dead_letter,
                heartbeat: self.heartbeat.unwrap_or(ack_wait / 3),
                max_deliver,
                lifecycle: Lifecycle::new(),
                settle_timeout: self.request_timeout.unwrap_or(Duration::from_secs(5)),
            }),
        })
    }
}

/// Where dead letters go and how their publish is confirmed (see the crate docs).
async fn dead_letter_target(
    jetstream: &jetstream::Context,
    stream: &str,
    subject: &str,
    stream_subjects: &[String],
) -> Result<DeadLetter, Error> {
    if subject.is_empty()
        || subject
            .split('.')
            .any(|t| t.is_empty() || t == "*" || t == ">" || t.contains(char::is_whitespace))
    {
        return Err(Error::DeadLetterSubjectInvalid {
            subject: subject.to_string(),
        });
    }
    let captured = |pattern: &str| Error::DeadLetterCaptured {
        subject: subject.to_string(),
        stream: stream.to_string(),
        pattern: pattern.to_string(),
    };
    if let Some(pattern) = stream_subjects.iter().find(|p| subject_matches(p, subject)) {
        return Err(captured(pattern));
    }
    use jetstream::context::GetStreamByNameErrorKind as Kind;
    match jetstream.stream_by_subject(subject).await {
        Ok(name) if name == stream => Err(captured(subject)),
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
        Err(err) => Err(Error::Request {
            what: format!("looking up the stream of the dead-letter subject {subject}"),
            source: err.into(),
        }),
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

/// A durable pull consumer of a JetStream stream: hand [`deliveries`](Source::deliveries) to
/// `idem::consume::Consumer::run`, then [`close`](Source::close) it.
pub struct Source {
    pub(crate) consumer: PullConsumer,
    prefetch: usize,
    expires: Duration,
    pub(crate) shared: Arc<Shared>,
}

impl Source {
    /// The existing durable pull consumer `consumer` of the stream `stream` on the server at
    /// `url` (`nats://host:4222`, several separated by commas; its ack policy must be explicit,
    /// JetStream's default for pull consumers). Nothing connects until
    /// [`SourceBuilder::connect`].
    pub fn builder(
        url: impl Into<String>,
        stream: impl Into<String>,
        consumer: impl Into<String>,
    ) -> SourceBuilder {
        SourceBuilder {
            url: url.into(),
            stream: stream.into(),
            consumer: consumer.into(),
            prefetch: 100,
            expires: Duration::from_secs(5),
            dead_letters: None,
            heartbeat: None,
            options: None,
            request_timeout: None,
        }
    }

    /// The deliveries, for `Consumer::run`: endless (it pulls again after every pull request
    /// ends) until [`close`](Source::close). May be called more than once: the streams pull
    /// from the same consumer, each message going to one of them.
    pub fn deliveries(&self) -> Deliveries {
        let pulls = Pulls::new(
            self.consumer.clone(),
            self.prefetch,
            self.expires,
            self.shared.clone(),
        );
        Deliveries {
            inner: stream::unfold(pulls, Pulls::next)
                .take_until(self.shared.lifecycle.stopped())
                .boxed(),
            shared: self.shared.clone(),
        }
    }

    /// Leaves the server: stops pulling (every stream of this source ends), waits up to
    /// [`CLOSE_TIMEOUT`] (30 s) for the streams and the deliveries still out to be settled or
    /// dropped, and for the messages of a pull still open at the stop to be given back (a nak
    /// delayed by `expires`), then flushes and drains the connection.
    pub async fn close(self) -> Result<(), Error> {
        let Source {
            consumer, shared, ..
        } = self;
        shared.lifecycle.stop();
        drop(consumer);
        if !shared.lifecycle.drained(CLOSE_TIMEOUT).await {
            tracing::warn!(
                stream = %shared.stream,
                consumer = %shared.consumer,
                out = shared.lifecycle.in_flight(),
                "deliveries still out {CLOSE_TIMEOUT:?} after close began; leaving anyway (they come back after ack_wait)"
            );
        }
        shared.client.flush().await.map_err(|err| Error::Request {
            what: "flushing the connection".into(),
            source: err.into(),
        })?;
        shared.client.drain().await.map_err(|err| Error::Request {
            what: "draining the connection".into(),
            source: err.into(),
        })
    }

    /// The default dead-letter subject of a stream and consumer:
    /// `idem.dead-letter.<stream>.<consumer>` (create a stream on it to keep dead letters).
    pub fn default_dead_letter_subject(stream: &str, consumer: &str) -> String {
        format!("idem.dead-letter.{stream}.{consumer}")
    }

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

    /// The connection's client (to publish, or to watch its state).
    pub fn client(&self) -> &async_nats::Client {
        &self.shared.client
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("stream", &self.shared.stream)
            .field("consumer", &self.shared.consumer)
            .field("dead_letter_subject", &self.shared.dead_letter.subject)
            .finish_non_exhaustive()
    }
}

impl idem_runtime::consume::Source for Source {
    type Delivery = Delivery;
    type Error = Error;
    type Deliveries = Deliveries;

    fn deliveries(&self) -> Deliveries {
        Source::deliveries(self)
    }

    async fn lag(&self) -> Result<Vec<idem_runtime::consume::Lag>, Error> {
        Source::lag(self).await
    }

    async fn close(self) -> Result<(), Error> {
        Source::close(self).await
    }

    fn probe(&self) -> idem_runtime::consume::Probe {
        Source::probe(self)
    }
}

/// The deliveries of a [`Source`]: a `Stream<Item = Result<Delivery, Error>>` for
/// `Consumer::run`, endless until [`Source::close`]. An error item (a failed pull) is followed
/// by a short pause; the stream goes on.
pub struct Deliveries {
    inner: BoxStream<'static, Result<Delivery, Error>>,
    shared: Arc<Shared>,
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
    type Item = Result<Delivery, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
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

//! The outbox's JetStream side: [`OutboxPublisher`], an `idem::outbox::Publisher` that
//! publishes with the message id as `Nats-Msg-Id` and waits for every publish ack.

use std::str::FromStr as _;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishAckFuture, message::PublishMessage};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use idem_runtime::outbox::{Message, PublishError, Publisher};

use crate::error::Error;
use crate::headers;

/// The settings of an [`OutboxPublisher`], from [`OutboxPublisher::builder`]; nothing connects
/// until [`connect`](OutboxPublisherBuilder::connect).
#[derive(Clone)]
pub struct OutboxPublisherBuilder {
    url: String,
    options: Option<async_nats::ConnectOptions>,
    request_timeout: Option<Duration>,
}

/// The URL without its password or token.
impl std::fmt::Debug for OutboxPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisherBuilder")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .field("options", &self.options)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl OutboxPublisherBuilder {
    /// async-nats' connection options (credentials, TLS, a name, reconnect policy, ...);
    /// default `ConnectOptions::new()`.
    pub fn options(mut self, options: async_nats::ConnectOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// How long a publish waits for the stream's ack (default async-nats' 5 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Connects ([`Error::Connect`], or [`Error::Tls`] when the TLS handshake fails). The
    /// client reconnects by itself afterwards.
    pub async fn connect(self) -> Result<OutboxPublisher, Error> {
        let client = crate::connect::connect(&self.url, self.options.unwrap_or_default()).await?;
        let mut context = jetstream::ContextBuilder::new();
        if let Some(timeout) = self.request_timeout {
            context = context.timeout(timeout);
        }
        Ok(OutboxPublisher {
            js: context.build(client),
        })
    }
}

/// Publishes outbox messages to JetStream for an `idem::outbox::Relay`: each to the subject
/// named by its destination, with its id as `Nats-Msg-Id` and as [`headers::MESSAGE_ID`], its
/// headers, and its partition key as [`headers::PARTITION_KEY`]. A batch is published in
/// order without waiting (pipelined), then its publish acks are awaited in order; it succeeds
/// once the stream acked every message. A message the stream reports as a duplicate (its id
/// was stored within the stream's duplicate window, 2 minutes by default: the relay published
/// it before and crashed, or timed out, before marking it) counts as confirmed: it is stored
/// once.
///
/// A subject that no stream captures fails the batch (no responders): the relay keeps the rows
/// and tries again after a backoff, so create the stream first. The client reconnects by itself.
///
/// Consumers downstream dedupe on the id, read from [`Delivery::message`](crate::Delivery::message)'s
/// headers: JetStream's window drops a quick republish, and `#[idempotent(key = ...)]` on that
/// id covers what the window cannot see.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::nats::OutboxPublisher;
/// use idem::outbox::Relay;
///
/// let publisher = OutboxPublisher::builder("nats://127.0.0.1:4222").connect().await?;
/// let stats = Relay::new(pool, publisher)
///     .run(std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
///     .await;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OutboxPublisher {
    js: jetstream::Context,
}

impl OutboxPublisher {
    /// A publisher to the server at `url` (`nats://host:4222`, several separated by commas);
    /// nothing connects until [`OutboxPublisherBuilder::connect`].
    pub fn builder(url: impl Into<String>) -> OutboxPublisherBuilder {
        OutboxPublisherBuilder {
            url: url.into(),
            options: None,
            request_timeout: None,
        }
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(batch.len());
        // One client connection, in order: the server stores one connection's publishes to a
        // stream in the order it received them.
        for message in batch {
            let ack = self
                .js
                .send_publish(
                    message.destination.clone(),
                    PublishMessage::build()
                        .payload(message.payload.clone().into())
                        .headers(fields(message)?),
                )
                .await
                .map_err(|err| {
                    format!(
                        "publishing message {} to {:?}: {err}",
                        message.id, message.destination
                    )
                })?;
            acks.push(ack);
        }
        for (ack, message) in acks.into_iter().zip(batch) {
            // `duplicate: true` is a success: the stream already holds this id.
            ack.await.map_err(|err| {
                format!(
                    "JetStream did not store message {} on {:?}: {err}",
                    message.id, message.destination
                )
            })?;
        }
        Ok(())
    }

    /// [`BROKER`](crate::BROKER).
    fn broker(&self) -> &str {
        crate::BROKER
    }
}

/// The headers of an outbox message's publish: its own, its partition key, its id (idem's
/// header and `Nats-Msg-Id`).
/// A header NATS cannot carry (a name with `:`, a space or a control character, a value with a
/// line break) is an error naming it, never a panic.
fn fields(message: &Message) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    let refused = |what: &str, text: &str| {
        format!(
            "message {}: NATS cannot carry the header {what} {text:?}",
            message.id
        )
    };
    let value =
        |text: &str| HeaderValue::from_str(text).map_err(|_| refused("value (line break)", text));
    for (name, text) in &message.headers {
        let name = HeaderName::from_str(name).map_err(|_| refused("name", name))?;
        headers.append(name, value(text)?);
    }
    if !message.partition_key.is_empty() {
        headers.insert(headers::PARTITION_KEY, value(&message.partition_key)?);
    }
    headers.insert(headers::MESSAGE_ID, value(&message.id)?);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, value(&message.id)?);
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(headers: &[(&str, &str)], partition_key: &str) -> Message {
        Message {
            id: "idem-0123".into(),
            destination: "orders.placed".into(),
            partition_key: partition_key.into(),
            payload: b"{}".to_vec(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            attempts: 0,
        }
    }

    #[test]
    fn headers_carry_the_id_the_partition_key_and_the_message_headers() {
        let fields = fields(&message(&[("kind", "receipt")], "ada")).unwrap();
        assert_eq!(fields.get("Nats-Msg-Id").unwrap().as_str(), "idem-0123");
        assert_eq!(
            fields.get(headers::MESSAGE_ID).unwrap().as_str(),
            "idem-0123"
        );
        assert_eq!(fields.get(headers::PARTITION_KEY).unwrap().as_str(), "ada");
        assert_eq!(fields.get("kind").unwrap().as_str(), "receipt");
        let unkeyed = super::fields(&message(&[], "")).unwrap();
        assert!(unkeyed.get(headers::PARTITION_KEY).is_none());
    }

    #[test]
    fn headers_nats_cannot_carry_are_errors_not_panics() {
        let err = fields(&message(&[("a:b", "x")], "")).unwrap_err();
        assert!(err.contains("idem-0123") && err.contains("a:b"), "{err}");
        assert!(fields(&message(&[("kind", "a\nb")], "")).is_err());
        assert!(fields(&message(&[], "line\nbreak")).is_err());
    }
}

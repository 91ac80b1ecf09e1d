//! The outbox's RabbitMQ side: [`OutboxPublisher`], an `idem::outbox::Publisher` that
//! publishes with publisher confirms and the message id as AMQP `message_id`.

use std::sync::Mutex;
use std::time::Duration;

use idem_runtime::outbox::{Message, PublishError, Publisher};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::BasicProperties;
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};

use crate::error::Error;
use crate::headers;
use crate::source::{exchange_exists, open, CONNECT_TIMEOUT};

/// The settings of an [`OutboxPublisher`], from [`OutboxPublisher::builder`]; nothing connects
/// until [`connect`](OutboxPublisherBuilder::connect).
#[derive(Clone)]
pub struct OutboxPublisherBuilder {
    url: String,
    exchange: String,
    properties: Option<ConnectionProperties>,
    tls: Option<OwnedTLSConfig>,
    connect_timeout: Duration,
}

/// The URL without its password; of the TLS settings (which may hold a key's
/// password) only whether there are any.
impl std::fmt::Debug for OutboxPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisherBuilder")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .field("exchange", &self.exchange)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl OutboxPublisherBuilder {
    /// Publishes to `exchange` instead of the default exchange (the destination is then the
    /// routing key on it). It must exist: [`connect`](OutboxPublisherBuilder::connect) checks it.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// lapin's connection properties (connection name, auth provider, ...).
    pub fn connection_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = Some(properties);
        self
    }

    /// TLS settings for an `amqps://` URL: a custom CA chain (PEM) or a client identity.
    pub fn tls(mut self, tls: OwnedTLSConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long opening a connection waits for the broker, at `connect` and when a lost one
    /// is opened again for a batch (default [`CONNECT_TIMEOUT`], 30 s): past it,
    /// [`Error::ConnectTimeout`] (the relay tries the batch again later).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects, checks that the exchange exists ([`Error::ExchangeMissing`]; the default
    /// exchange always does) and opens a confirm-mode channel. Later, a lost channel or
    /// connection is opened again on the next batch.
    pub async fn connect(self) -> Result<OutboxPublisher, Error> {
        let publisher = OutboxPublisher {
            url: self.url,
            exchange: self.exchange,
            properties: self.properties,
            tls: self.tls,
            connect_timeout: self.connect_timeout,
            open: Mutex::new(None),
        };
        let (connection, channel) = publisher.open().await?;
        if !publisher.exchange.is_empty() {
            let check = connection
                .create_channel()
                .await
                .map_err(|source| Error::Setup {
                    what: "a channel of the outbox publisher".into(),
                    source,
                })?;
            if let Err(source) = exchange_exists(&check, &publisher.exchange).await {
                let _ = connection.close(200, "OK".into()).await;
                return Err(Error::ExchangeMissing {
                    exchange: publisher.exchange,
                    source,
                });
            }
            let _ = check.close(200, "OK".into()).await;
        }
        *publisher.lock() = Some((connection, channel));
        Ok(publisher)
    }
}

/// Publishes outbox messages to RabbitMQ for an `idem::outbox::Relay`: each to `exchange`
/// (default: the default exchange, which routes to the queue named by the routing key) with
/// the message's destination as routing key, persistent, `mandatory`, with its id as AMQP
/// `message_id` and as the [`headers::MESSAGE_ID`] header, `application/json`, its headers and
/// its partition key ([`headers::PARTITION_KEY`]) as AMQP headers. A batch succeeds once the
/// broker confirmed (publisher confirms) every message and returned none as unroutable;
/// otherwise the relay publishes the batch again later. A lost channel or connection is
/// opened again on the next batch.
///
/// Consumers downstream dedupe on the id: `#[idempotent(key = "msg.id")]` with the id taken
/// from the delivery's properties or headers (or carried in the payload).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::outbox::Relay;
/// use idem::rabbitmq::OutboxPublisher;
///
/// let publisher = OutboxPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .exchange("events") // or the default exchange: the destination is the queue
///     .connect()
///     .await?;
/// let stats = Relay::new(pool, publisher)
///     .run(std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
///     .await;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
pub struct OutboxPublisher {
    url: String,
    exchange: String,
    properties: Option<ConnectionProperties>,
    tls: Option<OwnedTLSConfig>,
    connect_timeout: Duration,
    /// The connection and its confirm-mode channel, while they are open.
    open: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for OutboxPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisher")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

impl OutboxPublisher {
    /// A publisher to the broker at `url` (`amqp://...`, `amqps://...`); nothing connects
    /// until [`OutboxPublisherBuilder::connect`].
    pub fn builder(url: impl Into<String>) -> OutboxPublisherBuilder {
        OutboxPublisherBuilder {
            url: url.into(),
            exchange: String::new(),
            properties: None,
            tls: None,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }

    /// A new connection and its confirm-mode channel.
    async fn open(&self) -> Result<(Connection, Channel), Error> {
        let connection = open(
            &self.url,
            self.properties.clone(),
            self.tls.clone(),
            self.connect_timeout,
        )
        .await?;
        let setup = |source| Error::Setup {
            what: "the outbox publisher's confirm-mode channel".into(),
            source,
        };
        let channel = connection.create_channel().await.map_err(setup)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(setup)?;
        Ok((connection, channel))
    }

    /// The open confirm-mode channel, or a new connection and channel.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let open = self.lock().as_ref().and_then(|(connection, channel)| {
            (connection.status().connected() && channel.status().connected())
                .then(|| channel.clone())
        });
        if let Some(channel) = open {
            return Ok(channel);
        }
        let (connection, channel) = self.open().await?;
        *self.lock() = Some((connection, channel.clone()));
        Ok(channel)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Connection, Channel)>> {
        // A panic while the lock was held left nothing half-written: the value is still usable.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn publish_all(&self, channel: &Channel, batch: &[Message]) -> Result<(), PublishError> {
        let mut confirms = Vec::with_capacity(batch.len());
        // One channel, in order: RabbitMQ keeps the order of one channel's publishes to a queue.
        for message in batch {
            let confirm = channel
                .basic_publish(
                    ShortString::from(self.exchange.as_str()),
                    ShortString::from(message.destination.as_str()),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.payload,
                    properties(message),
                )
                .await?;
            confirms.push(confirm);
        }
        for (confirm, message) in confirms.into_iter().zip(batch) {
            let confirmation = confirm.await?;
            if !confirmation.is_ack() {
                return Err(format!("the broker refused (nack) message {}", message.id).into());
            }
            if let Some(returned) = confirmation.take_message() {
                return Err(format!(
                    "exchange {:?} routed message {} (routing key {:?}) to no queue: {}",
                    self.exchange, message.id, message.destination, returned.reply_text
                )
                .into());
            }
        }
        Ok(())
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        let channel = self.channel().await?;
        let result = self.publish_all(&channel, batch).await;
        if result.is_err() {
            // Open a fresh channel next time: this one may be closed or in an unknown state.
            if let Some((connection, _)) = self.lock().take() {
                tokio::spawn(async move {
                    let _ = connection
                        .close(200, "idem outbox: reconnecting".into())
                        .await;
                });
            }
        }
        result
    }

    /// [`BROKER`](crate::BROKER).
    fn broker(&self) -> &str {
        crate::BROKER
    }
}

/// The AMQP properties of an outbox message.
fn properties(message: &Message) -> BasicProperties {
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut fields = FieldTable::default();
    for (name, value) in &message.headers {
        fields.insert(name.as_str().into(), text(value));
    }
    if !message.partition_key.is_empty() {
        fields.insert(headers::PARTITION_KEY.into(), text(&message.partition_key));
    }
    fields.insert(headers::MESSAGE_ID.into(), text(&message.id));
    BasicProperties::default()
        .with_message_id(ShortString::from(message.id.as_str()))
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2) // persistent
        .with_headers(fields)
}

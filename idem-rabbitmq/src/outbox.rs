//! The outbox's RabbitMQ side: [`OutboxPublisher`], an [`idem_runtime::outbox::Publisher`]
//! that publishes with publisher confirms and the message id as AMQP `message_id`.

use std::sync::Mutex;

use idem_runtime::outbox::{Message, PublishError, Publisher};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};

/// The header that carries a message's partition key.
pub const PARTITION_KEY_HEADER: &str = "x-idem-partition-key";

/// Publishes outbox messages to RabbitMQ for an [`idem::outbox::Relay`](idem_runtime::outbox::Relay):
/// each to `exchange` (default: the default exchange, which routes to the queue named by the
/// routing key) with the message's destination as routing key, persistent, `mandatory`, with
/// its id as AMQP `message_id`, `application/json`, its headers and its partition key
/// ([`PARTITION_KEY_HEADER`]) as AMQP headers. A batch succeeds once the broker confirmed
/// (publisher confirms) every message and returned none as unroutable; otherwise the relay
/// publishes the batch again later. A lost channel or connection is opened again on the next
/// batch.
///
/// Consumers downstream dedupe on `message_id`: `#[idempotent(key = "msg.id")]` with the id
/// taken from the delivery's properties (or carried in the payload).
pub struct OutboxPublisher {
    url: String,
    exchange: String,
    /// The connection and its confirm-mode channel, while they are open.
    open: Mutex<Option<(Connection, Channel)>>,
}

impl OutboxPublisher {
    /// A publisher to the broker at `url` (`amqp://...`); it connects on its first batch.
    pub fn new(url: impl Into<String>) -> Self {
        OutboxPublisher {
            url: url.into(),
            exchange: String::new(),
            open: Mutex::new(None),
        }
    }

    /// Publishes to `exchange` instead of the default exchange (the destination is then the
    /// routing key on it).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
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
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
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
}

/// The AMQP properties of an outbox message.
fn properties(message: &Message) -> BasicProperties {
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut headers = FieldTable::default();
    for (name, value) in &message.headers {
        headers.insert(name.as_str().into(), text(value));
    }
    if !message.partition_key.is_empty() {
        headers.insert(PARTITION_KEY_HEADER.into(), text(&message.partition_key));
    }
    BasicProperties::default()
        .with_message_id(ShortString::from(message.id.as_str()))
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2) // persistent
        .with_headers(headers)
}

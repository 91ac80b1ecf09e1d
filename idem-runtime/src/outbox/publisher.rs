//! The broker side of the relay: [`Publisher`], which the broker crates implement.

use std::future::Future;

use super::message::Message;

/// Why a batch was not published (the relay keeps its rows and tries again after a backoff).
pub type PublishError = Box<dyn std::error::Error + Send + Sync>;

/// Publishes batches of outbox messages to a broker: the `OutboxPublisher` of idem-rabbitmq,
/// idem-nats, idem-kafka and idem-redis implement it, and so can any other.
///
/// `publish` returns `Ok` only once the broker confirmed every message of the batch (publisher
/// confirms, a JetStream ack): the relay then marks the rows sent. On `Err` nothing is marked
/// and the whole batch is published again later, in the same order with the same ids, so set
/// [`Message::id`] as the broker's message id (AMQP `message_id`, `Nats-Msg-Id`, a Kafka
/// header, a Redis stream field) for the
/// consumers downstream to dedupe on. Messages must reach the broker in the batch's order.
pub trait Publisher: Send + Sync {
    /// Publishes `batch` in order and waits for the broker's confirms.
    fn publish(&self, batch: &[Message]) -> impl Future<Output = Result<(), PublishError>> + Send;

    /// The broker it publishes to, as the `messaging.system` of the relay's send spans
    /// (feature `otel`): `rabbitmq`, `nats`, `kafka`, `redis` for idem's publishers. The default
    /// is `other`.
    fn broker(&self) -> &str {
        "other"
    }
}

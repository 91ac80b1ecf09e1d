//! What a broker adapter gives the loop: [`Delivery`], one message not yet settled.

use std::future::Future;

use super::settle::Settle;
use crate::recover::Origin;

/// Why a settlement did not reach the broker (a closed channel, a lost connection). The loop
/// logs and counts it; the broker delivers the message again, and idem sees a duplicate.
pub type SettleError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One message taken from a broker and not yet settled. [`settle`](Delivery::settle) consumes
/// it, so a delivery is settled at most once.
pub trait Delivery: Send + 'static {
    /// The bytes to decode into the handler's message.
    fn payload(&self) -> &[u8];

    /// How many times the broker has delivered this message, this time included, where the
    /// broker counts (RabbitMQ `x-delivery-count`, JetStream `delivered`, Redis Streams);
    /// `None` where it does not (Kafka). Feeds the consumer's `max_deliveries`.
    fn deliveries(&self) -> Option<u32> {
        None
    }

    /// True once the broker has taken this delivery away from this consumer (a Kafka
    /// rebalance revoked its partition): the loop then drops it without running or settling
    /// it, since its new owner gets it again. Checked before a delivery runs.
    fn revoked(&self) -> bool {
        false
    }

    /// A short name for logs: the broker's message id, an offset, an entry id.
    fn describe(&self) -> String;

    /// The message's headers (Redis: its fields other than the payload), in order, as text:
    /// kept with a parked retry or a dead letter in the database. The default has none.
    fn headers(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The message's id, where the broker keeps it apart from [`headers`](Delivery::headers)
    /// (Redis: the entry's `idem-message-id` field): the `messaging.message.id` of its span
    /// (feature `otel`), when its headers do not hold `idem-message-id`. The default has none.
    fn message_id(&self) -> Option<String> {
        None
    }

    /// The consumer group it was delivered to, where the broker has one (a Kafka group, a
    /// JetStream durable consumer, a Redis Streams group): the `messaging.consumer.group.name`
    /// of its span (feature `otel`). The default has none.
    fn consumer_group(&self) -> Option<String> {
        None
    }

    /// Where the message came from and where a replay sends it back: kept with a parked retry
    /// or a dead letter in the database. The default names no broker.
    fn origin(&self) -> Origin {
        Origin::default()
    }

    /// Tells the broker how this delivery ended. Called only after the delivery's transaction
    /// committed (or rolled back).
    fn settle(self, settle: Settle) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Acks `deliveries`, all taken from one stream and each after its transaction committed:
    /// one result per delivery, in order. The default acks them one at a time; an adapter that
    /// can ack many in one go (AMQP's `multiple`) overrides it, and a wrapper around another
    /// delivery type forwards it to keep that.
    fn ack_all(deliveries: Vec<Self>) -> impl Future<Output = Vec<Result<(), SettleError>>> + Send
    where
        Self: Sized,
    {
        async move {
            let mut results = Vec::with_capacity(deliveries.len());
            for delivery in deliveries {
                results.push(delivery.settle(Settle::Ack).await);
            }
            results
        }
    }
}

//! The AMQP headers idem writes and reads on RabbitMQ, as constants. The same names, with the
//! same values, on every broker (the table in `idem::consume`'s docs).

/// An outbox message's id, on what [`OutboxPublisher`](crate::OutboxPublisher) publishes. It
/// is also the AMQP `message_id` property, which AMQP tools show and consumers usually read;
/// the header is there so that code reading idem's headers finds the id the same way on every
/// broker.
pub const MESSAGE_ID: &str = "idem-message-id";

/// An outbox message's partition key (absent when it has none).
pub const PARTITION_KEY: &str = "idem-partition-key";

/// A dead letter's reason, short and stable: `undecodable`, `bad_key`, `too_many_deliveries`,
/// `poisoned`, `conflict`, `replay` (`DeadLetterReason::as_str`).
pub const REASON: &str = "idem-reason";

/// A dead letter's reason in words (the decoder's error, ...).
pub const DETAIL: &str = "idem-detail";

/// How many times the broker had delivered a dead letter's original (an AMQP long), where the
/// queue counts (quorum queues, or a first delivery).
pub const DELIVERIES: &str = "idem-deliveries";

/// How many times the handler failed on a dead letter's original, when it was dead-lettered
/// as `poisoned` (an AMQP long).
pub const ATTEMPTS: &str = "idem-attempts";

/// The queue a dead letter was consumed from.
pub const SOURCE: &str = "idem-source";

/// The exchange a dead letter's original was published to (empty: the default exchange).
pub const SOURCE_EXCHANGE: &str = "idem-source-exchange";

/// The routing key a dead letter's original was published with.
pub const SOURCE_ROUTING_KEY: &str = "idem-source-routing-key";

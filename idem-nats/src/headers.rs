//! The message headers idem writes and reads on NATS, as constants. The same names, with the
//! same values, on every broker (the table in `idem::consume`'s docs).

/// An outbox message's id, on what [`OutboxPublisher`](crate::OutboxPublisher) publishes. The
/// id is also the `Nats-Msg-Id` header, which JetStream deduplicates on within a stream's
/// duplicate window; this one is there so that code reading idem's headers finds the id the
/// same way on every broker.
pub const MESSAGE_ID: &str = "idem-message-id";

/// An outbox message's partition key (absent when it has none).
pub const PARTITION_KEY: &str = "idem-partition-key";

/// A dead letter's reason, short and stable: `undecodable`, `bad_key`, `too_many_deliveries`,
/// `poisoned`, `conflict`, `replay` (`DeadLetterReason::as_str`).
pub const REASON: &str = "idem-reason";

/// A dead letter's reason in words (the decoder's error, ...), on one line.
pub const DETAIL: &str = "idem-detail";

/// How many times JetStream had delivered a dead letter's original.
pub const DELIVERIES: &str = "idem-deliveries";

/// How many times the handler failed on a dead letter's original, when it was dead-lettered
/// as `poisoned`.
pub const ATTEMPTS: &str = "idem-attempts";

/// The stream a dead letter came from.
pub const SOURCE: &str = "idem-source";

/// The durable consumer a dead letter came from.
pub const SOURCE_CONSUMER: &str = "idem-source-consumer";

/// A dead letter's sequence in its source stream.
pub const SOURCE_SEQUENCE: &str = "idem-source-sequence";

/// The subject a dead letter's original was published on.
pub const SOURCE_SUBJECT: &str = "idem-source-subject";

//! The record headers idem writes and reads on Kafka, as constants. The same names, with the
//! same values, on every broker (the table in `idem::consume`'s docs). Kafka keeps no delivery
//! count, so there is no `DELIVERIES` here.

/// An outbox message's id, on what [`OutboxPublisher`](crate::OutboxPublisher) produces.
pub const MESSAGE_ID: &str = "idem-message-id";

/// An outbox message's partition key (absent when it has none). It is also the record's key,
/// which is what Kafka partitions by.
pub const PARTITION_KEY: &str = "idem-partition-key";

/// A dead letter's reason, short and stable: `undecodable`, `bad_key`, `too_many_deliveries`,
/// `poisoned`, `conflict`, `replay` (`DeadLetterReason::as_str`).
pub const REASON: &str = "idem-reason";

/// A dead letter's reason in words (the decoder's error, ...).
pub const DETAIL: &str = "idem-detail";

/// How many times the handler failed on a dead letter's original, when it was dead-lettered
/// as `poisoned`.
pub const ATTEMPTS: &str = "idem-attempts";

/// The topic a dead letter came from.
pub const SOURCE: &str = "idem-source";

/// The partition a dead letter's original was in.
pub const SOURCE_PARTITION: &str = "idem-source-partition";

/// A dead letter original's offset in its partition.
pub const SOURCE_OFFSET: &str = "idem-source-offset";

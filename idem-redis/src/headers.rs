//! The entry fields idem writes and reads on Redis Streams, as constants. The same names, with
//! the same values, as the headers of the other brokers (the table in `idem::consume`'s docs),
//! plus the two that only Redis needs: [`PAYLOAD`] and [`HEADER_PREFIX`].

/// The field that holds the message: what [`Source`](crate::Source) decodes, and what
/// [`OutboxPublisher`](crate::OutboxPublisher) writes. Not `idem-` prefixed: it is the body,
/// which other brokers carry outside their headers, and producers that know nothing of idem
/// write it too (`XADD <stream> * payload <json>`).
pub const PAYLOAD: &str = "payload";

/// An outbox message's id.
pub const MESSAGE_ID: &str = "idem-message-id";

/// An outbox message's partition key (absent when it has none).
pub const PARTITION_KEY: &str = "idem-partition-key";

/// The prefix of the fields that carry an outbox message's headers: `idem-header-<name>`.
pub const HEADER_PREFIX: &str = "idem-header-";

/// A dead letter's reason, short and stable: `undecodable`, `bad_key`, `too_many_deliveries`,
/// `poisoned`, `conflict`, `replay` (`DeadLetterReason::as_str`).
pub const REASON: &str = "idem-reason";

/// A dead letter's reason in words (the decoder's error, ...).
pub const DETAIL: &str = "idem-detail";

/// How many times the group had delivered a dead letter's original.
pub const DELIVERIES: &str = "idem-deliveries";

/// How many times the handler failed on a dead letter's original, when it was dead-lettered
/// as `poisoned`.
pub const ATTEMPTS: &str = "idem-attempts";

/// The stream a dead letter came from.
pub const SOURCE: &str = "idem-source";

/// A dead letter original's entry id in its source stream.
pub const SOURCE_ID: &str = "idem-source-id";

//! What the outbox holds: a message as a [`Publisher`](super::Publisher) sees it, and the
//! checks a message passes before anything is written.

use sha2::{Digest, Sha256};

use super::store::PARTITIONS;

/// The longest destination and partition key, in bytes (they fit an index on every backend).
pub const MAX_NAME_LEN: usize = 255;

/// A committed outbox message, as the relay hands it to a [`Publisher`](super::Publisher).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message id (`idem-` and 32 hex digits), derived from the message that published it:
    /// set it as the broker's message id so that downstream consumers dedupe on it.
    pub id: String,
    /// Where it goes: a queue, routing key, subject or topic, as the publisher reads it.
    pub destination: String,
    /// Messages with one destination and partition key are published in order (`""` = none).
    pub partition_key: String,
    /// The payload, as serde JSON.
    pub payload: Vec<u8>,
    /// Extra headers given at publish time, in order.
    pub headers: Vec<(String, String)>,
    /// How many earlier publishes of it failed.
    pub attempts: u32,
}

/// Why a message was refused before anything was written (reached as `sqlx::Error::Encode`).
///
/// ```
/// let err = idem::outbox::InvalidMessage::new("the destination is empty");
/// assert_eq!(err.to_string(), "outbox message refused: the destination is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidMessage(String);

impl InvalidMessage {
    /// A refusal saying why.
    pub fn new(why: impl Into<String>) -> Self {
        InvalidMessage(why.into())
    }
}

impl std::fmt::Display for InvalidMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "outbox message refused: {}", self.0)
    }
}

impl std::error::Error for InvalidMessage {}

/// Refuses an empty destination, a destination or partition key over [`MAX_NAME_LEN`], and a
/// partition key with a line break or NUL (publishers carry it in a header, as NATS and AMQP
/// header values cannot hold them: such a row would fail on every publish).
pub(crate) fn check_names(destination: &str, partition_key: &str) -> Result<(), InvalidMessage> {
    if destination.is_empty() {
        return Err(InvalidMessage::new("the destination is empty"));
    }
    for (what, value) in [
        ("destination", destination),
        ("partition key", partition_key),
    ] {
        if value.len() > MAX_NAME_LEN {
            return Err(InvalidMessage::new(format!(
                "the {what} is {} bytes; at most {MAX_NAME_LEN} are allowed",
                value.len()
            )));
        }
    }
    if partition_key.contains(['\r', '\n', '\0']) {
        return Err(InvalidMessage::new(
            "the partition key holds a line break or NUL",
        ));
    }
    Ok(())
}

/// Checks the headers every broker can carry: a name of 1 to 255 visible ASCII characters other
/// than `:` (NATS and AMQP are the strictest), a value without line breaks or NUL. Refused here, in
/// the handler's transaction, rather than by the broker on every publish of the row.
pub(crate) fn check_headers(headers: &[(String, String)]) -> Result<(), InvalidMessage> {
    for (name, value) in headers {
        let visible = |c: char| c.is_ascii_graphic() && c != ':';
        if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(visible) {
            return Err(InvalidMessage::new(format!(
                "the header name {name:?} must be 1 to {MAX_NAME_LEN} visible ASCII characters, not `:`"
            )));
        }
        if value.contains(['\r', '\n', '\0']) {
            return Err(InvalidMessage::new(format!(
                "the value of header {name:?} holds a line break or NUL"
            )));
        }
    }
    Ok(())
}

/// The partition of a destination and partition key: the first bytes of their SHA-256, modulo
/// [`PARTITIONS`]. Part of the stored format: relays of one database must agree on it.
pub(crate) fn partition_of(destination: &str, partition_key: &str) -> i32 {
    let mut hash = Sha256::new();
    for part in [destination.as_bytes(), partition_key.as_bytes()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    // PARTITIONS is a small positive constant, so the remainder fits an i32.
    (n % PARTITIONS as u32) as i32
}

/// Headers as stored: a JSON array of `[name, value]` pairs, or `None` when there are none.
pub(crate) fn encode_headers(headers: &[(String, String)]) -> Option<String> {
    if headers.is_empty() {
        return None;
    }
    serde_json::to_string(headers).ok()
}

/// Headers as stored, read back; a column that is not such an array reads as no headers.
pub(crate) fn decode_headers(stored: Option<&str>) -> Vec<(String, String)> {
    stored
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_in_range() {
        let p = partition_of("payments", "order-7");
        assert_eq!(p, partition_of("payments", "order-7"));
        assert!((0..PARTITIONS).contains(&p));
        let spread: std::collections::HashSet<i32> = (0..1000)
            .map(|i| partition_of("payments", &format!("k{i}")))
            .collect();
        assert!(spread.len() > PARTITIONS as usize / 2, "{}", spread.len());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_names("q", "").is_ok());
        assert!(check_names("", "").is_err());
        assert!(check_names("q", &"k".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(check_names(&"q".repeat(MAX_NAME_LEN), "").is_ok());
        assert!(check_names("q", "order 7\t(é)").is_ok());
        for bad in ["a\nb", "a\r", "\0"] {
            let err = check_names("q", bad).unwrap_err();
            assert!(err.to_string().contains("line break or NUL"), "{err}");
        }
    }

    #[test]
    fn headers_are_checked() {
        let h = |n: &str, v: &str| vec![(n.to_string(), v.to_string())];
        assert!(check_headers(&[]).is_ok());
        assert!(check_headers(&h("trace-id", "a b\tc")).is_ok());
        for bad in ["", "a b", "a:b", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(check_headers(&h(bad, "v")).is_err(), "{bad:?}");
        }
        for bad in ["a\nb", "a\r", "\0"] {
            let err = check_headers(&h("n", bad)).unwrap_err();
            assert!(err.to_string().contains("line break or NUL"), "{err}");
        }
    }

    #[test]
    fn headers_round_trip() {
        let headers = vec![("a".to_string(), "1".to_string()), ("b".into(), "2".into())];
        let stored = encode_headers(&headers);
        assert_eq!(decode_headers(stored.as_deref()), headers);
        assert_eq!(encode_headers(&[]), None);
        assert!(decode_headers(Some("not json")).is_empty());
    }
}

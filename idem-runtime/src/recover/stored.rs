//! What the three backends share when they store a failure: the checks a parked retry or a dead
//! letter passes before anything is written ([`InvalidFailure`]), its texts as stored, and a
//! parked row read back.

// All but `InvalidFailure` serves the backends: unused in a build without any.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]

use std::borrow::Cow;

use super::{Failure, NewDeadLetter, Parked};
use crate::key::{MAX_KEY_LEN, MAX_SCOPE_LEN};
use crate::outbox::{encode_headers, MAX_NAME_LEN};

/// The longest broker name, reason and error group, in bytes (ASCII columns of 32, 32 and 16
/// characters on MySQL).
const MAX_BROKER_LEN: usize = 32;
const MAX_REASON_LEN: usize = 32;
const MAX_GROUP_LEN: usize = 16;

/// The longest error, error shape and encoded headers, in bytes: a MySQL `MEDIUMTEXT`.
pub(crate) const MAX_TEXT_LEN: usize = (1 << 24) - 1;

/// Why a parked retry or a dead letter was refused before anything was written (reached as
/// `sqlx::Error::Encode`): a value longer than its column holds on some database, or one that
/// some database cannot store. The limits are the same on every backend, in bytes of UTF-8:
/// consumer, source, coordinates, destination and scope 255; broker and reason 32 and error
/// group 16, ASCII only; key 512; error, error shape and headers (as stored: JSON) 16 MiB - 1.
/// No name may hold a NUL character (PostgreSQL's text cannot); in an error and its shape, text
/// for people, a NUL is written as the two characters `\0` instead, so that an odd error never
/// keeps a message from being parked or kept.
///
/// ```
/// use idem_runtime::recover::InvalidFailure;
///
/// let err = InvalidFailure::new("source", "it is 300 bytes; at most 255 are allowed");
/// assert_eq!(err.field(), "source");
/// assert_eq!(
///     err.to_string(),
///     "failure refused: the source: it is 300 bytes; at most 255 are allowed"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidFailure {
    field: &'static str,
    why: String,
}

impl InvalidFailure {
    /// A refusal of `field`, saying why.
    pub fn new(field: &'static str, why: impl Into<String>) -> Self {
        InvalidFailure {
            field,
            why: why.into(),
        }
    }

    /// The field refused: `consumer`, `broker`, `source`, `coordinates`, `destination`,
    /// `error`, `headers`, `scope`, `key`, `reason`, `error shape` or `error group`.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl std::fmt::Display for InvalidFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failure refused: the {}: {}", self.field, self.why)
    }
}

impl std::error::Error for InvalidFailure {}

fn refuse(field: &'static str, why: String) -> sqlx::Error {
    sqlx::Error::Encode(Box::new(InvalidFailure::new(field, why)))
}

/// Refuses `value` over `max` bytes, with a NUL, or (when `ascii`) with a character outside
/// ASCII.
fn check_name(
    field: &'static str,
    value: &str,
    max: usize,
    ascii: bool,
) -> Result<(), sqlx::Error> {
    if value.len() > max {
        return Err(refuse(
            field,
            format!("it is {} bytes; at most {max} are allowed", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(refuse(field, "it holds a NUL character".into()));
    }
    if ascii && !value.is_ascii() {
        return Err(refuse(field, "it holds a character outside ASCII".into()));
    }
    Ok(())
}

/// Free text for people (an error, its shape) as stored: each NUL written as `\0`; refused
/// over [`MAX_TEXT_LEN`] bytes once written so.
pub(crate) fn stored_text<'a>(
    field: &'static str,
    text: &'a str,
) -> Result<Cow<'a, str>, sqlx::Error> {
    let text = if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\0"))
    } else {
        Cow::Borrowed(text)
    };
    if text.len() > MAX_TEXT_LEN {
        return Err(refuse(
            field,
            format!(
                "it is {} bytes; at most {MAX_TEXT_LEN} are allowed",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// A failure's texts as stored.
#[derive(Debug)]
pub(crate) struct StoredFailure<'a> {
    /// The error ([`stored_text`]).
    pub(crate) error: Cow<'a, str>,
    /// The headers: a JSON array of `[name, value]` pairs, or `None` without headers.
    pub(crate) headers: Option<String>,
}

/// Checks a failure and gives its texts as stored.
pub(crate) fn check_failure<'a>(failure: &Failure<'a>) -> Result<StoredFailure<'a>, sqlx::Error> {
    let origin = failure.origin;
    check_name("consumer", failure.consumer, MAX_NAME_LEN, false)?;
    check_name("broker", &origin.broker, MAX_BROKER_LEN, true)?;
    check_name("source", &origin.source, MAX_NAME_LEN, false)?;
    check_name("coordinates", &origin.coordinates, MAX_NAME_LEN, false)?;
    check_name("destination", &origin.destination, MAX_NAME_LEN, false)?;
    let error = stored_text("error", failure.error)?;
    let headers = encode_headers(failure.headers);
    if let Some(json) = &headers {
        // JSON escapes every control character, NUL included: only the length is checked.
        if json.len() > MAX_TEXT_LEN {
            return Err(refuse(
                "headers",
                format!(
                    "they are {} bytes as stored; at most {MAX_TEXT_LEN} are allowed",
                    json.len()
                ),
            ));
        }
    }
    Ok(StoredFailure { error, headers })
}

/// Checks a dead letter and gives its failure's texts and its error shape as stored.
pub(crate) fn check_dead_letter<'a>(
    dead: &NewDeadLetter<'a>,
) -> Result<(StoredFailure<'a>, Cow<'a, str>), sqlx::Error> {
    let stored = check_failure(&dead.failure)?;
    check_name("reason", dead.reason, MAX_REASON_LEN, true)?;
    if let Some(scope) = dead.scope {
        check_name("scope", scope, MAX_SCOPE_LEN, false)?;
    }
    if let Some(key) = dead.key {
        if key.len() > MAX_KEY_LEN {
            return Err(refuse(
                "key",
                format!(
                    "it is {} bytes; at most {MAX_KEY_LEN} are allowed",
                    key.len()
                ),
            ));
        }
    }
    let shape = stored_text("error shape", dead.shape)?;
    check_name("error group", dead.group, MAX_GROUP_LEN, true)?;
    Ok((stored, shape))
}

/// A failure's attempts as stored (a 32-bit signed column everywhere); a count past it is kept
/// as the largest one.
pub(crate) fn stored_attempts(attempts: u32) -> i32 {
    i32::try_from(attempts).unwrap_or(i32::MAX)
}

/// A parked row as the backends read it back: id, payload, headers, broker, source,
/// coordinates, destination, attempts, last error, first failure and due time (epoch
/// milliseconds).
pub(crate) type ParkedRow = (
    i64,
    Vec<u8>,
    Option<String>,
    String,
    String,
    String,
    String,
    i64,
    Option<String>,
    i64,
    i64,
);

/// The rows taken under `token`, oldest due first (then by id): a statement's `RETURNING` gives
/// them in no set order.
pub(crate) fn taken(mut rows: Vec<ParkedRow>, token: i64) -> Vec<Parked> {
    rows.sort_by_key(|row| (row.10, row.0));
    rows.into_iter()
        .map(
            |(
                id,
                payload,
                headers,
                broker,
                source,
                coordinates,
                destination,
                attempts,
                last_error,
                first_failed_ms,
                _,
            )| {
                Parked {
                    id,
                    token,
                    payload,
                    headers: crate::outbox::decode_headers(headers.as_deref()),
                    origin: super::Origin {
                        broker,
                        source,
                        coordinates,
                        destination,
                    },
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    last_error,
                    first_failed_ms,
                }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recover::Origin;

    fn origin() -> Origin {
        Origin {
            broker: "kafka".into(),
            source: "orders".into(),
            coordinates: "partition 3 offset 1042".into(),
            destination: "orders".into(),
        }
    }

    fn failure<'a>(origin: &'a Origin, headers: &'a [(String, String)]) -> Failure<'a> {
        Failure {
            consumer: "billing",
            payload: b"{}",
            headers,
            origin,
            attempts: 1,
            error: "boom",
            first_failed_ms: None,
        }
    }

    fn dead<'a>(failure: Failure<'a>) -> NewDeadLetter<'a> {
        NewDeadLetter {
            failure,
            reason: "poisoned",
            scope: Some("billing::charge"),
            key: Some(b"order-1"),
            shape: "boom",
            group: "0123456789abcdef",
        }
    }

    /// The field a refusal names, or `None` when the value passed.
    fn refused<T>(result: Result<T, sqlx::Error>) -> Option<&'static str> {
        match result {
            Ok(_) => None,
            Err(sqlx::Error::Encode(err)) => Some(
                err.downcast_ref::<InvalidFailure>()
                    .expect("an InvalidFailure")
                    .field(),
            ),
            Err(other) => panic!("not an encode error: {other}"),
        }
    }

    #[test]
    fn a_failure_within_the_limits_passes_and_gives_its_headers_as_json() {
        let origin = origin();
        let headers = vec![("a".to_string(), "1".to_string())];
        let stored = check_failure(&failure(&origin, &headers)).unwrap();
        assert_eq!(stored.headers.as_deref(), Some(r#"[["a","1"]]"#));
        assert!(matches!(stored.error, Cow::Borrowed("boom")));
        assert_eq!(check_failure(&failure(&origin, &[])).unwrap().headers, None);
        assert_eq!(
            refused(check_dead_letter(&dead(failure(&origin, &[])))),
            None
        );
    }

    #[test]
    fn names_are_limited_in_bytes_not_characters() {
        // 255 bytes in 128 characters passes; one byte more is refused.
        let at_limit = format!("{}a", "é".repeat(127));
        assert_eq!(at_limit.len(), 255);
        let over = format!("{at_limit}a");
        for field in ["consumer", "source", "coordinates", "destination"] {
            let mut origin = origin();
            let mut consumer = "billing".to_string();
            for value in [&at_limit, &over] {
                match field {
                    "consumer" => consumer = value.clone(),
                    "source" => origin.source = value.clone(),
                    "coordinates" => origin.coordinates = value.clone(),
                    _ => origin.destination = value.clone(),
                }
                let f = Failure {
                    consumer: &consumer,
                    ..failure(&origin, &[])
                };
                let expected = (value.len() > 255).then_some(field);
                assert_eq!(refused(check_failure(&f)), expected, "{field}");
            }
        }
    }

    #[test]
    fn ascii_columns_refuse_other_characters_and_names_refuse_nul() {
        let mut origin = origin();
        origin.broker = "kafkä".into();
        assert_eq!(
            refused(check_failure(&failure(&origin, &[]))),
            Some("broker")
        );
        origin.broker = "k".repeat(33);
        assert_eq!(
            refused(check_failure(&failure(&origin, &[]))),
            Some("broker")
        );
        let origin = Origin {
            coordinates: "entry\0-1".into(),
            ..self::origin()
        };
        assert_eq!(
            refused(check_failure(&failure(&origin, &[]))),
            Some("coordinates")
        );
        // A NUL in a header is escaped by JSON: stored as it is.
        let origin = self::origin();
        let headers = vec![("h".to_string(), "a\0b".to_string())];
        let stored = check_failure(&failure(&origin, &headers)).unwrap();
        assert_eq!(stored.headers.as_deref(), Some(r#"[["h","a\u0000b"]]"#));
    }

    #[test]
    fn a_nul_in_an_error_or_its_shape_is_written_as_backslash_zero() {
        let origin = origin();
        let f = Failure {
            error: "bad\0byte\0",
            ..failure(&origin, &[])
        };
        assert_eq!(check_failure(&f).unwrap().error, "bad\\0byte\\0");
        let with_shape = NewDeadLetter {
            shape: "a\0b",
            ..dead(f)
        };
        let (stored, shape) = check_dead_letter(&with_shape).unwrap();
        assert_eq!(
            (stored.error.as_ref(), shape.as_ref()),
            ("bad\\0byte\\0", "a\\0b")
        );
        assert_eq!(stored_text("error", "plain").unwrap(), "plain");
    }

    #[test]
    fn a_text_over_a_mediumtext_is_refused_counting_its_escapes() {
        let at_limit = "e".repeat(MAX_TEXT_LEN);
        assert!(stored_text("error", &at_limit).is_ok());
        assert_eq!(
            refused(stored_text("error", &format!("{at_limit}e"))),
            Some("error")
        );
        let nul_at_limit = format!("{}\0", "e".repeat(MAX_TEXT_LEN - 1));
        assert_eq!(refused(stored_text("error", &nul_at_limit)), Some("error"));
    }

    #[test]
    fn a_dead_letters_own_fields_are_checked() {
        let origin = origin();
        let f = failure(&origin, &[]);
        let long_scope = "s".repeat(256);
        let long_key = vec![7u8; 513];
        let cases: [(NewDeadLetter<'_>, &str); 4] = [
            (
                NewDeadLetter {
                    reason: "a reason of more than thirty-two bytes",
                    ..dead(f)
                },
                "reason",
            ),
            (
                NewDeadLetter {
                    scope: Some(&long_scope),
                    ..dead(f)
                },
                "scope",
            ),
            (
                NewDeadLetter {
                    key: Some(&long_key),
                    ..dead(f)
                },
                "key",
            ),
            (
                NewDeadLetter {
                    group: "0123456789abcdef0",
                    ..dead(f)
                },
                "error group",
            ),
        ];
        for (dead, field) in cases {
            assert_eq!(refused(check_dead_letter(&dead)), Some(field));
        }
        let key = vec![0xffu8; 512];
        let no_scope = NewDeadLetter {
            scope: None,
            key: Some(&key),
            ..dead(f)
        };
        assert_eq!(refused(check_dead_letter(&no_scope)), None);
    }

    #[test]
    fn a_refusal_names_its_field_and_says_why() {
        let origin = Origin {
            source: "q".repeat(300),
            ..origin()
        };
        let err = check_failure(&failure(&origin, &[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "error occurred while encoding a value: failure refused: the source: \
             it is 300 bytes; at most 255 are allowed"
        );
    }

    #[test]
    fn attempts_past_a_signed_32_bit_column_are_kept_as_its_largest() {
        assert_eq!(stored_attempts(7), 7);
        assert_eq!(stored_attempts(u32::MAX), i32::MAX);
    }

    #[test]
    fn taken_rows_are_ordered_by_due_time_then_id_and_carry_the_token() {
        let row = |id: i64, due: i64| -> ParkedRow {
            (
                id,
                vec![id as u8],
                Some(r#"[["k","v"]]"#.into()),
                "nats".into(),
                "s".into(),
                "c".into(),
                "d".into(),
                2,
                None,
                5,
                due,
            )
        };
        let parked = taken(vec![row(3, 20), row(2, 10), row(1, 20)], 99);
        let ids: Vec<i64> = parked.iter().map(|p| p.id).collect();
        assert_eq!(ids, [2, 1, 3]);
        assert!(parked.iter().all(|p| p.token == 99 && p.attempts == 2));
        assert_eq!(parked[0].headers, [("k".to_string(), "v".to_string())]);
        assert_eq!(parked[0].origin.broker, "nats");
        assert_eq!(parked[0].first_failed_ms, 5);
    }
}

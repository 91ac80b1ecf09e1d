//! The `Idempotency-Key` header: a Structured Field string (RFC 8941), as the IETF draft
//! defines it (`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`).

use http::HeaderValue;

/// The header's name.
pub const HEADER: &str = "idempotency-key";

/// The longest key accepted by default, in bytes (the draft leaves the limit to the server;
/// UUIDs are 36, Stripe accepts 255).
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// Why an `Idempotency-Key` header was refused (the client gets 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyProblem {
    /// The header is not there and the route requires it.
    Missing,
    /// More than one `Idempotency-Key` header.
    Repeated,
    /// Not a Structured Field string (for example, not in double quotes).
    NotAString(String),
    /// The empty string.
    Empty,
    /// Longer than the route's limit.
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl std::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyProblem::Missing => {
                f.write_str("this endpoint requires an Idempotency-Key header")
            }
            KeyProblem::Repeated => f.write_str("send one Idempotency-Key header, not several"),
            KeyProblem::NotAString(why) => write!(
                f,
                "the Idempotency-Key header must be a Structured Field string in double quotes, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\" ({why})"
            ),
            KeyProblem::Empty => f.write_str("the Idempotency-Key header is an empty string"),
            KeyProblem::TooLong { len, max } => write!(
                f,
                "the Idempotency-Key is {len} bytes long; this endpoint accepts at most {max}"
            ),
        }
    }
}

/// Reads the key from the request's `Idempotency-Key` values: `Ok(None)` when there is none.
pub fn parse<'a>(
    mut values: impl Iterator<Item = &'a HeaderValue>,
    max_len: usize,
) -> Result<Option<String>, KeyProblem> {
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    let item: sfv::Item = sfv::Parser::new(value.as_bytes())
        .parse_item()
        .map_err(|err| KeyProblem::NotAString(err.to_string()))?;
    let key = match item.bare_item {
        sfv::BareItem::String(key) => key.as_str().to_owned(),
        other => return Err(KeyProblem::NotAString(format!("got a {}", kind_of(&other)))),
    };
    if key.is_empty() {
        return Err(KeyProblem::Empty);
    }
    if key.len() > max_len {
        return Err(KeyProblem::TooLong {
            len: key.len(),
            max: max_len,
        });
    }
    Ok(Some(key))
}

fn kind_of(item: &sfv::BareItem) -> &'static str {
    match item {
        sfv::BareItem::Decimal(_) => "decimal",
        sfv::BareItem::Integer(_) => "integer",
        sfv::BareItem::String(_) => "string",
        sfv::BareItem::ByteSequence(_) => "byte sequence",
        sfv::BareItem::Boolean(_) => "boolean",
        sfv::BareItem::Token(_) => "token, not a quoted string",
        _ => "value of another type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &[u8]) -> Result<Option<String>, KeyProblem> {
        parse([HeaderValue::from_bytes(value).unwrap()].iter(), 16)
    }

    #[test]
    fn a_quoted_string_is_a_key() {
        assert_eq!(one(b"\"abc-1\"").unwrap().as_deref(), Some("abc-1"));
        assert_eq!(
            one(b"\"a \\\"q\\\" b\"").unwrap().as_deref(),
            Some("a \"q\" b")
        );
        // Parameters are allowed by the grammar and ignored.
        assert_eq!(one(b"\"k\";v=1").unwrap().as_deref(), Some("k"));
    }

    #[test]
    fn no_header_is_no_key() {
        assert_eq!(parse(std::iter::empty(), 16), Ok(None));
    }

    #[test]
    fn malformed_keys_are_refused_with_the_reason() {
        assert!(matches!(one(b"abc"), Err(KeyProblem::NotAString(why)) if why.contains("token")));
        assert!(matches!(one(b"12"), Err(KeyProblem::NotAString(why)) if why.contains("integer")));
        assert!(matches!(one(b"\"open"), Err(KeyProblem::NotAString(_))));
        assert_eq!(one(b"\"\""), Err(KeyProblem::Empty));
        assert_eq!(
            one(b"\"0123456789abcdefg\""),
            Err(KeyProblem::TooLong { len: 17, max: 16 })
        );
        let two = [
            HeaderValue::from_static("\"a\""),
            HeaderValue::from_static("\"b\""),
        ];
        assert_eq!(parse(two.iter(), 16), Err(KeyProblem::Repeated));
    }

    #[test]
    fn every_problem_names_the_header() {
        for problem in [
            KeyProblem::Missing,
            KeyProblem::Repeated,
            KeyProblem::NotAString("x".into()),
            KeyProblem::Empty,
            KeyProblem::TooLong { len: 2, max: 1 },
        ] {
            assert!(problem.to_string().contains("Idempotency-Key"), "{problem}");
        }
    }
}

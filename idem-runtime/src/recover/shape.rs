//! An error's shape: its message with the parts that differ from one message to the next
//! (numbers, ids, hashes, quoted values) taken out, so that "order 17 not found" and "order 93
//! not found" are one group for an operator.

use sha2::{Digest, Sha256};

/// `error` with every run of digits, every UUID and every hex id of 8 or more characters
/// replaced by `#`, and every single- or double-quoted value by `'…'`; whitespace runs become
/// one space. At most 200 characters are kept.
///
/// ```
/// use idem_runtime::recover::shape;
/// assert_eq!(shape("order 17 not found"), shape("order 93 not found"));
/// assert_eq!(shape("order 17 not found"), "order # not found");
/// ```
pub fn shape(error: &str) -> String {
    let mut out = String::with_capacity(error.len().min(MAX_SHAPE));
    let mut rest = error.trim();
    while let Some(c) = rest.chars().next() {
        if out.chars().count() >= MAX_SHAPE {
            break;
        }
        let token = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .map_or(rest, |end| &rest[..end]);
        if c == '\'' || c == '"' {
            // A quoted value: up to its closing quote (or the end).
            let close = rest[1..].find(c).map_or(rest.len(), |i| i + 2);
            out.push_str("'…'");
            rest = &rest[close..];
        } else if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
            rest = rest.trim_start();
        } else if !token.is_empty() {
            if is_variable(token) {
                out.push('#');
            } else {
                out.push_str(token);
            }
            rest = &rest[token.len()..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.trim_end().to_string()
}

/// The longest shape kept, in characters.
const MAX_SHAPE: usize = 200;

/// A word that names one message rather than a kind of failure: one with a digit in it (a
/// number, `order-17`, a UUID, a hash), or a hex id of 8 characters or more.
fn is_variable(token: &str) -> bool {
    token.bytes().any(|b| b.is_ascii_digit())
        || (token.len() >= 8 && token.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// The group of a dead letter: the first 16 hex digits of the SHA-256 of consumer, scope,
/// reason and shape, each ended by a NUL.
pub fn group_of(consumer: &str, scope: Option<&str>, reason: &str, shape: &str) -> String {
    let mut hash = Sha256::new();
    for part in [consumer, scope.unwrap_or(""), reason, shape] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_ids_and_quoted_values_are_taken_out() {
        assert_eq!(shape("order 17 not found"), "order # not found");
        assert_eq!(
            shape("customer 6f1c2a4e-1b2c-4d5e-8f90-123456789abc has no card"),
            "customer # has no card"
        );
        assert_eq!(shape("sku 'AB-12' is \"gone\""), "sku '…' is '…'");
        assert_eq!(shape("hash deadbeefcafe mismatch"), "hash # mismatch");
        assert_eq!(shape("  many\n  spaces  "), "many spaces");
        assert_eq!(shape("ünïcode 12 ok"), "ünïcode # ok");
    }

    #[test]
    fn words_that_are_not_ids_stay() {
        assert_eq!(shape("connection refused"), "connection refused");
        assert_eq!(shape("bad-request: decade"), "bad-request: decade");
    }

    #[test]
    fn a_long_message_is_cut() {
        let long = "word ".repeat(200);
        assert!(shape(&long).chars().count() <= MAX_SHAPE);
    }

    #[test]
    fn groups_differ_by_every_part() {
        let base = group_of("c", Some("s"), "poisoned", "x #");
        assert_eq!(base.len(), 16);
        assert_eq!(base, group_of("c", Some("s"), "poisoned", "x #"));
        assert_ne!(base, group_of("d", Some("s"), "poisoned", "x #"));
        assert_ne!(base, group_of("c", None, "poisoned", "x #"));
        assert_ne!(base, group_of("c", Some("s"), "conflict", "x #"));
        assert_ne!(base, group_of("c", Some("s"), "poisoned", "y #"));
    }
}

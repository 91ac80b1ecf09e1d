//! Idempotency keys: the [`Key`] trait, its canonical byte encoding, and why a key is refused
//! ([`KeyError`]).

pub use crate::error::{KeyError, KeyPart, KeyProblem};

/// The longest key, in bytes of its canonical encoding, that idem stores.
///
/// Longer keys are refused with [`KeyError`] before anything is written; hash a
/// long business identifier yourself if you need one.
pub const MAX_KEY_LEN: usize = 512;

/// The longest scope, in bytes, that idem stores: handlers with a longer `scope` (or a longer
/// default, the fn's path) refuse every delivery with [`KeyError`] before
/// anything is written. Scope and key together must fit a database's index: on MySQL/InnoDB
/// they are `VARCHAR(255)` (utf8mb4, up to 1020 bytes) and `VARBINARY(512)`, a primary key of
/// at most 1532 bytes within InnoDB's 3072-byte limit.
pub const MAX_SCOPE_LEN: usize = 255;

/// A value that identifies a message (or, with `entity = ...`, the entity a version orders).
///
/// A key is encoded to canonical bytes, stored as a binary column. Strings encode as their UTF-8
/// bytes, integers as decimal digits (so `42` and `"42"` are the same key), byte arrays as
/// themselves, [`Uuid`](uuid::Uuid) (feature `uuid`) as its hyphenated lowercase text, and tuples
/// of up to four keys as length-prefixed parts, so `("a", "bc")` and `("ab", "c")` differ. An
/// empty key, or a tuple with an empty part, encodes to nothing, which handlers refuse.
///
/// ```
/// use idem::Key;
///
/// let mut out = Vec::new();
/// (7_u32, "eu").write_key(&mut out);
/// assert_eq!(out, b"\0\0\0\x017\0\0\0\x02eu");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "not an `idem::Key`",
    note = "keys are strings, integers, byte arrays, `Uuid` (feature `uuid`) or tuples of these; implement `idem::Key` for your own type"
)]
pub trait Key {
    /// Appends the canonical bytes of this key to `out`.
    fn write_key(&self, out: &mut Vec<u8>);
}

impl<K: Key + ?Sized> Key for &K {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out);
    }
}

impl Key for str {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl Key for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl Key for [u8] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl Key for Vec<u8> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl<const N: usize> Key for [u8; N] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl Key for std::borrow::Cow<'_, str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl Key for Box<str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl Key for std::sync::Arc<str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

macro_rules! integer_keys {
    ($($t:ty)*) => {$(
        impl Key for $t {
            fn write_key(&self, out: &mut Vec<u8>) {
                use std::io::Write as _;
                // Writing to a Vec cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_keys!(i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize);

#[cfg(feature = "uuid")]
impl Key for uuid::Uuid {
    fn write_key(&self, out: &mut Vec<u8>) {
        let mut buf = uuid::Uuid::encode_buffer();
        out.extend_from_slice(self.hyphenated().encode_lower(&mut buf).as_bytes());
    }
}

/// Writes one part of a composite key: a 4-byte big-endian length, then the part. Returns
/// whether the part was empty.
fn write_part<K: Key + ?Sized>(part: &K, out: &mut Vec<u8>) -> bool {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    part.write_key(out);
    // Saturate: a part over 4 GiB is far over MAX_KEY_LEN and will be refused anyway.
    let len = u32::try_from(out.len() - at - 4).unwrap_or(u32::MAX);
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    len == 0
}

macro_rules! tuple_keys {
    ($(($($name:ident)+))*) => {$(
        impl<$($name: Key),+> Key for ($($name,)+) {
            #[allow(non_snake_case)]
            fn write_key(&self, out: &mut Vec<u8>) {
                let start = out.len();
                let ($($name,)+) = self;
                let mut empty = false;
                $(empty |= write_part($name, out);)+
                // A composite key with an empty part (a missing tenant, a blank id) would make
                // every such message one key: it encodes to nothing and is refused as empty.
                if empty {
                    out.truncate(start);
                }
            }
        }
    )*};
}
tuple_keys!((A) (A B) (A B C) (A B C D));

/// Shows a stored key to people: as text when it is UTF-8, otherwise as `0x` and hex.
///
/// ```
/// use idem::key::KeyDisplay;
/// assert_eq!(KeyDisplay(b"order-1").to_string(), "order-1");
/// assert_eq!(KeyDisplay(&[0xff, 0x00]).to_string(), "0xff00");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct KeyDisplay<'a>(pub &'a [u8]);

impl std::fmt::Display for KeyDisplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match std::str::from_utf8(self.0) {
            Ok(text) if !text.contains('\0') => f.write_str(text),
            _ => {
                f.write_str("0x")?;
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(k: impl Key) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_key(&mut out);
        out
    }

    #[test]
    fn strings_and_integers_encode_as_text() {
        assert_eq!(bytes("abc"), b"abc");
        assert_eq!(bytes(String::from("abc")), b"abc");
        assert_eq!(bytes(-42_i64), b"-42");
        assert_eq!(bytes(u64::MAX), b"18446744073709551615");
        assert_eq!(bytes(42_u8), bytes("42"));
    }

    #[test]
    fn bytes_are_kept_verbatim() {
        assert_eq!(bytes([0_u8, 255, 0]), vec![0, 255, 0]);
        assert_eq!(bytes(vec![1_u8, 2]), vec![1, 2]);
        assert_eq!(bytes(&b"x"[..]), b"x");
    }

    #[test]
    fn tuple_parts_cannot_run_into_each_other() {
        assert_ne!(bytes(("a", "bc")), bytes(("ab", "c")));
        assert_eq!(bytes((1, 2, 3, 4)).len(), 4 * 5);
        assert_eq!(bytes(("a", "")), b"");
        assert_eq!(bytes((1, "")), b"");
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn uuid_is_hyphenated_lowercase() {
        let id = uuid::Uuid::from_u128(0xA1A2A3A4B1B2C1C2D1D2D3D4D5D6D7D8);
        assert_eq!(bytes(id), b"a1a2a3a4-b1b2-c1c2-d1d2-d3d4d5d6d7d8");
    }

    #[test]
    fn display_falls_back_to_hex() {
        assert_eq!(KeyDisplay("é".as_bytes()).to_string(), "é");
        assert_eq!(KeyDisplay(b"a\0b").to_string(), "0x610062");
    }
}

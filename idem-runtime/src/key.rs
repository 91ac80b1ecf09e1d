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

    /// How many bytes [`write_key`](Key::write_key) appends, where that is known without
    /// encoding: idem then allocates the key's buffer once, at its size. `0` (the default)
    /// when not known; a wrong hint costs a reallocation, never a wrong key.
    fn key_len_hint(&self) -> usize {
        0
    }
}

impl<K: Key + ?Sized> Key for &K {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out);
    }

    fn key_len_hint(&self) -> usize {
        (**self).key_len_hint()
    }
}

impl Key for str {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl Key for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl Key for [u8] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl Key for Vec<u8> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl<const N: usize> Key for [u8; N] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }

    fn key_len_hint(&self) -> usize {
        N
    }
}

impl Key for std::borrow::Cow<'_, str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl Key for Box<str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

impl Key for std::sync::Arc<str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        self.len()
    }
}

// Integers as `write!(out, "{n}")` writes them, without the formatting machinery (some 700
// instructions a key, written twice a batched message).
macro_rules! integer_keys {
    ($($t:ty => |$n:ident| $sign:expr, $magnitude:expr;)*) => {$(
        impl Key for $t {
            fn write_key(&self, out: &mut Vec<u8>) {
                let $n = *self;
                write_decimal(out, $sign, $magnitude);
            }

            fn key_len_hint(&self) -> usize {
                let $n = *self;
                decimal_len($sign, $magnitude)
            }
        }
    )*};
}
integer_keys! {
    i8 => |n| n < 0, u128::from(n.unsigned_abs());
    i16 => |n| n < 0, u128::from(n.unsigned_abs());
    i32 => |n| n < 0, u128::from(n.unsigned_abs());
    i64 => |n| n < 0, u128::from(n.unsigned_abs());
    i128 => |n| n < 0, n.unsigned_abs();
    isize => |n| n < 0, n.unsigned_abs() as u128;
    u8 => |n| false, u128::from(n);
    u16 => |n| false, u128::from(n);
    u32 => |n| false, u128::from(n);
    u64 => |n| false, u128::from(n);
    u128 => |n| false, n;
    usize => |n| false, n as u128;
}

/// Appends `magnitude` in decimal digits, after a `-` when `negative`.
fn write_decimal(out: &mut Vec<u8>, negative: bool, magnitude: u128) {
    let mut digits = [0_u8; 40];
    let mut at = digits.len();
    // A u128's division by 10 is a call, a u64's a multiplication: the low digits of a number
    // over u64::MAX are taken as u128 until the rest fits in a u64 (it is then not 0).
    let mut wide = magnitude;
    let mut n = loop {
        match u64::try_from(wide) {
            Ok(n) => break n,
            Err(_) => {
                at -= 1;
                // A digit: 0..=9, always fits in a u8.
                digits[at] = b'0' + (wide % 10) as u8;
                wide /= 10;
            }
        }
    };
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        digits[at] = b'-';
    }
    out.extend_from_slice(&digits[at..]);
}

/// How many bytes [`write_decimal`] appends.
fn decimal_len(negative: bool, magnitude: u128) -> usize {
    let digits = magnitude.checked_ilog10().map_or(1, |d| d as usize + 1);
    digits + usize::from(negative)
}

#[cfg(feature = "uuid")]
impl Key for uuid::Uuid {
    fn write_key(&self, out: &mut Vec<u8>) {
        let mut buf = uuid::Uuid::encode_buffer();
        out.extend_from_slice(self.hyphenated().encode_lower(&mut buf).as_bytes());
    }

    fn key_len_hint(&self) -> usize {
        uuid::fmt::Hyphenated::LENGTH
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

            #[allow(non_snake_case)]
            fn key_len_hint(&self) -> usize {
                let ($($name,)+) = self;
                0 $(+ 4 + $name.key_len_hint())+
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
    fn hints_are_the_encoded_lengths() {
        fn exact(k: impl Key) {
            assert_eq!(k.key_len_hint(), bytes(&k).len());
        }
        exact("abc");
        exact(String::from("order-1"));
        exact(&b"xy"[..]);
        exact(vec![1_u8, 2, 3]);
        exact([0_u8; 5]);
        exact(std::borrow::Cow::Borrowed("c"));
        exact(Box::<str>::from("box"));
        exact(std::sync::Arc::<str>::from("arc"));
        exact(("tenant", "id"));
        exact((&"a", b"bc".to_vec(), "d", String::from("e")));
        for n in [0_i64, 7, -7, 10, -10, 99, i64::MIN, i64::MAX] {
            exact(n);
        }
        exact(u128::MAX);
        exact(i128::MIN);
        exact(0_u8);
    }

    #[test]
    fn integers_encode_as_format_writes_them() {
        fn same<N: Key + std::fmt::Display>(n: N) {
            assert_eq!(bytes(&n), n.to_string().into_bytes(), "{n}");
        }
        for n in [0, 1, -1, 9, 10, -10, 1_000_000, i64::MIN, i64::MAX] {
            same(n);
        }
        same(i128::MIN);
        same(i128::MAX);
        same(u128::MAX);
        same(u64::MAX);
        same(u128::from(u64::MAX) + 1);
        same(i8::MIN);
        same(255_u8);
        same(usize::MAX);
        same(isize::MIN);
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn a_uuid_hints_its_length() {
        let id = uuid::Uuid::from_u128(7);
        assert_eq!(id.key_len_hint(), bytes(id).len());
    }

    #[test]
    fn display_falls_back_to_hex() {
        assert_eq!(KeyDisplay("é".as_bytes()).to_string(), "é");
        assert_eq!(KeyDisplay(b"a\0b").to_string(), "0x610062");
    }
}

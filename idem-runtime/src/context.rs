//! [`Context`]: what a handler knows about the delivery it runs, and keys derived from it.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};

use sha2::{Digest, Sha256};

use crate::key::KeyDisplay;

/// The delivery a handler body is running: its scope, key and version, and stable keys derived
/// from them for calls outside the database.
///
/// Add a parameter of this type (by reference or by value) to an `#[idempotent]` fn and the
/// macro fills it; callers do not pass it. [`derive`](Context::derive) gives the same string for
/// every redelivery of the message, on every process and machine, so it can be passed as the
/// idempotency key of a payment provider or another API: if a crash after the call makes the
/// message run again, the provider sees the same key and does not act twice.
///
/// ```
/// let ctx = idem::Context::new("billing::on_paid", b"evt-42".to_vec(), None);
/// assert_eq!(ctx.derive("charge"), ctx.derive("charge"));
/// assert_ne!(ctx.derive("charge"), ctx.derive("refund"));
/// assert_eq!(ctx.derive("charge").len(), "idem-".len() + 32);
/// ```
#[derive(Debug)]
pub struct Context {
    scope: &'static str,
    // Boxed: `Context` lives in every claimed delivery, so it is kept small.
    key: Box<[u8]>,
    version: Option<i64>,
    /// Unlabelled outbox publishes so far in this run of the body (their ordinals).
    published: AtomicU32,
}

impl Clone for Context {
    fn clone(&self) -> Self {
        Context {
            scope: self.scope,
            key: self.key.clone(),
            version: self.version,
            published: AtomicU32::new(self.published.load(Ordering::Relaxed)),
        }
    }
}

/// Two contexts are equal when they are about the same delivery (the publish count aside).
impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        (self.scope, &self.key, self.version) == (other.scope, &other.key, other.version)
    }
}

impl Eq for Context {}

impl Context {
    /// The context of a delivery (the macro builds it; tests may too).
    // Inline: a claim, generic over its database, builds it in the handler's crate, where a
    // call would not be inlined.
    #[inline]
    pub fn new(scope: &'static str, key: Vec<u8>, version: Option<i64>) -> Self {
        Context {
            scope,
            key: key.into_boxed_slice(),
            version,
            published: AtomicU32::new(0),
        }
    }

    /// The handler's scope.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// The encoded idempotency key (see [`Key`](crate::Key)).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The version of the message, when the handler has `version = ...`.
    pub fn version(&self) -> Option<i64> {
        self.version
    }

    /// A key for an external call labelled `label` (`"charge"`, `"email"`): `idem-` and 32 hex
    /// digits of SHA-256 over the scope, key, version and label. Different labels give
    /// different keys, so one handler can make several protected calls.
    ///
    /// ```
    /// let a = idem::Context::new("s", b"k".to_vec(), Some(1)).derive("charge");
    /// let b = idem::Context::new("s", b"k".to_vec(), Some(2)).derive("charge");
    /// assert_ne!(a, b);
    /// ```
    pub fn derive(&self, label: &str) -> String {
        self.digest(b"idem/derive/v1", label.as_bytes())
    }

    /// The id of an outbox message this delivery publishes: `idem-` and 32 hex digits of
    /// SHA-256 over the scope, key, version and `what` (a label, or an ordinal), in a domain of
    /// its own, so that an outbox id never equals a [`derive`](Context::derive)d key.
    pub(crate) fn outbox_id(&self, what: OutboxLabel<'_>) -> String {
        match what {
            OutboxLabel::Label(label) => {
                self.digest(b"idem/outbox/v1", &[b"l:", label.as_bytes()].concat())
            }
            OutboxLabel::Ordinal(n) => {
                self.digest(b"idem/outbox/v1", &[&b"#:"[..], &n.to_be_bytes()].concat())
            }
        }
    }

    /// The next ordinal of an unlabelled outbox publish in this run of the body (0, 1, ...).
    pub(crate) fn next_ordinal(&self) -> u32 {
        self.published.fetch_add(1, Ordering::Relaxed)
    }

    fn digest(&self, domain: &[u8], label: &[u8]) -> String {
        let mut hash = Sha256::new();
        // Length-prefixed parts: no two different inputs run into the same bytes.
        for part in [domain, self.scope.as_bytes(), &self.key, label] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        match self.version {
            Some(version) => hash.update([&[1_u8][..], &version.to_be_bytes()].concat()),
            None => hash.update([0_u8]),
        }
        let digest = hash.finalize();
        let mut out = String::with_capacity(5 + 32);
        out.push_str("idem-");
        for byte in &digest[..16] {
            // Writing to a String cannot fail.
            let _ = write!(out, "{byte:02x}");
        }
        out
    }
}

/// What an outbox message's id is derived from, besides the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutboxLabel<'a> {
    /// A label the handler gave.
    Label(&'a str),
    /// The publish's ordinal among the handler's unlabelled publishes.
    Ordinal(u32),
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.scope, KeyDisplay(&self.key))?;
        if let Some(version) = self.version {
            write!(f, "@{version}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_are_pinned() {
        // The derivation is part of the contract: providers remember these keys for days, so a
        // change here would make a redelivery after an upgrade charge twice. The value was
        // checked against Python's hashlib over the same length-prefixed parts.
        let ctx = Context::new("billing::charge", b"evt-1".to_vec(), None);
        assert_eq!(
            ctx.derive("charge"),
            "idem-ec486832cea0ae0c767b002e6fb7a5b5"
        );
        assert_eq!(ctx.to_string(), "billing::charge/evt-1");
    }

    #[test]
    fn outbox_ids_are_pinned_and_apart_from_derived_keys() {
        let ctx = Context::new("billing::charge", b"evt-1".to_vec(), None);
        // Checked against Python's hashlib, as above.
        let first = ctx.outbox_id(OutboxLabel::Ordinal(0));
        assert_eq!(first, "idem-8b41918f09746d5dbc7ef34c50b68005");
        assert_ne!(first, ctx.outbox_id(OutboxLabel::Ordinal(1)));
        assert_ne!(
            ctx.outbox_id(OutboxLabel::Label("charge")),
            ctx.derive("charge")
        );
        assert_eq!((ctx.next_ordinal(), ctx.next_ordinal()), (0, 1));
        assert_eq!(ctx.clone(), ctx);
    }

    #[test]
    fn every_part_changes_the_key() {
        let base = Context::new("s", b"k".to_vec(), None);
        let keys = [
            base.derive("a"),
            Context::new("t", b"k".to_vec(), None).derive("a"),
            Context::new("s", b"j".to_vec(), None).derive("a"),
            Context::new("s", b"k".to_vec(), Some(0)).derive("a"),
            base.derive("b"),
        ];
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len());
    }
}

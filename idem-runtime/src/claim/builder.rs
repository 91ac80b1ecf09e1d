//! [`Claim`]: the values of one delivery (scope, key, version, entity, retention, lease), each
//! checked as it is added. The first problem is kept and reported before anything is written.

use std::time::Duration;

use crate::context::Context;
use crate::error::{KeyError, KeyPart, KeyProblem};
use crate::key::{Key, MAX_KEY_LEN, MAX_SCOPE_LEN};
use crate::store::{Record, RecordKey, StampKey, StampRow, VersionEntry};
use crate::version::Version;

/// How long a record is kept when the handler does not say (`retention = "..."`): 30 days,
/// longer than the redelivery window of common brokers.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a lease lasts when a lease-mode handler does not say (`lease = "..."`): 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The values of one delivery: scope, key and optional version and entity, checked as they are
/// added; the first problem is kept and reported by [`Claim::begin`] before anything is written.
///
/// ```
/// use idem::__private::Claim;
/// let claim = Claim::new("billing::charge").key(&"msg-1").version(&u64::MAX);
/// assert_eq!(claim.scope(), "billing::charge");
/// assert_eq!(claim.problem().unwrap().to_string(),
///            "idempotent handler `billing::charge`: version 18446744073709551615 does not fit in an i64");
/// ```
// At most 128 bytes (a unit test says so): a claim is moved several times a delivery, and
// larger values are copied by a call to `memcpy` where smaller ones are moved inline
// (docs/design/performance.md#moves-over-128-bytes). What only some handlers use is boxed.
#[derive(Debug, Clone)]
pub struct Claim {
    scope: &'static str,
    key: Vec<u8>,
    entity: Option<Vec<u8>>,
    version: Option<i64>,
    retention: Duration,
    /// Lease, fingerprint, replay, max_attempts: `None` when the handler has none of them.
    options: Option<Box<Options>>,
    problem: Option<Box<KeyError>>,
}

/// The handler options a claim carries beyond key, entity, version and retention.
#[derive(Debug, Clone, Default)]
struct Options {
    lease: Option<Duration>,
    /// `fingerprint = "..."`: SHA-256 of the value's key encoding.
    fingerprint: Option<[u8; 32]>,
    /// `replay = true`.
    replay: bool,
    /// `max_attempts = N`.
    max_attempts: Option<u32>,
}

// The builder's steps are `#[inline]`: a generated handler calls them one after another, and
// each call would otherwise move the whole `Claim` (208 bytes) through its return slot
// (docs/design/performance.md#moves-over-128-bytes).
impl Claim {
    /// A delivery for the handler with this scope (refused if longer than [`MAX_SCOPE_LEN`] or
    /// if it holds a NUL character, which PostgreSQL text cannot store).
    #[inline]
    pub fn new(scope: &'static str) -> Self {
        let mut claim = Claim {
            scope,
            key: Vec::new(),
            entity: None,
            version: None,
            retention: DEFAULT_RETENTION,
            options: None,
            problem: None,
        };
        if scope.len() > MAX_SCOPE_LEN {
            claim.refuse(
                KeyPart::Scope,
                KeyProblem::TooLong {
                    len: scope.len(),
                    max: MAX_SCOPE_LEN,
                },
            );
        } else if scope.contains('\0') {
            claim.refuse(KeyPart::Scope, KeyProblem::Nul);
        }
        claim
    }

    /// Sets the idempotency key.
    #[inline]
    pub fn key<K: Key + ?Sized>(mut self, key: &K) -> Self {
        self.key = self.encode(KeyPart::Key, key);
        self
    }

    /// Sets the entity whose version orders this message (default: the key).
    #[inline]
    pub fn entity<K: Key + ?Sized>(mut self, entity: &K) -> Self {
        self.entity = Some(self.encode(KeyPart::Entity, entity));
        self
    }

    /// Sets the version of the entity this message carries.
    #[inline]
    pub fn version<V: Version + ?Sized>(mut self, version: &V) -> Self {
        match version.to_version() {
            Ok(v) => self.version = Some(v),
            Err(problem) => self.refuse(KeyPart::Version, problem),
        }
        self
    }

    /// Sets how long the record of the message is kept (default [`DEFAULT_RETENTION`]).
    #[inline]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the lease of a lease-mode handler (default [`DEFAULT_LEASE`]).
    #[inline]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options_mut().lease = Some(lease);
        self
    }

    /// Sets the payload's fingerprint: SHA-256 of `value`'s [`Key`] encoding (the bytes of a
    /// string or byte slice, big-endian integers, tuples part by part), kept with the record.
    /// A later delivery of the same key with another fingerprint is refused (`Error::Conflict`).
    pub fn fingerprint<K: Key + ?Sized>(mut self, value: &K) -> Self {
        use sha2::{Digest, Sha256};
        let mut bytes = Vec::with_capacity(value.key_len_hint());
        value.write_key(&mut bytes);
        self.options_mut().fingerprint = Some(Sha256::digest(&bytes).into());
        self
    }

    /// Keeps the body's `Ok` value with the record, for duplicates to replay
    /// (`Outcome::Replayed`).
    #[inline]
    pub fn replay(mut self) -> Self {
        self.options_mut().replay = true;
        self
    }

    /// Counts the handler's failures; from the `n`th on, the message is `Outcome::Poisoned`.
    #[inline]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.options_mut().max_attempts = Some(n);
        self
    }

    /// The handler's scope.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// The first key, entity or version problem met, if any: the delivery is refused with it.
    pub fn problem(&self) -> Option<&KeyError> {
        self.problem.as_deref()
    }

    /// The encoded key.
    pub(crate) fn key_bytes(&self) -> &[u8] {
        &self.key
    }

    /// Which message this is, to the store.
    pub(crate) fn record_key(&self) -> RecordKey<'_> {
        RecordKey {
            scope: self.scope,
            key: &self.key,
        }
    }

    /// The fingerprint of the payload, with `fingerprint = "..."`.
    pub(crate) fn fingerprint_bytes(&self) -> Option<&[u8; 32]> {
        self.options.as_ref()?.fingerprint.as_ref()
    }

    /// Whether the body's value is kept for duplicates (`replay = true`).
    pub(crate) fn replays(&self) -> bool {
        self.options.as_ref().is_some_and(|o| o.replay)
    }

    /// The bound on failed attempts, with `max_attempts = N`.
    pub(crate) fn attempt_limit(&self) -> Option<u32> {
        self.options.as_ref()?.max_attempts
    }

    /// Whether a duplicate must read what the first delivery stamped on its row.
    pub(crate) fn stamps(&self) -> bool {
        self.options
            .as_ref()
            .is_some_and(|o| o.fingerprint.is_some() || o.replay)
    }

    /// The row that keeps this message's stamp: its record, or in key + version mode (which
    /// writes no record) the version row of its key.
    pub(crate) fn stamp_key(&self) -> StampKey<'_> {
        StampKey {
            row: if self.needs_record() {
                StampRow::Record
            } else {
                StampRow::Version
            },
            scope: self.scope,
            key: &self.key,
        }
    }

    /// How long a lease-mode delivery holds its lease.
    pub(crate) fn lease_duration(&self) -> Duration {
        self.options
            .as_ref()
            .and_then(|o| o.lease)
            .unwrap_or(DEFAULT_LEASE)
    }

    /// The record this delivery writes.
    pub(crate) fn record(&self) -> Record<'_> {
        Record {
            scope: self.scope,
            key: &self.key,
            retention: self.retention,
            fingerprint: self.fingerprint_bytes().map(<[u8; 32]>::as_slice),
        }
    }

    /// Whether deciding writes a record of the message (all modes but key + version).
    pub(crate) fn needs_record(&self) -> bool {
        self.version.is_none() || self.entity.is_some()
    }

    /// The version this delivery must advance (of its entity, or of its key when it has no
    /// entity), in the modes that have one.
    pub(crate) fn version_entry(&self) -> Option<VersionEntry<'_>> {
        Some(VersionEntry {
            scope: self.scope,
            entity: self.entity.as_deref().unwrap_or(&self.key),
            version: self.version?,
        })
    }

    /// What the handler's [`Context`] parameter shows.
    pub(crate) fn into_context(self) -> Context {
        Context::new(self.scope, self.key, self.version)
    }

    fn encode<K: Key + ?Sized>(&mut self, part: KeyPart, key: &K) -> Vec<u8> {
        // Sized once where the key knows its length (`Key::key_len_hint`).
        let mut bytes = Vec::with_capacity(key.key_len_hint());
        key.write_key(&mut bytes);
        if bytes.is_empty() {
            self.refuse(part, KeyProblem::Empty);
        } else if bytes.len() > MAX_KEY_LEN {
            self.refuse(
                part,
                KeyProblem::TooLong {
                    len: bytes.len(),
                    max: MAX_KEY_LEN,
                },
            );
        }
        bytes
    }

    fn refuse(&mut self, part: KeyPart, problem: KeyProblem) {
        self.problem
            .get_or_insert_with(|| Box::new(KeyError::new(self.scope, part, problem)));
    }

    /// The handler options, made on the first one set.
    #[inline]
    fn options_mut(&mut self) -> &mut Options {
        self.options.get_or_insert_with(Box::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_moved_inline() {
        // Over 128 bytes, each move of a claim is a call to `memcpy` (see `Claim`).
        assert!(std::mem::size_of::<Claim>() <= 128);
    }

    #[test]
    fn options_are_kept_as_set() {
        let plain = Claim::new("s").key(&1_u32);
        assert!(!plain.stamps() && !plain.replays() && plain.attempt_limit().is_none());
        assert_eq!(plain.lease_duration(), DEFAULT_LEASE);
        let all = Claim::new("s")
            .key(&1_u32)
            .lease(Duration::from_secs(5))
            .fingerprint(&"body")
            .replay()
            .max_attempts(3);
        assert_eq!(all.lease_duration(), Duration::from_secs(5));
        assert!(all.stamps() && all.replays() && all.fingerprint_bytes().is_some());
        assert_eq!(all.attempt_limit(), Some(3));
        assert!(Claim::new("s").key(&1_u32).replay().stamps());
    }

    #[test]
    fn the_first_problem_is_kept() {
        let claim = Claim::new("s").key(&"").entity(&"").version(&u64::MAX);
        let problem = claim.problem().unwrap();
        assert_eq!(problem.part(), KeyPart::Key);
        assert_eq!(problem.problem(), &KeyProblem::Empty);
    }

    #[test]
    fn a_key_over_the_limit_is_refused_and_one_at_it_is_not() {
        let at = "k".repeat(MAX_KEY_LEN);
        assert!(Claim::new("s").key(&at.as_str()).problem().is_none());
        let over = "k".repeat(MAX_KEY_LEN + 1);
        let claim = Claim::new("s").key(&over.as_str());
        assert_eq!(
            claim.problem().unwrap().problem(),
            &KeyProblem::TooLong {
                len: MAX_KEY_LEN + 1,
                max: MAX_KEY_LEN
            }
        );
    }

    #[test]
    fn a_scope_over_the_limit_is_refused_and_one_at_it_is_not() {
        let at: &'static str = Box::leak("s".repeat(MAX_SCOPE_LEN).into_boxed_str());
        assert!(Claim::new(at).key(&1_u32).problem().is_none());
        let over: &'static str = Box::leak("s".repeat(MAX_SCOPE_LEN + 1).into_boxed_str());
        let problem = Claim::new(over).key(&1_u32).problem().cloned().unwrap();
        assert_eq!(problem.part(), KeyPart::Scope);
        assert_eq!(
            problem.problem(),
            &KeyProblem::TooLong {
                len: MAX_SCOPE_LEN + 1,
                max: MAX_SCOPE_LEN
            }
        );
    }

    #[test]
    fn a_scope_with_a_nul_is_refused() {
        let problem = Claim::new("billing\0charge")
            .key(&1_u32)
            .problem()
            .cloned()
            .unwrap();
        assert_eq!(problem.part(), KeyPart::Scope);
        assert_eq!(problem.problem(), &KeyProblem::Nul);
    }

    #[test]
    fn modes_follow_the_values_given() {
        let key_only = Claim::new("s").key(&1_u32);
        assert!(key_only.needs_record() && key_only.version_entry().is_none());
        let versioned = Claim::new("s").key(&1_u32).version(&7_i64);
        assert!(!versioned.needs_record());
        assert_eq!(
            versioned.version_entry().unwrap().entity,
            versioned.key_bytes()
        );
        let with_entity = Claim::new("s").key(&1_u32).entity(&"e").version(&7_i64);
        assert!(with_entity.needs_record());
        assert_eq!(with_entity.version_entry().unwrap().entity, b"e");
    }
}

//! [`Claim`]: the values of one delivery (scope, key, version, entity, retention, lease), each
//! checked as it is added. The first problem is kept and reported before anything is written.

use std::marker::PhantomData;
use std::time::Duration;

use sqlx::Database;

use crate::context::Context;
use crate::error::{KeyError, KeyPart, KeyProblem};
use crate::key::{Key, MAX_KEY_LEN, MAX_SCOPE_LEN};
use crate::store::{Attempts, Leases, Record, RecordKey, StampKey, StampRow, Stamps, VersionEntry};
use crate::version::Version;

use super::ops::{AttemptOps, LeaseOps, StampOps};

/// How long a record is kept when the handler does not say (`retention = "..."`): 30 days,
/// longer than the redelivery window of common brokers.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a lease lasts when a lease-mode handler does not say (`lease = "..."`): 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The values of one delivery on database `DB`: scope, key and optional version and entity,
/// checked as they are added; the first problem is kept and reported by [`Claim::begin`]
/// before anything is written. The options that need a capability of `DB` beyond
/// [`Store`](crate::store::Store) ask for it where they are set (`fingerprint`, `replay`,
/// `max_attempts`, `lease_mode`), and keep its table (`claim/ops.rs`).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::__private::Claim;
/// let claim = Claim::<sqlx::Sqlite>::new("billing::charge").key(&"msg-1").version(&u64::MAX);
/// assert_eq!(claim.scope(), "billing::charge");
/// assert_eq!(claim.problem().unwrap().to_string(),
///            "idempotent handler `billing::charge`: version 18446744073709551615 does not fit in an i64");
/// # }
/// ```
// At most 128 bytes (a unit test says so): a claim is moved several times a delivery, and
// larger values are copied by a call to `memcpy` where smaller ones are moved inline
// (docs/design/performance.md#moves-over-128-bytes). What only some handlers use is boxed,
// the capability tables of the options with them.
pub struct Claim<DB: Database> {
    scope: &'static str,
    key: Vec<u8>,
    entity: Option<Vec<u8>>,
    version: Option<i64>,
    retention: Duration,
    /// Lease, fingerprint, replay, max_attempts: `None` when the handler has none of them.
    options: Option<Box<Options<DB>>>,
    problem: Option<Box<KeyError>>,
    /// A claim is `Send` and `Sync` whatever `DB` is.
    db: PhantomData<fn() -> DB>,
}

/// The handler options a claim carries beyond key, entity, version and retention, and the
/// tables of the capabilities they need.
struct Options<DB: Database> {
    lease: Option<Duration>,
    /// `fingerprint = "..."`: SHA-256 of the value's key encoding.
    fingerprint: Option<[u8; 32]>,
    /// `replay = true`.
    replay: bool,
    /// `fingerprint` or `replay`: `DB`'s [`Stamps`] methods.
    stamps: Option<&'static StampOps<DB>>,
    /// `max_attempts = N`, and `DB`'s [`Attempts`] methods.
    max_attempts: Option<(u32, &'static AttemptOps<DB>)>,
    /// `mode = "lease"`: `DB`'s [`Leases`] methods.
    leases: Option<&'static LeaseOps<DB>>,
}

impl<DB: Database> Default for Options<DB> {
    fn default() -> Self {
        Options {
            lease: None,
            fingerprint: None,
            replay: false,
            stamps: None,
            max_attempts: None,
            leases: None,
        }
    }
}

impl<DB: Database> Clone for Options<DB> {
    fn clone(&self) -> Self {
        Options {
            lease: self.lease,
            fingerprint: self.fingerprint,
            replay: self.replay,
            stamps: self.stamps,
            max_attempts: self.max_attempts,
            leases: self.leases,
        }
    }
}

impl<DB: Database> std::fmt::Debug for Options<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("lease", &self.lease)
            .field("fingerprint", &self.fingerprint)
            .field("replay", &self.replay)
            .field("max_attempts", &self.max_attempts.map(|(n, _)| n))
            .field("lease_mode", &self.leases.is_some())
            .finish()
    }
}

impl<DB: Database> Clone for Claim<DB> {
    fn clone(&self) -> Self {
        Claim {
            scope: self.scope,
            key: self.key.clone(),
            entity: self.entity.clone(),
            version: self.version,
            retention: self.retention,
            options: self.options.clone(),
            problem: self.problem.clone(),
            db: PhantomData,
        }
    }
}

impl<DB: Database> std::fmt::Debug for Claim<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("entity", &self.entity)
            .field("version", &self.version)
            .field("retention", &self.retention)
            .field("options", &self.options)
            .field("problem", &self.problem)
            .finish()
    }
}

// The builder's steps are `#[inline]`: a generated handler calls them one after another, and
// each call would otherwise move the whole `Claim` (208 bytes) through its return slot
// (docs/design/performance.md#moves-over-128-bytes).
impl<DB: Database> Claim<DB> {
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
            db: PhantomData,
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
    /// Needs `DB:` [`Stamps`].
    pub fn fingerprint<K: Key + ?Sized>(mut self, value: &K) -> Self
    where
        DB: Stamps,
    {
        use sha2::{Digest, Sha256};
        let mut bytes = Vec::with_capacity(value.key_len_hint());
        value.write_key(&mut bytes);
        let options = self.options_mut();
        options.fingerprint = Some(Sha256::digest(&bytes).into());
        options.stamps = Some(StampOps::OF);
        self
    }

    /// Keeps the body's `Ok` value with the record, for duplicates to replay
    /// (`Outcome::Replayed`). Needs `DB:` [`Stamps`].
    #[inline]
    pub fn replay(mut self) -> Self
    where
        DB: Stamps,
    {
        let options = self.options_mut();
        options.replay = true;
        options.stamps = Some(StampOps::OF);
        self
    }

    /// Counts the handler's failures; from the `n`th on, the message is `Outcome::Poisoned`.
    /// Needs `DB:` [`Attempts`].
    #[inline]
    pub fn max_attempts(mut self, n: u32) -> Self
    where
        DB: Attempts,
    {
        self.options_mut().max_attempts = Some((n, AttemptOps::OF));
        self
    }

    /// Lease mode (`mode = "lease"`): the claim is taken with [`begin_lease`](Claim::begin_lease).
    /// Needs `DB:` [`Leases`].
    #[inline]
    pub fn lease_mode(mut self) -> Self
    where
        DB: Leases,
    {
        self.options_mut().leases = Some(LeaseOps::OF);
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

    /// The bound on failed attempts, with `max_attempts = N`, and where they are counted.
    pub(crate) fn attempt_limit(&self) -> Option<(u32, &'static AttemptOps<DB>)> {
        self.options.as_ref()?.max_attempts
    }

    /// With `fingerprint` or `replay`, where the stamps are kept: a duplicate must read what
    /// the first delivery stamped on its row.
    pub(crate) fn stamp_ops(&self) -> Option<&'static StampOps<DB>> {
        self.options.as_ref()?.stamps
    }

    /// Lease mode: `DB`'s [`Leases`] methods, kept by [`lease_mode`](Claim::lease_mode).
    pub(crate) fn lease_ops(&self) -> Option<&'static LeaseOps<DB>> {
        self.options.as_ref()?.leases
    }

    /// Whether a duplicate must read what the first delivery stamped on its row.
    pub(crate) fn stamps(&self) -> bool {
        self.stamp_ops().is_some()
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
    fn options_mut(&mut self) -> &mut Options<DB> {
        self.options.get_or_insert_with(Box::default)
    }
}

// A claim names its database: the tests take SQLite's.
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    type Claim = super::Claim<sqlx::Sqlite>;

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
        assert_eq!(all.attempt_limit().map(|(n, _)| n), Some(3));
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

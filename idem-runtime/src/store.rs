//! The storage contract: what a database must do for idem, and where a transaction comes from.

use std::future::Future;
use std::time::Duration;

use sqlx::{Database, Pool, Transaction};

/// The transaction type a handler body writes through: `sqlx::Transaction`.
///
/// ```
/// fn takes(_tx: &mut idem_runtime::Tx<'_, sqlx::Sqlite>) {}
/// ```
pub type Tx<'c, DB> = Transaction<'c, DB>;

/// What happened to an entity's version high-water mark.
///
/// ```
/// use idem_runtime::VersionCheck;
/// assert_ne!(VersionCheck::Advanced, VersionCheck::Behind { latest: 3 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCheck {
    /// The new version was greater than the stored one (or the entity was new) and is now stored.
    Advanced,
    /// The stored version equals the new one; nothing changed.
    Equal,
    /// The stored version is greater than the new one; nothing changed.
    Behind {
        /// The stored version.
        latest: i64,
    },
}

/// A record of one message to insert: its scope and key, and how long to keep it.
///
/// ```
/// use std::time::Duration;
/// let record = idem_runtime::Record { scope: "billing", key: b"evt-1", retention: Duration::from_secs(60) };
/// assert_eq!(record.retention_ms(), 60_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record<'a> {
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded idempotency key.
    pub key: &'a [u8],
    /// How long after now the record may be purged.
    pub retention: Duration,
}

impl Record<'_> {
    /// The retention in milliseconds, saturating at `i64::MAX`.
    pub fn retention_ms(&self) -> i64 {
        millis(self.retention)
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One version to advance, in [`Store::advance_versions`].
///
/// ```
/// let entry = idem_runtime::VersionEntry { scope: "orders", entity: b"42", version: 7 };
/// assert_eq!(entry.version, 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionEntry<'a> {
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded entity.
    pub entity: &'a [u8],
    /// The version the message carries.
    pub version: i64,
}

/// Decides `entries` one after another, in order, from the `stored` versions (`None`: a new
/// entity). Returns each entry's check and the final version of every entity that advanced.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // used by the PostgreSQL backend
pub(crate) fn sequential_checks<'a>(
    stored: &std::collections::HashMap<(&'a str, &'a [u8]), Option<i64>>,
    entries: &[VersionEntry<'a>],
) -> (Vec<VersionCheck>, Vec<VersionEntry<'a>>) {
    let mut latest = stored.clone();
    // Entities that advanced, in first-advance order (the Vec) without a linear search (the set).
    let mut advanced: Vec<(&'a str, &'a [u8])> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let checks = entries
        .iter()
        .map(|e| {
            let current = latest.entry((e.scope, e.entity)).or_insert(None);
            match *current {
                Some(stored) if e.version == stored => VersionCheck::Equal,
                Some(stored) if e.version < stored => VersionCheck::Behind { latest: stored },
                _ => {
                    *current = Some(e.version);
                    if seen.insert((e.scope, e.entity)) {
                        advanced.push((e.scope, e.entity));
                    }
                    VersionCheck::Advanced
                }
            }
        })
        .collect();
    let finals = advanced
        .into_iter()
        .filter_map(|(scope, entity)| {
            latest
                .get(&(scope, entity))
                .copied()
                .flatten()
                .map(|version| VersionEntry {
                    scope,
                    entity,
                    version,
                })
        })
        .collect();
    (checks, finals)
}

/// What a lease-mode claim found.
///
/// ```
/// assert_ne!(idem_runtime::LeaseClaim::Acquired, idem_runtime::LeaseClaim::InProgress);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseClaim {
    /// The message was new, or its lease had expired: the caller now holds the lease.
    Acquired,
    /// The message is done.
    Done,
    /// Another delivery holds an unexpired lease on it.
    InProgress,
}

/// A database that can hold idempotency records: implemented for `sqlx::Sqlite` and
/// `sqlx::Postgres` (features `sqlite`, `postgres`); implement it to add another sqlx database.
///
/// Every method decides atomically, through the database's own unique constraints and
/// conditional upserts, never by a read followed by a write. Times come from the database's
/// clock, so consumers on many machines agree on them.
///
/// ```
/// async fn setup<DB: idem_runtime::Store>(pool: &sqlx::Pool<DB>) -> Result<(), sqlx::Error> {
///     DB::migrate(pool).await
/// }
/// ```
pub trait Store: Database {
    /// Creates or updates idem's tables; safe to run any number of times, also concurrently.
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// Records that a message was handled. Returns `false`, writing nothing, if its scope and
    /// key already were; a concurrent claim of the same key waits on the first until it
    /// commits or rolls back.
    fn insert_record<'c>(
        conn: &'c mut Self::Connection,
        record: Record<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;

    /// Records many messages in one round trip where the database allows it: like
    /// [`insert_record`](Store::insert_record) for each, in order, and returns whether each was
    /// new. A scope and key given twice is new at most once, at its first place.
    /// The default makes one call per record.
    fn insert_records<'c>(
        conn: &'c mut Self::Connection,
        records: &'c [Record<'c>],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send + 'c {
        async move {
            let mut inserted = Vec::with_capacity(records.len());
            for record in records {
                inserted.push(Self::insert_record(&mut *conn, *record).await?);
            }
            Ok(inserted)
        }
    }

    /// Removes the record of `key` in `scope`, which this transaction inserted: a batch undoes
    /// the record of a message that turned out stale.
    fn delete_record<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// Raises the version of `entity` in `scope` to `version` if it is greater than the stored
    /// one (an atomic conditional upsert); otherwise reports the stored version.
    fn advance_version<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        entity: &'c [u8],
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c;

    /// Records the message, and if it was new, raises the version of `entity` as
    /// [`advance_version`](Store::advance_version) does. `None` when the record already
    /// existed (a duplicate; the version is untouched). The default makes the two calls;
    /// PostgreSQL does both in one statement.
    fn record_and_advance<'c>(
        conn: &'c mut Self::Connection,
        record: Record<'c>,
        entity: &'c [u8],
        version: i64,
    ) -> impl Future<Output = Result<Option<VersionCheck>, sqlx::Error>> + Send + 'c {
        async move {
            if !Self::insert_record(&mut *conn, record).await? {
                return Ok(None);
            }
            Self::advance_version(conn, record.scope, entity, version)
                .await
                .map(Some)
        }
    }

    /// Advances many versions for a batch, in as few round trips as the database allows: the
    /// result for each entry is what [`advance_version`](Store::advance_version) would return
    /// if the entries were applied one after another, in order. The default makes one call per
    /// entry; PostgreSQL locks every entity row at once (inserting the missing ones), decides
    /// in memory, and writes the new versions in one statement.
    fn advance_versions<'c>(
        conn: &'c mut Self::Connection,
        entries: &'c [VersionEntry<'c>],
    ) -> impl Future<Output = Result<Vec<VersionCheck>, sqlx::Error>> + Send + 'c {
        async move {
            let mut checks = Vec::with_capacity(entries.len());
            for entry in entries {
                checks.push(
                    Self::advance_version(&mut *conn, entry.scope, entry.entity, entry.version)
                        .await?,
                );
            }
            Ok(checks)
        }
    }

    /// Deletes at most `limit` records whose retention has passed (never one whose lease is
    /// still running), in one statement, and returns how many it deleted.
    fn purge_expired<'c>(
        conn: &'c mut Self::Connection,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;

    /// Deletes at most `limit` version rows not advanced for `older_than`, and returns how many.
    fn purge_versions<'c>(
        conn: &'c mut Self::Connection,
        older_than: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;

    /// Lease mode: takes the lease on a message for `lease`, marked with `token`, if the
    /// message is new or its lease expired (one atomic upsert, committed by the caller at once).
    fn claim_lease<'c>(
        conn: &'c mut Self::Connection,
        record: Record<'c>,
        lease: Duration,
        token: i64,
    ) -> impl Future<Output = Result<LeaseClaim, sqlx::Error>> + Send + 'c;

    /// Lease mode: marks the message done, if `token` still holds its lease. Runs in the
    /// transaction of the handler's effect, so both commit together.
    fn complete_lease<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        key: &'c [u8],
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;

    /// Lease mode: gives the lease up (deletes the in-progress record), if `token` holds it,
    /// so that a redelivery runs again at once.
    fn release_lease<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        key: &'c [u8],
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;
}

/// Creates idem's tables in the database behind `pool`. Idempotent; the SQL also ships as files
/// in `idem-runtime/migrations/` for teams that run their own migrations.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// idem_runtime::migrate(&pool).await?; // again: no error
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub async fn migrate<DB: Store>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    DB::migrate(pool).await
}

/// Classifies a version that did not advance: equal to the stored one, or behind it.
pub(crate) fn compare(version: i64, latest: i64) -> VersionCheck {
    if version == latest {
        VersionCheck::Equal
    } else {
        VersionCheck::Behind { latest }
    }
}

/// Flags, for each requested `(scope, key)`, whether the database returned it as inserted; a
/// pair requested twice is flagged at its first place only.
pub(crate) fn mark_inserted(requested: &[Record<'_>], inserted: &[(String, Vec<u8>)]) -> Vec<bool> {
    let mut fresh: std::collections::HashSet<(&str, &[u8])> = inserted
        .iter()
        .map(|(scope, key)| (scope.as_str(), key.as_slice()))
        .collect();
    requested
        .iter()
        .map(|r| fresh.remove(&(r.scope, r.key)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_pairs_are_new_once() {
        let record = |scope, key| Record {
            scope,
            key,
            retention: Duration::ZERO,
        };
        let requested = [
            record("s", &b"a"[..]),
            record("s", b"b"),
            record("s", b"a"),
            record("t", b"a"),
        ];
        let inserted = vec![
            ("s".to_string(), b"a".to_vec()),
            ("t".to_string(), b"a".to_vec()),
        ];
        assert_eq!(
            mark_inserted(&requested, &inserted),
            [true, false, false, true]
        );
    }

    #[test]
    fn batched_versions_decide_as_if_one_after_another() {
        let entry = |entity, version| VersionEntry {
            scope: "s",
            entity,
            version,
        };
        let mut stored = std::collections::HashMap::new();
        stored.insert(("s", &b"a"[..]), Some(5));
        stored.insert(("s", &b"b"[..]), None);
        let entries = [
            entry(b"a", 4),
            entry(b"a", 6),
            entry(b"a", 6),
            entry(b"b", 1),
            entry(b"a", 5),
            entry(b"c", -3),
        ];
        let (checks, finals) = sequential_checks(&stored, &entries);
        assert_eq!(
            checks,
            [
                VersionCheck::Behind { latest: 5 },
                VersionCheck::Advanced,
                VersionCheck::Equal,
                VersionCheck::Advanced,
                VersionCheck::Behind { latest: 6 },
                VersionCheck::Advanced,
            ]
        );
        assert_eq!(finals, [entry(b"a", 6), entry(b"b", 1), entry(b"c", -3)]);
    }

    #[test]
    fn versions_compare() {
        assert_eq!(compare(3, 3), VersionCheck::Equal);
        assert_eq!(compare(2, 3), VersionCheck::Behind { latest: 3 });
    }
}

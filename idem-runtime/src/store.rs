//! The storage contract: what a database must do for idem, and where a transaction comes from.

use std::future::Future;

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

/// A database that can hold idempotency records: implemented for `sqlx::Sqlite` and
/// `sqlx::Postgres` (features `sqlite`, `postgres`); implement it to add another sqlx database.
///
/// Every method runs inside the handler's transaction and must decide atomically, through the
/// database's own unique constraints and conditional upserts, never by a read followed by a write.
///
/// ```
/// async fn setup<DB: idem_runtime::Store>(pool: &sqlx::Pool<DB>) -> Result<(), sqlx::Error> {
///     DB::migrate(pool).await
/// }
/// ```
pub trait Store: Database {
    /// Creates or updates idem's tables; safe to run any number of times, also concurrently.
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_;

    /// Records that `key` was handled in `scope`. Returns `false`, writing nothing, if it already
    /// was; a concurrent claim of the same key waits on the first until it commits or rolls back.
    fn insert_record<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;

    /// Records many messages in one round trip where the database allows it: like
    /// [`insert_record`](Store::insert_record) for each `(scope, key)`, in order, and returns
    /// whether each was new. A pair given twice is new at most once, at its first place.
    /// The default makes one call per record.
    fn insert_records<'c>(
        conn: &'c mut Self::Connection,
        records: &'c [(&'c str, &'c [u8])],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send + 'c {
        async move {
            let mut inserted = Vec::with_capacity(records.len());
            for (scope, key) in records {
                inserted.push(Self::insert_record(&mut *conn, scope, key).await?);
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
pub(crate) fn mark_inserted(
    requested: &[(&str, &[u8])],
    inserted: &[(String, Vec<u8>)],
) -> Vec<bool> {
    let mut fresh: std::collections::HashSet<(&str, &[u8])> = inserted
        .iter()
        .map(|(scope, key)| (scope.as_str(), key.as_slice()))
        .collect();
    requested.iter().map(|pair| fresh.remove(pair)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_pairs_are_new_once() {
        let requested: [(&str, &[u8]); 4] = [("s", b"a"), ("s", b"b"), ("s", b"a"), ("t", b"a")];
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
    fn versions_compare() {
        assert_eq!(compare(3, 3), VersionCheck::Equal);
        assert_eq!(compare(2, 3), VersionCheck::Behind { latest: 3 });
    }
}

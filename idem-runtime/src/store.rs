//! The storage contract: what a database must do for idem, and where a transaction comes from.

use std::future::Future;

use futures_core::future::BoxFuture;
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

/// Whatever can open the transaction of a handler: a pool (`&pool`, a new transaction that the
/// handler commits), an open transaction (`&mut tx`, a savepoint inside it that the caller
/// commits), or a connection (`&mut conn`).
///
/// ```
/// fn accepts<'c>(_: impl idem_runtime::Source<'c, sqlx::Sqlite>) {}
/// # #[cfg(feature = "sqlite")]
/// fn demo(pool: &sqlx::SqlitePool) { accepts(pool) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a transaction for an idempotent handler",
    label = "expected a pool or an open transaction",
    note = "pass `&pool` (idem commits a new transaction) or `&mut tx` (idem adds a savepoint; you commit)"
)]
pub trait Source<'c, DB: Database>: Send {
    /// Begins a transaction, or a savepoint when `self` is already in one.
    fn begin(self) -> BoxFuture<'c, Result<Transaction<'c, DB>, sqlx::Error>>;
}

impl<'c, DB: Database, A> Source<'c, DB> for A
where
    A: sqlx::Acquire<'c, Database = DB> + Send,
{
    fn begin(self) -> BoxFuture<'c, Result<Transaction<'c, DB>, sqlx::Error>> {
        sqlx::Acquire::begin(self)
    }
}

/// Classifies a version that did not advance: equal to the stored one, or behind it.
pub(crate) fn compare(version: i64, latest: i64) -> VersionCheck {
    if version == latest {
        VersionCheck::Equal
    } else {
        VersionCheck::Behind { latest }
    }
}

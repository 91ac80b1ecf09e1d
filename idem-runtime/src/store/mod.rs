//! The storage contract: what a database must do for idem, the values its methods take and
//! return, and which of its errors are worth a retry ([`is_transient`]).
//!
//! Handler authors never call this module; it is for backend authors (and the conformance kit,
//! `idem-testkit`, which checks a backend method by method). idem's own implementations, one
//! folder per database, are in `src/backend/`.
//!
//! The contract is a core, [`Store`], and three capabilities, each a trait of its own over it.
//! A handler needs the core alone; each handler option needs one capability more, and a backend
//! without it is a compile error at the option (its message names the trait), never a failure
//! at run time. SQLite, PostgreSQL and MySQL implement all four.
//!
//! | Trait | What needs it | Methods (*: has a default built on the others) |
//! |---|---|---|
//! | [`Store`] | every handler: `key`, `version`, `entity`, `retention`; on a pool, in a savepoint, in a batch; the purger | [`migrate`](Store::migrate), [`insert_record`](Store::insert_record), [`insert_records`](Store::insert_records)*, [`delete_record`](Store::delete_record), [`advance_version`](Store::advance_version), [`record_and_advance`](Store::record_and_advance)*, [`advance_versions`](Store::advance_versions)*, [`purge_expired`](Store::purge_expired), [`purge_versions`](Store::purge_versions), [`is_transient`](Store::is_transient)*, [`retry_claim`](Store::retry_claim)* |
//! | [`Leases`] | `mode = "lease"` | [`claim_lease`](Leases::claim_lease), [`complete_lease`](Leases::complete_lease), [`release_lease`](Leases::release_lease) |
//! | [`Stamps`] | `fingerprint = "..."`, `replay = true` | [`save_stamp`](Stamps::save_stamp), [`load_stamp`](Stamps::load_stamp), [`save_stamps`](Stamps::save_stamps)*, [`load_stamps`](Stamps::load_stamps)*, [`insert_record_or_read_stamp`](Stamps::insert_record_or_read_stamp)*, [`insert_records_reading_stamps`](Stamps::insert_records_reading_stamps)*, [`RECORDS_FINGERPRINT`](Stamps::RECORDS_FINGERPRINT)* |
//! | [`Attempts`] | `max_attempts = N` | [`load_attempts`](Attempts::load_attempts), [`count_attempt`](Attempts::count_attempt), [`clear_attempts`](Attempts::clear_attempts) |
//!
//! A handler generic over the database names the capabilities its options need:
//!
//! ```
//! use idem::{idempotent, Tx};
//! use idem::store::{Stamps, Store};
//!
//! #[idempotent(key = "id", fingerprint = "body")]
//! async fn checked<DB: Stamps>(tx: &mut Tx<'_, DB>, id: &str, body: &str) -> Result<(), sqlx::Error> {
//!     Ok(())
//! }
//!
//! #[idempotent(key = "id")] // no option: the core is enough
//! async fn plain<DB: Store>(tx: &mut Tx<'_, DB>, id: &str) -> Result<(), sqlx::Error> {
//!     Ok(())
//! }
//! ```

use std::future::Future;
use std::time::Duration;

use sqlx::{Database, Pool, Transaction};

/// The transaction type a handler body writes through: `sqlx::Transaction`.
///
/// ```
/// fn takes(_tx: &mut idem::Tx<'_, idem::sqlx::Sqlite>) {}
/// ```
pub type Tx<'c, DB> = Transaction<'c, DB>;

/// Which message a record is about: the handler's scope and the encoded key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordKey<'a> {
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded idempotency key.
    pub key: &'a [u8],
}

/// A record of one message to insert: which message, and how long to keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record<'a> {
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded idempotency key.
    pub key: &'a [u8],
    /// How long after now the record may be purged.
    pub retention: Duration,
    /// `fingerprint = "..."`: the payload's SHA-256, which a backend whose
    /// [`Stamps::RECORDS_FINGERPRINT`] is true writes with a new record.
    pub fingerprint: Option<&'a [u8]>,
}

impl<'a> Record<'a> {
    /// The retention in milliseconds, saturating at `i64::MAX`.
    pub fn retention_ms(&self) -> i64 {
        millis(self.retention)
    }

    /// Where this record's stamp is kept: on the record itself.
    pub fn stamp_key(&self) -> StampKey<'a> {
        StampKey {
            row: StampRow::Record,
            scope: self.scope,
            key: self.key,
        }
    }

    /// Which message this record is about.
    pub fn id(&self) -> RecordKey<'a> {
        RecordKey {
            scope: self.scope,
            key: self.key,
        }
    }
}

/// One version to advance: an entity of a scope, and the version a message carries for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionEntry<'a> {
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded entity.
    pub entity: &'a [u8],
    /// The version the message carries.
    pub version: i64,
}

/// What happened to an entity's version high-water mark.
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

/// Lease mode: the lease a delivery asks for on a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest<'a> {
    /// The record to insert (or take over) as in progress.
    pub record: Record<'a>,
    /// How long the lease lasts.
    pub lease: Duration,
    /// What tells this delivery's lease from any other's.
    pub token: i64,
}

/// Lease mode: a lease held on a message, to complete or release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseHold<'a> {
    /// The message.
    pub record: RecordKey<'a>,
    /// The token its lease was taken with.
    pub token: i64,
}

/// What a lease-mode claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseClaim {
    /// The message was new, or its lease had expired: the caller now holds the lease.
    Acquired,
    /// The message is done.
    Done,
    /// Another delivery holds an unexpired lease on it.
    InProgress,
}

/// Which row of a message keeps its stamp (fingerprint, replayed result): its record, or in
/// key + version mode (no record) the version row of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StampRow {
    /// `idem_records`, by scope and key.
    Record,
    /// `idem_versions`, by scope and entity (the key, in key + version mode).
    Version,
}

/// The row that keeps a message's stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StampKey<'a> {
    /// Which table.
    pub row: StampRow,
    /// The handler's scope.
    pub scope: &'a str,
    /// The encoded key (the entity's column for [`StampRow::Version`]).
    pub key: &'a [u8],
}

/// What `fingerprint = "..."` and `replay = true` keep of an applied message, written in the
/// transaction of its effect (`None` columns are written as NULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp<'a> {
    /// The row to write.
    pub at: StampKey<'a>,
    /// SHA-256 of the payload (32 bytes).
    pub fingerprint: Option<&'a [u8]>,
    /// The handler's `Ok` value, as JSON.
    pub result: Option<&'a [u8]>,
}

/// A stamp as stored: what a duplicate is checked against and replays.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredStamp {
    /// SHA-256 of the first payload, if its handler had `fingerprint`.
    pub fingerprint: Option<Vec<u8>>,
    /// The first delivery's `Ok` value as JSON, if its handler had `replay = true`.
    pub result: Option<Vec<u8>>,
}

/// One record of [`Stamps::insert_records_reading_stamps`]: whether the claim was new, and for
/// a record that already was, its stamp, where the insert read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inserted {
    /// The record is new: its message applies.
    pub new: bool,
    /// A record that already was: the stamp its first delivery left, if the insert read it
    /// (`None`: not read; the caller reads it with [`Stamps::load_stamps`]).
    pub stamp: Option<StoredStamp>,
}

impl Inserted {
    /// A result of [`Store::insert_records`], its stamp not read.
    pub fn unread(new: bool) -> Self {
        Inserted { new, stamp: None }
    }
}

/// `max_attempts = N`: the longest [`FailedAttempt::error`] idem writes to
/// `idem_attempts.last_error`, in bytes (UTF-8): a longer text is cut at a character boundary
/// and ends with `…`.
pub const MAX_ERROR_LEN: usize = 1024;

/// `max_attempts = N`: a failed attempt to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedAttempt<'a> {
    /// The message.
    pub record: RecordKey<'a>,
    /// Why it failed, for operators: the Display text of the handler's error (its type name,
    /// `Err(path::Type)`, if it has no Display), or `panicked: ` and the panic's message; at
    /// most [`MAX_ERROR_LEN`] bytes.
    pub error: &'a str,
}

/// The core of the storage contract: what a handler with a key, a version and an entity needs,
/// on a pool, in a savepoint or in a batch, and what retention needs. Implemented for
/// `sqlx::Sqlite`, `sqlx::Postgres` and `sqlx::MySql` (features `sqlite`, `postgres`, `mysql`);
/// implement it to add another sqlx database, and run `idem-testkit`'s suite on it.
///
/// The handler options need a capability more each: [`Leases`] (`mode = "lease"`),
/// [`Stamps`] (`fingerprint`, `replay`), [`Attempts`] (`max_attempts`). A backend may implement
/// any of them, or none: a handler that uses an option its backend lacks does not compile.
///
/// Every method decides atomically, through the database's own unique constraints and
/// conditional upserts, never by a read followed by a write. Times come from the database's
/// clock, so consumers on many machines agree on them. Each method takes the connection of the
/// transaction it runs in and one value (a record, a key, an entry) or a slice of them.
///
/// ```
/// async fn setup<DB: idem::store::Store>(pool: &sqlx::Pool<DB>) -> Result<(), sqlx::Error> {
///     DB::migrate(pool).await
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "idem has no backend for `{Self}`",
    label = "not an `idem::store::Store`",
    note = "enable idem's feature for this database: `sqlite` (on by default), `postgres` or `mysql`; for another database, implement `idem::store::Store`"
)]
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

    /// Removes the record of a message, which this transaction inserted: a batch undoes the
    /// record of a message that turned out stale.
    fn delete_record<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// Raises the version of the entry's entity to its version if that is greater than the
    /// stored one (an atomic conditional upsert); otherwise reports the stored version.
    fn advance_version<'c>(
        conn: &'c mut Self::Connection,
        entry: VersionEntry<'c>,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c;

    /// Records the message, and if it was new, advances the entry as
    /// [`advance_version`](Store::advance_version) does. `None` when the record already
    /// existed (a duplicate; the version is untouched). The default makes the two calls;
    /// PostgreSQL does both in one statement.
    fn record_and_advance<'c>(
        conn: &'c mut Self::Connection,
        record: Record<'c>,
        entry: VersionEntry<'c>,
    ) -> impl Future<Output = Result<Option<VersionCheck>, sqlx::Error>> + Send + 'c {
        async move {
            if !Self::insert_record(&mut *conn, record).await? {
                return Ok(None);
            }
            Self::advance_version(conn, entry).await.map(Some)
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
                checks.push(Self::advance_version(&mut *conn, *entry).await?);
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

    /// Whether an error of this database may not happen again in a new transaction: a
    /// serialization failure, a deadlock, a busy or locked database, a dropped connection.
    /// The default knows sqlx's own I/O and pool errors and the standard SQLSTATE classes
    /// ([`is_transient_by_sqlstate`]); backends add their own codes.
    fn is_transient(error: &sqlx::Error) -> bool {
        is_transient_by_sqlstate(error)
    }

    /// Whether a claim that failed with `error` may begin again at once, in a new transaction,
    /// when idem opened the failed one itself (a pool source; never a caller's transaction,
    /// whose own work the error may have undone). True only for an error that rolled the whole
    /// transaction back before the body ran and that a second attempt is expected to get past:
    /// MySQL's deadlock (1213), which InnoDB gives waiting duplicates of a delivery that rolls
    /// back. The default: never.
    fn retry_claim(error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }
}

/// Lease mode (`mode = "lease"`): a claim committed on its own before the body runs, as a
/// record *in progress* with a lease, so that other consumers see it at once; the body's
/// transaction marks it done, or the lease is given back (or expires).
///
/// The lease lives on the message's record: [`Store::purge_expired`] must skip a record whose
/// lease is still running.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// fn leases<DB: idem::store::Leases>() {}
/// # #[cfg(feature = "sqlite")]
/// leases::<sqlx::Sqlite>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold leases: `mode = \"lease\"` needs `idem::store::Leases`",
    label = "`mode = \"lease\"` needs `idem::store::Leases`",
    note = "a backend implements `idem::store::Leases` (`claim_lease`, `complete_lease`, `release_lease`) and runs `idem_testkit::suite!` on it; a handler generic over the database bounds it by `idem::store::Leases`"
)]
pub trait Leases: Store {
    /// Takes the lease on a message if the message is new or its lease expired (one atomic
    /// upsert, committed by the caller at once).
    fn claim_lease<'c>(
        conn: &'c mut Self::Connection,
        request: LeaseRequest<'c>,
    ) -> impl Future<Output = Result<LeaseClaim, sqlx::Error>> + Send + 'c;

    /// Marks the message done, if the hold's token still holds its lease. Runs in the
    /// transaction of the handler's effect, so both commit together.
    fn complete_lease<'c>(
        conn: &'c mut Self::Connection,
        hold: LeaseHold<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;

    /// Gives the lease up (deletes the in-progress record), if the hold's token holds it, so
    /// that a redelivery runs again at once.
    fn release_lease<'c>(
        conn: &'c mut Self::Connection,
        hold: LeaseHold<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;
}

/// `fingerprint = "..."` and `replay = true`: the stamp of an applied message (the payload's
/// fingerprint, the handler's value) kept on its row, and read back for a duplicate, which is
/// then refused (another payload) or replayed.
///
/// A backend implements [`save_stamp`](Stamps::save_stamp) and
/// [`load_stamp`](Stamps::load_stamp); the batch methods have defaults built on them, which a
/// backend overrides to save round trips.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// fn stamps<DB: idem::store::Stamps>() {}
/// # #[cfg(feature = "sqlite")]
/// stamps::<sqlx::Sqlite>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot keep stamps: `fingerprint = ...` and `replay = true` need `idem::store::Stamps`",
    label = "this option needs `idem::store::Stamps`",
    note = "a backend implements `idem::store::Stamps` (`save_stamp` and `load_stamp`; the batch methods have defaults) and runs `idem_testkit::suite!` on it; a handler generic over the database bounds it by `idem::store::Stamps`"
)]
pub trait Stamps: Store {
    /// Whether [`Store::insert_record`], [`Store::insert_records`] and
    /// [`Store::record_and_advance`] write each new record's
    /// [`fingerprint`](Record::fingerprint) with it. Then an applied message of a `fingerprint`
    /// handler (without `replay`) needs no [`save_stamp`](Stamps::save_stamp): one statement
    /// fewer. The default, `false`, has the fingerprint stamped after the body, as for `replay`.
    const RECORDS_FINGERPRINT: bool = false;

    /// Writes the stamp of an applied message on its row (which this transaction inserted or
    /// advanced), in the transaction of its effect.
    fn save_stamp<'c>(
        conn: &'c mut Self::Connection,
        stamp: Stamp<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// In a batch: writes the stamps of the batch's applied messages, each on its row, in as
    /// few round trips as the database allows. Each row appears once (the batch keeps the last
    /// stamp of a row). The default makes one [`save_stamp`](Stamps::save_stamp) call per stamp;
    /// SQLite and PostgreSQL write a batch's in one statement per table, MySQL in one per table
    /// and scope of at most about 1 MiB.
    fn save_stamps<'c>(
        conn: &'c mut Self::Connection,
        stamps: &'c [Stamp<'c>],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            for stamp in stamps {
                Self::save_stamp(&mut *conn, *stamp).await?;
            }
            Ok(())
        }
    }

    /// Reads the stamp of a message found to be a duplicate (`None` if it has no row). Runs
    /// after the claim's statement, which waited for a concurrent first delivery to end, so it
    /// reads what that delivery committed.
    fn load_stamp<'c>(
        conn: &'c mut Self::Connection,
        at: StampKey<'c>,
    ) -> impl Future<Output = Result<Option<StoredStamp>, sqlx::Error>> + Send + 'c;

    /// With a key only: [`Store::insert_record`], and for a record that already was, the stamp
    /// its first delivery left ([`StampRow::Record`]), in as few round trips as the database
    /// allows. `None`: the record is new; `Some(stamp)`: it was not. The default inserts, then
    /// reads a duplicate's stamp with [`load_stamp`](Stamps::load_stamp); MariaDB does both in
    /// one statement.
    fn insert_record_or_read_stamp<'c>(
        conn: &'c mut Self::Connection,
        record: Record<'c>,
    ) -> impl Future<Output = Result<Option<Option<StoredStamp>>, sqlx::Error>> + Send + 'c {
        async move {
            if Self::insert_record(&mut *conn, record).await? {
                return Ok(None);
            }
            Self::load_stamp(conn, record.stamp_key()).await.map(Some)
        }
    }

    /// In a batch: [`Store::insert_records`], and for each record that already was, the stamp
    /// its first delivery left where the database reads it in the same statement. One result
    /// per record, in order. The default reads no stamp (`stamp: None` everywhere): the batch
    /// then reads them with [`load_stamps`](Stamps::load_stamps). MariaDB reads them in its
    /// upsert.
    fn insert_records_reading_stamps<'c>(
        conn: &'c mut Self::Connection,
        records: &'c [Record<'c>],
    ) -> impl Future<Output = Result<Vec<Inserted>, sqlx::Error>> + Send + 'c {
        async move {
            let inserted = Self::insert_records(conn, records).await?;
            Ok(inserted.into_iter().map(Inserted::unread).collect())
        }
    }

    /// Reads the stamps of a batch's duplicates in as few round trips as the database allows,
    /// one result per key, in order. The default makes one [`load_stamp`](Stamps::load_stamp)
    /// call per key; SQLite and PostgreSQL read them all in one statement.
    fn load_stamps<'c>(
        conn: &'c mut Self::Connection,
        keys: &'c [StampKey<'c>],
    ) -> impl Future<Output = Result<Vec<Option<StoredStamp>>, sqlx::Error>> + Send + 'c {
        async move {
            let mut stamps = Vec::with_capacity(keys.len());
            for key in keys {
                stamps.push(Self::load_stamp(&mut *conn, *key).await?);
            }
            Ok(stamps)
        }
    }
}

/// `max_attempts = N`: each failed attempt of a message counted (in a transaction of its own,
/// after the body's rolled back), read by the next delivery, which is poisoned at the bound,
/// and forgotten when the message applies.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// fn attempts<DB: idem::store::Attempts>() {}
/// # #[cfg(feature = "sqlite")]
/// attempts::<sqlx::Sqlite>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot count attempts: `max_attempts` needs `idem::store::Attempts`",
    label = "`max_attempts` needs `idem::store::Attempts`",
    note = "a backend implements `idem::store::Attempts` (`load_attempts`, `count_attempt`, `clear_attempts`) and runs `idem_testkit::suite!` on it; a handler generic over the database bounds it by `idem::store::Attempts`"
)]
pub trait Attempts: Store {
    /// How many failed attempts of the message are counted (0 if none).
    fn load_attempts<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<u32, sqlx::Error>> + Send + 'c;

    /// Counts one failed attempt (an atomic upsert) and returns the count. Runs in a short
    /// transaction of its own, after the failed body's transaction rolled back.
    fn count_attempt<'c>(
        conn: &'c mut Self::Connection,
        attempt: FailedAttempt<'c>,
    ) -> impl Future<Output = Result<u32, sqlx::Error>> + Send + 'c;

    /// Forgets the failed attempts of a message that applied, in the transaction of its effect.
    fn clear_attempts<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;
}

/// Whether `error` is worth another attempt, asked of the backend it came from (each knows
/// its own codes: PostgreSQL's SQLSTATEs, SQLite's busy and locked results, MySQL's error
/// numbers), or of the standard SQLSTATE rule for an error of a database idem has no backend for.
///
/// ```
/// assert!(idem::store::is_transient(&sqlx::Error::PoolTimedOut));
/// assert!(!idem::store::is_transient(&sqlx::Error::RowNotFound));
/// ```
pub fn is_transient(error: &sqlx::Error) -> bool {
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    if let sqlx::Error::Database(db) = error {
        #[cfg(feature = "mysql")]
        if db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some()
        {
            return <sqlx::MySql as Store>::is_transient(error);
        }
        #[cfg(feature = "postgres")]
        if db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .is_some()
        {
            return <sqlx::Postgres as Store>::is_transient(error);
        }
        #[cfg(feature = "sqlite")]
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
            return <sqlx::Sqlite as Store>::is_transient(error);
        }
    }
    is_transient_by_sqlstate(error)
}

/// The transient rule every SQL database shares: sqlx's I/O errors (but a TLS certificate the
/// client refuses, which no retry mends) and pool time-outs, and the standard SQLSTATE classes
/// of a serialization failure (`40001`), a deadlock (`40P01` on PostgreSQL, `40001`
/// elsewhere) and a connection exception (`08…`).
///
/// ```
/// assert!(idem::store::is_transient_by_sqlstate(&sqlx::Error::PoolTimedOut));
/// ```
pub fn is_transient_by_sqlstate(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(io) => !is_refused_certificate(io),
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code == "40001" || code.starts_with("08")),
        _ => false,
    }
}

/// Whether an I/O error is rustls refusing the server's certificate (an unknown issuer, a
/// wrong name, an expired certificate): the TLS layer reports it as invalid data, naming the
/// certificate. A setting to fix, not a fault that passes.
fn is_refused_certificate(io: &std::io::Error) -> bool {
    io.kind() == std::io::ErrorKind::InvalidData && io.to_string().contains("certificate")
}

/// A duration in whole milliseconds, saturating at `i64::MAX`: the `*_ms` values of this
/// contract ([`Record::retention_ms`]).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Creates idem's tables in the database behind `pool`. Idempotent; the SQL also ships as files
/// in `idem-runtime/migrations/` for teams that run their own migrations.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// idem::migrate(&pool).await?; // again: no error
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub async fn migrate<DB: Store>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    DB::migrate(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_not_transient() {
        use std::io::{Error, ErrorKind};
        let refused = Error::new(
            ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        assert!(!is_transient_by_sqlstate(&sqlx::Error::Io(refused)));
        let reset = Error::new(ErrorKind::ConnectionReset, "connection reset by peer");
        assert!(is_transient_by_sqlstate(&sqlx::Error::Io(reset)));
        let garbled = Error::new(ErrorKind::InvalidData, "unexpected message");
        assert!(is_transient_by_sqlstate(&sqlx::Error::Io(garbled)));
    }

    #[test]
    fn standard_sqlstates() {
        assert!(is_transient_by_sqlstate(&sqlx::Error::PoolTimedOut));
        assert!(!is_transient_by_sqlstate(&sqlx::Error::RowNotFound));
    }
}

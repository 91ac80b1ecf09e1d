//! The capabilities a claim's options need, as tables of a backend's methods.
//!
//! The delivery code is generic over `DB: Store` only, so that a handler without options
//! compiles (and runs exactly the same code) on a backend with the core contract alone. A
//! handler with an option reaches the capability it needs through a table: `&'static` fn
//! pointers to `DB`'s methods of [`Stamps`], [`Attempts`] or [`Leases`], each returning a boxed
//! future. A table can only be made where `DB` has the capability (its associated const `OF` is
//! in an impl bounded by it), so the claim builder's steps for the options
//! ([`Claim::fingerprint`](super::Claim::fingerprint), `replay`, `max_attempts`, `lease_mode`)
//! carry the bound: a backend without the capability is a compile error at the option, and a
//! claim with the option has its table. The one step that needs a table it was not given,
//! [`Claim::begin_lease`](super::Claim::begin_lease) without `lease_mode`, which generated code
//! never writes, fails with [`missing`]: a bug of the caller, not a run-time "unsupported".
//!
//! What a table costs is paid by the handlers with the option only: an indirect call and a
//! boxed future per statement. A claim without options has no table and runs the same code
//! (docs/design/performance.md#capability-tables).

use futures_core::future::BoxFuture;
use sqlx::Database;

use crate::store::{
    Attempts, FailedAttempt, Inserted, LeaseClaim, LeaseHold, LeaseRequest, Leases, Record,
    RecordKey, Stamp, StampKey, Stamps, StoredStamp,
};

/// The result of a table's operation: a boxed future of the statement.
type Op<'c, T> = BoxFuture<'c, Result<T, sqlx::Error>>;

/// `fingerprint` / `replay`: `DB`'s [`Stamps`] methods.
// Each field is the fn pointer type of one method, spelled out beside its name.
#[allow(clippy::type_complexity)]
pub(crate) struct StampOps<DB: Database> {
    /// [`Stamps::RECORDS_FINGERPRINT`].
    pub records_fingerprint: bool,
    pub save_stamp: for<'c> fn(&'c mut DB::Connection, Stamp<'c>) -> Op<'c, ()>,
    pub save_stamps: for<'c> fn(&'c mut DB::Connection, &'c [Stamp<'c>]) -> Op<'c, ()>,
    pub load_stamp: for<'c> fn(&'c mut DB::Connection, StampKey<'c>) -> Op<'c, Option<StoredStamp>>,
    pub load_stamps:
        for<'c> fn(&'c mut DB::Connection, &'c [StampKey<'c>]) -> Op<'c, Vec<Option<StoredStamp>>>,
    pub insert_record_or_read_stamp:
        for<'c> fn(&'c mut DB::Connection, Record<'c>) -> Op<'c, Option<Option<StoredStamp>>>,
    pub insert_records_reading_stamps:
        for<'c> fn(&'c mut DB::Connection, &'c [Record<'c>]) -> Op<'c, Vec<Inserted>>,
}

impl<DB: Stamps> StampOps<DB> {
    /// `DB`'s table, at a `'static` address.
    pub(crate) const OF: &'static Self = &StampOps {
        records_fingerprint: DB::RECORDS_FINGERPRINT,
        save_stamp: |conn, stamp| Box::pin(DB::save_stamp(conn, stamp)),
        save_stamps: |conn, stamps| Box::pin(DB::save_stamps(conn, stamps)),
        load_stamp: |conn, at| Box::pin(DB::load_stamp(conn, at)),
        load_stamps: |conn, keys| Box::pin(DB::load_stamps(conn, keys)),
        insert_record_or_read_stamp: |conn, record| {
            Box::pin(DB::insert_record_or_read_stamp(conn, record))
        },
        insert_records_reading_stamps: |conn, records| {
            Box::pin(DB::insert_records_reading_stamps(conn, records))
        },
    };
}

/// `max_attempts`: `DB`'s [`Attempts`] methods.
pub(crate) struct AttemptOps<DB: Database> {
    pub load_attempts: for<'c> fn(&'c mut DB::Connection, RecordKey<'c>) -> Op<'c, u32>,
    pub count_attempt: for<'c> fn(&'c mut DB::Connection, FailedAttempt<'c>) -> Op<'c, u32>,
    pub clear_attempts: for<'c> fn(&'c mut DB::Connection, RecordKey<'c>) -> Op<'c, ()>,
}

impl<DB: Attempts> AttemptOps<DB> {
    /// `DB`'s table, at a `'static` address.
    pub(crate) const OF: &'static Self = &AttemptOps {
        load_attempts: |conn, record| Box::pin(DB::load_attempts(conn, record)),
        count_attempt: |conn, attempt| Box::pin(DB::count_attempt(conn, attempt)),
        clear_attempts: |conn, record| Box::pin(DB::clear_attempts(conn, record)),
    };
}

/// Lease mode: `DB`'s [`Leases`] methods.
pub(crate) struct LeaseOps<DB: Database> {
    pub claim_lease: for<'c> fn(&'c mut DB::Connection, LeaseRequest<'c>) -> Op<'c, LeaseClaim>,
    pub complete_lease: for<'c> fn(&'c mut DB::Connection, LeaseHold<'c>) -> Op<'c, bool>,
    pub release_lease: for<'c> fn(&'c mut DB::Connection, LeaseHold<'c>) -> Op<'c, bool>,
}

impl<DB: Leases> LeaseOps<DB> {
    /// `DB`'s table, at a `'static` address.
    pub(crate) const OF: &'static Self = &LeaseOps {
        claim_lease: |conn, request| Box::pin(DB::claim_lease(conn, request)),
        complete_lease: |conn, hold| Box::pin(DB::complete_lease(conn, hold)),
        release_lease: |conn, hold| Box::pin(DB::release_lease(conn, hold)),
    };
}

/// The error of a claim that reached a capability's step without the table its builder step
/// keeps: a bug in the code that built the claim (generated code always calls both).
pub(crate) fn missing(step: &str, builder: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "idem: a bug: `Claim::{step}` on a claim built without `Claim::{builder}`, which keeps \
         the table of the database's methods it needs"
    ))
}

/// The tables are plain fn pointers: no `DB: Debug` needed to print a claim that holds one.
macro_rules! opaque_debug {
    ($($table:ident),*) => {$(
        impl<DB: Database> std::fmt::Debug for $table<DB> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($table))
            }
        }
    )*};
}
opaque_debug!(StampOps, AttemptOps, LeaseOps);

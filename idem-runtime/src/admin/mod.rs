//! The operator's queries: what the `idem` command line asks of a database, apart from the
//! handler's hot [`Store`] trait.
//!
//! Every time is Unix epoch milliseconds read from the database's clock (never the caller's),
//! and [`Admin::now_ms`] gives that clock's now, so "how long ago" agrees with what handlers and
//! purges see. These queries scan whole scopes; they are for people, not for the message path.

use std::future::Future;

use sqlx::Pool;

use crate::store::Store;

pub use dead_letters::{
    replay_id, DeadCounts, DeadLetter, DeadLetterAdmin, DeadLetterFilter, DeadLetterGroup,
    DeadLetterInfo, DeadLetterState, Page, ParkedCounts, RecoveryCounts, Replay, ReplayOutcome,
    ReplayTo, ABANDONED,
};
pub use outbox::{Backlog, DestinationStats, OutboxAdmin};

pub mod dead_letters;
pub(crate) mod outbox;

/// The records and version rows of one scope, as [`Admin::stats`] counts them.
///
/// ```
/// let stats = idem_runtime::admin::ScopeStats { scope: "billing".into(), ..Default::default() };
/// assert_eq!(stats.records, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeStats {
    /// The handler's scope.
    pub scope: String,
    /// Every record of the scope: done, in progress, or expired and not purged yet.
    pub records: u64,
    /// Records in progress under a lease that has not run out.
    pub in_progress: u64,
    /// Records in progress under a lease that ran out (their worker is gone): the next
    /// delivery takes them over.
    pub lapsed_leases: u64,
    /// Records past their retention that a purge would delete now.
    pub expired: u64,
    /// When the oldest record was processed (claimed, for a lease), in epoch milliseconds.
    pub oldest_processed_ms: Option<i64>,
    /// When the newest record was processed, in epoch milliseconds.
    pub newest_processed_ms: Option<i64>,
    /// Version high-water marks (one per entity) of the scope.
    pub versions: u64,
}

/// One message's record, as [`Admin::record`] reads it.
///
/// ```
/// let record = idem_runtime::admin::RecordInfo { processed_ms: 0, expires_ms: 10, lease_until_ms: None };
/// assert!(!record.in_progress());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordInfo {
    /// When the message was processed (for a lease still held: when it was claimed).
    pub processed_ms: i64,
    /// When the record may be purged.
    pub expires_ms: i64,
    /// Lease mode: until when the message is held; `None` once it is done.
    pub lease_until_ms: Option<i64>,
}

impl RecordInfo {
    /// Whether the message is in progress (its lease not ended by a commit), lapsed or not.
    pub fn in_progress(&self) -> bool {
        self.lease_until_ms.is_some()
    }
}

/// An entity's version high-water mark, as [`Admin::version`] reads it.
///
/// ```
/// let row = idem_runtime::admin::VersionInfo { version: 7, updated_ms: 0 };
/// assert_eq!(row.version, 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionInfo {
    /// The highest version applied.
    pub version: i64,
    /// When it was applied.
    pub updated_ms: i64,
}

/// What [`Admin::forget`] or [`Admin::release`] did to a record.
///
/// ```
/// assert_ne!(idem_runtime::admin::Deletion::Deleted, idem_runtime::admin::Deletion::Missing);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The record is gone: the next delivery of the message runs the handler.
    Deleted,
    /// The record is in the other state (in progress for `forget`, done for `release`) and
    /// was kept.
    Refused,
    /// There is no such record.
    Missing,
}

/// The operator's queries on a database that holds idem's tables: implemented for
/// `sqlx::Sqlite`, `sqlx::Postgres` and `sqlx::MySql` (features `sqlite`, `postgres`, `mysql`).
///
/// Changes ([`forget`](Admin::forget), [`release`](Admin::release),
/// [`purge_batch`](Admin::purge_batch)) are single conditional statements, so they never undo
/// what a handler committed in between.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem_runtime::admin::Admin;
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// assert!(!sqlx::Sqlite::tables_present(&pool).await?);
/// idem_runtime::migrate(&pool).await?;
/// assert!(sqlx::Sqlite::tables_present(&pool).await?);
/// assert!(sqlx::Sqlite::stats(&pool, None).await?.is_empty());
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub trait Admin: Store {
    /// Whether idem's tables (`idem_records`, `idem_versions`) exist, i.e. `migrate` has run.
    fn tables_present(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_;

    /// Now, by the database's clock, in epoch milliseconds.
    fn now_ms(pool: &Pool<Self>) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + '_;

    /// Counts per scope (only `scope`, when given), sorted by scope; a scope appears if it has
    /// records or version rows.
    fn stats<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<ScopeStats>, sqlx::Error>> + Send + 'a;

    /// Whether `scope` has any record or version row.
    fn scope_known<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// The record of the encoded `key` in `scope`, if there is one.
    fn record<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Option<RecordInfo>, sqlx::Error>> + Send + 'a;

    /// The version row of the encoded `entity` in `scope`, if there is one.
    fn version<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        entity: &'a [u8],
    ) -> impl Future<Output = Result<Option<VersionInfo>, sqlx::Error>> + Send + 'a;

    /// Deletes the record of a done message, so that its next delivery applies again. A record
    /// in progress is kept ([`Deletion::Refused`]): ending a lease is [`release`](Admin::release).
    fn forget<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Deletion, sqlx::Error>> + Send + 'a;

    /// Ends the lease of a message in progress by deleting its record, so that its next
    /// delivery runs the handler. A done record is kept ([`Deletion::Refused`]).
    fn release<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Deletion, sqlx::Error>> + Send + 'a;

    /// How many records a purge would delete now (past retention, no running lease).
    fn count_expired(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;

    /// Deletes at most `limit` expired records in one statement, as
    /// [`Store::purge_expired`] does, and returns how many.
    fn purge_batch(
        pool: &Pool<Self>,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;

    /// Messages whose handler failed and was counted (`max_attempts`), most attempts first,
    /// at most `limit` (only `scope`, when given). At the handler's bound a delivery is
    /// `Outcome::Poisoned` and does not run.
    fn attempts<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<AttemptInfo>, sqlx::Error>> + Send + 'a;

    /// Clears the counted failures of the encoded `key` in `scope`, so that its next delivery
    /// runs the handler again; `false` when none were counted.
    fn clear_attempts<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;
}

/// The counted failures of one message (`idem_attempts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The handler's scope.
    pub scope: String,
    /// The encoded key.
    pub key: Vec<u8>,
    /// Failed attempts counted.
    pub attempts: u32,
    /// What the last failure said.
    pub last_error: Option<String>,
    /// When the last failure was counted, in epoch milliseconds of the database's clock.
    pub updated_ms: i64,
}

/// A row of `idem_attempts` as the backends select it: scope, key, attempts, last error, and
/// the time of the last failure in epoch milliseconds.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) type AttemptRow = (String, Vec<u8>, i64, Option<String>, i64);

#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
impl AttemptInfo {
    pub(crate) fn of((scope, key, attempts, last_error, updated_ms): AttemptRow) -> Self {
        AttemptInfo {
            scope,
            key,
            attempts: u32::try_from(attempts).unwrap_or(0),
            last_error,
            updated_ms,
        }
    }
}

/// A count from the database (never negative) as `u64`.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Adds the version-row counts to `stats` (a scope with versions only gets a row of its own)
/// and sorts by scope.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn merge_versions(stats: &mut Vec<ScopeStats>, versions: Vec<(String, i64)>) {
    let mut by_scope: std::collections::BTreeMap<String, ScopeStats> =
        stats.drain(..).map(|s| (s.scope.clone(), s)).collect();
    for (scope, n) in versions {
        by_scope
            .entry(scope)
            .or_insert_with_key(|scope| ScopeStats {
                scope: scope.clone(),
                ..ScopeStats::default()
            })
            .versions = count(n);
    }
    stats.extend(by_scope.into_values());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_counts_join_their_scope_or_add_one() {
        let mut stats = vec![ScopeStats {
            scope: "b".into(),
            records: 2,
            ..ScopeStats::default()
        }];
        merge_versions(&mut stats, vec![("b".into(), 3), ("a".into(), 1)]);
        assert_eq!(stats.len(), 2);
        assert_eq!(
            (stats[0].scope.as_str(), stats[0].versions, stats[0].records),
            ("a", 1, 0)
        );
        assert_eq!(
            (stats[1].scope.as_str(), stats[1].versions, stats[1].records),
            ("b", 3, 2)
        );
    }
}

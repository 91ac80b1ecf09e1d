//! The storage contract of the outbox ([`OutboxStore`]): what a database must do to hold
//! outbox rows and let relays take them in order, one owner per partition.

use std::future::Future;
use std::time::Duration;

use crate::store::Store;

/// How many partitions the rows are hashed into: the unit of ordering and of ownership
/// between relays. Part of the stored format.
pub const PARTITIONS: i32 = 256;

/// An outbox row to insert, in the handler's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRow<'a> {
    /// The derived message id.
    pub id: &'a str,
    /// Where the message goes.
    pub destination: &'a str,
    /// The ordering key within the destination (`""` = none).
    pub partition_key: &'a str,
    /// The partition (0..[`PARTITIONS`]) of destination and partition key.
    pub partition_no: i32,
    /// The payload (serde JSON).
    pub payload: &'a [u8],
    /// Headers as a JSON array of `[name, value]` pairs, if any.
    pub headers: Option<&'a str>,
}

/// A pending row as a relay reads it, oldest first within its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRow {
    /// The row's insertion order.
    pub seq: i64,
    /// The partition (0..[`PARTITIONS`]) of its destination and partition key.
    pub partition_no: i32,
    /// The derived message id.
    pub id: String,
    /// Where the message goes.
    pub destination: String,
    /// The ordering key within the destination.
    pub partition_key: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Headers as stored (a JSON array of `[name, value]` pairs), if any.
    pub headers: Option<String>,
    /// Failed publishes so far.
    pub attempts: i64,
    /// Whether its `available_at` has come (a failed publish moves it on).
    pub ready: bool,
}

/// A database that can hold outbox rows and serve relays: implemented for `sqlx::Sqlite`,
/// `sqlx::Postgres` and `sqlx::MySql`.
///
/// Ownership of a partition is a session-level lock of the connection the relay keeps for its
/// lifetime (PostgreSQL `pg_try_advisory_lock`, MySQL/MariaDB `GET_LOCK`), so a relay that dies
/// gives its partitions up with its connection. SQLite has no such lock: run one relay per
/// SQLite database. Every method but [`insert_outbox`](OutboxStore::insert_outbox) runs on
/// that connection, outside any transaction (each statement commits by itself).
pub trait OutboxStore: Store {
    /// Inserts a row in the caller's transaction; a row with the same id already there (the
    /// same message, published by an earlier run that committed) is left as it is.
    fn insert_outbox<'c>(
        conn: &'c mut Self::Connection,
        row: NewRow<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// The partitions that have at least one pending row whose time has come, at most `limit`.
    fn pending_partitions<'c>(
        conn: &'c mut Self::Connection,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<i32>, sqlx::Error>> + Send + 'c;

    /// Takes ownership of each of `partitions` that no other session owns, for this
    /// connection's session, without waiting, in one round trip; returns the ones it took, in
    /// the order given.
    fn try_own<'c>(
        conn: &'c mut Self::Connection,
        partitions: &'c [i32],
    ) -> impl Future<Output = Result<Vec<i32>, sqlx::Error>> + Send + 'c;

    /// Gives up ownership of partitions taken with [`try_own`](OutboxStore::try_own), in one
    /// round trip.
    fn disown<'c>(
        conn: &'c mut Self::Connection,
        partitions: &'c [i32],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// Pending rows of the given partitions (at most [`PARTITIONS`]): the first `each` of
    /// every partition, in its order, and at most `limit` in all, the oldest first (insertion
    /// order across partitions). Reads only those rows, however long the partitions' backlogs.
    fn take_pending<'c>(
        conn: &'c mut Self::Connection,
        partitions: &'c [i32],
        each: u32,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PendingRow>, sqlx::Error>> + Send + 'c;

    /// Marks rows sent (after the broker confirmed them); returns how many it marked.
    fn mark_sent<'c>(
        conn: &'c mut Self::Connection,
        seqs: &'c [i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;

    /// Counts a failed publish of rows and makes them wait `backoff` before the next one.
    fn mark_failed<'c>(
        conn: &'c mut Self::Connection,
        seqs: &'c [i64],
        backoff: Duration,
        error: &'c str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// Deletes at most `limit` rows sent more than `older_than` ago, in one statement, and
    /// returns how many.
    fn purge_sent<'c>(
        conn: &'c mut Self::Connection,
        older_than: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c;
}

/// A pending row as the backends select it: seq, partition, id, destination, partition key,
/// payload, headers, attempts, and whether it is ready (0 or 1).
pub(crate) type RawRow = (
    i64,
    i32,
    String,
    String,
    String,
    Vec<u8>,
    Option<String>,
    i64,
    i64,
);

impl From<RawRow> for PendingRow {
    fn from(row: RawRow) -> Self {
        let (seq, partition_no, id, destination, partition_key, payload, headers, attempts, ready) =
            row;
        PendingRow {
            seq,
            partition_no,
            id,
            destination,
            partition_key,
            payload,
            headers,
            attempts,
            ready: ready != 0,
        }
    }
}

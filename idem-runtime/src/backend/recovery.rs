//! [`RecoverySql`]: the statements of parked retries and dead letters
//! ([`RecoveryStore`](crate::recover::RecoveryStore)), written once over each database's
//! [`RecoveryDialect`], and [`recovery_store!`], which writes a database's
//! `impl RecoveryStore` from them.
//!
//! The databases differ in how they write times (SQLite binds its clock, read once a call;
//! MySQL adds to its server's epoch milliseconds; PostgreSQL keeps `TIMESTAMPTZ`), in how a
//! consumer takes due rows (one `UPDATE … RETURNING`, with `FOR UPDATE SKIP LOCKED` on
//! PostgreSQL; MySQL's locking `SELECT` then `UPDATE`) and in how an insert gives its new id
//! (`RETURNING id`, MySQL's `LAST_INSERT_ID()`); the rest is here once.

use std::future::Future;
use std::time::Duration;

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Transaction, Type};

use super::dead_letters::{Binds, DeadLetterDialect};
use super::sql::Sql;
use super::{span_ms, statement, Statement};
use crate::recover::stored::{
    check_dead_letter, check_failure, stored_attempts, stored_text, taken, ParkedRow,
};
use crate::recover::{Failure, NewDeadLetter, Parked};

/// `unpark`: id, token.
const UNPARK: Statement = statement!("DELETE FROM idem_parked WHERE id = ? AND lease_token = ?");
/// `release_parked`: id, token.
const RELEASE_PARKED: Statement = statement!(
    "UPDATE idem_parked SET lease_until = NULL, lease_token = NULL \
     WHERE id = ? AND lease_token = ?"
);
/// `last_error`: scope, key.
const LAST_ERROR: Statement =
    statement!("SELECT last_error FROM idem_attempts WHERE scope = ? AND msg_key = ?");

/// The columns a taken row is read back with, as [`ParkedRow`] (but for its two times and
/// attempts, which a dialect may convert): id to last error.
const PARKED_COLUMNS: &str = "id, payload, headers, broker, source, coordinates, destination";

/// `now` plus a duration, in epoch milliseconds.
pub(crate) fn after(now: i64, span: Duration) -> i64 {
    now.saturating_add(span_ms(span))
}

/// Where the times of one call come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    /// Now, in epoch milliseconds, read once and bound (SQLite: this process's clock is
    /// SQLite's).
    Bound(i64),
    /// The server's clock, read by the statements.
    Server,
}

/// How a database writes the recovery tables' times and takes due rows. The defaults are for
/// a server whose tables keep epoch milliseconds of its clock ([`NOW_MS`](
/// super::AdminDialect::NOW_MS)).
pub(crate) trait RecoveryDialect: DeadLetterDialect {
    /// What `take_due`'s inner `SELECT` ends with to skip the rows another taker holds.
    const SKIP_LOCKED: &'static str = "";

    /// Where this call's times come from.
    fn clock() -> Clock {
        Clock::Server
    }

    /// Now plus a bound number of milliseconds, as the tables store a time.
    fn later(param: &str) -> String {
        format!("{} + {param}", Self::NOW_MS)
    }

    /// A bound epoch-milliseconds time, or now where it is NULL, as the tables store a time.
    fn at_or_now(param: &str) -> String {
        format!("COALESCE({param}, {})", Self::NOW_MS)
    }
}

/// The recovery statements, written once over the database's dialect: each method is the
/// [`RecoveryStore`](crate::recover::RecoveryStore) method of its name for a database whose
/// `impl` takes it with [`recovery_store!`] (the rest are its parts). The bounds are sqlx's,
/// for the values idem binds and reads.
pub(crate) trait RecoverySql: Sql + RecoveryDialect
where
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    Self::Arguments: IntoArguments<Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q [u8]>: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'q> Option<i64>: Encode<'q, Self> + Type<Self>,
    for<'q> i32: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'r> bool: Decode<'r, Self> + Type<Self>,
    for<'r> String: Decode<'r, Self> + Type<Self>,
    for<'r> Vec<u8>: Decode<'r, Self> + Type<Self>,
    usize: ColumnIndex<Self::Row>,
{
    /// Now, bound or in the statement.
    fn now_sql(binds: &mut Binds<Self>, clock: Clock) -> Result<String, sqlx::Error> {
        match clock {
            Clock::Bound(now) => binds.bind(now),
            Clock::Server => Ok(Self::now_stored()),
        }
    }

    /// `span` after now, bound or in the statement.
    fn after_sql(
        binds: &mut Binds<Self>,
        clock: Clock,
        span: Duration,
    ) -> Result<String, sqlx::Error> {
        match clock {
            Clock::Bound(now) => binds.bind(after(now, span)),
            Clock::Server => Ok(Self::later(&binds.bind(span_ms(span))?)),
        }
    }

    /// `at` (epoch milliseconds), or now where it is `None`, bound or in the statement.
    fn at_or_now_sql(
        binds: &mut Binds<Self>,
        clock: Clock,
        at: Option<i64>,
    ) -> Result<String, sqlx::Error> {
        match clock {
            Clock::Bound(now) => binds.bind(at.unwrap_or(now)),
            Clock::Server => Ok(Self::at_or_now(&binds.bind(at)?)),
        }
    }

    /// Runs an `INSERT` (`sql`, without a `RETURNING`) and gives the id of its row.
    fn insert_id<'e, E>(
        executor: E,
        sql: String,
        binds: Binds<Self>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'e
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        async move {
            sqlx::query_scalar_with(
                sqlx::AssertSqlSafe(format!("{sql} RETURNING id")),
                binds.into_arguments(),
            )
            .fetch_one(executor)
            .await
        }
    }

    /// Begins a transaction that writes.
    fn begin_write(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin()
    }

    /// `consumer`'s rows due now and not held, oldest due first, at most `limit`: the
    /// condition, order and limit of a `SELECT … FROM idem_parked`.
    fn due_sql(
        binds: &mut Binds<Self>,
        clock: Clock,
        consumer: &str,
        limit: u32,
    ) -> Result<String, sqlx::Error> {
        Ok(format!(
            "WHERE consumer = {} AND due_at <= {} AND (lease_until IS NULL OR lease_until < {}) \
             ORDER BY due_at, id LIMIT {}",
            binds.bind(consumer)?,
            Self::now_sql(binds, clock)?,
            Self::now_sql(binds, clock)?,
            binds.bind(i64::from(limit))?,
        ))
    }

    /// The columns of a taken row, as [`ParkedRow`].
    fn parked_columns() -> String {
        format!(
            "{PARKED_COLUMNS}, {}, last_error, {}, {}",
            Self::bigint("attempts"),
            Self::stored_ms("first_failed_at"),
            Self::stored_ms("due_at"),
        )
    }

    /// `take_due`'s statement, one `UPDATE … RETURNING`: its inner `SELECT` picks the rows
    /// (and, with [`SKIP_LOCKED`](RecoveryDialect::SKIP_LOCKED), locks them and skips those
    /// another taker holds; a row another taker changed after this statement's snapshot is
    /// checked again, as it is now, before it is locked).
    fn take_due_sql(
        binds: &mut Binds<Self>,
        clock: Clock,
        consumer: &str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> Result<String, sqlx::Error> {
        Ok(format!(
            "UPDATE idem_parked SET lease_until = {}, lease_token = {} \
             WHERE id IN (SELECT id FROM idem_parked {}{}) RETURNING {}",
            Self::after_sql(binds, clock, lease)?,
            binds.bind(token)?,
            Self::due_sql(binds, clock, consumer, limit)?,
            Self::SKIP_LOCKED,
            Self::parked_columns(),
        ))
    }

    /// The values of a failure's `payload, headers, broker, source, coordinates, destination,
    /// attempts`, as parked retries and dead letters both keep them (`headers` as stored).
    fn delivery_values(
        binds: &mut Binds<Self>,
        failure: &Failure<'_>,
        headers: Option<&str>,
    ) -> Result<String, sqlx::Error> {
        let origin = failure.origin;
        Ok([
            binds.bind(failure.payload)?,
            binds.bind(headers)?,
            binds.bind(origin.broker.as_str())?,
            binds.bind(origin.source.as_str())?,
            binds.bind(origin.coordinates.as_str())?,
            binds.bind(origin.destination.as_str())?,
            binds.bind(stored_attempts(failure.attempts))?,
        ]
        .join(", "))
    }

    /// [`RecoveryStore::park`](crate::recover::RecoveryStore::park).
    fn park<'a>(
        pool: &'a Pool<Self>,
        failure: &'a Failure<'a>,
        due_in: Duration,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a {
        async move {
            let stored = check_failure(failure)?;
            let clock = Self::clock();
            let mut binds = Binds::new();
            let sql = format!(
                "INSERT INTO idem_parked (consumer, payload, headers, broker, source, \
                 coordinates, destination, attempts, last_error, first_failed_at, due_at) \
                 VALUES ({}, {}, {}, {}, {})",
                binds.bind(failure.consumer)?,
                Self::delivery_values(&mut binds, failure, stored.headers.as_deref())?,
                binds.bind(&*stored.error)?,
                Self::at_or_now_sql(&mut binds, clock, failure.first_failed_ms)?,
                Self::after_sql(&mut binds, clock, due_in)?,
            );
            Self::insert_id(pool, sql, binds).await
        }
    }

    /// [`RecoveryStore::take_due`](crate::recover::RecoveryStore::take_due).
    fn take_due<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> impl Future<Output = Result<Vec<Parked>, sqlx::Error>> + Send + 'a {
        async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut binds = Binds::new();
            let sql = Self::take_due_sql(&mut binds, Self::clock(), consumer, limit, lease, token)?;
            let rows: Vec<ParkedRow> =
                sqlx::query_as_with(sqlx::AssertSqlSafe(sql), binds.into_arguments())
                    .fetch_all(pool)
                    .await?;
            Ok(taken(rows, token))
        }
    }

    /// Runs `sql` (its binds: a parked row's id and token): whether it changed the row, that
    /// is whether the row is still held under the token.
    fn by_token<'e, E>(
        executor: E,
        sql: &'static str,
        id: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'e
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        async move {
            let changed = sqlx::query(sql)
                .bind(id)
                .bind(token)
                .execute(executor)
                .await?;
            Ok(Self::rows_affected(&changed) == 1)
        }
    }

    /// [`RecoveryStore::unpark`](crate::recover::RecoveryStore::unpark).
    fn unpark<'c>(
        conn: &'c mut Self::Connection,
        id: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        Self::by_token(conn, const { UNPARK.with(Self::PARAMETERS) }, id, token)
    }

    /// [`RecoveryStore::repark`](crate::recover::RecoveryStore::repark). On MySQL, rows
    /// affected are the rows found (sqlx sets CLIENT_FOUND_ROWS): 1 when it is held.
    fn repark<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        token: i64,
        attempts: u32,
        error: &'a str,
        due_in: Duration,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        async move {
            let error = stored_text("error", error)?;
            let mut binds = Binds::new();
            let sql = format!(
                "UPDATE idem_parked SET attempts = {}, last_error = {}, due_at = {}, \
                 lease_until = NULL, lease_token = NULL WHERE id = {} AND lease_token = {}",
                binds.bind(stored_attempts(attempts))?,
                binds.bind(&*error)?,
                Self::after_sql(&mut binds, Self::clock(), due_in)?,
                binds.bind(id)?,
                binds.bind(token)?,
            );
            let changed = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.into_arguments())
                .execute(pool)
                .await?;
            Ok(Self::rows_affected(&changed) == 1)
        }
    }

    /// [`RecoveryStore::release_parked`](crate::recover::RecoveryStore::release_parked).
    fn release_parked(
        pool: &Pool<Self>,
        id: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_ {
        Self::by_token(
            pool,
            const { RELEASE_PARKED.with(Self::PARAMETERS) },
            id,
            token,
        )
    }

    /// [`RecoveryStore::bury`](crate::recover::RecoveryStore::bury).
    fn bury<'a>(
        pool: &'a Pool<Self>,
        dead: &'a NewDeadLetter<'a>,
        parked: Option<(i64, i64)>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
        async move {
            let (stored, shape) = check_dead_letter(dead)?;
            let mut tx = Self::begin_write(pool).await?;
            if let Some((id, token)) = parked {
                if !<Self as RecoverySql>::unpark(&mut *tx, id, token).await? {
                    tx.rollback().await?;
                    return Ok(None);
                }
            }
            let clock = Self::clock();
            let failure = &dead.failure;
            let mut binds = Binds::new();
            let sql = format!(
                "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, \
                 error_shape, error_group, payload, headers, broker, source, coordinates, \
                 destination, attempts, first_failed_at, last_failed_at, state) \
                 VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 'dead')",
                binds.bind(failure.consumer)?,
                binds.bind(dead.scope)?,
                binds.bind(dead.key)?,
                binds.bind(dead.reason)?,
                binds.bind(&*stored.error)?,
                binds.bind(&*shape)?,
                binds.bind(dead.group)?,
                Self::delivery_values(&mut binds, failure, stored.headers.as_deref())?,
                Self::at_or_now_sql(&mut binds, clock, failure.first_failed_ms)?,
                Self::now_sql(&mut binds, clock)?,
            );
            let id = Self::insert_id(&mut *tx, sql, binds).await?;
            tx.commit().await?;
            Ok(Some(id))
        }
    }

    /// [`RecoveryStore::last_error`](crate::recover::RecoveryStore::last_error).
    fn last_error<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send + 'a {
        async move {
            let last: Option<Option<String>> =
                sqlx::query_scalar(const { LAST_ERROR.with(Self::PARAMETERS) })
                    .bind(scope)
                    .bind(key)
                    .fetch_optional(pool)
                    .await?;
            Ok(last.flatten())
        }
    }
}

/// `impl RecoveryStore for $db`, each method the [`RecoverySql`] method of its name.
macro_rules! recovery_store {
    ($db:ty) => {
        impl $crate::recover::RecoveryStore for $db {
            fn park<'a>(
                pool: &'a sqlx::Pool<Self>,
                failure: &'a $crate::recover::Failure<'a>,
                due_in: std::time::Duration,
            ) -> impl std::future::Future<Output = Result<i64, sqlx::Error>> + Send + 'a {
                <Self as $crate::backend::recovery::RecoverySql>::park(pool, failure, due_in)
            }

            fn take_due<'a>(
                pool: &'a sqlx::Pool<Self>,
                consumer: &'a str,
                limit: u32,
                lease: std::time::Duration,
                token: i64,
            ) -> impl std::future::Future<
                Output = Result<Vec<$crate::recover::Parked>, sqlx::Error>,
            > + Send
                   + 'a {
                <Self as $crate::backend::recovery::RecoverySql>::take_due(
                    pool, consumer, limit, lease, token,
                )
            }

            fn unpark<'c>(
                conn: &'c mut Self::Connection,
                id: i64,
                token: i64,
            ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
                <Self as $crate::backend::recovery::RecoverySql>::unpark(conn, id, token)
            }

            fn repark<'a>(
                pool: &'a sqlx::Pool<Self>,
                id: i64,
                token: i64,
                attempts: u32,
                error: &'a str,
                due_in: std::time::Duration,
            ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
                <Self as $crate::backend::recovery::RecoverySql>::repark(
                    pool, id, token, attempts, error, due_in,
                )
            }

            fn release_parked<'a>(
                pool: &'a sqlx::Pool<Self>,
                id: i64,
                token: i64,
            ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
                <Self as $crate::backend::recovery::RecoverySql>::release_parked(pool, id, token)
            }

            fn bury<'a>(
                pool: &'a sqlx::Pool<Self>,
                dead: &'a $crate::recover::NewDeadLetter<'a>,
                parked: Option<(i64, i64)>,
            ) -> impl std::future::Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a
            {
                <Self as $crate::backend::recovery::RecoverySql>::bury(pool, dead, parked)
            }

            fn last_error<'a>(
                pool: &'a sqlx::Pool<Self>,
                scope: &'a str,
                key: &'a [u8],
            ) -> impl std::future::Future<Output = Result<Option<String>, sqlx::Error>> + Send + 'a
            {
                <Self as $crate::backend::recovery::RecoverySql>::last_error(pool, scope, key)
            }
        }
    };
}
pub(crate) use recovery_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_past_the_columns_range_is_capped() {
        assert_eq!(after(1_000, Duration::from_millis(250)), 1_250);
        assert_eq!(after(1_000, Duration::MAX), 1_000 + i64::MAX / 2);
        assert_eq!(after(i64::MAX / 2 + 5, Duration::MAX), i64::MAX);
    }
}

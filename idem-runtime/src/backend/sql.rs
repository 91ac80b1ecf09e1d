//! [`Sql`]: the statements every database runs alike, written once over its dialect, and
//! [`sql_methods!`], which puts them in a database's `impl`s.

use std::future::Future;
use std::time::Duration;

use sqlx::Arguments as _;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::{
    compare, limit, row_list, span_ms, text, Catalog, InLists, OnConflict, OutboxDialect,
    Placeholders, StampColumns, StampRowOf, StampRows, Statement,
};
use crate::admin::outbox::{assemble, Backlog, CountRow, DestinationStats};
use crate::admin::{count, merge_versions, AttemptInfo, AttemptRow, Deletion, RecordInfo};
use crate::admin::{ScopeStats, VersionInfo};
use crate::outbox::store::{NewRow, PendingRow, RawRow};
use crate::store::{
    millis, FailedAttempt, LeaseClaim, LeaseHold, LeaseRequest, RecordKey, Stamp, StampKey,
    StampRow, Store, StoredStamp, VersionCheck, VersionEntry,
};

/// A count of failures as `u32`: 0 below, `u32::MAX` above.
fn attempts(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// The statements that every database runs alike, written once over its dialect. Each method
/// is the one of its name of [`Store`], [`Admin`](crate::admin::Admin),
/// [`OutboxStore`](crate::outbox::OutboxStore) or [`OutboxAdmin`](crate::admin::OutboxAdmin)
/// for a database whose `impl` takes it with [`sql_methods!`] (the rest are its parts). The
/// bounds are sqlx's, for the values idem binds and reads.
pub(crate) trait Sql: Store + OutboxDialect
where
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    Self::Arguments: IntoArguments<Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q [u8]>: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'q> i32: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'r> bool: Decode<'r, Self> + Type<Self>,
    for<'r> String: Decode<'r, Self> + Type<Self>,
    for<'r> Vec<u8>: Decode<'r, Self> + Type<Self>,
    usize: ColumnIndex<Self::Row>,
{
    // The store. Every statement of the message path is a `&'static str`, and a method's
    // future is its own statements' (a store method returns it: no layer more).

    /// Runs each of the migrations not yet recorded in `idem_migrations`, in the transaction
    /// `conn` is in (the caller serializes concurrent migrations first, each database its own
    /// way). A version is recorded with `ON CONFLICT DO NOTHING`, so that one row affected
    /// means "not run before".
    fn run_migrations(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_
    where
        Self: OnConflict,
    {
        async move {
            sqlx::query(Self::MIGRATIONS_TABLE)
                .execute(&mut *conn)
                .await?;
            for &(version, sql) in Self::MIGRATIONS {
                let done = sqlx::query(const { text::RECORD_MIGRATION.with(Self::PLACEHOLDERS) })
                    .bind(version)
                    .execute(&mut *conn)
                    .await?;
                if Self::rows_affected(&done) == 1 {
                    conn.execute(sql).await?;
                }
            }
            Ok(())
        }
    }

    /// [`Store::delete_record`].
    fn delete_record<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        Self::by_key(
            conn,
            const { text::DELETE_RECORD.with(Self::PLACEHOLDERS) },
            record,
        )
    }

    /// [`Store::clear_attempts`].
    fn clear_attempts<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        Self::by_key(
            conn,
            const { text::CLEAR_ATTEMPTS.with(Self::PLACEHOLDERS) },
            record,
        )
    }

    /// Runs `sql` with a record's scope and key.
    fn by_key<'c>(
        conn: &'c mut Self::Connection,
        sql: &'static str,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            sqlx::query(sql)
                .bind(record.scope)
                .bind(record.key)
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    /// [`Store::complete_lease`].
    fn complete_lease<'c>(
        conn: &'c mut Self::Connection,
        hold: LeaseHold<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        Self::by_hold(conn, Self::COMPLETE_LEASE, hold)
    }

    /// [`Store::release_lease`].
    fn release_lease<'c>(
        conn: &'c mut Self::Connection,
        hold: LeaseHold<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        Self::by_hold(
            conn,
            const { text::RELEASE_LEASE.with(Self::PLACEHOLDERS) },
            hold,
        )
    }

    /// Runs `sql` with a lease's scope, key and token: whether it changed the record.
    fn by_hold<'c>(
        conn: &'c mut Self::Connection,
        sql: &'static str,
        hold: LeaseHold<'c>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        async move {
            let changed = sqlx::query(sql)
                .bind(hold.record.scope)
                .bind(hold.record.key)
                .bind(hold.token)
                .execute(conn)
                .await?;
            Ok(Self::rows_affected(&changed) == 1)
        }
    }

    /// [`Store::save_stamp`].
    fn save_stamp<'c>(
        conn: &'c mut Self::Connection,
        stamp: Stamp<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            let sql = match stamp.at.row {
                StampRow::Record => Self::SAVE_STAMP[0],
                StampRow::Version => Self::SAVE_STAMP[1],
            };
            sqlx::query(sql)
                .bind(stamp.fingerprint)
                .bind(stamp.result)
                .bind(stamp.at.scope)
                .bind(stamp.at.key)
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    /// [`Store::load_stamp`].
    fn load_stamp<'c>(
        conn: &'c mut Self::Connection,
        at: StampKey<'c>,
    ) -> impl Future<Output = Result<Option<StoredStamp>, sqlx::Error>> + Send + 'c {
        async move {
            let sql = match at.row {
                StampRow::Record => const { text::LOAD_RECORD_STAMP.with(Self::PLACEHOLDERS) },
                StampRow::Version => const { text::LOAD_VERSION_STAMP.with(Self::PLACEHOLDERS) },
            };
            let row: Option<StampColumns> = sqlx::query_as(sql)
                .bind(at.scope)
                .bind(at.key)
                .fetch_optional(conn)
                .await?;
            Ok(row.map(|(fingerprint, result)| StoredStamp {
                fingerprint,
                result,
            }))
        }
    }

    /// [`Store::load_stamps`], one statement per table and chunk of keys.
    fn load_stamps<'c>(
        conn: &'c mut Self::Connection,
        keys: &'c [StampKey<'c>],
    ) -> impl Future<Output = Result<Vec<Option<StoredStamp>>, sqlx::Error>> + Send + 'c
    where
        Self: InLists,
    {
        async move {
            let mut found = StampRows::new(keys);
            for row in [StampRow::Record, StampRow::Version] {
                let wanted: Vec<&StampKey<'_>> = keys.iter().filter(|k| k.row == row).collect();
                for chunk in wanted.chunks(Self::ROWS_PER_STATEMENT) {
                    // Built from constant fragments only; every value is bound.
                    let sql = Self::stamps_select(row, chunk.len());
                    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
                    for key in chunk {
                        query = query.bind(key.scope).bind(key.key);
                    }
                    let rows: Vec<StampRowOf> = query.fetch_all(&mut *conn).await?;
                    found.add(row, rows);
                }
            }
            Ok(found.into_stamps())
        }
    }

    /// [`Store::load_attempts`].
    fn load_attempts<'c>(
        conn: &'c mut Self::Connection,
        record: RecordKey<'c>,
    ) -> impl Future<Output = Result<u32, sqlx::Error>> + Send + 'c {
        async move {
            let counted: Option<Self::Attempts> =
                sqlx::query_scalar(const { text::LOAD_ATTEMPTS.with(Self::PLACEHOLDERS) })
                    .bind(record.scope)
                    .bind(record.key)
                    .fetch_optional(conn)
                    .await?;
            Ok(counted.map_or(0, |n| attempts(n.into())))
        }
    }

    /// [`Store::count_attempt`].
    fn count_attempt<'c>(
        conn: &'c mut Self::Connection,
        attempt: FailedAttempt<'c>,
    ) -> impl Future<Output = Result<u32, sqlx::Error>> + Send + 'c
    where
        Self: OnConflict,
    {
        async move {
            let counted: Self::Attempts = sqlx::query_scalar(Self::COUNT_ATTEMPT)
                .bind(attempt.record.scope)
                .bind(attempt.record.key)
                .bind(attempt.error)
                .fetch_one(conn)
                .await?;
            Ok(attempts(counted.into()))
        }
    }

    /// [`Store::claim_lease`].
    fn claim_lease<'c>(
        conn: &'c mut Self::Connection,
        request: LeaseRequest<'c>,
    ) -> impl Future<Output = Result<LeaseClaim, sqlx::Error>> + Send + 'c
    where
        Self: OnConflict,
    {
        async move {
            let LeaseRequest {
                record,
                lease,
                token,
            } = request;
            // New, or in progress under an expired lease: the upsert takes it over atomically.
            let acquired = sqlx::query(Self::CLAIM_LEASE)
                .bind(record.scope)
                .bind(record.key)
                .bind(record.retention_ms())
                .bind(millis(lease))
                .bind(token)
                .execute(&mut *conn)
                .await?;
            if Self::rows_affected(&acquired) == 1 {
                return Ok(LeaseClaim::Acquired);
            }
            let in_progress: Option<bool> =
                sqlx::query_scalar(const { text::LEASE_HELD.with(Self::PLACEHOLDERS) })
                    .bind(record.scope)
                    .bind(record.key)
                    .fetch_optional(conn)
                    .await?;
            // Gone between the two statements (released or purged): the caller may retry.
            Ok(if in_progress.unwrap_or(true) {
                LeaseClaim::InProgress
            } else {
                LeaseClaim::Done
            })
        }
    }

    /// [`Store::advance_version`].
    fn advance_version<'c>(
        conn: &'c mut Self::Connection,
        entry: VersionEntry<'c>,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c
    where
        Self: OnConflict,
    {
        async move {
            let VersionEntry {
                scope,
                entity,
                version,
            } = entry;
            let advanced = sqlx::query(Self::ADVANCE_VERSION)
                .bind(scope)
                .bind(entity)
                .bind(version)
                .execute(&mut *conn)
                .await?;
            if Self::rows_affected(&advanced) == 1 {
                return Ok(VersionCheck::Advanced);
            }
            Self::behind(conn, scope, entity, version).await
        }
    }

    /// Why `version` did not advance `entity`: equal to the stored version, or behind it.
    /// The conditional upsert before this locked the entity's row (PostgreSQL) or holds the
    /// write lock (SQLite), even though its WHERE was false: this read sees the committed
    /// version, and no one can change it before the transaction ends.
    fn behind<'c>(
        conn: &'c mut Self::Connection,
        scope: &'c str,
        entity: &'c [u8],
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c {
        async move {
            let latest: i64 =
                sqlx::query_scalar(const { text::LATEST_VERSION.with(Self::PLACEHOLDERS) })
                    .bind(scope)
                    .bind(entity)
                    .fetch_one(conn)
                    .await?;
            Ok(compare(version, latest))
        }
    }

    /// [`Store::purge_expired`].
    fn purge_expired<'c>(
        conn: &'c mut Self::Connection,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c
    where
        Self: OnConflict,
    {
        async move {
            let deleted = sqlx::query(Self::PURGE_EXPIRED)
                .bind(self::limit(limit))
                .execute(conn)
                .await?;
            Ok(Self::rows_affected(&deleted))
        }
    }

    /// [`Store::purge_versions`].
    fn purge_versions<'c>(
        conn: &'c mut Self::Connection,
        older_than: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c
    where
        Self: OnConflict,
    {
        Self::purge_older(conn, Self::PURGE_VERSIONS, millis(older_than), limit)
    }

    /// Runs a delete of at most `limit` rows older than `age_ms`: how many it deleted.
    fn purge_older<'c>(
        conn: &'c mut Self::Connection,
        sql: &'static str,
        age_ms: i64,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c {
        async move {
            let deleted = sqlx::query(sql)
                .bind(age_ms)
                .bind(self::limit(limit))
                .execute(conn)
                .await?;
            Ok(Self::rows_affected(&deleted))
        }
    }

    // The operator's queries: cold, so their text is built, by the dialect (`AdminDialect`,
    // `OutboxDialect`) from its parts.

    /// `value`, bound as many times as a filter names it: once where its parameter is
    /// numbered, at each `?` where it is not (MySQL).
    fn filter_arguments(value: Option<&str>) -> Result<Self::Arguments, sqlx::Error> {
        let mut arguments = Self::Arguments::default();
        let times = match Self::PARAMETERS {
            Placeholders::Plain => 2,
            Placeholders::Question | Placeholders::Dollar => 1,
        };
        for _ in 0..times {
            arguments.add(value).map_err(sqlx::Error::Encode)?;
        }
        Ok(arguments)
    }

    /// Whether each of `tables` exists.
    fn present<'a>(
        pool: &'a Pool<Self>,
        tables: &'a [&'a str],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        async move {
            match Self::catalog(tables) {
                Catalog::Count(sql) => {
                    let found: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .fetch_one(pool)
                        .await?;
                    Ok(usize::try_from(found).is_ok_and(|n| n == tables.len()))
                }
                Catalog::Present(sql) => {
                    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                        .fetch_one(pool)
                        .await
                }
            }
        }
    }

    /// [`Admin::tables_present`](crate::admin::Admin::tables_present).
    fn tables_present<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        Self::present(pool, &["idem_records", "idem_versions"])
    }

    /// [`Admin::now_ms`](crate::admin::Admin::now_ms).
    fn now_ms<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a {
        async move {
            let sql = format!("SELECT {}", Self::NOW_MS);
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }
    }

    /// [`Admin::stats`](crate::admin::Admin::stats).
    fn stats<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<ScopeStats>, sqlx::Error>> + Send + 'a {
        async move {
            let (records, versions) = Self::stats_sql();
            type Row = (String, i64, i64, i64, i64, Option<i64>, Option<i64>);
            let records: Vec<Row> =
                sqlx::query_as_with(sqlx::AssertSqlSafe(records), Self::filter_arguments(scope)?)
                    .fetch_all(pool)
                    .await?;
            let versions: Vec<(String, i64)> = sqlx::query_as_with(
                sqlx::AssertSqlSafe(versions),
                Self::filter_arguments(scope)?,
            )
            .fetch_all(pool)
            .await?;
            let mut stats: Vec<ScopeStats> = records
                .into_iter()
                .map(
                    |(scope, records, in_progress, lapsed, expired, oldest, newest)| ScopeStats {
                        scope,
                        records: count(records),
                        in_progress: count(in_progress),
                        lapsed_leases: count(lapsed),
                        expired: count(expired),
                        oldest_processed_ms: oldest,
                        newest_processed_ms: newest,
                        versions: 0,
                    },
                )
                .collect();
            merge_versions(&mut stats, versions);
            Ok(stats)
        }
    }

    /// [`Admin::scope_known`](crate::admin::Admin::scope_known).
    fn scope_known<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        async move {
            let sql = Self::scope_known_sql();
            // Bound as a filter's value is: the scope is named twice.
            sqlx::query_scalar_with(
                sqlx::AssertSqlSafe(sql),
                Self::filter_arguments(Some(scope))?,
            )
            .fetch_one(pool)
            .await
        }
    }

    /// [`Admin::record`](crate::admin::Admin::record).
    fn record<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Option<RecordInfo>, sqlx::Error>> + Send + 'a {
        async move {
            let sql = Self::record_sql();
            let row: Option<(i64, i64, Option<i64>)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(scope)
                .bind(key)
                .fetch_optional(pool)
                .await?;
            Ok(
                row.map(|(processed_ms, expires_ms, lease_until_ms)| RecordInfo {
                    processed_ms,
                    expires_ms,
                    lease_until_ms,
                }),
            )
        }
    }

    /// [`Admin::version`](crate::admin::Admin::version).
    fn version<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        entity: &'a [u8],
    ) -> impl Future<Output = Result<Option<VersionInfo>, sqlx::Error>> + Send + 'a {
        async move {
            let sql = Self::version_sql();
            let row: Option<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(scope)
                .bind(entity)
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|(version, updated_ms)| VersionInfo {
                version,
                updated_ms,
            }))
        }
    }

    /// [`Admin::forget`](crate::admin::Admin::forget).
    fn forget<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Deletion, sqlx::Error>> + Send + 'a {
        Self::delete_in_state(pool, text::FORGET, scope, key)
    }

    /// [`Admin::release`](crate::admin::Admin::release).
    fn release<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Deletion, sqlx::Error>> + Send + 'a {
        Self::delete_in_state(pool, text::RELEASE, scope, key)
    }

    /// Deletes a record with `delete` (one state only), then tells what it did from a read.
    fn delete_in_state<'a>(
        pool: &'a Pool<Self>,
        delete: Statement,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Deletion, sqlx::Error>> + Send + 'a {
        async move {
            let deleted = sqlx::query(delete.with(Self::PARAMETERS))
                .bind(scope)
                .bind(key)
                .execute(pool)
                .await?;
            // In progress (`false`), done (`true`), or missing.
            let done: Option<bool> = sqlx::query_scalar(text::DONE.with(Self::PARAMETERS))
                .bind(scope)
                .bind(key)
                .fetch_optional(pool)
                .await?;
            Ok(match (Self::rows_affected(&deleted), done) {
                (1.., _) => Deletion::Deleted,
                (0, Some(_)) => Deletion::Refused,
                (0, None) => Deletion::Missing,
            })
        }
    }

    /// [`Admin::count_expired`](crate::admin::Admin::count_expired).
    fn count_expired<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let sql = Self::count_expired_sql();
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await?;
            Ok(count(n))
        }
    }

    /// [`Admin::purge_batch`](crate::admin::Admin::purge_batch).
    fn purge_batch<'a>(
        pool: &'a Pool<Self>,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let mut conn = pool.acquire().await?;
            <Self as Store>::purge_expired(&mut conn, limit).await
        }
    }

    /// [`Admin::attempts`](crate::admin::Admin::attempts).
    fn attempts<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<AttemptInfo>, sqlx::Error>> + Send + 'a {
        async move {
            let sql = Self::attempts_sql();
            let mut arguments = Self::filter_arguments(scope)?;
            arguments
                .add(self::limit(limit))
                .map_err(sqlx::Error::Encode)?;
            let rows: Vec<AttemptRow> = sqlx::query_as_with(sqlx::AssertSqlSafe(sql), arguments)
                .fetch_all(pool)
                .await?;
            Ok(rows.into_iter().map(AttemptInfo::of).collect())
        }
    }

    /// [`Admin::clear_attempts`](crate::admin::Admin::clear_attempts): whether any were counted.
    fn forget_attempts<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        async move {
            let deleted = sqlx::query(text::CLEAR_ATTEMPTS.with(Self::PARAMETERS))
                .bind(scope)
                .bind(key)
                .execute(pool)
                .await?;
            Ok(Self::rows_affected(&deleted) > 0)
        }
    }

    // The outbox: the insert runs in a handler's transaction (a `&'static str`); the relay's
    // statements are built per batch, as they always were.

    /// [`OutboxStore::insert_outbox`](crate::outbox::OutboxStore::insert_outbox).
    fn insert_outbox<'c>(
        conn: &'c mut Self::Connection,
        row: NewRow<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            sqlx::query(Self::INSERT_OUTBOX)
                .bind(row.id)
                .bind(row.destination)
                .bind(row.partition_key)
                .bind(row.partition_no)
                .bind(row.payload)
                .bind(row.headers)
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    /// [`OutboxStore::pending_partitions`](crate::outbox::OutboxStore::pending_partitions).
    fn pending_partitions<'c>(
        conn: &'c mut Self::Connection,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<i32>, sqlx::Error>> + Send + 'c {
        sqlx::query_scalar(Self::PENDING_PARTITIONS)
            .bind(i64::from(limit))
            .fetch_all(conn)
    }

    /// [`OutboxStore::take_pending`](crate::outbox::OutboxStore::take_pending): each
    /// partition's head, merged in insertion order.
    fn take_pending<'c>(
        conn: &'c mut Self::Connection,
        partitions: &'c [i32],
        each: u32,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<PendingRow>, sqlx::Error>> + Send + 'c
    where
        Self: InLists,
    {
        async move {
            if partitions.is_empty() {
                return Ok(Vec::new());
            }
            // Each partition's first `each` rows on the pending index, then merged in insertion
            // order: never a scan of whole partitions, however long their backlog.
            let sql = format!(
                "{} ORDER BY seq LIMIT ?",
                vec![Self::PARTITION_HEAD; partitions.len()].join(" UNION ALL ")
            );
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
            for partition in partitions {
                query = query.bind(partition).bind(i64::from(each));
            }
            let rows: Vec<RawRow> = query.bind(i64::from(limit)).fetch_all(conn).await?;
            Ok(rows.into_iter().map(PendingRow::from).collect())
        }
    }

    /// [`OutboxStore::mark_sent`](crate::outbox::OutboxStore::mark_sent).
    fn mark_sent<'c>(
        conn: &'c mut Self::Connection,
        seqs: &'c [i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c
    where
        Self: InLists,
    {
        async move {
            let mut marked = 0;
            for chunk in seqs.chunks(Self::ROWS_PER_STATEMENT) {
                let sql = format!(
                    "UPDATE idem_outbox SET sent_at = {} WHERE seq IN ({})",
                    Self::NOW_MS,
                    row_list("?", chunk.len())
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for seq in chunk {
                    query = query.bind(seq);
                }
                marked += Self::rows_affected(&query.execute(&mut *conn).await?);
            }
            Ok(marked)
        }
    }

    /// [`OutboxStore::mark_failed`](crate::outbox::OutboxStore::mark_failed).
    fn mark_failed<'c>(
        conn: &'c mut Self::Connection,
        seqs: &'c [i64],
        backoff: Duration,
        error: &'c str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c
    where
        Self: InLists,
    {
        async move {
            let error = Self::failure(error);
            for chunk in seqs.chunks(Self::ROWS_PER_STATEMENT) {
                let sql = format!(
                    "UPDATE idem_outbox SET attempts = attempts + 1, last_error = ?, \
                     available_at = {} + ? WHERE seq IN ({})",
                    Self::NOW_MS,
                    row_list("?", chunk.len())
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(&*error)
                    .bind(span_ms(backoff));
                for seq in chunk {
                    query = query.bind(seq);
                }
                query.execute(&mut *conn).await?;
            }
            Ok(())
        }
    }

    /// [`OutboxStore::purge_sent`](crate::outbox::OutboxStore::purge_sent).
    fn purge_sent<'c>(
        conn: &'c mut Self::Connection,
        older_than: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'c {
        Self::purge_older(conn, Self::PURGE_SENT, span_ms(older_than), limit)
    }

    /// [`OutboxAdmin::outbox_present`](crate::admin::OutboxAdmin::outbox_present).
    fn outbox_present<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        Self::present(pool, &["idem_outbox"])
    }

    /// [`OutboxAdmin::outbox_stats`](crate::admin::OutboxAdmin::outbox_stats).
    fn outbox_stats<'a>(
        pool: &'a Pool<Self>,
        destination: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<DestinationStats>, sqlx::Error>> + Send + 'a {
        async move {
            let (counts, errors) = Self::outbox_stats_sql();
            let counts: Vec<CountRow> = sqlx::query_as_with(
                sqlx::AssertSqlSafe(counts),
                Self::filter_arguments(destination)?,
            )
            .fetch_all(pool)
            .await?;
            let errors: Vec<(String, Option<String>)> = sqlx::query_as_with(
                sqlx::AssertSqlSafe(errors),
                Self::filter_arguments(destination)?,
            )
            .fetch_all(pool)
            .await?;
            Ok(assemble(counts, errors))
        }
    }

    /// [`OutboxAdmin::outbox_backlog`](crate::admin::OutboxAdmin::outbox_backlog).
    fn outbox_backlog<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<Vec<Backlog>, sqlx::Error>> + Send + 'a {
        async move {
            let rows: Vec<(String, i64, i64)> =
                sqlx::query_as(sqlx::AssertSqlSafe(Self::outbox_backlog_sql()))
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(destination, pending, oldest_ms)| Backlog {
                    destination,
                    pending: count(pending),
                    oldest_ms,
                })
                .collect())
        }
    }
}

/// Writes, in a database's `impl` of [`Store`] (or of a capability:
/// [`Leases`](crate::store::Leases), [`Stamps`](crate::store::Stamps),
/// [`Attempts`](crate::store::Attempts)), [`Admin`](crate::admin::Admin), [`OutboxStore`](crate::outbox::OutboxStore)
/// or [`OutboxAdmin`](crate::admin::OutboxAdmin), each named method as the [`Sql`] method of its
/// name (for `Admin::clear_attempts`, `forget_attempts`), with the trait's signature, written
/// once here. A name may be a group: `store` (the core methods every database runs alike),
/// `on_conflict` (the core methods of an [`OnConflict`] database), `leases`, `stamps`,
/// `attempt_counts` (the methods of that capability every database runs alike; an
/// [`OnConflict`] database adds `claim_lease` and `count_attempt`), `admin` (all of `Admin`), `outbox` (the
/// outbox methods every database runs alike), `outbox_in_lists` (those of an [`InLists`]
/// database), `outbox_admin` (all of `OutboxAdmin`).
macro_rules! sql_methods {
    ($($method:ident),+ $(,)?) => {
        $($crate::backend::sql::sql_methods!(@sig $method);)+
    };
    // Groups: what every database runs alike, and what the databases of one dialect trait do.
    (@sig store) => {
        $crate::backend::sql::sql_methods!(delete_record);
    };
    (@sig on_conflict) => {
        $crate::backend::sql::sql_methods!(advance_version, purge_expired, purge_versions);
    };
    (@sig leases) => {
        $crate::backend::sql::sql_methods!(complete_lease, release_lease);
    };
    (@sig stamps) => {
        $crate::backend::sql::sql_methods!(save_stamp, load_stamp);
    };
    (@sig attempt_counts) => {
        $crate::backend::sql::sql_methods!(load_attempts, clear_attempts);
    };
    (@sig admin) => {
        $crate::backend::sql::sql_methods!(
            tables_present, now_ms, stats, scope_known, record, version, forget, release,
            count_expired, purge_batch, attempts, forget_attempts
        );
    };
    (@sig outbox) => {
        $crate::backend::sql::sql_methods!(insert_outbox, purge_sent);
    };
    (@sig outbox_in_lists) => {
        $crate::backend::sql::sql_methods!(take_pending, mark_sent, mark_failed);
    };
    (@sig outbox_admin) => {
        $crate::backend::sql::sql_methods!(outbox_present, outbox_stats, outbox_backlog);
    };
    // The store's methods: the connection of the transaction and one value.
    (@sig delete_record) => { $crate::backend::sql::sql_methods!(@conn delete_record(record: $crate::store::RecordKey<'c>) -> ()); };
    (@sig clear_attempts) => { $crate::backend::sql::sql_methods!(@conn clear_attempts(record: $crate::store::RecordKey<'c>) -> ()); };
    (@sig complete_lease) => { $crate::backend::sql::sql_methods!(@conn complete_lease(hold: $crate::store::LeaseHold<'c>) -> bool); };
    (@sig release_lease) => { $crate::backend::sql::sql_methods!(@conn release_lease(hold: $crate::store::LeaseHold<'c>) -> bool); };
    (@sig save_stamp) => { $crate::backend::sql::sql_methods!(@conn save_stamp(stamp: $crate::store::Stamp<'c>) -> ()); };
    (@sig load_stamp) => { $crate::backend::sql::sql_methods!(@conn load_stamp(at: $crate::store::StampKey<'c>) -> Option<$crate::store::StoredStamp>); };
    (@sig load_stamps) => { $crate::backend::sql::sql_methods!(@conn load_stamps(keys: &'c [$crate::store::StampKey<'c>]) -> Vec<Option<$crate::store::StoredStamp>>); };
    (@sig load_attempts) => { $crate::backend::sql::sql_methods!(@conn load_attempts(record: $crate::store::RecordKey<'c>) -> u32); };
    (@sig count_attempt) => { $crate::backend::sql::sql_methods!(@conn count_attempt(attempt: $crate::store::FailedAttempt<'c>) -> u32); };
    (@sig claim_lease) => { $crate::backend::sql::sql_methods!(@conn claim_lease(request: $crate::store::LeaseRequest<'c>) -> $crate::store::LeaseClaim); };
    (@sig advance_version) => { $crate::backend::sql::sql_methods!(@conn advance_version(entry: $crate::store::VersionEntry<'c>) -> $crate::store::VersionCheck); };
    (@sig purge_expired) => { $crate::backend::sql::sql_methods!(@conn purge_expired(limit: u64) -> u64); };
    (@sig purge_versions) => { $crate::backend::sql::sql_methods!(@conn purge_versions(older_than: std::time::Duration, limit: u64) -> u64); };
    // The outbox's methods: the relay's connection (or the handler's, to insert).
    (@sig insert_outbox) => { $crate::backend::sql::sql_methods!(@conn insert_outbox(row: $crate::outbox::NewRow<'c>) -> ()); };
    (@sig pending_partitions) => { $crate::backend::sql::sql_methods!(@conn pending_partitions(limit: u32) -> Vec<i32>); };
    (@sig take_pending) => { $crate::backend::sql::sql_methods!(@conn take_pending(partitions: &'c [i32], each: u32, limit: u32) -> Vec<$crate::outbox::PendingRow>); };
    (@sig mark_sent) => { $crate::backend::sql::sql_methods!(@conn mark_sent(seqs: &'c [i64]) -> u64); };
    (@sig mark_failed) => { $crate::backend::sql::sql_methods!(@conn mark_failed(seqs: &'c [i64], backoff: std::time::Duration, error: &'c str) -> ()); };
    (@sig purge_sent) => { $crate::backend::sql::sql_methods!(@conn purge_sent(older_than: std::time::Duration, limit: u64) -> u64); };
    // The operator's queries: a pool.
    (@sig tables_present) => { $crate::backend::sql::sql_methods!(@pool tables_present() -> bool); };
    (@sig now_ms) => { $crate::backend::sql::sql_methods!(@pool now_ms() -> i64); };
    (@sig stats) => { $crate::backend::sql::sql_methods!(@pool stats(scope: Option<&'c str>) -> Vec<$crate::admin::ScopeStats>); };
    (@sig scope_known) => { $crate::backend::sql::sql_methods!(@pool scope_known(scope: &'c str) -> bool); };
    (@sig record) => { $crate::backend::sql::sql_methods!(@pool record(scope: &'c str, key: &'c [u8]) -> Option<$crate::admin::RecordInfo>); };
    (@sig version) => { $crate::backend::sql::sql_methods!(@pool version(scope: &'c str, entity: &'c [u8]) -> Option<$crate::admin::VersionInfo>); };
    (@sig forget) => { $crate::backend::sql::sql_methods!(@pool forget(scope: &'c str, key: &'c [u8]) -> $crate::admin::Deletion); };
    (@sig release) => { $crate::backend::sql::sql_methods!(@pool release(scope: &'c str, key: &'c [u8]) -> $crate::admin::Deletion); };
    (@sig count_expired) => { $crate::backend::sql::sql_methods!(@pool count_expired() -> u64); };
    (@sig purge_batch) => { $crate::backend::sql::sql_methods!(@pool purge_batch(limit: u64) -> u64); };
    (@sig attempts) => { $crate::backend::sql::sql_methods!(@pool attempts(scope: Option<&'c str>, limit: u64) -> Vec<$crate::admin::AttemptInfo>); };
    (@sig forget_attempts) => {
        fn clear_attempts<'c>(
            pool: &'c sqlx::Pool<Self>,
            scope: &'c str,
            key: &'c [u8],
        ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
            <Self as $crate::backend::sql::Sql>::forget_attempts(pool, scope, key)
        }
    };
    (@sig outbox_present) => { $crate::backend::sql::sql_methods!(@pool outbox_present() -> bool); };
    (@sig outbox_backlog) => { $crate::backend::sql::sql_methods!(@pool outbox_backlog() -> Vec<$crate::admin::Backlog>); };
    (@sig outbox_stats) => { $crate::backend::sql::sql_methods!(@pool outbox_stats(destination: Option<&'c str>) -> Vec<$crate::admin::DestinationStats>); };
    (@conn $method:ident($($arg:ident: $ty:ty),*) -> $out:ty) => {
        fn $method<'c>(
            conn: &'c mut Self::Connection,
            $($arg: $ty),*
        ) -> impl std::future::Future<Output = Result<$out, sqlx::Error>> + Send + 'c {
            <Self as $crate::backend::sql::Sql>::$method(conn, $($arg),*)
        }
    };
    (@pool $method:ident($($arg:ident: $ty:ty),*) -> $out:ty) => {
        fn $method<'c>(
            pool: &'c sqlx::Pool<Self>,
            $($arg: $ty),*
        ) -> impl std::future::Future<Output = Result<$out, sqlx::Error>> + Send + 'c {
            <Self as $crate::backend::sql::Sql>::$method(pool, $($arg),*)
        }
    };
}
pub(crate) use sql_methods;

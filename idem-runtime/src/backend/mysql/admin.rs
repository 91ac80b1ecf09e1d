//! The operator's queries on MySQL / MariaDB, where `expires_at`, `lease_until` and
//! `updated_ms` are epoch milliseconds and `processed_at` is a DATETIME(6) in UTC.

use sqlx::{MySql, Pool};

use crate::admin::{
    count, Admin, AttemptInfo, AttemptRow, Deletion, RecordInfo, ScopeStats, VersionInfo,
};
use crate::store::Store;

/// Now, in Unix epoch milliseconds of the server's UTC clock, as the MySQL backend computes it.
macro_rules! now_ms {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    };
}

/// A DATETIME(6) in UTC (`processed_at`) as epoch milliseconds.
macro_rules! datetime_ms {
    ($column:literal) => {
        concat!(
            "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ",
            $column,
            ") DIV 1000)"
        )
    };
}

/// Whether a record is in progress (`false`), done (`true`), or missing (`None`).
async fn done(pool: &Pool<MySql>, scope: &str, key: &[u8]) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT lease_until IS NULL FROM idem_records WHERE scope = ? AND msg_key = ?",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
}

/// What a conditional delete did, told apart by a read after it.
async fn deletion(
    pool: &Pool<MySql>,
    deleted: u64,
    scope: &str,
    key: &[u8],
) -> Result<Deletion, sqlx::Error> {
    Ok(match (deleted, done(pool, scope, key).await?) {
        (1.., _) => Deletion::Deleted,
        (0, Some(_)) => Deletion::Refused,
        (0, None) => Deletion::Missing,
    })
}

impl Admin for MySql {
    async fn tables_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        // In the connection's current database, where idem's own queries look.
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
             AND table_name IN ('idem_records', 'idem_versions')",
        )
        .fetch_one(pool)
        .await?;
        Ok(found == 2)
    }

    async fn now_ms(pool: &Pool<Self>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(pool)
            .await
    }

    async fn stats<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
    ) -> Result<Vec<ScopeStats>, sqlx::Error> {
        type Row = (String, i64, i64, i64, i64, Option<i64>, Option<i64>);
        // COUNT of a CASE without ELSE counts the rows it holds for: a BIGINT, where SUM would
        // be a DECIMAL.
        let records: Vec<Row> = sqlx::query_as(concat!(
            "SELECT scope, COUNT(*), \
                 COUNT(CASE WHEN lease_until >= now.ms THEN 1 END), \
                 COUNT(CASE WHEN lease_until < now.ms THEN 1 END), \
                 COUNT(CASE WHEN expires_at < now.ms \
                            AND (lease_until IS NULL OR lease_until < now.ms) THEN 1 END), ",
            datetime_ms!("MIN(processed_at)"),
            ", ",
            datetime_ms!("MAX(processed_at)"),
            " FROM idem_records, (SELECT ",
            now_ms!(),
            " AS ms) now WHERE ? IS NULL OR scope = ? GROUP BY scope"
        ))
        .bind(scope)
        .bind(scope)
        .fetch_all(pool)
        .await?;
        let versions: Vec<(String, i64)> = sqlx::query_as(
            "SELECT scope, COUNT(*) FROM idem_versions WHERE ? IS NULL OR scope = ? GROUP BY scope",
        )
        .bind(scope)
        .bind(scope)
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
        crate::admin::merge_versions(&mut stats, versions);
        Ok(stats)
    }

    async fn scope_known<'a>(pool: &'a Pool<Self>, scope: &'a str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM idem_records WHERE scope = ?) \
                 OR EXISTS (SELECT 1 FROM idem_versions WHERE scope = ?)",
        )
        .bind(scope)
        .bind(scope)
        .fetch_one(pool)
        .await
    }

    async fn record<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<Option<RecordInfo>, sqlx::Error> {
        let row: Option<(i64, i64, Option<i64>)> = sqlx::query_as(concat!(
            "SELECT ",
            datetime_ms!("processed_at"),
            ", expires_at, lease_until FROM idem_records WHERE scope = ? AND msg_key = ?"
        ))
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

    async fn version<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        entity: &'a [u8],
    ) -> Result<Option<VersionInfo>, sqlx::Error> {
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT version, updated_ms FROM idem_versions WHERE scope = ? AND entity = ?",
        )
        .bind(scope)
        .bind(entity)
        .fetch_optional(pool)
        .await?;
        Ok(row.map(|(version, updated_ms)| VersionInfo {
            version,
            updated_ms,
        }))
    }

    async fn forget<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<Deletion, sqlx::Error> {
        let deleted = sqlx::query(
            "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NULL",
        )
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await?
        .rows_affected();
        deletion(pool, deleted, scope, key).await
    }

    async fn release<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<Deletion, sqlx::Error> {
        let deleted = sqlx::query(
            "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NOT NULL",
        )
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await?
        .rows_affected();
        deletion(pool, deleted, scope, key).await
    }

    async fn count_expired(pool: &Pool<Self>) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM idem_records, (SELECT ",
            now_ms!(),
            " AS ms) now \
             WHERE expires_at < now.ms AND (lease_until IS NULL OR lease_until < now.ms)"
        ))
        .fetch_one(pool)
        .await?;
        Ok(count(n))
    }

    async fn purge_batch(pool: &Pool<Self>, limit: u64) -> Result<u64, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        <MySql as Store>::purge_expired(&mut conn, limit).await
    }

    async fn attempts<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
        limit: u64,
    ) -> Result<Vec<AttemptInfo>, sqlx::Error> {
        let rows: Vec<AttemptRow> = sqlx::query_as(
            "SELECT scope, msg_key, CAST(attempts AS SIGNED), last_error, updated_ms \
             FROM idem_attempts WHERE ? IS NULL OR scope = ? \
             ORDER BY attempts DESC, scope, msg_key LIMIT ?",
        )
        .bind(scope)
        .bind(scope)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?;
        Ok(rows.into_iter().map(AttemptInfo::of).collect())
    }

    async fn clear_attempts<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<bool, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM idem_attempts WHERE scope = ? AND msg_key = ?")
            .bind(scope)
            .bind(key)
            .execute(pool)
            .await?
            .rows_affected();
        Ok(deleted > 0)
    }
}

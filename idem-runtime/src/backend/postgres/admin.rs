//! The operator's queries on PostgreSQL, where every time is a `TIMESTAMPTZ`.

use sqlx::{Pool, Postgres};

use crate::admin::{count, Admin, Deletion, RecordInfo, ScopeStats, VersionInfo};
use crate::store::Store;

/// A `TIMESTAMPTZ` expression as epoch milliseconds.
macro_rules! ms {
    ($column:literal) => {
        concat!("(EXTRACT(EPOCH FROM ", $column, ") * 1000)::BIGINT")
    };
}

/// Whether a record is in progress (`false`), done (`true`), or missing (`None`).
async fn done(pool: &Pool<Postgres>, scope: &str, key: &[u8]) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT lease_until IS NULL FROM idem_records WHERE scope = $1 AND msg_key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
}

impl Admin for Postgres {
    async fn tables_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        // to_regclass follows the search_path, as idem's own queries do.
        sqlx::query_scalar(
            "SELECT to_regclass('idem_records') IS NOT NULL \
                 AND to_regclass('idem_versions') IS NOT NULL",
        )
        .fetch_one(pool)
        .await
    }

    async fn now_ms(pool: &Pool<Self>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(concat!("SELECT ", ms!("now()")))
            .fetch_one(pool)
            .await
    }

    async fn stats<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
    ) -> Result<Vec<ScopeStats>, sqlx::Error> {
        type Row = (String, i64, i64, i64, i64, Option<i64>, Option<i64>);
        let records: Vec<Row> = sqlx::query_as(concat!(
            "SELECT scope, COUNT(*), \
                 COUNT(*) FILTER (WHERE lease_until >= now()), \
                 COUNT(*) FILTER (WHERE lease_until < now()), \
                 COUNT(*) FILTER (WHERE expires_at < now() AND (lease_until IS NULL OR lease_until < now())), ",
            ms!("MIN(processed_at)"),
            ", ",
            ms!("MAX(processed_at)"),
            " FROM idem_records WHERE $1::TEXT IS NULL OR scope = $1 GROUP BY scope"
        ))
        .bind(scope)
        .fetch_all(pool)
        .await?;
        let versions: Vec<(String, i64)> = sqlx::query_as(
            "SELECT scope, COUNT(*) FROM idem_versions WHERE $1::TEXT IS NULL OR scope = $1 GROUP BY scope",
        )
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
            "SELECT EXISTS (SELECT 1 FROM idem_records WHERE scope = $1) \
                 OR EXISTS (SELECT 1 FROM idem_versions WHERE scope = $1)",
        )
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
            ms!("processed_at"),
            ", ",
            ms!("expires_at"),
            ", ",
            ms!("lease_until"),
            " FROM idem_records WHERE scope = $1 AND msg_key = $2"
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
        let row: Option<(i64, i64)> = sqlx::query_as(concat!(
            "SELECT version, ",
            ms!("updated_at"),
            " FROM idem_versions WHERE scope = $1 AND entity = $2"
        ))
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
            "DELETE FROM idem_records WHERE scope = $1 AND msg_key = $2 AND lease_until IS NULL",
        )
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await?
        .rows_affected();
        Ok(match (deleted, done(pool, scope, key).await?) {
            (1.., _) => Deletion::Deleted,
            (0, Some(_)) => Deletion::Refused,
            (0, None) => Deletion::Missing,
        })
    }

    async fn release<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<Deletion, sqlx::Error> {
        let deleted = sqlx::query(
            "DELETE FROM idem_records WHERE scope = $1 AND msg_key = $2 AND lease_until IS NOT NULL",
        )
        .bind(scope)
        .bind(key)
        .execute(pool)
        .await?
        .rows_affected();
        Ok(match (deleted, done(pool, scope, key).await?) {
            (1.., _) => Deletion::Deleted,
            (0, Some(_)) => Deletion::Refused,
            (0, None) => Deletion::Missing,
        })
    }

    async fn count_expired(pool: &Pool<Self>) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_records \
             WHERE expires_at < now() AND (lease_until IS NULL OR lease_until < now())",
        )
        .fetch_one(pool)
        .await?;
        Ok(count(n))
    }

    async fn purge_batch(pool: &Pool<Self>, limit: u64) -> Result<u64, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        <Postgres as Store>::purge_expired(&mut conn, limit).await
    }

    async fn attempts<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
        limit: u64,
    ) -> Result<Vec<crate::admin::AttemptInfo>, sqlx::Error> {
        let rows: Vec<crate::admin::AttemptRow> = sqlx::query_as(
            "SELECT scope, msg_key, attempts::bigint, last_error, \
                    (extract(epoch FROM updated_at) * 1000)::bigint \
             FROM idem_attempts WHERE $1::text IS NULL OR scope = $1 \
             ORDER BY attempts DESC, scope, msg_key LIMIT $2",
        )
        .bind(scope)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(crate::admin::AttemptInfo::of)
            .collect())
    }

    async fn clear_attempts<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<bool, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM idem_attempts WHERE scope = $1 AND msg_key = $2")
            .bind(scope)
            .bind(key)
            .execute(pool)
            .await?
            .rows_affected();
        Ok(deleted > 0)
    }
}

//! The operator's queries on SQLite, where `expires_at` and `lease_until` are epoch
//! milliseconds and `processed_at`/`updated_at` ISO-8601 text.

use sqlx::{Pool, Sqlite};

use super::{count, Admin, Deletion, RecordInfo, ScopeStats, VersionInfo};
use crate::store::Store;

/// Now, in Unix epoch milliseconds, as the SQLite backend computes it.
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// ISO-8601 text (`processed_at`, `updated_at`) as epoch milliseconds.
macro_rules! text_ms {
    ($column:literal) => {
        concat!(
            "CAST(ROUND((julianday(",
            $column,
            ") - 2440587.5) * 86400000) AS INTEGER)"
        )
    };
}

/// Whether a record is in progress (`false`), done (`true`), or missing (`None`).
async fn done(pool: &Pool<Sqlite>, scope: &str, key: &[u8]) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT lease_until IS NULL FROM idem_records WHERE scope = ? AND msg_key = ?",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
}

impl Admin for Sqlite {
    async fn tables_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' \
             AND name IN ('idem_records', 'idem_versions')",
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
        let records: Vec<Row> = sqlx::query_as(concat!(
            "WITH now(ms) AS (SELECT ",
            now_ms!(),
            ") SELECT scope, COUNT(*), \
                 COALESCE(SUM(lease_until >= now.ms), 0), \
                 COALESCE(SUM(lease_until < now.ms), 0), \
                 COALESCE(SUM(expires_at < now.ms AND (lease_until IS NULL OR lease_until < now.ms)), 0), ",
            text_ms!("MIN(processed_at)"),
            ", ",
            text_ms!("MAX(processed_at)"),
            " FROM idem_records, now WHERE ?1 IS NULL OR scope = ?1 GROUP BY scope"
        ))
        .bind(scope)
        .fetch_all(pool)
        .await?;
        let versions: Vec<(String, i64)> = sqlx::query_as(
            "SELECT scope, COUNT(*) FROM idem_versions WHERE ?1 IS NULL OR scope = ?1 GROUP BY scope",
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
        super::merge_versions(&mut stats, versions);
        Ok(stats)
    }

    async fn scope_known<'a>(pool: &'a Pool<Self>, scope: &'a str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM idem_records WHERE scope = ?1) \
                 OR EXISTS (SELECT 1 FROM idem_versions WHERE scope = ?1)",
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
            text_ms!("processed_at"),
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
        let row: Option<(i64, i64)> = sqlx::query_as(concat!(
            "SELECT version, ",
            text_ms!("updated_at"),
            " FROM idem_versions WHERE scope = ? AND entity = ?"
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
            "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NULL",
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
            "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NOT NULL",
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
        let n: i64 = sqlx::query_scalar(concat!(
            "WITH now(ms) AS (SELECT ",
            now_ms!(),
            ") SELECT COUNT(*) FROM idem_records, now \
             WHERE expires_at < now.ms AND (lease_until IS NULL OR lease_until < now.ms)"
        ))
        .fetch_one(pool)
        .await?;
        Ok(count(n))
    }

    async fn purge_batch(pool: &Pool<Self>, limit: u64) -> Result<u64, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        <Sqlite as Store>::purge_expired(&mut conn, limit).await
    }
}

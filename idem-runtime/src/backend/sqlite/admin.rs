//! The operator's queries on SQLite, where `expires_at` and `lease_until` are epoch
//! milliseconds and `processed_at`/`updated_at` ISO-8601 text.

use sqlx::{Pool, Sqlite};

use crate::admin::{count, Admin, Deletion, RecordInfo, ScopeStats, VersionInfo};
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
        crate::admin::merge_versions(&mut stats, versions);
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

    async fn attempts<'a>(
        pool: &'a Pool<Self>,
        scope: Option<&'a str>,
        limit: u64,
    ) -> Result<Vec<crate::admin::AttemptInfo>, sqlx::Error> {
        let rows: Vec<crate::admin::AttemptRow> = sqlx::query_as(
            "SELECT scope, msg_key, attempts, last_error, \
                    CAST((julianday(updated_at) - 2440587.5) * 86400000 AS INTEGER) \
             FROM idem_attempts WHERE ?1 IS NULL OR scope = ?1 \
             ORDER BY attempts DESC, scope, msg_key LIMIT ?2",
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
        let deleted = sqlx::query("DELETE FROM idem_attempts WHERE scope = ?1 AND msg_key = ?2")
            .bind(scope)
            .bind(key)
            .execute(pool)
            .await?
            .rows_affected();
        Ok(deleted > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pool() -> Pool<Sqlite> {
        // One connection: each connection of `sqlite::memory:` is a database of its own.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        crate::migrate(&pool).await.unwrap();
        pool
    }

    /// Inserts a record expiring `expires_in` ms from now, with a lease ending `lease_in` ms
    /// from now (`None`: done).
    async fn insert(
        pool: &Pool<Sqlite>,
        scope: &str,
        key: &[u8],
        expires_in: i64,
        lease_in: Option<i64>,
    ) {
        sqlx::query(concat!(
            "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) VALUES (?1, ?2, ",
            now_ms!(),
            " + ?3, ",
            now_ms!(),
            " + ?4, 1)"
        ))
        .bind(scope)
        .bind(key)
        .bind(expires_in)
        .bind(lease_in)
        .execute(pool)
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn forget_and_release_each_delete_only_their_state() {
        let pool = pool().await;
        insert(&pool, "s", b"done", 60_000, None).await;
        insert(&pool, "s", b"held", 60_000, Some(60_000)).await;
        assert_eq!(
            Sqlite::forget(&pool, "s", b"held").await.unwrap(),
            Deletion::Refused
        );
        assert_eq!(
            Sqlite::release(&pool, "s", b"done").await.unwrap(),
            Deletion::Refused
        );
        assert_eq!(
            Sqlite::forget(&pool, "s", b"nope").await.unwrap(),
            Deletion::Missing
        );
        assert_eq!(
            Sqlite::release(&pool, "s", b"nope").await.unwrap(),
            Deletion::Missing
        );
        assert!(Sqlite::record(&pool, "s", b"held")
            .await
            .unwrap()
            .unwrap()
            .in_progress());
        assert_eq!(
            Sqlite::forget(&pool, "s", b"done").await.unwrap(),
            Deletion::Deleted
        );
        assert_eq!(
            Sqlite::release(&pool, "s", b"held").await.unwrap(),
            Deletion::Deleted
        );
        assert!(!Sqlite::scope_known(&pool, "s").await.unwrap());
    }

    #[tokio::test]
    async fn stats_and_purges_agree_on_what_expired() {
        let pool = pool().await;
        insert(&pool, "a", b"live", 60_000, None).await;
        insert(&pool, "a", b"old", -60_000, None).await;
        insert(&pool, "a", b"held", -60_000, Some(60_000)).await; // expired, lease running
        insert(&pool, "a", b"lapsed", -60_000, Some(-1_000)).await;
        sqlx::query("INSERT INTO idem_versions (scope, entity, version) VALUES ('b', X'01', 3)")
            .execute(&pool)
            .await
            .unwrap();
        let now = Sqlite::now_ms(&pool).await.unwrap();
        let stats = Sqlite::stats(&pool, None).await.unwrap();
        assert_eq!(stats.len(), 2);
        let a = &stats[0];
        assert_eq!(
            (
                a.records,
                a.in_progress,
                a.lapsed_leases,
                a.expired,
                a.versions
            ),
            (4, 1, 1, 2, 0)
        );
        let oldest = a.oldest_processed_ms.unwrap();
        assert!((now - oldest).abs() < 60_000, "{now} {oldest}");
        assert_eq!(
            (stats[1].scope.as_str(), stats[1].records, stats[1].versions),
            ("b", 0, 1)
        );
        assert_eq!(Sqlite::stats(&pool, Some("b")).await.unwrap().len(), 1);
        let version = Sqlite::version(&pool, "b", &[1]).await.unwrap().unwrap();
        assert_eq!(version.version, 3);
        assert!((now - version.updated_ms).abs() < 60_000);

        assert_eq!(Sqlite::count_expired(&pool).await.unwrap(), 2);
        assert_eq!(Sqlite::purge_batch(&pool, 1).await.unwrap(), 1);
        assert_eq!(Sqlite::purge_batch(&pool, 10).await.unwrap(), 1);
        assert_eq!(Sqlite::count_expired(&pool).await.unwrap(), 0);
        assert!(Sqlite::record(&pool, "a", b"held").await.unwrap().is_some());
        assert!(Sqlite::record(&pool, "a", b"old").await.unwrap().is_none());
    }
}

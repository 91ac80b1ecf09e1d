//! SQLite's operator queries, where `expires_at` and `lease_until` are epoch milliseconds and
//! `processed_at`/`updated_at` ISO-8601 text.

use sqlx::Sqlite;

use crate::admin::Admin;
use crate::backend::sql::sql_methods;
use crate::backend::{named, AdminDialect, Catalog, Now, Placeholders};

impl AdminDialect for Sqlite {
    const PARAMETERS: Placeholders = Placeholders::Question;
    const NOW_MS: &'static str = now_ms!();
    const VERSION_UPDATED_MS: &'static str = text_ms!("updated_at");
    const ATTEMPT_UPDATED_MS: &'static str =
        "CAST((julianday(updated_at) - 2440587.5) * 86400000 AS INTEGER)";

    fn catalog(tables: &[&str]) -> Catalog {
        Catalog::Count(format!(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name {}",
            named(tables)
        ))
    }

    fn now() -> Now {
        Now {
            with: format!("WITH now(ms) AS (SELECT {}) ", now_ms!()),
            from: ", now".to_string(),
            at: "now.ms",
        }
    }

    fn count_where(condition: &str) -> String {
        format!("COALESCE(SUM({condition}), 0)")
    }

    fn processed_ms(expression: &str) -> String {
        format!(text_ms!("{}"), expression)
    }
}

impl Admin for Sqlite {
    sql_methods!(admin);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::Deletion;
    use sqlx::Pool;

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

//! The SQLite backend: the embedded default (a file in WAL mode, or memory).

use std::future::Future;

use sqlx::{Pool, Sqlite, SqliteConnection};

use crate::store::{Store, VersionCheck};

const MIGRATIONS: &[(i64, &str)] =
    &[(1, include_str!("../migrations/sqlite/0001_idempotency.sql"))];

/// Rows per multi-row insert: two parameters each, far below SQLite's limit of 32,766.
const SQLITE_ROWS_PER_INSERT: usize = 500;

impl Store for Sqlite {
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        async move {
            // BEGIN IMMEDIATE takes the write lock first (waiting through busy_timeout). A deferred
            // transaction that reads first fails with "database is locked" when it upgrades.
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS idem_migrations (version INTEGER PRIMARY KEY)")
                .execute(&mut *tx)
                .await?;
            for &(version, sql) in MIGRATIONS {
                let fresh = sqlx::query(
                    "INSERT INTO idem_migrations (version) VALUES (?) ON CONFLICT DO NOTHING",
                )
                .bind(version)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                if fresh {
                    sqlx::Executor::execute(&mut *tx, sql).await?;
                }
            }
            tx.commit().await
        }
    }

    fn insert_record<'c>(
        conn: &'c mut SqliteConnection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        async move {
            let inserted = sqlx::query(
                "INSERT INTO idem_records (scope, msg_key) VALUES (?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(scope)
            .bind(key)
            .execute(conn)
            .await?
            .rows_affected();
            Ok(inserted == 1)
        }
    }

    fn insert_records<'c>(
        conn: &'c mut SqliteConnection,
        records: &'c [(&'c str, &'c [u8])],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send + 'c {
        async move {
            let mut inserted: Vec<(String, Vec<u8>)> = Vec::with_capacity(records.len());
            // Multi-row inserts, within SQLite's limit of bound parameters per statement.
            for chunk in records.chunks(SQLITE_ROWS_PER_INSERT) {
                let mut sql = String::from("INSERT INTO idem_records (scope, msg_key) VALUES ");
                for i in 0..chunk.len() {
                    sql.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
                }
                sql.push_str(" ON CONFLICT DO NOTHING RETURNING scope, msg_key");
                let mut query = sqlx::query_as(&sql);
                for (scope, key) in chunk {
                    query = query.bind(*scope).bind(*key);
                }
                inserted.extend(query.fetch_all(&mut *conn).await?);
            }
            Ok(crate::store::mark_inserted(records, &inserted))
        }
    }

    fn delete_record<'c>(
        conn: &'c mut SqliteConnection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            sqlx::query("DELETE FROM idem_records WHERE scope = ? AND msg_key = ?")
                .bind(scope)
                .bind(key)
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    fn advance_version<'c>(
        conn: &'c mut SqliteConnection,
        scope: &'c str,
        entity: &'c [u8],
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c {
        async move {
            let advanced = sqlx::query(
                "INSERT INTO idem_versions (scope, entity, version) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (scope, entity) DO UPDATE \
                 SET version = excluded.version, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') \
                 WHERE idem_versions.version < excluded.version",
            )
            .bind(scope)
            .bind(entity)
            .bind(version)
            .execute(&mut *conn)
            .await?
            .rows_affected()
                == 1;
            if advanced {
                return Ok(VersionCheck::Advanced);
            }
            // The upsert above holds SQLite's write lock, so this read sees the row it conflicted with.
            let latest: i64 = sqlx::query_scalar(
                "SELECT version FROM idem_versions WHERE scope = ? AND entity = ?",
            )
            .bind(scope)
            .bind(entity)
            .fetch_one(conn)
            .await?;
            Ok(crate::store::compare(version, latest))
        }
    }
}

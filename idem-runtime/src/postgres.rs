//! The PostgreSQL backend: many consumer processes on many machines share one database.

use std::future::Future;

use sqlx::{PgConnection, Pool, Postgres};

use crate::store::{Store, VersionCheck};

const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    include_str!("../migrations/postgres/0001_idempotency.sql"),
)];

/// Key of the advisory lock that serializes concurrent `migrate` calls ("idem" in ASCII).
const MIGRATE_LOCK: i64 = 0x6964_656d;

impl Store for Postgres {
    fn migrate(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        async move {
            let mut tx = pool.begin().await?;
            // Concurrent `CREATE TABLE IF NOT EXISTS` can fail on a unique index of the catalog;
            // the transaction-scoped advisory lock makes concurrent migrations take turns.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATE_LOCK)
                .execute(&mut *tx)
                .await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS idem_migrations (version BIGINT PRIMARY KEY)")
                .execute(&mut *tx)
                .await?;
            for &(version, sql) in MIGRATIONS {
                let fresh = sqlx::query(
                    "INSERT INTO idem_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING",
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
        conn: &'c mut PgConnection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c {
        async move {
            // ON CONFLICT DO NOTHING, never a caught unique violation: in PostgreSQL an error
            // aborts the whole transaction. A concurrent insert of the same key waits here until
            // the first commits (0 rows: a duplicate) or rolls back (1 row: ours to apply).
            let inserted = sqlx::query(
                "INSERT INTO idem_records (scope, msg_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
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
        conn: &'c mut PgConnection,
        records: &'c [(&'c str, &'c [u8])],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send + 'c {
        async move {
            let scopes: Vec<&str> = records.iter().map(|(scope, _)| *scope).collect();
            let keys: Vec<&[u8]> = records.iter().map(|(_, key)| *key).collect();
            // One statement for the whole batch; a pair given twice conflicts with itself and
            // is inserted once.
            let inserted: Vec<(String, Vec<u8>)> = sqlx::query_as(
                "INSERT INTO idem_records (scope, msg_key) \
                 SELECT * FROM UNNEST($1::text[], $2::bytea[]) \
                 ON CONFLICT DO NOTHING RETURNING scope, msg_key",
            )
            .bind(&scopes)
            .bind(&keys)
            .fetch_all(conn)
            .await?;
            Ok(crate::store::mark_inserted(records, &inserted))
        }
    }

    fn delete_record<'c>(
        conn: &'c mut PgConnection,
        scope: &'c str,
        key: &'c [u8],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        async move {
            sqlx::query("DELETE FROM idem_records WHERE scope = $1 AND msg_key = $2")
                .bind(scope)
                .bind(key)
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    fn advance_version<'c>(
        conn: &'c mut PgConnection,
        scope: &'c str,
        entity: &'c [u8],
        version: i64,
    ) -> impl Future<Output = Result<VersionCheck, sqlx::Error>> + Send + 'c {
        async move {
            let advanced = sqlx::query(
                "INSERT INTO idem_versions (scope, entity, version) VALUES ($1, $2, $3) \
                 ON CONFLICT (scope, entity) DO UPDATE \
                 SET version = EXCLUDED.version, updated_at = now() \
                 WHERE idem_versions.version < EXCLUDED.version",
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
            // ON CONFLICT locked the conflicting row even though its WHERE was false, so this
            // read sees the committed version, and no one can change it before we finish.
            let latest: i64 = sqlx::query_scalar(
                "SELECT version FROM idem_versions WHERE scope = $1 AND entity = $2",
            )
            .bind(scope)
            .bind(entity)
            .fetch_one(conn)
            .await?;
            Ok(crate::store::compare(version, latest))
        }
    }
}

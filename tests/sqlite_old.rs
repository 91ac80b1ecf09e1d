//! The behaviour suite on SQLite (a file in WAL mode): nothing to install.

mod common;

type Db = sqlx::Sqlite;

async fn database() -> Option<sqlx::Pool<Db>> {
    Some(common::sqlite().await)
}

async fn release(pool: sqlx::Pool<Db>) {
    pool.close().await;
}

/// Inserts `$1` records in scope `$2` whose retention ends `$3` days from now (negative: expired).
const FILL_RECORDS: &str =
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
     INSERT INTO idem_records (scope, msg_key, expires_at) \
     SELECT $2, CAST('k' || i AS BLOB), \
            CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + $3 * 86400000 FROM n";

#[path = "suite/mod.rs"]
mod suite;

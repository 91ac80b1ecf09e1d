//! Bad input, widened, on every backend (SQLite; PostgreSQL and MariaDB when their feature is on
//! and their server answers): scopes at and over the documented limit, a NUL in a scope, a
//! retention of 100 years, batches of 0, 1 and 50,000 messages, a pool closed mid-run, and a
//! handler future dropped by a timeout mid-flight. Each asserts the rows of the effects table,
//! `idem_records` and `idem_versions`: a clear error or the right outcome, and nothing written
//! that should not be.
//!
//! Already covered elsewhere, not repeated here: keys and entities at and over 512 bytes,
//! versions `i64::MIN`/`i64::MAX` and unsigned overflow (`idem-testkit`'s `bad_input__*` rules, on
//! all three backends), a retention and a lease of 0 (refused by the attribute at compile time:
//! `idem-ui/tests/ui/fail/bad_literals.rs`). The body is `tests/reliability/bad_input.rs`, included once
//! per backend.

mod common;

mod sqlite {
    use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

    type Db = sqlx::Sqlite;
    const BACKEND: &str = "sqlite";
    const EXPIRES_IN_DAYS: &str =
        "SELECT (expires_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) \
         / 86400000 FROM idem_records WHERE scope = 'bad_input::century'";
    const SERVER_SLEEP: &str =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000000) \
         SELECT COUNT(*) FROM c";

    /// A migrated database in a new file.
    async fn database() -> Option<SqlitePool> {
        Some(crate::common::sqlite().await)
    }

    /// Another pool on the same file.
    async fn reopen(pool: &SqlitePool) -> SqlitePool {
        crate::common::sqlite_file(pool.connect_options().get_filename()).await
    }

    /// A pool of one connection on the same file.
    async fn one_connection(pool: &SqlitePool) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(20))
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap()
    }

    async fn release(pool: SqlitePool) {
        let path = pool.connect_options().get_filename().to_path_buf();
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    include!("reliability/bad_input.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    use sqlx::postgres::{PgPool, PgPoolOptions};

    type Db = sqlx::Postgres;
    const BACKEND: &str = "postgres";
    const EXPIRES_IN_DAYS: &str =
        "SELECT CAST(EXTRACT(EPOCH FROM (expires_at - now())) / 86400 AS BIGINT) \
         FROM idem_records WHERE scope = 'bad_input::century'";
    const SERVER_SLEEP: &str = "SELECT pg_sleep(3)";

    /// A migrated schema of its own on the shared server.
    async fn database() -> Option<PgPool> {
        crate::common::postgres().await
    }

    /// Another pool on the same schema.
    async fn reopen(pool: &PgPool) -> PgPool {
        let options = crate::common::postgres_options(pool, &[]).await;
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .unwrap()
    }

    /// A pool of one connection on the same schema.
    async fn one_connection(pool: &PgPool) -> PgPool {
        let options = crate::common::postgres_options(pool, &[]).await;
        PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(20))
            .connect_with(options)
            .await
            .unwrap()
    }

    async fn release(pool: PgPool) {
        crate::common::drop_postgres(pool).await;
    }

    include!("reliability/bad_input.rs");
}

#[cfg(feature = "mysql")]
mod mysql {
    use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

    type Db = sqlx::MySql;
    const BACKEND: &str = "mysql";
    const EXPIRES_IN_DAYS: &str =
        "SELECT CAST((expires_at - TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
         UTC_TIMESTAMP(6)) DIV 1000) DIV 86400000 AS SIGNED) FROM idem_records \
         WHERE scope = 'bad_input::century'";
    const SERVER_SLEEP: &str = "SELECT SLEEP(3)";

    /// A migrated database of its own on the shared server.
    async fn database() -> Option<MySqlPool> {
        crate::common::mysql().await
    }

    /// Another pool on the same database.
    async fn reopen(pool: &MySqlPool) -> MySqlPool {
        let options = crate::common::mysql_options(pool).await;
        MySqlPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .unwrap()
    }

    /// A pool of one connection on the same database.
    async fn one_connection(pool: &MySqlPool) -> MySqlPool {
        let options = crate::common::mysql_options(pool).await;
        MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(20))
            .connect_with(options)
            .await
            .unwrap()
    }

    async fn release(pool: MySqlPool) {
        crate::common::drop_mysql(pool).await;
    }

    include!("reliability/bad_input.rs");
}

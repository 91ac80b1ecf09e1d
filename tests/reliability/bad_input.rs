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
//! `idem-ui/tests/ui/fail/bad_literals.rs`). The rules are `bad_input/rules.rs`, included once
//! per backend.

mod sqlite {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

    type Db = sqlx::Sqlite;
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

    /// The options of a connection to the same file.
    async fn options(pool: &SqlitePool) -> SqliteConnectOptions {
        (*pool.connect_options()).clone()
    }

    async fn release(pool: SqlitePool) {
        let path = pool.connect_options().get_filename().to_path_buf();
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    include!("bad_input/rules.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    use sqlx::postgres::{PgConnectOptions, PgPool};

    type Db = sqlx::Postgres;
    const EXPIRES_IN_DAYS: &str =
        "SELECT CAST(EXTRACT(EPOCH FROM (expires_at - now())) / 86400 AS BIGINT) \
         FROM idem_records WHERE scope = 'bad_input::century'";
    const SERVER_SLEEP: &str = "SELECT pg_sleep(3)";

    /// A migrated schema of its own on the shared server.
    async fn database() -> Option<PgPool> {
        crate::common::postgres().await
    }

    /// The options of a connection to the same schema.
    async fn options(pool: &PgPool) -> PgConnectOptions {
        crate::common::postgres_options(pool, &[]).await
    }

    async fn release(pool: PgPool) {
        crate::common::drop_postgres(pool).await;
    }

    include!("bad_input/rules.rs");
}

#[cfg(feature = "mysql")]
mod mysql {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPool};

    type Db = sqlx::MySql;
    const EXPIRES_IN_DAYS: &str =
        "SELECT CAST((expires_at - TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', \
         UTC_TIMESTAMP(6)) DIV 1000) DIV 86400000 AS SIGNED) FROM idem_records \
         WHERE scope = 'bad_input::century'";
    const SERVER_SLEEP: &str = "SELECT SLEEP(3)";

    /// A migrated database of its own on the shared server.
    async fn database() -> Option<MySqlPool> {
        crate::common::mysql().await
    }

    /// The options of a connection to the same database.
    async fn options(pool: &MySqlPool) -> MySqlConnectOptions {
        crate::common::mysql_options(pool).await
    }

    async fn release(pool: MySqlPool) {
        crate::common::drop_mysql(pool).await;
    }

    include!("bad_input/rules.rs");
}

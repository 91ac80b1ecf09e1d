//! Bad input, widened, on every backend (SQLite; PostgreSQL and MariaDB when their feature is on,
//! ignored, saying so, when the crate was built without their server's variable): scopes at and
//! over the documented limit, a NUL in a scope, a retention of 100 years, batches of 0, 1 and
//! 50,000 messages, a pool closed mid-run, and a handler future dropped by a timeout mid-flight.
//! Each asserts the rows of the effects table, `idem_records` and `idem_versions`: a clear error
//! or the right outcome, and nothing written that should not be.
//!
//! Already covered elsewhere, not repeated here: keys and entities at and over 512 bytes,
//! versions `i64::MIN`/`i64::MAX` and unsigned overflow (`idem-testkit`'s `bad_input__*` rules, on
//! all three backends), a retention and a lease of 0 (refused by the attribute at compile time:
//! `idem-ui/tests/ui/fail/bad_literals.rs`). The rules are `bad_input/rules.rs`, included once
//! per backend (`backend!`).

/// In a backend's module: the rules of `bad_input/rules.rs` (module `rules`) and a test per
/// rule, ignored with the reason when the cfg given holds (the backend's server was not named at
/// build time).
macro_rules! backend {
    ($($absent:ident = $why:literal)?) => {
        mod rules {
            use super::*;

            include!("bad_input/rules.rs");
        }

        backend!(@tests [$($absent = $why)?];
            [tokio::test] scopes_at_the_limit_are_stored_and_over_it_refused,
            [tokio::test] a_nul_in_a_scope_is_refused,
            [tokio::test] a_retention_of_a_hundred_years_is_kept,
            [tokio::test] batches_of_zero_one_and_fifty_thousand,
            [tokio::test(flavor = "multi_thread", worker_threads = 2)]
            a_pool_closed_mid_run_leaves_nothing_half_done,
            [tokio::test] a_handler_dropped_by_a_timeout_leaves_nothing_and_the_pool_serves_on,
        );
    };
    (@tests $absent:tt;) => {};
    (@tests [$($absent:ident = $why:literal)?]; [$($test:tt)*] $name:ident, $($rest:tt)*) => {
        #[$($test)*]
        $(#[cfg_attr($absent, ignore = $why)])?
        async fn $name() {
            rules::$name().await
        }

        backend!(@tests [$($absent = $why)?]; $($rest)*);
    };
}

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

    backend!();
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

    backend!(
        idem_no_postgres =
            "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
    );
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

    backend!(idem_no_mysql = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run");
}

//! Migration 0002 of the handler options (`fingerprint`, `replay`, `max_attempts`) on SQLite,
//! PostgreSQL and MySQL / MariaDB: a database created by 0001 migrates and its records still
//! dedupe. The options' behaviour on every path is in the conformance kit (`idem-testkit`:
//! `replay__`, `fingerprint__`, `attempts__`, `metrics__`, `lease_versions__`), run on every
//! backend. Each rule is one async fn in `handler_features/rules.rs`, generic over the backend
//! through `Db` (and `sql`, the backend's placeholders); `backend_tests!` runs every rule on each
//! backend, and every rule asserts the database's state.

mod common;

/// One `#[tokio::test]` per rule, on the backend of the module it is used in; ignored with the
/// reason when the cfg in the brackets holds (the backend's server was not named at build time).
macro_rules! backend_tests {
    ($absent:tt;) => {};
    ([$($cfg:ident = $why:literal)?]; $rule:ident $(, $rest:ident)* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[cfg_attr($cfg, ignore = $why)])?
        async fn $rule() {
            let Some(pool) = database().await else { return };
            rules::$rule(&pool).await;
            release(pool).await;
        }
        backend_tests!([$($cfg = $why)?]; $($rest),*);
    };
}

/// The rules for the backend of the module it is used in, and every rule, once per backend
/// (ignored, as [`backend_tests`] says, when the cfg in the brackets holds).
macro_rules! all_rules {
    ($absent:tt) => {
        mod rules {
            use super::{old_database, release_old, Db, MIGRATION_0001};
            include!("handler_features/rules.rs");
        }

        backend_tests!($absent; an_old_schema_migrates_and_its_records_still_dedupe);
    };
}

/// Drops idem's tables from a migrated database, for 0001 to create them again as idem 0.1 did.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn drop_idem_tables<DB: sqlx::Database>(pool: &sqlx::Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS idem_records, idem_versions, idem_attempts, idem_migrations",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The rules' SQL as written (`$1` placeholders, standard casts): SQLite's and PostgreSQL's.
fn as_written(sql: &'static str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.to_string())
}

mod sqlite {
    type Db = sqlx::Sqlite;

    use super::as_written as sql;

    async fn database() -> Option<sqlx::Pool<Db>> {
        Some(super::common::sqlite().await)
    }

    /// A database with only migration 0001 applied, as idem 0.1 left it.
    async fn old_database() -> sqlx::Pool<Db> {
        let path = super::common::temp_db("idem_old");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        sqlx::SqlitePool::connect_with(options).await.unwrap()
    }

    const MIGRATION_0001: &str =
        include_str!("../idem-runtime/migrations/sqlite/0001_idempotency.sql");

    async fn release(pool: sqlx::Pool<Db>) {
        pool.close().await;
    }

    /// The old database's file is in the temporary directory, like every test database's.
    async fn release_old(pool: sqlx::Pool<Db>) {
        pool.close().await;
    }

    all_rules!([]);
}

#[cfg(feature = "postgres")]
mod postgres {
    type Db = sqlx::Postgres;

    use super::as_written as sql;

    async fn database() -> Option<sqlx::Pool<Db>> {
        super::common::postgres().await
    }

    /// A schema of its own with only migration 0001 applied, as idem 0.1 left it.
    async fn old_database() -> sqlx::Pool<Db> {
        let pool = super::common::postgres().await.expect("PostgreSQL");
        super::drop_idem_tables(&pool).await;
        pool
    }

    const MIGRATION_0001: &str =
        include_str!("../idem-runtime/migrations/postgres/0001_idempotency.sql");

    async fn release(pool: sqlx::Pool<Db>) {
        super::common::drop_postgres(pool).await;
    }

    /// The old database is a schema of its own: dropped like any test schema.
    async fn release_old(pool: sqlx::Pool<Db>) {
        super::common::drop_postgres(pool).await;
    }

    all_rules!([idem_no_postgres =
        "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"]);
}

#[cfg(feature = "mysql")]
mod mysql {
    type Db = sqlx::MySql;

    /// The rules' SQL in MySQL's words: `?` placeholders (the rules bind in order), and
    /// `SIGNED` for the BIGINT cast MariaDB does not name.
    fn sql(sql: &'static str) -> sqlx::AssertSqlSafe<String> {
        let mut out = sql.replace("AS BIGINT", "AS SIGNED");
        for n in (1..10).rev() {
            out = out.replace(&format!("${n}"), "?");
        }
        sqlx::AssertSqlSafe(out)
    }

    async fn database() -> Option<sqlx::Pool<Db>> {
        super::common::mysql().await
    }

    /// The databases `old_database` made, for `release` to drop.
    static OLD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    /// A database of its own with only migration 0001 applied, as idem 0.1 left it.
    async fn old_database() -> sqlx::Pool<Db> {
        let pool = super::common::mysql().await.expect("MySQL / MariaDB");
        let name: String = sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(&pool)
            .await
            .unwrap();
        OLD.lock().unwrap().push(name);
        super::drop_idem_tables(&pool).await;
        pool
    }

    const MIGRATION_0001: &str =
        include_str!("../idem-runtime/migrations/mysql/0001_idempotency.sql");

    /// `release` drops the old databases (`OLD`) once the rule is done.
    async fn release_old(pool: sqlx::Pool<Db>) {
        pool.close().await;
    }

    async fn release(pool: sqlx::Pool<Db>) {
        let old = std::mem::take(&mut *OLD.lock().unwrap());
        for name in old {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name}"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
        super::common::drop_mysql(pool).await;
    }

    all_rules!([
        idem_no_mysql = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
    ]);
}

//! The `idem` binary against SQLite files populated by real `#[idempotent]` handlers.

mod common;

type Db = sqlx::Sqlite;

/// A fresh database: its URL for the binary, a pool for the test, and how to clean up.
struct TestDb {
    url: String,
    pool: sqlx::Pool<Db>,
    path: std::path::PathBuf,
}

impl TestDb {
    async fn close(self) {
        self.pool.close().await;
        common::remove_sqlite(&self.path);
    }
}

/// A new, empty database file (no tables yet).
async fn empty() -> Option<TestDb> {
    let (url, path) = common::sqlite_url();
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    let pool = sqlx::SqlitePool::connect_with(
        options
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(30)),
    )
    .await
    .unwrap();
    Some(TestDb { url, pool, path })
}

/// The suite's SQL as written (`$1` placeholders).
fn sql(sql: &'static str) -> &'static str {
    sql
}

/// A bound epoch-milliseconds parameter as the recovery tables store times.
fn time(param: &str) -> String {
    param.to_string()
}

/// A statement the suite builds, as written (`$1` placeholders).
fn query(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

#[macro_use]
#[path = "suite/mod.rs"]
mod scenarios;

suite!();

//! The `idem` binary against MySQL / MariaDB (`IDEM_MYSQL_URL`), a new database per test,
//! populated by real `#[idempotent]` handlers.

mod common;

type Db = sqlx::MySql;

/// A fresh database: the URL for the binary, a pool for the test, and how to clean up.
struct TestDb {
    url: String,
    pool: sqlx::Pool<Db>,
}

impl TestDb {
    async fn close(self) {
        common::drop_database(self.pool).await;
    }
}

/// A new, empty database (no tables yet), or `None` when there is no server (outside CI).
async fn empty() -> Option<TestDb> {
    let (pool, url) = common::mysql_database().await?;
    Some(TestDb { url, pool })
}

/// The suite's SQL with MySQL's `?` placeholders (the suite binds in order).
fn sql(sql: &'static str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.replace("$1", "?").replace("$2", "?"))
}

/// A bound epoch-milliseconds parameter as the recovery tables store times.
fn time(param: &str) -> String {
    param.to_string()
}

/// A statement the suite builds, with MySQL's `?` for each `$N` (the suite binds in order).
fn query(sql: String) -> sqlx::AssertSqlSafe<String> {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    sqlx::AssertSqlSafe(out)
}

#[macro_use]
#[path = "suite/mod.rs"]
mod scenarios;

suite!(idem_no_mysql = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run");

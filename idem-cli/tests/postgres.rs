//! The `idem` binary against PostgreSQL (`IDEM_POSTGRES_URL`), a new schema per test,
//! populated by real `#[idempotent]` handlers.

mod common;

type Db = sqlx::Postgres;

/// A fresh schema: the URL for the binary, a pool for the test, and how to clean up.
struct TestDb {
    url: String,
    pool: sqlx::Pool<Db>,
    schema: String,
}

impl TestDb {
    async fn close(self) {
        common::drop_schema(self.pool, &self.schema).await;
    }
}

/// A new, empty schema (no tables yet), or `None` when there is no server (outside CI).
async fn empty() -> Option<TestDb> {
    let (pool, schema) = common::postgres_schema().await?;
    let url = common::with_schema(&common::postgres_url(), &schema);
    Some(TestDb { url, pool, schema })
}

/// The suite's SQL as written (`$1` placeholders).
fn sql(sql: &'static str) -> &'static str {
    sql
}

/// A bound epoch-milliseconds parameter as the recovery tables store times (`TIMESTAMPTZ`).
fn time(param: &str) -> String {
    format!("to_timestamp({param}::BIGINT / 1000.0)")
}

/// A statement the suite builds, as written (`$1` placeholders).
fn query(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

#[macro_use]
#[path = "suite/mod.rs"]
mod scenarios;

suite!(
    idem_no_postgres =
        "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
);

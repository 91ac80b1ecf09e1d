//! The behaviour suite on PostgreSQL (`IDEM_POSTGRES_URL`, default the local server), one schema per test.

mod common;

type Db = sqlx::Postgres;

async fn database() -> Option<sqlx::Pool<Db>> {
    common::postgres().await
}

async fn release(pool: sqlx::Pool<Db>) {
    common::drop_postgres(pool).await;
}

/// Inserts `$1` records in scope `$2` whose retention ends `$3` days from now (negative: expired).
const FILL_RECORDS: &str = "INSERT INTO idem_records (scope, msg_key, expires_at) \
     SELECT $2, convert_to('k' || i, 'UTF8'), now() + $3::int * interval '1 day' \
     FROM generate_series(1, $1) AS i";

#[path = "suite/mod.rs"]
mod suite;

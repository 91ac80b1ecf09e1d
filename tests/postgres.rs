//! The behaviour suite on PostgreSQL (`IDEM_POSTGRES_URL`, default the local server), one schema per test.

mod common;

type Db = sqlx::Postgres;

async fn database() -> Option<sqlx::Pool<Db>> {
    common::postgres().await
}

async fn release(pool: sqlx::Pool<Db>) {
    common::drop_postgres(pool).await;
}

#[path = "suite/mod.rs"]
mod suite;

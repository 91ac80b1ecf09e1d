//! The behaviour suite on SQLite (a file in WAL mode): nothing to install.

mod common;

type Db = sqlx::Sqlite;

async fn database() -> Option<sqlx::Pool<Db>> {
    Some(common::sqlite().await)
}

async fn release(pool: sqlx::Pool<Db>) {
    pool.close().await;
}

#[path = "suite/mod.rs"]
mod suite;

//! What the pass cases share (each includes it with `#[path = "../support.rs"] mod support;`).
#![allow(dead_code)]

use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

/// An in-memory SQLite database on one connection (the database lives in its connection).
pub async fn connect() -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap()
}

/// [`connect`], with idem's tables.
pub async fn pool() -> SqlitePool {
    let pool = connect().await;
    idem::migrate(&pool).await.unwrap();
    pool
}

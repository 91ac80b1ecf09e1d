//! Bad input, on SQLite and on PostgreSQL: empty, huge, NUL-bearing, non-UTF-8 and unicode keys,
//! extreme and negative versions, a `u64` over `i64::MAX`, and keys and a scope full of SQL
//! metacharacters. Each is either refused with a clear `idem::Error::Key` before anything is
//! written, or handled exactly (stored byte for byte, deduplicated); never a panic, never a
//! partial write: every test asserts the tables.
//!
//! The body is `tests/reliability/bad_input.rs`, included once per backend with its own `Db`.

mod common;

mod sqlite {
    type Db = sqlx::Sqlite;

    async fn database() -> Option<sqlx::Pool<Db>> {
        Some(crate::common::sqlite().await)
    }

    async fn release(pool: sqlx::Pool<Db>) {
        pool.close().await;
    }

    include!("reliability/bad_input.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    type Db = sqlx::Postgres;

    async fn database() -> Option<sqlx::Pool<Db>> {
        crate::common::postgres().await
    }

    async fn release(pool: sqlx::Pool<Db>) {
        crate::common::drop_postgres(pool).await;
    }

    include!("reliability/bad_input.rs");
}

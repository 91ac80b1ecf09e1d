//! Cutting a database connection from the server's side, from another connection, and waiting
//! until it is gone, so that nothing of it can still commit.

use std::time::Duration;

/// Ends PostgreSQL backend `pid` (`pg_terminate_backend`) and waits until it is gone.
#[cfg(feature = "postgres")]
pub async fn terminate_backend(pool: &sqlx::PgPool, pid: i32) {
    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(done, "pg_terminate_backend({pid})");
    let alive = "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1";
    for _ in 0..500 {
        let n: i64 = sqlx::query_scalar(alive)
            .bind(pid)
            .fetch_one(pool)
            .await
            .unwrap();
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} still alive after pg_terminate_backend");
}

/// Ends MariaDB/MySQL connection `id` (`KILL CONNECTION`) and waits until it is gone.
#[cfg(feature = "mysql")]
pub async fn kill_connection(pool: &sqlx::MySqlPool, id: u64) {
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
        .execute(pool)
        .await
        .unwrap();
    let alive = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?";
    for _ in 0..500 {
        let n: i64 = sqlx::query_scalar(alive)
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("connection {id} still alive after KILL CONNECTION");
}

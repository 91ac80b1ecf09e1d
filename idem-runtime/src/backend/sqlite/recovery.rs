//! Parked retries and dead letters on SQLite. Times are epoch milliseconds of this process's
//! clock (`clock`, which is SQLite's), read once a call and bound. One writer at a time: a
//! statement that writes holds the database's write lock from its start, so `take_due` is one
//! `UPDATE … RETURNING` that no other connection can interleave with.

use std::future::Future;

use sqlx::{Pool, Sqlite, Transaction};

use super::clock;
use crate::backend::recovery::{recovery_store, Clock, RecoveryDialect, RecoverySql};

impl RecoveryDialect for Sqlite {
    fn clock() -> Clock {
        Clock::Bound(clock::now_ms())
    }
}

impl RecoverySql for Sqlite {
    /// The write lock first (waiting through busy_timeout), as `migrate` does.
    fn begin_write(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin_with("BEGIN IMMEDIATE")
    }
}

recovery_store!(Sqlite);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::dead_letters::Binds;
    use std::time::Duration;

    #[tokio::test]
    async fn taking_due_rows_searches_the_due_index() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        crate::migrate(&pool).await.unwrap();
        let mut binds = Binds::<Sqlite>::new();
        let sql =
            Sqlite::take_due_sql(&mut binds, Clock::Bound(0), "c", 1, Duration::ZERO, 1).unwrap();
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as_with(
            sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")),
            binds.into_arguments(),
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let steps: Vec<String> = plan.into_iter().map(|(.., detail)| detail).collect();
        assert!(
            steps
                .iter()
                .any(|s| s.contains("USING INDEX idem_parked_due")),
            "{steps:?}"
        );
    }
}

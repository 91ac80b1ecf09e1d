//! Parked retries and dead letters on SQLite. Times are epoch milliseconds of this process's
//! clock (`clock`, which is SQLite's), read once a call and bound. One writer at a time: a
//! statement that writes holds the database's write lock from its start, so `take_due` is one
//! `UPDATE … RETURNING` that no other connection can interleave with.

use std::time::Duration;

use sqlx::{Pool, Sqlite, SqliteConnection};

use super::clock;
use crate::backend::span_ms;
use crate::recover::stored::{
    check_dead_letter, check_failure, stored_attempts, stored_text, taken, ParkedRow,
};
use crate::recover::{Failure, NewDeadLetter, Parked, RecoveryStore};

/// The rows of `?1` (consumer) due at `?2` (now) and not held, oldest due first, at most `?3`,
/// held until `?4` under `?5`.
const TAKE_DUE: &str = "UPDATE idem_parked SET lease_until = ?, lease_token = ? \
     WHERE id IN (SELECT id FROM idem_parked \
                  WHERE consumer = ? AND due_at <= ? AND (lease_until IS NULL OR lease_until < ?) \
                  ORDER BY due_at, id LIMIT ?) \
     RETURNING id, payload, headers, broker, source, coordinates, destination, attempts, \
               last_error, first_failed_at, due_at";

/// `now` plus a duration, in epoch milliseconds.
fn after(now: i64, span: Duration) -> i64 {
    now.saturating_add(span_ms(span))
}

impl RecoveryStore for Sqlite {
    async fn park<'a>(
        pool: &'a Pool<Self>,
        failure: &'a Failure<'a>,
        due_in: Duration,
    ) -> Result<i64, sqlx::Error> {
        let stored = check_failure(failure)?;
        let now = clock::now_ms();
        let origin = failure.origin;
        sqlx::query_scalar(
            "INSERT INTO idem_parked (consumer, payload, headers, broker, source, coordinates, \
             destination, attempts, last_error, first_failed_at, due_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(failure.consumer)
        .bind(failure.payload)
        .bind(stored.headers)
        .bind(&origin.broker)
        .bind(&origin.source)
        .bind(&origin.coordinates)
        .bind(&origin.destination)
        .bind(stored_attempts(failure.attempts))
        .bind(&*stored.error)
        .bind(failure.first_failed_ms.unwrap_or(now))
        .bind(after(now, due_in))
        .fetch_one(pool)
        .await
    }

    async fn take_due<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> Result<Vec<Parked>, sqlx::Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let now = clock::now_ms();
        let rows: Vec<ParkedRow> = sqlx::query_as(TAKE_DUE)
            .bind(after(now, lease))
            .bind(token)
            .bind(consumer)
            .bind(now)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
        Ok(taken(rows, token))
    }

    async fn unpark(conn: &mut SqliteConnection, id: i64, token: i64) -> Result<bool, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM idem_parked WHERE id = ? AND lease_token = ?")
            .bind(id)
            .bind(token)
            .execute(conn)
            .await?
            .rows_affected();
        Ok(deleted == 1)
    }

    async fn repark<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        token: i64,
        attempts: u32,
        error: &'a str,
        due_in: Duration,
    ) -> Result<bool, sqlx::Error> {
        let error = stored_text("error", error)?;
        let now = clock::now_ms();
        let changed = sqlx::query(
            "UPDATE idem_parked SET attempts = ?, last_error = ?, due_at = ?, \
             lease_until = NULL, lease_token = NULL WHERE id = ? AND lease_token = ?",
        )
        .bind(stored_attempts(attempts))
        .bind(&*error)
        .bind(after(now, due_in))
        .bind(id)
        .bind(token)
        .execute(pool)
        .await?
        .rows_affected();
        Ok(changed == 1)
    }

    async fn release_parked(pool: &Pool<Self>, id: i64, token: i64) -> Result<bool, sqlx::Error> {
        let changed = sqlx::query(
            "UPDATE idem_parked SET lease_until = NULL, lease_token = NULL \
             WHERE id = ? AND lease_token = ?",
        )
        .bind(id)
        .bind(token)
        .execute(pool)
        .await?
        .rows_affected();
        Ok(changed == 1)
    }

    async fn bury<'a>(
        pool: &'a Pool<Self>,
        dead: &'a NewDeadLetter<'a>,
        parked: Option<(i64, i64)>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (stored, shape) = check_dead_letter(dead)?;
        // The write lock first (waiting through busy_timeout), as `migrate` does.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some((id, token)) = parked {
            if !Self::unpark(&mut *tx, id, token).await? {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let now = clock::now_ms();
        let failure = &dead.failure;
        let origin = failure.origin;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, error_shape, \
             error_group, payload, headers, broker, source, coordinates, destination, attempts, \
             first_failed_at, last_failed_at, state) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'dead') RETURNING id",
        )
        .bind(failure.consumer)
        .bind(dead.scope)
        .bind(dead.key)
        .bind(dead.reason)
        .bind(&*stored.error)
        .bind(&*shape)
        .bind(dead.group)
        .bind(failure.payload)
        .bind(stored.headers)
        .bind(&origin.broker)
        .bind(&origin.source)
        .bind(&origin.coordinates)
        .bind(&origin.destination)
        .bind(stored_attempts(failure.attempts))
        .bind(failure.first_failed_ms.unwrap_or(now))
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(id))
    }

    async fn last_error<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> Result<Option<String>, sqlx::Error> {
        let last: Option<Option<String>> = sqlx::query_scalar(
            "SELECT last_error FROM idem_attempts WHERE scope = ? AND msg_key = ?",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(pool)
        .await?;
        Ok(last.flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_past_the_columns_range_is_capped() {
        assert_eq!(after(1_000, Duration::from_millis(250)), 1_250);
        assert_eq!(after(1_000, Duration::MAX), 1_000 + i64::MAX / 2);
        assert_eq!(after(i64::MAX / 2 + 5, Duration::MAX), i64::MAX);
    }

    #[tokio::test]
    async fn taking_due_rows_searches_the_due_index() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        crate::migrate(&pool).await.unwrap();
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {TAKE_DUE}"
        )))
        .bind(0_i64)
        .bind(1_i64)
        .bind("c")
        .bind(0_i64)
        .bind(0_i64)
        .bind(1_i64)
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

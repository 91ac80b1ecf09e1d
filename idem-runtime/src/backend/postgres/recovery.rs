//! Parked retries and dead letters on PostgreSQL. Times are `TIMESTAMPTZ` of the server's clock
//! (`now()`), read back as epoch milliseconds. Consumers on many machines take due rows with
//! `FOR UPDATE SKIP LOCKED`, so two of them never take the same row, nor wait on each other.

use std::time::Duration;

use sqlx::{PgConnection, Pool, Postgres};

use crate::backend::span_ms;
use crate::recover::stored::{
    check_dead_letter, check_failure, stored_attempts, stored_text, taken, ParkedRow,
};
use crate::recover::{Failure, NewDeadLetter, Parked, RecoveryStore};

/// A bound epoch-milliseconds parameter as a `TIMESTAMPTZ` (exact to the millisecond), or now
/// when it is NULL.
macro_rules! ms_or_now {
    ($param:literal) => {
        concat!(
            "COALESCE(TIMESTAMPTZ 'epoch' + ",
            $param,
            " * INTERVAL '1 millisecond', now())"
        )
    };
}

impl RecoveryStore for Postgres {
    async fn park<'a>(
        pool: &'a Pool<Self>,
        failure: &'a Failure<'a>,
        due_in: Duration,
    ) -> Result<i64, sqlx::Error> {
        let stored = check_failure(failure)?;
        let origin = failure.origin;
        sqlx::query_scalar(concat!(
            "INSERT INTO idem_parked (consumer, payload, headers, broker, source, coordinates, \
             destination, attempts, last_error, first_failed_at, due_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, ",
            ms_or_now!("$10"),
            ", now() + $11 * INTERVAL '1 millisecond') RETURNING id"
        ))
        .bind(failure.consumer)
        .bind(failure.payload)
        .bind(stored.headers)
        .bind(&origin.broker)
        .bind(&origin.source)
        .bind(&origin.coordinates)
        .bind(&origin.destination)
        .bind(stored_attempts(failure.attempts))
        .bind(&*stored.error)
        .bind(failure.first_failed_ms)
        .bind(span_ms(due_in))
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
        // The inner SELECT locks the rows it picks and skips those another taker holds; a row
        // another taker changed after this statement's snapshot is checked again, as it is now,
        // before it is locked (a row just taken is no longer "not held", and is left out).
        let rows: Vec<ParkedRow> = sqlx::query_as(concat!(
            "UPDATE idem_parked SET lease_until = now() + $1 * INTERVAL '1 millisecond', \
             lease_token = $2 \
             WHERE id IN (SELECT id FROM idem_parked \
                          WHERE consumer = $3 AND due_at <= now() \
                            AND (lease_until IS NULL OR lease_until < now()) \
                          ORDER BY due_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) \
             RETURNING id, payload, headers, broker, source, coordinates, destination, \
                       attempts::BIGINT, last_error, ",
            ms!("first_failed_at"),
            ", ",
            ms!("due_at")
        ))
        .bind(span_ms(lease))
        .bind(token)
        .bind(consumer)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
        Ok(taken(rows, token))
    }

    async fn unpark(conn: &mut PgConnection, id: i64, token: i64) -> Result<bool, sqlx::Error> {
        let deleted = sqlx::query("DELETE FROM idem_parked WHERE id = $1 AND lease_token = $2")
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
        let changed = sqlx::query(
            "UPDATE idem_parked SET attempts = $3, last_error = $4, \
             due_at = now() + $5 * INTERVAL '1 millisecond', \
             lease_until = NULL, lease_token = NULL WHERE id = $1 AND lease_token = $2",
        )
        .bind(id)
        .bind(token)
        .bind(stored_attempts(attempts))
        .bind(&*error)
        .bind(span_ms(due_in))
        .execute(pool)
        .await?
        .rows_affected();
        Ok(changed == 1)
    }

    async fn release_parked(pool: &Pool<Self>, id: i64, token: i64) -> Result<bool, sqlx::Error> {
        let changed = sqlx::query(
            "UPDATE idem_parked SET lease_until = NULL, lease_token = NULL \
             WHERE id = $1 AND lease_token = $2",
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
        let mut tx = pool.begin().await?;
        if let Some((id, token)) = parked {
            if !Self::unpark(&mut *tx, id, token).await? {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let failure = &dead.failure;
        let origin = failure.origin;
        let id: i64 = sqlx::query_scalar(concat!(
            "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, error_shape, \
             error_group, payload, headers, broker, source, coordinates, destination, attempts, \
             first_failed_at, last_failed_at, state) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, ",
            ms_or_now!("$15"),
            ", now(), 'dead') RETURNING id"
        ))
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
        .bind(failure.first_failed_ms)
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
            "SELECT last_error FROM idem_attempts WHERE scope = $1 AND msg_key = $2",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(pool)
        .await?;
        Ok(last.flatten())
    }
}

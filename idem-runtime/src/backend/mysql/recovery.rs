//! Parked retries and dead letters on MySQL/MariaDB. Times are epoch milliseconds of the
//! server's UTC clock (`now_ms!`). Consumers take due rows in a short READ COMMITTED
//! transaction, `SELECT … FOR UPDATE SKIP LOCKED` then `UPDATE` (MySQL 8, MariaDB 10.6+), so two
//! of them never take the same row, nor wait on each other. New ids are the statement's
//! `LAST_INSERT_ID()` (MySQL has no `INSERT … RETURNING`).

use std::time::Duration;

use sqlx::mysql::MySqlQueryResult;
use sqlx::{Connection as _, MySql, MySqlConnection, Pool};

use super::MYSQL_ROWS_PER_STATEMENT;
use crate::backend::{row_list, span_ms};
use crate::recover::stored::{
    check_dead_letter, check_failure, stored_attempts, stored_text, taken, ParkedRow,
};
use crate::recover::{Failure, NewDeadLetter, Parked, RecoveryStore};

/// The id an `INSERT` gave its row.
fn inserted_id(result: &MySqlQueryResult) -> Result<i64, sqlx::Error> {
    i64::try_from(result.last_insert_id()).map_err(|_| {
        sqlx::Error::Protocol(format!(
            "idem: the server gave the new row id {}, past a BIGINT",
            result.last_insert_id()
        ))
    })
}

impl RecoveryStore for MySql {
    async fn park<'a>(
        pool: &'a Pool<Self>,
        failure: &'a Failure<'a>,
        due_in: Duration,
    ) -> Result<i64, sqlx::Error> {
        let stored = check_failure(failure)?;
        let origin = failure.origin;
        // UTC_TIMESTAMP(6) is fixed for the statement: both times see the same now.
        let result = sqlx::query(concat!(
            "INSERT INTO idem_parked (consumer, payload, headers, broker, source, coordinates, \
             destination, attempts, last_error, first_failed_at, due_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, ",
            now_ms!(),
            "), ",
            now_ms!(),
            " + ?)"
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
        .execute(pool)
        .await?;
        inserted_id(&result)
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
        let mut conn = pool.acquire().await?;
        // For the next transaction of this session only: READ COMMITTED takes no gap locks on
        // the due index, which would hold back `park`'s inserts until this commits.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        let mut tx = conn.begin().await?;
        // A locking read sees the latest committed rows: one another taker just leased is no
        // longer "not held" and is left out; one it holds now is skipped.
        let rows: Vec<ParkedRow> = sqlx::query_as(concat!(
            "SELECT id, payload, headers, broker, source, coordinates, destination, attempts, \
             last_error, first_failed_at, due_at FROM idem_parked \
             WHERE consumer = ? AND due_at <= ",
            now_ms!(),
            " AND (lease_until IS NULL OR lease_until < ",
            now_ms!(),
            ") ORDER BY due_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
        ))
        .bind(consumer)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        for chunk in rows.chunks(MYSQL_ROWS_PER_STATEMENT) {
            let sql = format!(
                concat!(
                    "UPDATE idem_parked SET lease_until = ",
                    now_ms!(),
                    " + ?, lease_token = ? WHERE id IN ({})"
                ),
                row_list("?", chunk.len())
            );
            // Built from constant fragments only; every value is bound.
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(span_ms(lease))
                .bind(token);
            for row in chunk {
                query = query.bind(row.0);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(taken(rows, token))
    }

    async fn unpark(conn: &mut MySqlConnection, id: i64, token: i64) -> Result<bool, sqlx::Error> {
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
        // Rows affected are the rows found (sqlx sets CLIENT_FOUND_ROWS): 1 when it is held.
        let changed = sqlx::query(concat!(
            "UPDATE idem_parked SET attempts = ?, last_error = ?, due_at = ",
            now_ms!(),
            " + ?, lease_until = NULL, lease_token = NULL WHERE id = ? AND lease_token = ?"
        ))
        .bind(stored_attempts(attempts))
        .bind(&*error)
        .bind(span_ms(due_in))
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
        let mut tx = pool.begin().await?;
        if let Some((id, token)) = parked {
            if !Self::unpark(&mut *tx, id, token).await? {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let failure = &dead.failure;
        let origin = failure.origin;
        let result = sqlx::query(concat!(
            "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, error_shape, \
             error_group, payload, headers, broker, source, coordinates, destination, attempts, \
             first_failed_at, last_failed_at, state) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, ",
            now_ms!(),
            "), ",
            now_ms!(),
            ", 'dead')"
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
        .execute(&mut *tx)
        .await?;
        let id = inserted_id(&result)?;
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

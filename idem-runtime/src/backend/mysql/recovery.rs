//! Parked retries and dead letters on MySQL/MariaDB. Times are epoch milliseconds of the
//! server's UTC clock (`now_ms!`, fixed for a statement: every time one statement writes sees
//! the same now). Consumers take due rows in a short READ COMMITTED transaction,
//! `SELECT … FOR UPDATE SKIP LOCKED` then `UPDATE` (MySQL 8, MariaDB 10.6+), so two of them
//! never take the same row, nor wait on each other. New ids are the statement's
//! `LAST_INSERT_ID()` (MySQL has no `INSERT … RETURNING`).

use std::time::Duration;

use sqlx::mysql::MySqlQueryResult;
use sqlx::{Connection as _, Executor, MySql, Pool};

use super::MYSQL_ROWS_PER_STATEMENT;
use crate::backend::dead_letters::Binds;
use crate::backend::recovery::{recovery_store, Clock, RecoveryDialect, RecoverySql};
use crate::recover::stored::{taken, ParkedRow};
use crate::recover::Parked;

/// The id an `INSERT` gave its row.
fn inserted_id(result: &MySqlQueryResult) -> Result<i64, sqlx::Error> {
    i64::try_from(result.last_insert_id()).map_err(|_| {
        sqlx::Error::Protocol(format!(
            "idem: the server gave the new row id {}, past a BIGINT",
            result.last_insert_id()
        ))
    })
}

impl RecoveryDialect for MySql {}

impl RecoverySql for MySql {
    async fn insert_id<'e, E>(
        executor: E,
        sql: String,
        binds: Binds<Self>,
    ) -> Result<i64, sqlx::Error>
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        let result = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.into_arguments())
            .execute(executor)
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
        // For the next transaction of this session only: READ COMMITTED takes no gap locks
        // on the due index, which would hold back `park`'s inserts until this commits.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        let mut tx = conn.begin().await?;
        // A locking read sees the latest committed rows: one another taker just leased is
        // no longer "not held" and is left out; one it holds now is skipped.
        let mut binds = Binds::new();
        let sql = format!(
            "SELECT {} FROM idem_parked {} FOR UPDATE SKIP LOCKED",
            Self::parked_columns(),
            Self::due_sql(&mut binds, Clock::Server, consumer, limit)?,
        );
        let rows: Vec<ParkedRow> =
            sqlx::query_as_with(sqlx::AssertSqlSafe(sql), binds.into_arguments())
                .fetch_all(&mut *tx)
                .await?;
        for chunk in rows.chunks(MYSQL_ROWS_PER_STATEMENT) {
            let ids: Vec<i64> = chunk.iter().map(|row| row.0).collect();
            let mut binds = Binds::new();
            let sql = format!(
                "UPDATE idem_parked SET lease_until = {}, lease_token = {} WHERE id IN {}",
                Self::after_sql(&mut binds, Clock::Server, lease)?,
                binds.bind(token)?,
                binds.ids(&ids)?,
            );
            sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.into_arguments())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(taken(rows, token))
    }
}

recovery_store!(MySql);

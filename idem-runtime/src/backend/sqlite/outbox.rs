//! The outbox on SQLite: one writer at a time and no session locks, so one relay per database
//! (ownership of a partition is always granted).

use std::time::Duration;

use sqlx::{Pool, Sqlite, SqliteConnection};

use crate::backend::row_list;

use crate::admin::outbox::{assemble, CountRow, DestinationStats, OutboxAdmin};
use crate::outbox::store::{limit_i64, span_ms, NewRow, OutboxStore, PendingRow, RawRow};

/// Now, in Unix epoch milliseconds of the database's clock.
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// The first pending rows of one partition (`?`: the partition, then how many), as
/// [`take_pending`](OutboxStore::take_pending) selects them.
const PARTITION_HEAD: &str = concat!(
    "SELECT * FROM (SELECT seq, partition_no, id, destination, partition_key, payload, \
     headers, attempts, available_at <= ",
    now_ms!(),
    " AS ready FROM idem_outbox WHERE partition_no = ? AND sent_at IS NULL \
     ORDER BY seq LIMIT ?) AS head"
);

impl OutboxStore for Sqlite {
    async fn insert_outbox<'c>(
        conn: &'c mut SqliteConnection,
        row: NewRow<'c>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(concat!(
            "INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, \
             headers, created_at, available_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ") ON CONFLICT (id) DO NOTHING"
        ))
        .bind(row.id)
        .bind(row.destination)
        .bind(row.partition_key)
        .bind(row.partition_no)
        .bind(row.payload)
        .bind(row.headers)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn pending_partitions(
        conn: &mut SqliteConnection,
        limit: u32,
    ) -> Result<Vec<i32>, sqlx::Error> {
        sqlx::query_scalar(concat!(
            "SELECT DISTINCT partition_no FROM idem_outbox WHERE sent_at IS NULL AND available_at <= ",
            now_ms!(),
            " LIMIT ?1"
        ))
        .bind(i64::from(limit))
        .fetch_all(conn)
        .await
    }

    async fn try_own<'c>(
        conn: &'c mut SqliteConnection,
        partitions: &'c [i32],
    ) -> Result<Vec<i32>, sqlx::Error> {
        let _ = conn;
        Ok(partitions.to_vec())
    }

    async fn disown<'c>(
        conn: &'c mut SqliteConnection,
        partitions: &'c [i32],
    ) -> Result<(), sqlx::Error> {
        let _ = (conn, partitions);
        Ok(())
    }

    async fn take_pending<'c>(
        conn: &'c mut SqliteConnection,
        partitions: &'c [i32],
        each: u32,
        limit: u32,
    ) -> Result<Vec<PendingRow>, sqlx::Error> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        // Each partition's first `each` rows on the pending index, then merged in insertion
        // order: never a scan of whole partitions, however long their backlog.
        let sql = format!(
            "{} ORDER BY seq LIMIT ?",
            vec![PARTITION_HEAD; partitions.len()].join(" UNION ALL ")
        );
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
        for partition in partitions {
            query = query.bind(partition).bind(i64::from(each));
        }
        let rows: Vec<RawRow> = query.bind(i64::from(limit)).fetch_all(conn).await?;
        Ok(rows.into_iter().map(PendingRow::from).collect())
    }

    async fn mark_sent<'c>(
        conn: &'c mut SqliteConnection,
        seqs: &'c [i64],
    ) -> Result<u64, sqlx::Error> {
        let mut marked = 0;
        for chunk in seqs.chunks(ROWS_PER_STATEMENT) {
            let sql = format!(
                concat!(
                    "UPDATE idem_outbox SET sent_at = ",
                    now_ms!(),
                    " WHERE seq IN ({})"
                ),
                row_list("?", chunk.len())
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for seq in chunk {
                query = query.bind(seq);
            }
            marked += query.execute(&mut *conn).await?.rows_affected();
        }
        Ok(marked)
    }

    async fn mark_failed<'c>(
        conn: &'c mut SqliteConnection,
        seqs: &'c [i64],
        backoff: Duration,
        error: &'c str,
    ) -> Result<(), sqlx::Error> {
        for chunk in seqs.chunks(ROWS_PER_STATEMENT) {
            let sql = format!(
                concat!(
                    "UPDATE idem_outbox SET attempts = attempts + 1, last_error = ?, \
                     available_at = ",
                    now_ms!(),
                    " + ? WHERE seq IN ({})"
                ),
                row_list("?", chunk.len())
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(error)
                .bind(span_ms(backoff));
            for seq in chunk {
                query = query.bind(seq);
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn purge_sent(
        conn: &mut SqliteConnection,
        older_than: Duration,
        limit: u64,
    ) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(concat!(
            "DELETE FROM idem_outbox WHERE seq IN (SELECT seq FROM idem_outbox \
             WHERE sent_at < ",
            now_ms!(),
            " - ?1 ORDER BY sent_at LIMIT ?2)"
        ))
        .bind(span_ms(older_than))
        .bind(limit_i64(limit))
        .execute(conn)
        .await?
        .rows_affected())
    }
}

/// Rows per `IN (...)` statement: far below SQLite's limit of bound parameters.
const ROWS_PER_STATEMENT: usize = 500;

// The operator's queries on the outbox (OutboxAdmin).

impl OutboxAdmin for Sqlite {
    async fn outbox_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_outbox'",
        )
        .fetch_one(pool)
        .await?;
        Ok(found == 1)
    }

    async fn outbox_stats<'a>(
        pool: &'a Pool<Self>,
        destination: Option<&'a str>,
    ) -> Result<Vec<DestinationStats>, sqlx::Error> {
        let counts: Vec<CountRow> = sqlx::query_as(
            "SELECT destination, \
                 COALESCE(SUM(sent_at IS NULL), 0), \
                 MIN(CASE WHEN sent_at IS NULL THEN created_at END), \
                 COALESCE(SUM(sent_at IS NULL AND attempts > 0), 0), \
                 COALESCE(MAX(CASE WHEN sent_at IS NULL THEN attempts END), 0), \
                 COALESCE(SUM(sent_at IS NOT NULL), 0) \
             FROM idem_outbox WHERE ?1 IS NULL OR destination = ?1 \
             GROUP BY destination ORDER BY destination",
        )
        .bind(destination)
        .fetch_all(pool)
        .await?;
        let errors: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT destination, last_error FROM (SELECT destination, last_error, \
                 ROW_NUMBER() OVER (PARTITION BY destination ORDER BY attempts DESC, seq) AS n \
                 FROM idem_outbox WHERE sent_at IS NULL AND attempts > 0 \
                 AND (?1 IS NULL OR destination = ?1)) WHERE n = 1",
        )
        .bind(destination)
        .fetch_all(pool)
        .await?;
        Ok(assemble(counts, errors))
    }
}

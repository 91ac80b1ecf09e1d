//! The outbox on MySQL/MariaDB: partitions owned through `GET_LOCK` named locks of the relay's
//! session, named after a hash of the database, so that outboxes of two databases on one
//! server never contend. Times are epoch milliseconds of the server's UTC clock.

use std::time::Duration;

use sqlx::{MySql, MySqlConnection, Pool, Row as _};

use crate::backend::row_list;

use crate::admin::outbox::{assemble, CountRow, DestinationStats, OutboxAdmin};
use crate::outbox::store::{
    limit_i64, span_ms, NewRow, OutboxStore, PendingRow, RawRow, PARTITIONS,
};

/// Now, in Unix epoch milliseconds of the server's UTC clock (as the records' columns are).
macro_rules! now_ms {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    };
}

/// The named lock of a partition (at most 64 characters, as `GET_LOCK` allows).
macro_rules! lock_name {
    () => {
        "CONCAT('idem_outbox/', LEFT(SHA1(COALESCE(DATABASE(), '')), 20), '/', ?)"
    };
}

/// Rows per `IN (...)` statement: far below the 65,535 placeholders of a prepared statement.
const ROWS_PER_STATEMENT: usize = 1_000;

/// The first pending rows of one partition (`?`: the partition, then how many), as
/// [`take_pending`](OutboxStore::take_pending) selects them.
const PARTITION_HEAD: &str = concat!(
    "SELECT * FROM (SELECT seq, partition_no, id, destination, partition_key, payload, \
     headers, CAST(attempts AS SIGNED) AS attempts, CAST(available_at <= ",
    now_ms!(),
    " AS SIGNED) AS ready FROM idem_outbox WHERE partition_no = ? AND sent_at IS NULL \
     ORDER BY seq LIMIT ?) AS head"
);

impl OutboxStore for MySql {
    async fn insert_outbox<'c>(
        conn: &'c mut MySqlConnection,
        row: NewRow<'c>,
    ) -> Result<(), sqlx::Error> {
        // A duplicate id changes nothing (`id = id`), and is no error: never INSERT IGNORE,
        // which would also hide a truncation.
        sqlx::query(concat!(
            "INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, \
             headers, created_at, available_at) VALUES (?, ?, ?, ?, ?, ?, ",
            now_ms!(),
            ", ",
            now_ms!(),
            ") ON DUPLICATE KEY UPDATE id = id"
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
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> Result<Vec<i32>, sqlx::Error> {
        // Each partition number, kept if a ready row exists in it: the semi-join probes the
        // pending index once per partition (`partition_no = p AND sent_at IS NULL`), or reads
        // the pending rows when the statistics say they are few, so its cost is bounded by the
        // partitions, not by the backlog. `SELECT DISTINCT` read every pending row whenever
        // fewer than `limit` partitions had one (about 160 ms at 200,000 pending rows on
        // MariaDB). PostgreSQL's walk (`partition_no > previous`) does not suit InnoDB: it
        // plans no range on an outer reference and scans the index from its start each step.
        let found: Vec<i64> = sqlx::query_scalar(concat!(
            "WITH RECURSIVE parts (p) AS ( \
                 SELECT CAST(0 AS SIGNED) UNION ALL SELECT p + 1 FROM parts WHERE p + 1 < ? \
             ) \
             SELECT p FROM parts WHERE EXISTS ( \
                 SELECT 1 FROM idem_outbox o \
                 WHERE o.partition_no = parts.p AND o.sent_at IS NULL AND o.available_at <= ",
            now_ms!(),
            ") ORDER BY p LIMIT ?"
        ))
        .bind(i64::from(PARTITIONS))
        .bind(i64::from(limit))
        .fetch_all(conn)
        .await?;
        found
            .into_iter()
            .map(|p| {
                i32::try_from(p)
                    .map_err(|_| sqlx::Error::Protocol(format!("idem: partition {p} out of range")))
            })
            .collect()
    }

    async fn try_own<'c>(
        conn: &'c mut MySqlConnection,
        partitions: &'c [i32],
    ) -> Result<Vec<i32>, sqlx::Error> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        // One column per partition, in one statement; column i answers for partitions[i].
        let columns =
            vec![concat!("CAST(GET_LOCK(", lock_name!(), ", 0) AS SIGNED)"); partitions.len()];
        let sql = format!("SELECT {}", columns.join(", "));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for partition in partitions {
            query = query.bind(partition);
        }
        let row = query.fetch_one(conn).await?;
        let mut owned = Vec::with_capacity(partitions.len());
        for (i, &partition) in partitions.iter().enumerate() {
            if row.try_get::<Option<i64>, _>(i)? == Some(1) {
                owned.push(partition);
            }
        }
        Ok(owned)
    }

    async fn disown<'c>(
        conn: &'c mut MySqlConnection,
        partitions: &'c [i32],
    ) -> Result<(), sqlx::Error> {
        if partitions.is_empty() {
            return Ok(());
        }
        let columns = vec![concat!("RELEASE_LOCK(", lock_name!(), ")"); partitions.len()];
        let sql = format!("SELECT {}", columns.join(", "));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for partition in partitions {
            query = query.bind(partition);
        }
        query.execute(conn).await?;
        Ok(())
    }

    async fn take_pending<'c>(
        conn: &'c mut MySqlConnection,
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
        conn: &'c mut MySqlConnection,
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
        conn: &'c mut MySqlConnection,
        seqs: &'c [i64],
        backoff: Duration,
        error: &'c str,
    ) -> Result<(), sqlx::Error> {
        // TEXT holds 65,535 bytes; the reason is for operators, so a prefix will do.
        let error: String = error.chars().take(4_000).collect();
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
                .bind(&error)
                .bind(span_ms(backoff));
            for seq in chunk {
                query = query.bind(seq);
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn purge_sent(
        conn: &mut MySqlConnection,
        older_than: Duration,
        limit: u64,
    ) -> Result<u64, sqlx::Error> {
        // DELETE ... ORDER BY ... LIMIT on the sent_at index; no subquery on the same table.
        Ok(sqlx::query(concat!(
            "DELETE FROM idem_outbox WHERE sent_at < ",
            now_ms!(),
            " - ? ORDER BY sent_at LIMIT ?"
        ))
        .bind(span_ms(older_than))
        .bind(limit_i64(limit))
        .execute(conn)
        .await?
        .rows_affected())
    }
}

// The operator's queries on the outbox (OutboxAdmin).

impl OutboxAdmin for MySql {
    async fn outbox_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        // In the connection's current database, where idem's own queries look.
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
             AND table_name = 'idem_outbox'",
        )
        .fetch_one(pool)
        .await?;
        Ok(found == 1)
    }

    async fn outbox_stats<'a>(
        pool: &'a Pool<Self>,
        destination: Option<&'a str>,
    ) -> Result<Vec<DestinationStats>, sqlx::Error> {
        // COUNT of a CASE without ELSE counts the rows it holds for: a BIGINT, where SUM would
        // be a DECIMAL.
        let counts: Vec<CountRow> = sqlx::query_as(
            "SELECT CAST(destination AS CHAR), \
                 COUNT(CASE WHEN sent_at IS NULL THEN 1 END), \
                 MIN(CASE WHEN sent_at IS NULL THEN created_at END), \
                 COUNT(CASE WHEN sent_at IS NULL AND attempts > 0 THEN 1 END), \
                 CAST(COALESCE(MAX(CASE WHEN sent_at IS NULL THEN attempts END), 0) AS SIGNED), \
                 COUNT(CASE WHEN sent_at IS NOT NULL THEN 1 END) \
             FROM idem_outbox WHERE ? IS NULL OR destination = ? \
             GROUP BY destination ORDER BY destination",
        )
        .bind(destination)
        .bind(destination)
        .fetch_all(pool)
        .await?;
        let errors: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT CAST(destination AS CHAR), last_error FROM (SELECT destination, last_error, \
                 ROW_NUMBER() OVER (PARTITION BY destination ORDER BY attempts DESC, seq) AS n \
                 FROM idem_outbox WHERE sent_at IS NULL AND attempts > 0 \
                 AND (? IS NULL OR destination = ?)) ranked WHERE n = 1",
        )
        .bind(destination)
        .bind(destination)
        .fetch_all(pool)
        .await?;
        Ok(assemble(counts, errors))
    }
}

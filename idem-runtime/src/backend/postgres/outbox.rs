//! The outbox on PostgreSQL: partitions owned through session advisory locks, whose first key
//! is a hash of the schema, so that outboxes in two schemas of one database never contend.

use std::time::Duration;

use sqlx::{PgConnection, Postgres};

use crate::admin::OutboxAdmin;
use crate::backend::sql::sql_methods;
use crate::backend::{span_ms, OutboxDialect};
use crate::outbox::store::RawRow;
use crate::outbox::{OutboxStore, PendingRow};

/// The advisory lock of a partition: (hash of "idem_outbox/" and the schema, partition).
const LOCK_CLASS: &str = "hashtext('idem_outbox/' || current_schema())";

impl OutboxDialect for Postgres {
    const INSERT_OUTBOX: &'static str =
        "INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, headers) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING";

    const PURGE_SENT: &'static str =
        "DELETE FROM idem_outbox WHERE seq IN (SELECT seq FROM idem_outbox \
         WHERE sent_at < now() - $1 * interval '1 millisecond' ORDER BY sent_at LIMIT $2)";

    // A loose index scan of the pending index: one probe per partition that has pending
    // rows (at most 256), not a read of every pending row, however long the backlog.
    const PENDING_PARTITIONS: &'static str = "WITH RECURSIVE parts (no) AS ( \
             (SELECT partition_no FROM idem_outbox \
              WHERE sent_at IS NULL AND available_at <= now() \
              ORDER BY partition_no LIMIT 1) \
           UNION ALL \
             SELECT (SELECT o.partition_no FROM idem_outbox o \
                     WHERE o.sent_at IS NULL AND o.available_at <= now() \
                       AND o.partition_no > parts.no \
                     ORDER BY o.partition_no LIMIT 1) \
             FROM parts WHERE parts.no IS NOT NULL \
         ) \
         SELECT no FROM parts WHERE no IS NOT NULL LIMIT $1";

    fn aggregate_where(function: &str, column: &str, condition: &str) -> String {
        format!("{function}({column}) FILTER (WHERE {condition})")
    }

    fn last_errors(filter: &str) -> String {
        format!(
            "SELECT DISTINCT ON (destination) destination, last_error FROM idem_outbox \
             WHERE sent_at IS NULL AND attempts > 0 AND ({filter}) \
             ORDER BY destination, attempts DESC, seq"
        )
    }
}

impl OutboxStore for Postgres {
    sql_methods!(outbox, pending_partitions);

    async fn try_own<'c>(
        conn: &'c mut PgConnection,
        partitions: &'c [i32],
    ) -> Result<Vec<i32>, sqlx::Error> {
        // One attempt per partition (the select list runs once per row), all in one statement.
        let tried: Vec<(i32, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT p, pg_try_advisory_lock({LOCK_CLASS}, p) FROM unnest($1::int4[]) AS t(p)"
        )))
        .bind(partitions)
        .fetch_all(conn)
        .await?;
        Ok(tried.into_iter().filter(|t| t.1).map(|t| t.0).collect())
    }

    async fn disown<'c>(
        conn: &'c mut PgConnection,
        partitions: &'c [i32],
    ) -> Result<(), sqlx::Error> {
        if partitions.is_empty() {
            return Ok(());
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT pg_advisory_unlock({LOCK_CLASS}, p) FROM unnest($1::int4[]) AS t(p)"
        )))
        .bind(partitions)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn take_pending<'c>(
        conn: &'c mut PgConnection,
        partitions: &'c [i32],
        each: u32,
        limit: u32,
    ) -> Result<Vec<PendingRow>, sqlx::Error> {
        // Each partition's first `each` rows on the pending index, then merged in insertion
        // order: never a scan of whole partitions, however long their backlog.
        let rows: Vec<RawRow> = sqlx::query_as(
            "SELECT r.seq, r.partition_no, r.id, r.destination, r.partition_key, r.payload, \
             r.headers, r.attempts::int8, \
             CASE WHEN r.available_at <= now() THEN 1 ELSE 0 END::int8 FROM unnest($1::int4[]) AS p(no), LATERAL (SELECT * FROM idem_outbox \
             WHERE partition_no = p.no AND sent_at IS NULL ORDER BY seq LIMIT $2) AS r \
             ORDER BY r.seq LIMIT $3",
        )
        .bind(partitions)
        .bind(i64::from(each))
        .bind(i64::from(limit))
        .fetch_all(conn)
        .await?;
        Ok(rows.into_iter().map(PendingRow::from).collect())
    }

    async fn mark_sent<'c>(
        conn: &'c mut PgConnection,
        seqs: &'c [i64],
    ) -> Result<u64, sqlx::Error> {
        Ok(
            sqlx::query("UPDATE idem_outbox SET sent_at = now() WHERE seq = ANY($1)")
                .bind(seqs)
                .execute(conn)
                .await?
                .rows_affected(),
        )
    }

    async fn mark_failed<'c>(
        conn: &'c mut PgConnection,
        seqs: &'c [i64],
        backoff: Duration,
        error: &'c str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE idem_outbox SET attempts = attempts + 1, last_error = $2, \
             available_at = now() + $3 * interval '1 millisecond' WHERE seq = ANY($1)",
        )
        .bind(seqs)
        .bind(error)
        .bind(span_ms(backoff))
        .execute(conn)
        .await?;
        Ok(())
    }
}

impl OutboxAdmin for Postgres {
    sql_methods!(outbox_admin);
}

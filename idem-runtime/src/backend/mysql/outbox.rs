//! The outbox on MySQL/MariaDB: partitions owned through `GET_LOCK` named locks of the relay's
//! session, named after a hash of the database, so that outboxes of two databases on one
//! server never contend. Times are epoch milliseconds of the server's UTC clock.

use std::borrow::Cow;

use sqlx::{MySql, MySqlConnection, Row as _};

use crate::admin::OutboxAdmin;
use crate::backend::sql::sql_methods;
use crate::backend::{ranked_last_errors, OutboxDialect};
use crate::outbox::{OutboxStore, PARTITIONS};

/// The named lock of a partition (at most 64 characters, as `GET_LOCK` allows).
macro_rules! lock_name {
    () => {
        "CONCAT('idem_outbox/', LEFT(SHA1(COALESCE(DATABASE(), '')), 20), '/', ?)"
    };
}

impl OutboxDialect for MySql {
    // A duplicate id changes nothing (`id = id`), and is no error: never INSERT IGNORE,
    // which would also hide a truncation.
    const INSERT_OUTBOX: &'static str = concat!(
        "INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, \
             headers, created_at, available_at) VALUES (?, ?, ?, ?, ?, ?, ",
        now_ms!(),
        ", ",
        now_ms!(),
        ") ON DUPLICATE KEY UPDATE id = id"
    );

    // DELETE ... ORDER BY ... LIMIT on the sent_at index; no subquery on the same table.
    const PURGE_SENT: &'static str = concat!(
        "DELETE FROM idem_outbox WHERE sent_at < ",
        now_ms!(),
        " - ? ORDER BY sent_at LIMIT ?"
    );

    // Each partition number, kept if a ready row exists in it: the semi-join probes the
    // pending index once per partition (`partition_no = p AND sent_at IS NULL`), or reads
    // the pending rows when the statistics say they are few, so its cost is bounded by the
    // partitions, not by the backlog. `SELECT DISTINCT` read every pending row whenever
    // fewer than `limit` partitions had one (about 160 ms at 200,000 pending rows on
    // MariaDB). PostgreSQL's walk (`partition_no > previous`) does not suit InnoDB: it
    // plans no range on an outer reference and scans the index from its start each step.
    const PENDING_PARTITIONS: &'static str = concat!(
        "WITH RECURSIVE parts (p) AS ( \
             SELECT CAST(0 AS SIGNED) UNION ALL SELECT p + 1 FROM parts WHERE p + 1 < ? \
         ) \
         SELECT p FROM parts WHERE EXISTS ( \
             SELECT 1 FROM idem_outbox o \
             WHERE o.partition_no = parts.p AND o.sent_at IS NULL AND o.available_at <= ",
        now_ms!(),
        ") ORDER BY p LIMIT ?"
    );

    fn text(column: &str) -> String {
        format!("CAST({column} AS CHAR)")
    }

    fn last_errors(filter: &str) -> String {
        ranked_last_errors::<Self>(filter, " ranked")
    }

    fn failure(error: &str) -> Cow<'_, str> {
        // TEXT holds 65,535 bytes; the reason is for operators, so a prefix will do.
        Cow::Owned(error.chars().take(4_000).collect())
    }
}

impl OutboxStore for MySql {
    sql_methods!(outbox, outbox_in_lists);

    async fn pending_partitions(
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let found: Vec<i64> = sqlx::query_scalar(Self::PENDING_PARTITIONS)
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
}

impl OutboxAdmin for MySql {
    sql_methods!(outbox_admin);
}

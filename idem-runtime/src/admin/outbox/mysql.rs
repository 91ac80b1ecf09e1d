//! The outbox's operator queries on MySQL/MariaDB, where every time is epoch milliseconds.

use sqlx::{MySql, Pool};

use super::{assemble, CountRow, DestinationStats, OutboxAdmin};

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

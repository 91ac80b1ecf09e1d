//! The outbox's operator queries on SQLite, where every time is epoch milliseconds.

use sqlx::{Pool, Sqlite};

use super::{assemble, CountRow, DestinationStats, OutboxAdmin};

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

//! The outbox's operator queries on PostgreSQL, where every time is a `TIMESTAMPTZ`.

use sqlx::{Pool, Postgres};

use super::{assemble, CountRow, DestinationStats, OutboxAdmin};

impl OutboxAdmin for Postgres {
    async fn outbox_present(pool: &Pool<Self>) -> Result<bool, sqlx::Error> {
        // to_regclass follows the search_path, as idem's own queries do.
        sqlx::query_scalar("SELECT to_regclass('idem_outbox') IS NOT NULL")
            .fetch_one(pool)
            .await
    }

    async fn outbox_stats<'a>(
        pool: &'a Pool<Self>,
        destination: Option<&'a str>,
    ) -> Result<Vec<DestinationStats>, sqlx::Error> {
        let counts: Vec<CountRow> = sqlx::query_as(
            "SELECT destination, \
                 COUNT(*) FILTER (WHERE sent_at IS NULL), \
                 (EXTRACT(EPOCH FROM MIN(created_at) FILTER (WHERE sent_at IS NULL)) * 1000)::BIGINT, \
                 COUNT(*) FILTER (WHERE sent_at IS NULL AND attempts > 0), \
                 COALESCE(MAX(attempts) FILTER (WHERE sent_at IS NULL), 0)::BIGINT, \
                 COUNT(*) FILTER (WHERE sent_at IS NOT NULL) \
             FROM idem_outbox WHERE $1::TEXT IS NULL OR destination = $1 \
             GROUP BY destination ORDER BY destination",
        )
        .bind(destination)
        .fetch_all(pool)
        .await?;
        let errors: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT DISTINCT ON (destination) destination, last_error FROM idem_outbox \
             WHERE sent_at IS NULL AND attempts > 0 AND ($1::TEXT IS NULL OR destination = $1) \
             ORDER BY destination, attempts DESC, seq",
        )
        .bind(destination)
        .fetch_all(pool)
        .await?;
        Ok(assemble(counts, errors))
    }
}

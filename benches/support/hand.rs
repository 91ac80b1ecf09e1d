//! The seed's pattern as users write it, for each backend: a one-column table
//! `processed_messages (message_id TEXT PRIMARY KEY)` with no retention index, the claim and the
//! effect in one transaction; its hand-written version check (`entity_versions`); its batch.
//! Beside them, `idem::batch` of any size, for the benches that sweep batch sizes.

/// The hand-written version check where an upsert's rows affected tell a no-op from a change
/// (SQLite, PostgreSQL): advance the entity's high-water mark if this version is newer (one
/// upsert; 0 rows: stale).
macro_rules! upsert_version_check {
    () => {
        /// The hand-written version check: advance the entity's high-water mark if this version
        /// is newer (one upsert; 0 rows: stale).
        pub async fn version_check(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<bool, sqlx::Error> {
            Ok(sqlx::query(
                "INSERT INTO entity_versions (entity_id, version) VALUES ($1, $2) \
                 ON CONFLICT (entity_id) DO UPDATE SET version = excluded.version \
                 WHERE entity_versions.version < excluded.version",
            )
            .bind(msg.account)
            .bind(msg.version)
            .execute(&mut **tx)
            .await?
            .rows_affected()
                == 1)
        }
    };
}

/// The one-column batch claim as one multi-row insert, `$head` then a `(?)` row per message
/// then `$tail` (SQLite, MariaDB), returning the ids that were new.
macro_rules! multi_row_claim {
    ($doc:literal, $head:literal, $tail:literal) => {
        #[doc = $doc]
        pub async fn claim_all_one(
            tx: &mut Tx<'_, Db>,
            msgs: &[Credit],
        ) -> Result<Vec<String>, sqlx::Error> {
            let mut sql = String::from($head);
            for i in 0..msgs.len() {
                sql.push_str(if i == 0 { "(?)" } else { ", (?)" });
            }
            sql.push_str($tail);
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for msg in msgs {
                query = query.bind(&msg.id);
            }
            query.fetch_all(&mut **tx).await
        }
    };
}

macro_rules! hand {
    ($backend:ident, $one_claim:literal) => {
        use idem::Tx;
        use sqlx::Pool;

        use crate::support::handlers::tally;
        use crate::support::handlers::$backend::{credit_key, effect, Db};
        use crate::support::workload::Credit;

        /// (2a) the seed's pattern as users write it: a one-column table, no retention index;
        /// claim and effect in one transaction. With `VERSIONED`, a hand-written version check
        /// (`version_check`) after the claim; a stale message rolls back.
        pub async fn one_column<const VERSIONED: bool>(
            pool: &Pool<Db>,
            msg: &Credit,
        ) -> Result<bool, sqlx::Error> {
            let mut tx = pool.begin().await?;
            let fresh = sqlx::query($one_claim)
                .bind(&msg.id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if !fresh || (VERSIONED && !version_check(&mut tx, msg).await?) {
                tx.rollback().await?;
                return Ok(false);
            }
            effect(&mut tx, msg).await?;
            tx.commit().await?;
            Ok(true)
        }

        /// The one-column batch of `n`: one claim statement for the batch, one effect per new
        /// message, one commit.
        pub async fn hand_batches(
            pool: &Pool<Db>,
            msgs: &[Credit],
            n: usize,
        ) -> anyhow::Result<(u64, u64)> {
            let mut counts = (0, 0);
            for chunk in msgs.chunks(n) {
                let mut tx = pool.begin().await?;
                let mut fresh: std::collections::HashSet<String> =
                    claim_all_one(&mut tx, chunk).await?.into_iter().collect();
                for msg in chunk {
                    if fresh.remove(&msg.id) {
                        effect(&mut tx, msg).await?;
                        counts.0 += 1;
                    } else {
                        counts.1 += 1;
                    }
                }
                tx.commit().await?;
            }
            Ok(counts)
        }

        /// `idem::batch` of `n`, key only.
        pub async fn idem_batches(
            pool: &Pool<Db>,
            msgs: &[Credit],
            n: usize,
        ) -> anyhow::Result<(u64, u64)> {
            let mut counts = (0, 0);
            for chunk in msgs.chunks(n) {
                let results = idem::batch(pool, chunk, async |b, m| credit_key(b, m).await).await?;
                for result in results {
                    tally(result, &mut counts)?;
                }
            }
            Ok(counts)
        }
    };
}

pub mod sq {
    hand!(
        sq,
        "INSERT INTO processed_messages (message_id) VALUES ($1) ON CONFLICT DO NOTHING"
    );
    upsert_version_check!();
    multi_row_claim!(
        "The one-column batch claim: one multi-row insert, returning the ids that were new.",
        "INSERT INTO processed_messages (message_id) VALUES ",
        " ON CONFLICT DO NOTHING RETURNING message_id"
    );
}

pub mod pg {
    hand!(
        pg,
        "INSERT INTO processed_messages (message_id) VALUES ($1) ON CONFLICT DO NOTHING"
    );

    upsert_version_check!();

    /// The one-column batch claim: one INSERT ... SELECT FROM UNNEST, returning the new ids.
    pub async fn claim_all_one(
        tx: &mut Tx<'_, Db>,
        msgs: &[Credit],
    ) -> Result<Vec<String>, sqlx::Error> {
        let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
        sqlx::query_scalar(
            "INSERT INTO processed_messages (message_id) SELECT id FROM UNNEST($1::text[]) AS t(id) \
             ON CONFLICT DO NOTHING RETURNING message_id",
        )
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
    }
}

#[cfg(feature = "mysql")]
pub mod my {
    hand!(
        my,
        "INSERT IGNORE INTO processed_messages (message_id) VALUES (?)"
    );

    multi_row_claim!(
        "The one-column batch claim: one multi-row INSERT IGNORE ... RETURNING (MariaDB).",
        "INSERT IGNORE INTO processed_messages (message_id) VALUES ",
        " RETURNING message_id"
    );

    /// The hand-written version check on MySQL, where rows affected cannot tell an upsert's
    /// no-op from an insert (CLIENT_FOUND_ROWS): advance the entity's row if this version is
    /// newer; if none matched, create it (0 rows inserted: the entity exists, the message is
    /// stale).
    pub async fn version_check(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<bool, sqlx::Error> {
        let advanced = sqlx::query(
            "UPDATE entity_versions SET version = ? WHERE entity_id = ? AND version < ?",
        )
        .bind(msg.version)
        .bind(msg.account)
        .bind(msg.version)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if advanced == 1 {
            return Ok(true);
        }
        Ok(
            sqlx::query("INSERT IGNORE INTO entity_versions (entity_id, version) VALUES (?, ?)")
                .bind(msg.account)
                .bind(msg.version)
                .execute(&mut **tx)
                .await?
                .rows_affected()
                == 1,
        )
    }
}

//! SQLite's [`Store`]: the claim's times read from this process's clock, batches as multi-row
//! statements of plain `?` placeholders.

use std::time::Duration;

use sqlx::{Pool, Sqlite, SqliteConnection};

use super::clock;
use crate::backend::sql::{sql_methods, Sql};
use crate::backend::{
    complete_lease, fingerprinted, mark_inserted, mark_inserted_keys, one_scope, row_list, InLists,
    OnConflict, Placeholders, StoreDialect,
};
use crate::store::{millis, Attempts, Leases, Record, Stamp, StampRow, Stamps, Store};

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../../migrations/sqlite/0001_idempotency.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/sqlite/0002_handler_features.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/sqlite/0003_outbox.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/sqlite/0004_recovery.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/sqlite/0005_outbox_backlog.sql"),
    ),
];

/// The insert of `rows` records of one scope: one key a row, then the scope, processed_at and
/// expires_at, bound once after the keys; it returns the keys that were new (a key given twice
/// conflicts with itself and is new once).
///
/// Every placeholder is a plain `?`, numbered by SQLite in the order of the text: the keys'
/// rows come first, in the `WITH`, so the shared values after them need no number. A numbered
/// placeholder (`?5`) costs at every execution: sqlx asks SQLite each parameter's name, which
/// SQLite finds by a linear search of the numbered ones
/// (docs/design/performance.md#sqlite-plain-placeholders).
fn one_scope_insert(rows: usize) -> String {
    // Built from constant fragments only; every value is bound.
    format!(
        "WITH batch (msg_key) AS (VALUES {}) \
         INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
         SELECT ?, msg_key, ?, ? FROM batch WHERE true \
         ON CONFLICT DO NOTHING RETURNING msg_key",
        row_list("(?)", rows)
    )
}

/// The read of `rows` stamps from `table`, keyed by scope and `column` (two binds a row).
///
/// A join with the keys, not `WHERE (scope, key) IN (VALUES ...)`: SQLite 3.40 (Debian 12's, which
/// sqlx's `sqlite-unbundled` links) plans that IN list as a scan of the whole table, whatever
/// its size (the bundled 3.46 searches the key). The join searches the primary key once a row
/// on both (a unit test reads the plan).
pub(super) fn stamps_select(table: &str, column: &str, rows: usize) -> String {
    format!(
        "WITH wanted (scope, k) AS (VALUES {}) \
         SELECT t.scope, t.{column}, t.fingerprint, t.result \
         FROM wanted JOIN {table} t ON t.scope = wanted.scope AND t.{column} = wanted.k",
        row_list("(?, ?)", rows)
    )
}

/// When a record written at `now_ms` may be purged: `expires_at`, computed here rather than as
/// `? + ?` in each row of the statement.
fn expires_at(now_ms: i64, retention: Duration) -> i64 {
    now_ms.saturating_add(millis(retention))
}

impl StoreDialect for Sqlite {
    const PLACEHOLDERS: Placeholders = Placeholders::Plain;

    const SAVE_STAMP: [&'static str; 2] = [
        crate::backend::text::SAVE_RECORD_STAMP.with(Placeholders::Question),
        crate::backend::text::SAVE_VERSION_STAMP.with(Placeholders::Question),
    ];

    const COMPLETE_LEASE: &'static str = complete_lease!(iso_now!());

    type Attempts = i64;

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }
}

impl OnConflict for Sqlite {
    const MIGRATIONS: &'static [(i64, &'static str)] = MIGRATIONS;
    const MIGRATIONS_TABLE: &'static str =
        "CREATE TABLE IF NOT EXISTS idem_migrations (version INTEGER PRIMARY KEY)";

    const CLAIM_LEASE: &'static str = concat!(
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) \
         VALUES (?1, ?2, ",
        now_ms!(),
        " + ?3, ",
        now_ms!(),
        " + ?4, ?5) \
         ON CONFLICT (scope, msg_key) DO UPDATE \
         SET processed_at = ",
        iso_now!(),
        ", expires_at = excluded.expires_at, \
         lease_until = excluded.lease_until, lease_token = excluded.lease_token \
         WHERE idem_records.lease_until IS NOT NULL AND idem_records.lease_until < ",
        now_ms!()
    );

    const ADVANCE_VERSION: &'static str = concat!(
        "INSERT INTO idem_versions (scope, entity, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (scope, entity) DO UPDATE \
         SET version = excluded.version, updated_at = ",
        iso_now!(),
        " WHERE idem_versions.version < excluded.version"
    );

    const COUNT_ATTEMPT: &'static str = concat!(
        "INSERT INTO idem_attempts (scope, msg_key, attempts, last_error) VALUES (?1, ?2, 1, ?3) \
         ON CONFLICT (scope, msg_key) DO UPDATE \
         SET attempts = idem_attempts.attempts + 1, last_error = excluded.last_error, \
         updated_at = ",
        iso_now!(),
        " RETURNING attempts"
    );

    const PURGE_EXPIRED: &'static str = concat!(
        "DELETE FROM idem_records WHERE (scope, msg_key) IN ( \
         SELECT scope, msg_key FROM idem_records WHERE expires_at < ",
        now_ms!(),
        " AND (lease_until IS NULL OR lease_until < ",
        now_ms!(),
        ") LIMIT ?)"
    );

    // updated_at is ISO-8601 text, which sorts in time order.
    const PURGE_VERSIONS: &'static str = "DELETE FROM idem_versions WHERE (scope, entity) IN ( \
         SELECT scope, entity FROM idem_versions \
         WHERE updated_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%.3f seconds', ?1 / 1000.0)) \
         LIMIT ?2)";
}

impl Store for Sqlite {
    sql_methods!(store, on_conflict);

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        // BEGIN IMMEDIATE takes the write lock first (waiting through busy_timeout). A deferred
        // transaction that reads first fails with "database is locked" when it upgrades.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        Self::run_migrations(&mut tx).await?;
        tx.commit().await
    }

    async fn insert_record<'c>(
        conn: &'c mut SqliteConnection,
        record: Record<'c>,
    ) -> Result<bool, sqlx::Error> {
        // The clock read in Rust, not by strftime and julianday in SQL (see `clock`).
        let (now_ms, processed_at) = clock::now();
        // The fingerprint column only with a fingerprint (see `fingerprinted`).
        let sql = match record.fingerprint {
            None => {
                "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
                 VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
            }
            Some(_) => {
                "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at, fingerprint) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
            }
        };
        let mut query = sqlx::query(sql)
            .bind(record.scope)
            .bind(record.key)
            .bind(processed_at)
            .bind(expires_at(now_ms, record.retention));
        if let Some(fingerprint) = record.fingerprint {
            query = query.bind(fingerprint);
        }
        let inserted = query.execute(conn).await?.rows_affected();
        Ok(inserted == 1)
    }

    async fn insert_records<'c>(
        conn: &'c mut SqliteConnection,
        records: &'c [Record<'c>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        // The clock read once in Rust for the batch (see `clock`).
        let (now_ms, processed_at) = clock::now();
        if let Some((scope, retention)) = one_scope(records) {
            // One handler's batch: scope, time and retention bound once, only the keys read back.
            let mut inserted: Vec<Vec<u8>> = Vec::with_capacity(records.len());
            for chunk in records.chunks(Self::ROWS_PER_STATEMENT) {
                let mut query =
                    sqlx::query_scalar(sqlx::AssertSqlSafe(one_scope_insert(chunk.len())));
                for record in chunk {
                    query = query.bind(record.key);
                }
                let query = query
                    .bind(scope)
                    .bind(processed_at.as_str())
                    .bind(expires_at(now_ms, retention));
                inserted.extend(query.fetch_all(&mut *conn).await?);
            }
            return Ok(mark_inserted_keys(records, &inserted));
        }
        let mut inserted: Vec<(String, Vec<u8>)> = Vec::with_capacity(records.len());
        // The fingerprint column only with a fingerprint (see `fingerprinted`).
        let fingerprints = fingerprinted(records);
        let (column, row) = if fingerprints {
            (", fingerprint", "(?, ?, ?, ?, ?)")
        } else {
            ("", "(?, ?, ?, ?)")
        };
        // Multi-row inserts, within SQLite's limit of bound parameters per statement.
        for chunk in records.chunks(Self::ROWS_PER_STATEMENT) {
            // In order: a pair given twice is inserted as given first (with its fingerprint).
            let sql = format!(
                "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at{column}) \
                 VALUES {} ON CONFLICT DO NOTHING RETURNING scope, msg_key",
                row_list(row, chunk.len())
            );
            // Built from constant fragments only; every value is bound.
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
            for record in chunk {
                query = query
                    .bind(record.scope)
                    .bind(record.key)
                    .bind(processed_at.as_str())
                    .bind(expires_at(now_ms, record.retention));
                if fingerprints {
                    query = query.bind(record.fingerprint);
                }
            }
            inserted.extend(query.fetch_all(&mut *conn).await?);
        }
        Ok(mark_inserted(records, &inserted))
    }

    fn is_transient(error: &sqlx::Error) -> bool {
        // SQLITE_BUSY, SQLITE_LOCKED and their extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT,
        // LOCKED_SHAREDCACHE): another connection holds the lock a new transaction may get.
        let busy = |code: &str| matches!(code, "5" | "6" | "261" | "262" | "517");
        match error {
            sqlx::Error::Database(db) => db.code().is_some_and(|code| busy(&code)),
            _ => crate::store::is_transient_by_sqlstate(error),
        }
    }
}

impl Leases for Sqlite {
    sql_methods!(claim_lease, leases);
}

impl Stamps for Sqlite {
    const RECORDS_FINGERPRINT: bool = true;

    sql_methods!(stamps, load_stamps);

    async fn save_stamps<'c>(
        conn: &'c mut SqliteConnection,
        stamps: &'c [Stamp<'c>],
    ) -> Result<(), sqlx::Error> {
        for (row, table, column) in [
            (StampRow::Record, "idem_records", "msg_key"),
            (StampRow::Version, "idem_versions", "entity"),
        ] {
            let wanted: Vec<&Stamp<'_>> = stamps.iter().filter(|s| s.at.row == row).collect();
            if let [one] = wanted.as_slice() {
                <Self as Sql>::save_stamp(&mut *conn, **one).await?;
                continue;
            }
            // Four parameters per stamp, far below SQLite's limit of 32,766.
            for chunk in wanted.chunks(Self::ROWS_PER_STATEMENT) {
                let sql = format!(
                    "WITH s (scope, k, fingerprint, result) AS (VALUES {}) \
                     UPDATE {table} SET fingerprint = s.fingerprint, result = s.result FROM s \
                     WHERE {table}.scope = s.scope AND {table}.{column} = s.k",
                    row_list("(?, ?, ?, ?)", chunk.len())
                );
                // Built from constant fragments only; every value is bound.
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for stamp in chunk {
                    query = query
                        .bind(stamp.at.scope)
                        .bind(stamp.at.key)
                        .bind(stamp.fingerprint)
                        .bind(stamp.result);
                }
                query.execute(&mut *conn).await?;
            }
        }
        Ok(())
    }
}

impl Attempts for Sqlite {
    sql_methods!(count_attempt, attempt_counts);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step of SQLite's plan for `sql` (`EXPLAIN QUERY PLAN`), in a fresh migrated database
    /// of 2,000 records and versions.
    async fn plan(sql: &str, binds: usize) -> Vec<String> {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        crate::migrate(&pool).await.unwrap();
        for i in 0..2_000 {
            let key = format!("k{i}");
            let record = "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
                          VALUES ('s', ?, 'x', 0)";
            sqlx::query(record)
                .bind(key.as_bytes())
                .execute(&pool)
                .await
                .unwrap();
            let version = "INSERT INTO idem_versions (scope, entity, version) VALUES ('s', ?, 1)";
            sqlx::query(version)
                .bind(key.as_bytes())
                .execute(&pool)
                .await
                .unwrap();
        }
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
        for _ in 0..binds / 2 {
            query = query.bind("s").bind(&b"k1"[..]);
        }
        let steps: Vec<(i64, i64, i64, String)> = query.fetch_all(&pool).await.unwrap();
        steps.into_iter().map(|(.., detail)| detail).collect()
    }

    #[tokio::test]
    async fn reading_stamps_searches_the_primary_key_and_scans_no_table() {
        for (table, column) in [("idem_records", "msg_key"), ("idem_versions", "entity")] {
            let steps = plan(&stamps_select(table, column, 3), 6).await;
            assert!(
                steps
                    .iter()
                    .any(|s| s.starts_with("SEARCH t USING PRIMARY KEY")),
                "{table}: {steps:?}"
            );
            assert!(
                !steps
                    .iter()
                    .any(|s| s.contains(&format!("SCAN {table}")) || s == "SCAN t"),
                "{table}: {steps:?}"
            );
        }
    }

    #[test]
    fn a_one_scope_insert_binds_the_keys_first_then_the_shared_values() {
        assert_eq!(
            one_scope_insert(2),
            "WITH batch (msg_key) AS (VALUES (?), (?)) \
             INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
             SELECT ?, msg_key, ?, ? FROM batch WHERE true \
             ON CONFLICT DO NOTHING RETURNING msg_key"
        );
    }
}

//! PostgreSQL's [`Store`]: batches bind arrays (`UNNEST`), and a record with its version is one
//! statement.

use foldhash::{HashMap, HashSet};
use sqlx::{PgConnection, Pool, Postgres};

use crate::backend::sql::{sql_methods, Sql};
use crate::backend::{
    complete_lease, fingerprinted, mark_inserted, mark_inserted_keys, one_scope, sequential_checks,
    statement, OnConflict, Placeholders, StampRows, StoreDialect,
};
use crate::store::{
    millis, Attempts, Leases, Record, Stamp, StampKey, StampRow, Stamps, Store, StoredStamp,
    VersionCheck, VersionEntry,
};

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_idempotency.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_handler_features.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_outbox.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_recovery.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_outbox_backlog.sql"),
    ),
];

/// Key of the advisory lock that serializes concurrent `migrate` calls ("idem" in ASCII).
const MIGRATE_LOCK: i64 = 0x6964_656d;

impl StoreDialect for Postgres {
    const PLACEHOLDERS: Placeholders = Placeholders::Dollar;

    const COMPLETE_LEASE: &'static str =
        statement!(complete_lease!("now()")).with(Placeholders::Dollar);

    type Attempts = i32;

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

impl OnConflict for Postgres {
    const MIGRATIONS: &'static [(i64, &'static str)] = MIGRATIONS;
    const MIGRATIONS_TABLE: &'static str =
        "CREATE TABLE IF NOT EXISTS idem_migrations (version BIGINT PRIMARY KEY)";

    const CLAIM_LEASE: &'static str =
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) \
         VALUES ($1, $2, now() + $3 * interval '1 millisecond', \
                 now() + $4 * interval '1 millisecond', $5) \
         ON CONFLICT (scope, msg_key) DO UPDATE \
         SET processed_at = now(), expires_at = EXCLUDED.expires_at, \
             lease_until = EXCLUDED.lease_until, lease_token = EXCLUDED.lease_token \
         WHERE idem_records.lease_until IS NOT NULL AND idem_records.lease_until < now()";

    const ADVANCE_VERSION: &'static str =
        "INSERT INTO idem_versions (scope, entity, version) VALUES ($1, $2, $3) \
         ON CONFLICT (scope, entity) DO UPDATE \
         SET version = EXCLUDED.version, updated_at = now() \
         WHERE idem_versions.version < EXCLUDED.version";

    const COUNT_ATTEMPT: &'static str = "INSERT INTO idem_attempts (scope, msg_key, attempts, last_error) VALUES ($1, $2, 1, $3) \
         ON CONFLICT (scope, msg_key) DO UPDATE \
         SET attempts = idem_attempts.attempts + 1, last_error = EXCLUDED.last_error, updated_at = now() \
         RETURNING attempts";

    // SKIP LOCKED: a purge never waits on, nor blocks, a handler holding a row.
    const PURGE_EXPIRED: &'static str = "DELETE FROM idem_records r USING ( \
             SELECT scope, msg_key FROM idem_records \
             WHERE expires_at < now() AND (lease_until IS NULL OR lease_until < now()) \
             LIMIT $1 FOR UPDATE SKIP LOCKED \
         ) old WHERE r.scope = old.scope AND r.msg_key = old.msg_key";

    const PURGE_VERSIONS: &'static str = "DELETE FROM idem_versions v USING ( \
             SELECT scope, entity FROM idem_versions \
             WHERE updated_at < now() - $1 * interval '1 millisecond' \
             LIMIT $2 FOR UPDATE SKIP LOCKED \
         ) old WHERE v.scope = old.scope AND v.entity = old.entity";
}

impl Store for Postgres {
    sql_methods!(store, on_conflict);

    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin().await?;
        // Concurrent `CREATE TABLE IF NOT EXISTS` can fail on a unique index of the catalog;
        // the transaction-scoped advisory lock makes concurrent migrations take turns.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATE_LOCK)
            .execute(&mut *tx)
            .await?;
        Self::run_migrations(&mut tx).await?;
        tx.commit().await
    }

    async fn insert_record<'c>(
        conn: &'c mut PgConnection,
        record: Record<'c>,
    ) -> Result<bool, sqlx::Error> {
        // ON CONFLICT DO NOTHING, never a caught unique violation: in PostgreSQL an error
        // aborts the whole transaction. A concurrent insert of the same key waits here until
        // the first commits (0 rows: a duplicate) or rolls back (1 row: ours to apply).
        // The fingerprint column only with a fingerprint (see `fingerprinted`).
        let sql = match record.fingerprint {
            None => {
                "INSERT INTO idem_records (scope, msg_key, expires_at) \
                 VALUES ($1, $2, now() + $3 * interval '1 millisecond') ON CONFLICT DO NOTHING"
            }
            Some(_) => {
                "INSERT INTO idem_records (scope, msg_key, expires_at, fingerprint) \
                 VALUES ($1, $2, now() + $3 * interval '1 millisecond', $4) \
                 ON CONFLICT DO NOTHING"
            }
        };
        let mut query = sqlx::query(sql)
            .bind(record.scope)
            .bind(record.key)
            .bind(record.retention_ms());
        if let Some(fingerprint) = record.fingerprint {
            query = query.bind(fingerprint);
        }
        let inserted = query.execute(conn).await?.rows_affected();
        Ok(inserted == 1)
    }

    async fn insert_records<'c>(
        conn: &'c mut PgConnection,
        records: &'c [Record<'c>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if let Some((scope, retention)) = one_scope(records) {
            // One handler's batch: scope and retention bound once, only the keys read back.
            let keys: Vec<&[u8]> = records.iter().map(|r| r.key).collect();
            let inserted: Vec<Vec<u8>> = sqlx::query_scalar(
                "INSERT INTO idem_records (scope, msg_key, expires_at) \
                 SELECT $1, msg_key, now() + $3 * interval '1 millisecond' \
                 FROM UNNEST($2::bytea[]) AS r (msg_key) \
                 ORDER BY msg_key \
                 ON CONFLICT DO NOTHING RETURNING msg_key",
            )
            .bind(scope)
            .bind(&keys)
            .bind(millis(retention))
            .fetch_all(conn)
            .await?;
            return Ok(mark_inserted_keys(records, &inserted));
        }
        let scopes: Vec<&str> = records.iter().map(|r| r.scope).collect();
        let keys: Vec<&[u8]> = records.iter().map(|r| r.key).collect();
        let retentions: Vec<i64> = records.iter().map(Record::retention_ms).collect();
        // One statement for the whole batch; a pair given twice conflicts with itself and
        // is inserted once, as given first (with its fingerprint). Sorted, so that batches
        // sharing keys lock them in one order. The fingerprint column only with a fingerprint
        // (see `fingerprinted`).
        let fingerprints: Option<Vec<Option<&[u8]>>> =
            fingerprinted(records).then(|| records.iter().map(|r| r.fingerprint).collect());
        let sql = if fingerprints.is_some() {
            "INSERT INTO idem_records (scope, msg_key, expires_at, fingerprint) \
             SELECT scope, msg_key, now() + retention * interval '1 millisecond', fingerprint \
             FROM UNNEST($1::text[], $2::bytea[], $3::bigint[], $4::bytea[]) WITH ORDINALITY \
                 AS r (scope, msg_key, retention, fingerprint, at) \
             ORDER BY scope, msg_key, at \
             ON CONFLICT DO NOTHING RETURNING scope, msg_key"
        } else {
            "INSERT INTO idem_records (scope, msg_key, expires_at) \
             SELECT scope, msg_key, now() + retention * interval '1 millisecond' \
             FROM UNNEST($1::text[], $2::bytea[], $3::bigint[]) AS r (scope, msg_key, retention) \
             ORDER BY scope, msg_key \
             ON CONFLICT DO NOTHING RETURNING scope, msg_key"
        };
        let mut query = sqlx::query_as(sql)
            .bind(&scopes)
            .bind(&keys)
            .bind(&retentions);
        if let Some(fingerprints) = &fingerprints {
            query = query.bind(fingerprints);
        }
        let inserted: Vec<(String, Vec<u8>)> = query.fetch_all(conn).await?;
        Ok(mark_inserted(records, &inserted))
    }

    async fn record_and_advance<'c>(
        conn: &'c mut PgConnection,
        record: Record<'c>,
        entry: VersionEntry<'c>,
    ) -> Result<Option<VersionCheck>, sqlx::Error> {
        let VersionEntry {
            entity, version, ..
        } = entry;
        // One round trip: the version upsert runs only if the record was inserted (it reads
        // the record insert's RETURNING). Each keeps its own statement's semantics: ON
        // CONFLICT DO NOTHING for the record, the conditional upsert for the version.
        // The fingerprint column only with a fingerprint (see `fingerprinted`).
        macro_rules! record_and_advance {
            ($column:literal, $value:literal) => {
                concat!(
                    "WITH rec AS ( \
                         INSERT INTO idem_records (scope, msg_key, expires_at",
                    $column,
                    ") VALUES ($1, $2, now() + $5 * interval '1 millisecond'",
                    $value,
                    ") ON CONFLICT DO NOTHING RETURNING 1 \
                     ), ver AS ( \
                         INSERT INTO idem_versions (scope, entity, version) \
                         SELECT $1, $3, $4 WHERE EXISTS (SELECT 1 FROM rec) \
                         ON CONFLICT (scope, entity) DO UPDATE \
                         SET version = EXCLUDED.version, updated_at = now() \
                         WHERE idem_versions.version < EXCLUDED.version \
                         RETURNING 1 \
                     ) \
                     SELECT (SELECT count(*) FROM rec), (SELECT count(*) FROM ver)"
                )
            };
        }
        let sql = match record.fingerprint {
            None => record_and_advance!("", ""),
            Some(_) => record_and_advance!(", fingerprint", ", $6"),
        };
        let mut query = sqlx::query_as(sql)
            .bind(record.scope)
            .bind(record.key)
            .bind(entity)
            .bind(version)
            .bind(record.retention_ms());
        if let Some(fingerprint) = record.fingerprint {
            query = query.bind(fingerprint);
        }
        let (recorded, advanced): (i64, i64) = query.fetch_one(&mut *conn).await?;
        if recorded == 0 {
            return Ok(None);
        }
        if advanced == 1 {
            return Ok(Some(VersionCheck::Advanced));
        }
        <Self as Sql>::behind(conn, record.scope, entity, version)
            .await
            .map(Some)
    }

    async fn advance_versions<'c>(
        conn: &'c mut PgConnection,
        entries: &'c [VersionEntry<'c>],
    ) -> Result<Vec<VersionCheck>, sqlx::Error> {
        let scopes: Vec<&str> = entries.iter().map(|e| e.scope).collect();
        let entities: Vec<&[u8]> = entries.iter().map(|e| e.entity).collect();
        // 1. Create the rows of new entities, so that every entity has a row to lock. Ours are
        //    marked by RETURNING; the placeholder version is overwritten in step 3, and the
        //    rows vanish if the batch rolls back. Sorted, so batches lock in one order.
        let created: Vec<(String, Vec<u8>)> = sqlx::query_as(
            "INSERT INTO idem_versions (scope, entity, version) \
             SELECT DISTINCT scope, entity, 0 FROM UNNEST($1::text[], $2::bytea[]) AS u (scope, entity) \
             ORDER BY scope, entity \
             ON CONFLICT DO NOTHING RETURNING scope, entity",
        )
        .bind(&scopes)
        .bind(&entities)
        .fetch_all(&mut *conn)
        .await?;
        // 2. Lock every entity's row and read its committed version (READ COMMITTED re-reads
        //    a row after waiting for its lock).
        let rows: Vec<(String, Vec<u8>, i64)> = sqlx::query_as(
            "SELECT v.scope, v.entity, v.version FROM idem_versions v \
             JOIN (SELECT DISTINCT scope, entity FROM UNNEST($1::text[], $2::bytea[]) AS u (scope, entity)) u \
               ON v.scope = u.scope AND v.entity = u.entity \
             ORDER BY v.scope, v.entity FOR UPDATE OF v",
        )
        .bind(&scopes)
        .bind(&entities)
        .fetch_all(&mut *conn)
        .await?;
        let created: HashSet<(&str, &[u8])> = created
            .iter()
            .map(|(s, e)| (s.as_str(), e.as_slice()))
            .collect();
        let stored: HashMap<(&str, &[u8]), Option<i64>> = rows
            .iter()
            .map(|(s, e, v)| {
                let key = (s.as_str(), e.as_slice());
                (key, (!created.contains(&key)).then_some(*v))
            })
            .collect();
        // 3. Decide in memory, as one after another, and write the versions that advanced.
        let (checks, finals) = sequential_checks(&stored, entries);
        if !finals.is_empty() {
            let scopes: Vec<&str> = finals.iter().map(|e| e.scope).collect();
            let entities: Vec<&[u8]> = finals.iter().map(|e| e.entity).collect();
            let versions: Vec<i64> = finals.iter().map(|e| e.version).collect();
            sqlx::query(
                "UPDATE idem_versions v SET version = u.version, updated_at = now() \
                 FROM UNNEST($1::text[], $2::bytea[], $3::bigint[]) AS u (scope, entity, version) \
                 WHERE v.scope = u.scope AND v.entity = u.entity",
            )
            .bind(&scopes)
            .bind(&entities)
            .bind(&versions)
            .execute(conn)
            .await?;
        }
        Ok(checks)
    }

    fn is_transient(error: &sqlx::Error) -> bool {
        // serialization_failure, deadlock_detected, lock_not_available, query_canceled
        // (statement_timeout), admin_shutdown (pg_terminate_backend), cannot_connect_now,
        // and the connection_exception class.
        match error {
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                matches!(
                    &*code,
                    "40001" | "40P01" | "55P03" | "57014" | "57P01" | "57P03"
                ) || code.starts_with("08")
            }),
            _ => crate::store::is_transient_by_sqlstate(error),
        }
    }
}

impl Leases for Postgres {
    sql_methods!(claim_lease, leases);
}

impl Stamps for Postgres {
    const RECORDS_FINGERPRINT: bool = true;

    // `load_stamp` runs a statement of its own, after the claim's: under READ COMMITTED it
    // takes a new snapshot, which sees the row a concurrent first delivery committed while
    // the claim waited.
    sql_methods!(stamps);

    async fn save_stamps<'c>(
        conn: &'c mut PgConnection,
        stamps: &'c [Stamp<'c>],
    ) -> Result<(), sqlx::Error> {
        for (row, sql) in [
            (
                StampRow::Record,
                "UPDATE idem_records r SET fingerprint = u.fingerprint, result = u.result \
                 FROM UNNEST($1::text[], $2::bytea[], $3::bytea[], $4::bytea[]) \
                   AS u (scope, msg_key, fingerprint, result) \
                 WHERE r.scope = u.scope AND r.msg_key = u.msg_key",
            ),
            (
                StampRow::Version,
                "UPDATE idem_versions v SET fingerprint = u.fingerprint, result = u.result \
                 FROM UNNEST($1::text[], $2::bytea[], $3::bytea[], $4::bytea[]) \
                   AS u (scope, entity, fingerprint, result) \
                 WHERE v.scope = u.scope AND v.entity = u.entity",
            ),
        ] {
            let wanted: Vec<&Stamp<'_>> = stamps.iter().filter(|s| s.at.row == row).collect();
            match wanted.as_slice() {
                [] => continue,
                // One stamp: the plain UPDATE, without arrays to build and unnest.
                [one] => <Self as Sql>::save_stamp(&mut *conn, **one).await?,
                _ => {
                    let scopes: Vec<&str> = wanted.iter().map(|s| s.at.scope).collect();
                    let keys: Vec<&[u8]> = wanted.iter().map(|s| s.at.key).collect();
                    let fingerprints: Vec<Option<&[u8]>> =
                        wanted.iter().map(|s| s.fingerprint).collect();
                    let results: Vec<Option<&[u8]>> = wanted.iter().map(|s| s.result).collect();
                    sqlx::query(sql)
                        .bind(&scopes)
                        .bind(&keys)
                        .bind(&fingerprints)
                        .bind(&results)
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn load_stamps<'c>(
        conn: &'c mut PgConnection,
        keys: &'c [StampKey<'c>],
    ) -> Result<Vec<Option<StoredStamp>>, sqlx::Error> {
        let mut found = StampRows::new(keys);
        for (row, sql) in [
            (
                StampRow::Record,
                "SELECT r.scope, r.msg_key, r.fingerprint, r.result FROM idem_records r \
                 JOIN UNNEST($1::text[], $2::bytea[]) AS u (scope, msg_key) \
                   ON r.scope = u.scope AND r.msg_key = u.msg_key",
            ),
            (
                StampRow::Version,
                "SELECT v.scope, v.entity, v.fingerprint, v.result FROM idem_versions v \
                 JOIN UNNEST($1::text[], $2::bytea[]) AS u (scope, entity) \
                   ON v.scope = u.scope AND v.entity = u.entity",
            ),
        ] {
            let (scopes, keys): (Vec<&str>, Vec<&[u8]>) = keys
                .iter()
                .filter(|k| k.row == row)
                .map(|k| (k.scope, k.key))
                .unzip();
            if scopes.is_empty() {
                continue;
            }
            let rows = sqlx::query_as(sql)
                .bind(&scopes)
                .bind(&keys)
                .fetch_all(&mut *conn)
                .await?;
            found.add(row, rows);
        }
        Ok(found.into_stamps())
    }
}

impl Attempts for Postgres {
    sql_methods!(count_attempt, attempt_counts);
}

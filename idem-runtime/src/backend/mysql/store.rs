//! MySQL's [`Store`]: upserts that bump a counter on their duplicate path (see the module
//! docs), read back with `RETURNING` where the server takes it, and batches as multi-row
//! statements in a stable order.

use std::time::Duration;

use foldhash::HashMap;
use sqlx::mysql::{MySqlArguments, MySqlDatabaseError, MySqlQueryResult};
use sqlx::Arguments as _;
use sqlx::{Connection, MySql, MySqlConnection, Pool, Row as _};

use super::returning::try_returning;
use super::{migrate, pairs, MYSQL_ROWS_PER_STATEMENT};
use crate::backend::sql::{sql_methods, Sql};
use crate::backend::{
    compare, complete_lease, fingerprinted, limit, mark_inserted, mark_inserted_keys, one_scope,
    row_list, sequential_checks, span_ms, text, Placeholders, StoreDialect,
};
use crate::store::{
    Attempts, FailedAttempt, Inserted, LeaseClaim, LeaseRequest, Leases, Record, Stamp, StampRow,
    Stamps, Store, StoredStamp, VersionCheck, VersionEntry,
};

/// ER_LOCK_DEADLOCK: InnoDB chose this transaction as a deadlock's victim and rolled it back
/// whole (SQLSTATE 40001).
const ER_LOCK_DEADLOCK: u16 = 1213;
/// ER_LOCK_WAIT_TIMEOUT: a row lock was not granted within `innodb_lock_wait_timeout`; only
/// the statement was rolled back (SQLSTATE HY000, so it must be told by its number).
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// The rows an upsert that bumps a counter on its duplicate path reports: 1 inserted, 2 found
/// (and bumped). Anything else means the SQL no longer does what this file assumes.
fn upsert_inserted(result: &MySqlQueryResult, what: &str) -> Result<bool, sqlx::Error> {
    match result.rows_affected() {
        1 => Ok(true),
        2 => Ok(false),
        n => Err(sqlx::Error::Protocol(format!(
            "idem: the {what} upsert reported {n} rows affected (expected 1 or 2)"
        ))),
    }
}
/// The claim of one record: an upsert that bumps `dup_count` when the record already is (binds:
/// [`record_arguments`]). The fingerprint column only with a fingerprint (see `fingerprinted`);
/// with `returning`, it reads back the row's `dup_count` and stamp.
fn record_upsert(fingerprint: bool, returning: bool) -> &'static str {
    macro_rules! sql {
        ($column:literal, $value:literal, $returning:literal) => {
            concat!(
                "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at",
                $column,
                ") VALUES (?, ?, UTC_TIMESTAMP(6), ",
                now_ms!(),
                " + ?",
                $value,
                ") ON DUPLICATE KEY UPDATE dup_count = dup_count + 1",
                $returning
            )
        };
    }
    match (fingerprint, returning) {
        (false, false) => sql!("", "", ""),
        (true, false) => sql!(", fingerprint", ", ?", ""),
        (false, true) => sql!("", "", " RETURNING dup_count, fingerprint, result"),
        (true, true) => sql!(
            ", fingerprint",
            ", ?",
            " RETURNING dup_count, fingerprint, result"
        ),
    }
}

/// A record as its upsert's `RETURNING` reads it back: `dup_count` (0 for a new record), then
/// the stamp's `fingerprint` and `result`.
type CountedStamp = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// The values [`record_upsert`] binds: scope, key, retention, and the fingerprint if any.
fn record_arguments(record: Record<'_>) -> Result<MySqlArguments, sqlx::Error> {
    rows_arguments(&[record], record.fingerprint.is_some())
}

/// The binds of [`records_upsert`] for `records`: scope, key and retention a row, and with
/// `fingerprints` the fingerprint.
fn rows_arguments(
    records: &[Record<'_>],
    fingerprints: bool,
) -> Result<MySqlArguments, sqlx::Error> {
    let mut arguments = MySqlArguments::default();
    for record in records {
        arguments
            .add(record.scope)
            .and_then(|()| arguments.add(record.key))
            .and_then(|()| arguments.add(span_ms(record.retention)))
            .and_then(|()| match fingerprints {
                true => arguments.add(record.fingerprint),
                false => Ok(()),
            })
            .map_err(sqlx::Error::Encode)?;
    }
    Ok(arguments)
}
/// The upsert of one entity's version (binds: scope, entity, version three times). Found rows
/// keep what they held in `prev` (read before `version` is assigned, so with and without
/// SIMULTANEOUS_ASSIGNMENT) and advance only to a greater version.
macro_rules! version_upsert {
    () => {
        concat!(
            "INSERT INTO idem_versions (scope, entity, version, updated_ms) VALUES (?, ?, ?, ",
            now_ms!(),
            ") ON DUPLICATE KEY UPDATE bumps = bumps + 1, prev = version, \
             updated_ms = IF(version < ?, ",
            now_ms!(),
            ", updated_ms), version = GREATEST(version, ?)"
        )
    };
}

/// The multi-row upsert of `rows` records (binds: scope, key, retention a row, and with
/// `fingerprints` the fingerprint), then `returning`. Fresh rows keep dup_count = 0, found ones
/// are bumped (and keep their fingerprint). Built from constant fragments only; every value is
/// bound.
fn records_upsert(rows: usize, fingerprints: bool, returning: &str) -> String {
    let (column, row) = if fingerprints {
        (
            ", fingerprint",
            concat!("(?, ?, UTC_TIMESTAMP(6), ", now_ms!(), " + ?, ?)"),
        )
    } else {
        ("", concat!("(?, ?, UTC_TIMESTAMP(6), ", now_ms!(), " + ?)"))
    };
    format!(
        "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at{column}) \
         VALUES {} ON DUPLICATE KEY UPDATE dup_count = dup_count + 1{returning}",
        row_list(row, rows)
    )
}

/// `items` sorted, each once: a pair given twice would bump its own fresh row, and batches
/// sharing keys must lock them in one order.
fn sorted_unique<T: Ord>(mut items: Vec<T>) -> Vec<T> {
    items.sort_unstable();
    items.dedup();
    items
}

/// `records` sorted by scope and key, each pair once (a stable sort: of a pair given twice,
/// the first stays, with its fingerprint). Batches sharing keys lock them in one order.
fn sorted_records<'a>(records: &[Record<'a>]) -> Vec<Record<'a>> {
    let mut unique = records.to_vec();
    unique.sort_by(|a, b| (a.scope, a.key).cmp(&(b.scope, b.key)));
    unique.dedup_by(|a, b| (a.scope, a.key) == (b.scope, b.key));
    unique
}

/// The most bytes of stamps (keys, fingerprints, values) one statement sends: a batch of large
/// `replay` values must not outgrow the server's `max_allowed_packet` (4 MiB at its smallest
/// default, MySQL 5.7's; 16 MiB on MariaDB, 64 MiB on MySQL 8).
const MYSQL_STAMP_BYTES_PER_STATEMENT: usize = 1 << 20;

/// `stamps` in runs of at most [`MYSQL_ROWS_PER_STATEMENT`] stamps and about
/// [`MYSQL_STAMP_BYTES_PER_STATEMENT`] bytes (a single larger stamp goes alone).
fn stamp_chunks<'s, 'a>(stamps: &'s [&'s Stamp<'a>]) -> Vec<&'s [&'s Stamp<'a>]> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (at, stamp) in stamps.iter().enumerate() {
        // Each key is bound three times (two CASEs and the IN list).
        let size = 3 * stamp.at.key.len()
            + stamp.fingerprint.map_or(0, <[u8]>::len)
            + stamp.result.map_or(0, <[u8]>::len);
        let full = at - start == MYSQL_ROWS_PER_STATEMENT
            || bytes + size > MYSQL_STAMP_BYTES_PER_STATEMENT;
        if at > start && full {
            chunks.push(&stamps[start..at]);
            (start, bytes) = (at, 0);
        }
        bytes += size;
    }
    if start < stamps.len() {
        chunks.push(&stamps[start..]);
    }
    chunks
}

/// A record's row as its batch upsert's `RETURNING` reads it back: scope, key, `dup_count` (0
/// for a new record), then its stamp's fingerprint and result.
type ReadBack = (String, Vec<u8>, i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// Each requested record's result from the rows its upsert returned: new at the first place of
/// a row at `dup_count` 0, else found with the row's stamp. A record the upsert did not return
/// is an error, never a claim decided without its row. Each row's stamp is moved to its place;
/// only a pair requested twice copies it.
fn read_back(requested: &[Record<'_>], rows: Vec<ReadBack>) -> Result<Vec<Inserted>, sqlx::Error> {
    // Each pair's first place, and how many places ask for it.
    let mut places: HashMap<(&str, &[u8]), (usize, usize)> =
        HashMap::with_capacity_and_hasher(requested.len(), Default::default());
    for (at, r) in requested.iter().enumerate() {
        places.entry((r.scope, r.key)).or_insert((at, 0)).1 += 1;
    }
    let mut found: Vec<Option<(bool, StoredStamp)>> = vec![None; requested.len()];
    for (scope, key, dup_count, fingerprint, result) in rows {
        if let Some(&(first, _)) = places.get(&(scope.as_str(), key.as_slice())) {
            let stamp = StoredStamp {
                fingerprint,
                result,
            };
            found[first] = Some((dup_count == 0, stamp));
        }
    }
    requested
        .iter()
        .enumerate()
        .map(|(at, r)| {
            let (first, asked) = places[&(r.scope, r.key)];
            let row = match at == first && asked == 1 {
                true => found[first].take(),
                false => found[first].clone(),
            };
            match row {
                // A pair given twice is new at its first place only.
                Some((true, _)) if at == first => Ok(Inserted::unread(true)),
                Some((_, stamp)) => Ok(Inserted {
                    new: false,
                    stamp: Some(stamp),
                }),
                None => Err(sqlx::Error::Protocol(format!(
                    "idem: the batch upsert returned no row for a record of `{}`",
                    r.scope
                ))),
            }
        })
        .collect()
}

/// One handler's batch (every record in `scope`, one retention): upserts `keys` (sorted, each
/// once) and returns the ones that were new. Only the keys are read back.
async fn insert_keys(
    conn: &mut MySqlConnection,
    scope: &str,
    retention_ms: i64,
    keys: &[&[u8]],
) -> Result<Vec<Vec<u8>>, sqlx::Error> {
    let mut inserted = Vec::new();
    for chunk in keys.chunks(MYSQL_ROWS_PER_STATEMENT) {
        let bind_upsert = |sql: String| {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for key in chunk {
                query = query.bind(scope).bind(*key).bind(retention_ms);
            }
            query
        };
        let returned = try_returning(
            bind_upsert(records_upsert(
                chunk.len(),
                false,
                " RETURNING msg_key, dup_count",
            ))
            .fetch_all(&mut *conn),
        )
        .await?;
        if let Some(rows) = returned {
            for row in rows {
                if row.try_get::<i64, _>(1)? == 0 {
                    inserted.push(row.try_get(0)?);
                }
            }
            continue;
        }
        bind_upsert(records_upsert(chunk.len(), false, ""))
            .execute(&mut *conn)
            .await?;
        // As in the general form: the rows still at dup_count = 0 are the ones inserted.
        let sql = format!(
            "SELECT msg_key FROM idem_records \
             WHERE scope = ? AND msg_key IN ({}) AND dup_count = 0",
            row_list("?", chunk.len())
        );
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(scope);
        for key in chunk {
            query = query.bind(*key);
        }
        inserted.extend(query.fetch_all(&mut *conn).await?);
    }
    Ok(inserted)
}
impl StoreDialect for MySql {
    const PLACEHOLDERS: Placeholders = Placeholders::Plain;

    // The row changes whenever it matches (lease_until becomes NULL): 1 row with the flag on
    // and off.
    const COMPLETE_LEASE: &'static str = complete_lease!("UTC_TIMESTAMP(6)");

    type Attempts = i32;

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }
}

impl Store for MySql {
    sql_methods!(store);

    fn migrate(
        pool: &Pool<Self>,
    ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + '_ {
        migrate::migrate(pool)
    }

    async fn insert_record<'c>(
        conn: &'c mut MySqlConnection,
        record: Record<'c>,
    ) -> Result<bool, sqlx::Error> {
        // Never INSERT IGNORE (it also ignores data errors) and never a caught duplicate-key
        // error. A concurrent claim of the same key waits on the row lock until the first
        // commits (found: 2 rows, a duplicate) or rolls back (inserted: 1 row, ours to apply).
        let sql = record_upsert(record.fingerprint.is_some(), false);
        let result = sqlx::query_with(sql, record_arguments(record)?)
            .execute(conn)
            .await?;
        upsert_inserted(&result, "record")
    }

    async fn insert_records<'c>(
        conn: &'c mut MySqlConnection,
        records: &'c [Record<'c>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if let Some((scope, retention)) = one_scope(records) {
            let keys = sorted_unique(records.iter().map(|r| r.key).collect());
            let inserted = insert_keys(conn, scope, span_ms(retention), &keys).await?;
            return Ok(mark_inserted_keys(records, &inserted));
        }
        let unique = sorted_records(records);
        let mut inserted: Vec<(String, Vec<u8>)> = Vec::new();
        let fingerprints = fingerprinted(&unique);
        for chunk in unique.chunks(MYSQL_ROWS_PER_STATEMENT) {
            let bind_upsert = |sql: String| {
                rows_arguments(chunk, fingerprints)
                    .map(|arguments| sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments))
            };
            // MariaDB: the upsert returns every row as it left it, fresh ones at dup_count = 0.
            let returned = try_returning(async {
                let sql = records_upsert(
                    chunk.len(),
                    fingerprints,
                    " RETURNING scope, msg_key, dup_count",
                );
                bind_upsert(sql)?.fetch_all(&mut *conn).await
            })
            .await?;
            if let Some(rows) = returned {
                for row in rows {
                    if row.try_get::<i64, _>(2)? == 0 {
                        inserted.push((row.try_get(0)?, row.try_get(1)?));
                    }
                }
                continue;
            }
            bind_upsert(records_upsert(chunk.len(), fingerprints, ""))?
                .execute(&mut *conn)
                .await?;
            // Read back which rows are ours: this transaction holds every one of them now, and
            // a row still at dup_count = 0 was inserted by the upsert above.
            let sql = format!(
                "SELECT scope, msg_key FROM idem_records \
                 WHERE (scope, msg_key) IN ({}) AND dup_count = 0",
                pairs(chunk.len())
            );
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
            for record in chunk {
                query = query.bind(record.scope).bind(record.key);
            }
            let rows: Vec<(String, Vec<u8>)> = query.fetch_all(&mut *conn).await?;
            inserted.extend(rows);
        }
        Ok(mark_inserted(records, &inserted))
    }

    async fn advance_version<'c>(
        conn: &'c mut MySqlConnection,
        entry: VersionEntry<'c>,
    ) -> Result<VersionCheck, sqlx::Error> {
        let VersionEntry {
            scope,
            entity,
            version,
        } = entry;
        let upsert = |sql: &'static str| {
            sqlx::query(sql)
                .bind(scope)
                .bind(entity)
                .bind(version)
                .bind(version)
                .bind(version)
        };
        // MariaDB: the upsert returns the row as it left it: bumps = 0 on a fresh one.
        let returned = try_returning(
            upsert(concat!(version_upsert!(), " RETURNING bumps, prev")).fetch_one(&mut *conn),
        )
        .await?;
        let prev: Option<i64> = match returned {
            Some(row) if row.try_get::<i64, _>(0)? == 0 => return Ok(VersionCheck::Advanced),
            Some(row) => row.try_get(1)?,
            None => {
                let result = upsert(version_upsert!()).execute(&mut *conn).await?;
                if upsert_inserted(&result, "version")? {
                    return Ok(VersionCheck::Advanced);
                }
                // The upsert locked the row and wrote what it found; this transaction reads
                // its own write.
                sqlx::query_scalar("SELECT prev FROM idem_versions WHERE scope = ? AND entity = ?")
                    .bind(scope)
                    .bind(entity)
                    .fetch_one(conn)
                    .await?
            }
        };
        let prev = prev.ok_or_else(|| {
            sqlx::Error::Protocol("idem: a found version row has no previous version".into())
        })?;
        Ok(if version > prev {
            VersionCheck::Advanced
        } else {
            compare(version, prev)
        })
    }

    async fn advance_versions<'c>(
        conn: &'c mut MySqlConnection,
        entries: &'c [VersionEntry<'c>],
    ) -> Result<Vec<VersionCheck>, sqlx::Error> {
        // Each entity once, with the greatest version the batch brings for it (what a new
        // entity ends at), sorted so that batches lock in one order.
        let mut greatest: HashMap<(&str, &[u8]), i64> = HashMap::default();
        for e in entries {
            let v = greatest.entry((e.scope, e.entity)).or_insert(e.version);
            *v = (*v).max(e.version);
        }
        let mut unique: Vec<VersionEntry<'_>> = greatest
            .into_iter()
            .map(|((scope, entity), version)| VersionEntry {
                scope,
                entity,
                version,
            })
            .collect();
        unique.sort_by(|a, b| (a.scope.as_bytes(), a.entity).cmp(&(b.scope.as_bytes(), b.entity)));
        let mut stored: HashMap<(&str, &[u8]), Option<i64>> = HashMap::default();
        for chunk in unique.chunks(MYSQL_ROWS_PER_STATEMENT) {
            // 1. Insert the new entities at their final version; lock the found ones and keep
            //    their version in `prev` (no per-row value is needed on the duplicate path).
            let upsert = |returning: &str| {
                format!(
                    "INSERT INTO idem_versions (scope, entity, version, updated_ms) VALUES {} \
                     ON DUPLICATE KEY UPDATE bumps = bumps + 1, prev = version{returning}",
                    row_list(concat!("(?, ?, ?, ", now_ms!(), ")"), chunk.len())
                )
            };
            let bind_upsert = |sql: String| {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for e in chunk {
                    query = query.bind(e.scope).bind(e.entity).bind(e.version);
                }
                query
            };
            // 2. What each found row held; `prev` is NULL only on a row just inserted. MariaDB
            //    returns it from the upsert; MySQL reads it back.
            let returned = try_returning(
                bind_upsert(upsert(" RETURNING scope, entity, prev")).fetch_all(&mut *conn),
            )
            .await?;
            let rows: Vec<(String, Vec<u8>, Option<i64>)> = match returned {
                Some(rows) => rows
                    .into_iter()
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                    .collect::<Result<_, sqlx::Error>>()?,
                None => {
                    bind_upsert(upsert("")).execute(&mut *conn).await?;
                    let sql = format!(
                        "SELECT scope, entity, prev FROM idem_versions WHERE (scope, entity) IN ({})",
                        pairs(chunk.len())
                    );
                    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
                    for e in chunk {
                        query = query.bind(e.scope).bind(e.entity);
                    }
                    query.fetch_all(&mut *conn).await?
                }
            };
            let rows: HashMap<(String, Vec<u8>), Option<i64>> = rows
                .into_iter()
                .map(|(scope, entity, prev)| ((scope, entity), prev))
                .collect();
            for e in chunk {
                let prev = rows
                    .get(&(e.scope.to_string(), e.entity.to_vec()))
                    .copied()
                    .flatten();
                stored.insert((e.scope, e.entity), prev);
            }
        }
        // 3. Decide in memory, as one after another; write the found entities that advanced
        //    (new ones were inserted at their final version already).
        let (checks, finals) = sequential_checks(&stored, entries);
        let updates: Vec<VersionEntry<'_>> = finals
            .into_iter()
            .filter(|e| {
                stored
                    .get(&(e.scope, e.entity))
                    .copied()
                    .flatten()
                    .is_some()
            })
            .collect();
        for chunk in updates.chunks(MYSQL_ROWS_PER_STATEMENT) {
            let mut sql = String::from("UPDATE idem_versions v JOIN (");
            for i in 0..chunk.len() {
                sql.push_str(if i == 0 {
                    "SELECT ? AS scope, ? AS entity, ? AS version"
                } else {
                    " UNION ALL SELECT ?, ?, ?"
                });
            }
            sql.push_str(concat!(
                ") u ON v.scope = u.scope AND v.entity = u.entity \
                 SET v.updated_ms = ",
                now_ms!(),
                ", v.version = u.version"
            ));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for e in chunk {
                query = query.bind(e.scope).bind(e.entity).bind(e.version);
            }
            query.execute(&mut *conn).await?;
        }
        Ok(checks)
    }

    async fn purge_expired(conn: &mut MySqlConnection, max: u64) -> Result<u64, sqlx::Error> {
        purge(
            conn,
            concat!(
                "SELECT scope, msg_key FROM idem_records WHERE expires_at < ",
                now_ms!(),
                " AND (lease_until IS NULL OR lease_until < ",
                now_ms!(),
                ") ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            "DELETE FROM idem_records WHERE (scope, msg_key) IN ",
            None,
            limit(max),
        )
        .await
    }

    async fn purge_versions(
        conn: &mut MySqlConnection,
        older_than: Duration,
        max: u64,
    ) -> Result<u64, sqlx::Error> {
        purge(
            conn,
            concat!(
                "SELECT scope, entity FROM idem_versions WHERE updated_ms < ",
                now_ms!(),
                " - ? ORDER BY updated_ms LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            "DELETE FROM idem_versions WHERE (scope, entity) IN ",
            Some(span_ms(older_than)),
            limit(max),
        )
        .await
    }

    fn is_transient(error: &sqlx::Error) -> bool {
        // A deadlock's victim (1213, SQLSTATE 40001) and a lock-wait timeout (1205, SQLSTATE
        // HY000), told by number; connection errors by the standard rule.
        if let sqlx::Error::Database(db) = error {
            if let Some(db) = db.try_downcast_ref::<MySqlDatabaseError>() {
                if matches!(db.number(), ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT) {
                    return true;
                }
            }
        }
        crate::store::is_transient_by_sqlstate(error)
    }

    fn retry_claim(error: &sqlx::Error) -> bool {
        // A deadlock's victim was rolled back whole. A lock-wait timeout rolled back only its
        // statement, and waiting the same time again is not "at once": not retried here.
        match error {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|db| db.number() == ER_LOCK_DEADLOCK),
            _ => false,
        }
    }
}

impl Leases for MySql {
    sql_methods!(leases);

    async fn claim_lease<'c>(
        conn: &'c mut MySqlConnection,
        request: LeaseRequest<'c>,
    ) -> Result<LeaseClaim, sqlx::Error> {
        let LeaseRequest {
            record,
            lease,
            token,
        } = request;
        // New, or in progress under an expired lease: the upsert takes it over atomically.
        // `lease_until` is assigned last, since the other assignments test its old value.
        let result = sqlx::query(concat!(
            "INSERT INTO idem_records \
                 (scope, msg_key, processed_at, expires_at, lease_until, lease_token) \
             VALUES (?, ?, UTC_TIMESTAMP(6), ",
            now_ms!(),
            " + ?, ",
            now_ms!(),
            " + ?, ?) \
             ON DUPLICATE KEY UPDATE dup_count = dup_count + 1, \
             processed_at = IF(lease_until < ",
            now_ms!(),
            ", UTC_TIMESTAMP(6), processed_at), \
             expires_at = IF(lease_until < ",
            now_ms!(),
            ", ",
            now_ms!(),
            " + ?, expires_at), \
             lease_token = IF(lease_until < ",
            now_ms!(),
            ", ?, lease_token), \
             lease_until = IF(lease_until < ",
            now_ms!(),
            ", ",
            now_ms!(),
            " + ?, lease_until)"
        ))
        .bind(record.scope)
        .bind(record.key)
        .bind(span_ms(record.retention))
        .bind(span_ms(lease))
        .bind(token)
        .bind(span_ms(record.retention))
        .bind(token)
        .bind(span_ms(lease))
        .execute(&mut *conn)
        .await?;
        if upsert_inserted(&result, "lease")? {
            return Ok(LeaseClaim::Acquired);
        }
        // Found: taken over (our token now holds an unexpired lease), in progress elsewhere,
        // or done. (`lease_until IS NULL` compares as NULL, so a done record is never taken.)
        let row: Option<(bool, bool)> = sqlx::query_as(
            "SELECT lease_until IS NOT NULL, lease_token <=> ? \
             FROM idem_records WHERE scope = ? AND msg_key = ?",
        )
        .bind(token)
        .bind(record.scope)
        .bind(record.key)
        .fetch_optional(conn)
        .await?;
        Ok(match row {
            Some((true, true)) => LeaseClaim::Acquired,
            Some((false, _)) => LeaseClaim::Done,
            // In progress elsewhere; or gone between the two statements (released or purged):
            // the caller may retry.
            Some((true, false)) | None => LeaseClaim::InProgress,
        })
    }
}

impl Stamps for MySql {
    const RECORDS_FINGERPRINT: bool = true;

    // `load_stamp` reads with a plain `SELECT`: every claim before it (record, version, lease,
    // batch upserts) bumped a counter on the row it found, so this transaction has written that
    // row; even under REPEATABLE READ, with an older snapshot, a plain read sees its own write,
    // which InnoDB made on the latest committed version (what a concurrent first delivery
    // committed).
    sql_methods!(stamps, load_stamps);

    async fn insert_record_or_read_stamp<'c>(
        conn: &'c mut MySqlConnection,
        record: Record<'c>,
    ) -> Result<Option<Option<StoredStamp>>, sqlx::Error> {
        // MariaDB: the upsert returns the row as it left it, a duplicate's bumped `dup_count`
        // (a new record's is 0) and the stamp its first delivery committed, which the row
        // lock waited for. One round trip where `insert_record` and `load_stamp` take two.
        let sql = record_upsert(record.fingerprint.is_some(), true);
        // The arguments only where `RETURNING` is tried (not on MySQL 8, once it refused).
        let returned: Option<CountedStamp> = try_returning(async {
            let arguments = record_arguments(record)?;
            sqlx::query_as_with(sql, arguments)
                .fetch_one(&mut *conn)
                .await
        })
        .await?;
        match returned {
            Some((0, ..)) => Ok(None),
            Some((_, fingerprint, result)) => Ok(Some(Some(StoredStamp {
                fingerprint,
                result,
            }))),
            None => {
                if Self::insert_record(&mut *conn, record).await? {
                    return Ok(None);
                }
                <Self as Sql>::load_stamp(conn, record.stamp_key())
                    .await
                    .map(Some)
            }
        }
    }

    async fn insert_records_reading_stamps<'c>(
        conn: &'c mut MySqlConnection,
        records: &'c [Record<'c>],
    ) -> Result<Vec<Inserted>, sqlx::Error> {
        // MariaDB: the upsert returns every row as it left it, a found one with the stamp its
        // first delivery committed (the row lock waited for it). One round trip where
        // `insert_records` and `load_stamps` take two.
        let unique = sorted_records(records);
        let fingerprints = fingerprinted(&unique);
        let mut rows: Vec<ReadBack> = Vec::with_capacity(unique.len());
        for (at, chunk) in unique.chunks(MYSQL_ROWS_PER_STATEMENT).enumerate() {
            let sql = records_upsert(
                chunk.len(),
                fingerprints,
                " RETURNING scope, msg_key, dup_count, fingerprint, result",
            );
            let returned = try_returning(async {
                let arguments = rows_arguments(chunk, fingerprints)?;
                sqlx::query_as_with(sqlx::AssertSqlSafe(sql), arguments)
                    .fetch_all(&mut *conn)
                    .await
            });
            match returned.await? {
                Some(returned) => rows.extend(returned),
                // MySQL 8 refuses `RETURNING` in the first statement, before anything is
                // written: the stamps are then left to `load_stamps`.
                None if at == 0 => {
                    let inserted = Self::insert_records(conn, records).await?;
                    return Ok(inserted.into_iter().map(Inserted::unread).collect());
                }
                None => {
                    return Err(sqlx::Error::Protocol(
                        "idem: the server refused RETURNING after running it".into(),
                    ))
                }
            }
        }
        read_back(records, rows)
    }

    async fn save_stamps<'c>(
        conn: &'c mut MySqlConnection,
        stamps: &'c [Stamp<'c>],
    ) -> Result<(), sqlx::Error> {
        // One statement per table and scope, each value picked by its key in a CASE: about a
        // third of the server's time of a join with a derived table of one SELECT a stamp, and
        // the same syntax on MySQL and MariaDB
        // (docs/design/performance.md#mysql-a-batchs-stamps-in-one-statement).
        let mut groups: Vec<((StampRow, &str), Vec<&Stamp<'_>>)> = Vec::new();
        for stamp in stamps {
            let group = (stamp.at.row, stamp.at.scope);
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, members)) => members.push(stamp),
                None => groups.push((group, vec![stamp])),
            }
        }
        for ((row, scope), members) in groups {
            if let [one] = members.as_slice() {
                <Self as Sql>::save_stamp(&mut *conn, **one).await?;
                continue;
            }
            let (table, column) = match row {
                StampRow::Record => ("idem_records", "msg_key"),
                StampRow::Version => ("idem_versions", "entity"),
            };
            for chunk in stamp_chunks(&members) {
                let picks = vec!["WHEN ? THEN ?"; chunk.len()].join(" ");
                let sql = format!(
                    "UPDATE {table} SET fingerprint = CASE {column} {picks} END, \
                     result = CASE {column} {picks} END WHERE scope = ? AND {column} IN ({})",
                    row_list("?", chunk.len())
                );
                // Built from constant fragments only; every value is bound.
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for stamp in chunk {
                    query = query.bind(stamp.at.key).bind(stamp.fingerprint);
                }
                for stamp in chunk {
                    query = query.bind(stamp.at.key).bind(stamp.result);
                }
                query = query.bind(scope);
                for stamp in chunk {
                    query = query.bind(stamp.at.key);
                }
                query.execute(&mut *conn).await?;
            }
        }
        Ok(())
    }
}

impl Attempts for MySql {
    sql_methods!(attempt_counts);

    async fn count_attempt<'c>(
        conn: &'c mut MySqlConnection,
        attempt: FailedAttempt<'c>,
    ) -> Result<u32, sqlx::Error> {
        // No RETURNING on MySQL 8: the upsert locks the row, and the read that follows in the
        // same (short, own) transaction sees this transaction's write.
        // At most MAX_ERROR_LEN bytes (the runtime cuts it); MEDIUMTEXT holds far more.
        let error = attempt.error;
        sqlx::query(concat!(
            "INSERT INTO idem_attempts (scope, msg_key, attempts, last_error, updated_ms) \
             VALUES (?, ?, 1, ?, ",
            now_ms!(),
            ") ON DUPLICATE KEY UPDATE attempts = attempts + 1, last_error = ?, updated_ms = ",
            now_ms!()
        ))
        .bind(attempt.record.scope)
        .bind(attempt.record.key)
        .bind(error)
        .bind(error)
        .execute(&mut *conn)
        .await?;
        let attempts: i32 =
            sqlx::query_scalar(const { text::LOAD_ATTEMPTS.with(Self::PLACEHOLDERS) })
                .bind(attempt.record.scope)
                .bind(attempt.record.key)
                .fetch_one(conn)
                .await?;
        Ok(u32::try_from(attempts).unwrap_or(0))
    }
}

/// Deletes at most `limit` rows that `select` finds (two key columns; `SKIP LOCKED`, so a
/// purge never waits on, nor deadlocks with, a handler holding a row), in a short READ
/// COMMITTED transaction of its own (no gap locks that would block handlers' inserts). `arg`
/// is bound before the limit, if given.
async fn purge(
    conn: &mut MySqlConnection,
    select: &'static str,
    delete: &'static str,
    arg: Option<i64>,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    if !conn.is_in_transaction() {
        // For the next transaction of this session only.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
    }
    let mut tx = conn.begin().await?;
    let mut query = sqlx::query_as(select);
    if let Some(arg) = arg {
        query = query.bind(arg);
    }
    let rows: Vec<(String, Vec<u8>)> = query.bind(limit).fetch_all(&mut *tx).await?;
    let mut deleted = 0;
    for chunk in rows.chunks(MYSQL_ROWS_PER_STATEMENT) {
        let sql = format!("{delete}({})", pairs(chunk.len()));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (a, b) in chunk {
            query = query.bind(a).bind(b);
        }
        deleted += query.execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(deleted)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StampKey;

    fn at<'a>(scope: &'a str, key: &'a [u8]) -> Record<'a> {
        Record {
            scope,
            key,
            retention: Duration::from_secs(60),
            fingerprint: None,
        }
    }

    #[test]
    fn read_back_gives_each_place_its_rows_result() {
        let stamp = StoredStamp {
            fingerprint: Some(vec![1; 32]),
            result: Some(b"7".to_vec()),
        };
        let rows: Vec<ReadBack> = vec![
            (
                "s".into(),
                b"old".to_vec(),
                3,
                Some(vec![1; 32]),
                Some(b"7".to_vec()),
            ),
            ("s".into(), b"new".to_vec(), 0, Some(vec![2; 32]), None),
            ("t".into(), b"old".to_vec(), 0, None, None),
        ];
        let requested = [
            at("s", b"new"),
            at("s", b"old"),
            at("t", b"old"),
            at("s", b"new"),
        ];
        let found = read_back(&requested, rows).unwrap();
        let written = StoredStamp {
            fingerprint: Some(vec![2; 32]),
            result: None,
        };
        assert_eq!(
            found,
            [
                Inserted::unread(true),
                Inserted {
                    new: false,
                    stamp: Some(stamp),
                },
                Inserted::unread(true),
                // A pair given twice: new at its first place, then its row as the upsert left it.
                Inserted {
                    new: false,
                    stamp: Some(written),
                },
            ]
        );
    }

    fn stamp(result: &[u8]) -> Stamp<'_> {
        Stamp {
            at: StampKey {
                row: StampRow::Record,
                scope: "s",
                key: b"k",
            },
            fingerprint: None,
            result: Some(result),
        }
    }

    fn chunk_sizes(stamps: &[Stamp<'_>]) -> Vec<usize> {
        let refs: Vec<&Stamp<'_>> = stamps.iter().collect();
        stamp_chunks(&refs).iter().map(|c| c.len()).collect()
    }

    #[test]
    fn stamps_go_in_statements_bounded_in_rows_and_bytes() {
        let big = vec![b'x'; MYSQL_STAMP_BYTES_PER_STATEMENT / 3];
        let huge = vec![b'y'; 2 * MYSQL_STAMP_BYTES_PER_STATEMENT];
        let stamps = [
            stamp(&big),
            stamp(&big),
            stamp(&big),
            stamp(&huge),
            stamp(b"1"),
        ];
        // Three thirds and their keys overflow by the keys: two, then one; the huge one alone.
        assert_eq!(chunk_sizes(&stamps), [2, 1, 1, 1]);
        let small = vec![stamp(b"1"); MYSQL_ROWS_PER_STATEMENT + 1];
        assert_eq!(chunk_sizes(&small), [MYSQL_ROWS_PER_STATEMENT, 1]);
        assert!(chunk_sizes(&[]).is_empty());
    }

    #[test]
    fn read_back_refuses_a_record_without_its_row() {
        let rows: Vec<ReadBack> = vec![("s".into(), b"a".to_vec(), 0, None, None)];
        let missing = read_back(&[at("s", b"a"), at("s", b"b")], rows).unwrap_err();
        assert!(
            missing.to_string().contains("no row for a record of `s`"),
            "{missing}"
        );
    }
}

//! MySQL / MariaDB specific tests (`IDEM_MYSQL_URL`, default the local server), one database
//! per test: how sqlx's CLIENT_FOUND_ROWS and MariaDB's SIMULTANEOUS_ASSIGNMENT meet idem's
//! upserts, InnoDB's deadlocks between waiting duplicates, the index limits of scope and key,
//! epoch-millisecond times, purges, leases and batches. Every test asserts the database's state.
#![cfg(feature = "mysql")]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::store::{
    Inserted, LeaseClaim, LeaseHold, LeaseRequest, Leases, Record, RecordKey, Stamp, Stamps, Store,
    StoredStamp, VersionCheck, VersionEntry,
};
use idem::{idempotent, Error, Outcome, RetryPolicy, Transient, Tx};
use sqlx::{MySql, MySqlPool};

/// Opens the test database (with the tables of [`setup`], or a session sql_mode, if given),
/// or skips with the reason printed.
macro_rules! db {
    () => {
        db!(None)
    };
    (tables) => {{
        let pool = db!();
        setup(&pool).await;
        pool
    }};
    ($session:expr) => {
        match common::mysql_with($session).await {
            Some(pool) => pool,
            None => return,
        }
    };
}

const WITH_SIMULTANEOUS_ASSIGNMENT: &str =
    "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')";
const WITHOUT_SIMULTANEOUS_ASSIGNMENT: &str =
    "SET SESSION sql_mode = REPLACE(@@sql_mode, 'SIMULTANEOUS_ASSIGNMENT', '')";

async fn setup(pool: &MySqlPool) {
    for sql in [
        "CREATE TABLE effects (msg VARCHAR(64) NOT NULL)",
        "CREATE TABLE accounts (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status VARCHAR(32) NOT NULL, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// A handler's effect: one row of `effects`, no unique key, so a double shows.
async fn effect(tx: &mut Tx<'_, MySql>, msg: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (msg) VALUES (?)")
        .bind(msg)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn count(pool: &MySqlPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

fn record<'a>(scope: &'a str, key: &'a [u8]) -> Record<'a> {
    Record {
        scope,
        key,
        retention: Duration::from_secs(3600),
        fingerprint: None,
    }
}

/// [`record`], with a fingerprint to write.
fn fingerprinted<'a>(scope: &'a str, key: &'a [u8], fingerprint: &'a [u8; 32]) -> Record<'a> {
    Record {
        fingerprint: Some(fingerprint),
        ..record(scope, key)
    }
}

// ---------------------------------------------------------------------------------------------
// CLIENT_FOUND_ROWS

/// The rows affected that a client without CLIENT_FOUND_ROWS reads, through the `mariadb` (or
/// `mysql`) command-line client, which does not set the flag: `ROW_COUNT()` answers as the
/// session's flag says. `None` when no such client is installed.
fn rows_without_found_rows(database: &str, statements: &[&str]) -> Option<Vec<i64>> {
    let mut script = String::new();
    for statement in statements {
        script.push_str(statement);
        script.push_str(";\nSELECT ROW_COUNT();\n");
    }
    let url: sqlx::mysql::MySqlConnectOptions = common::mysql_url().parse().unwrap();
    for client in ["mariadb", "mysql"] {
        let Ok(out) = std::process::Command::new(client)
            .args([
                "-N",
                "-B",
                "-h",
                url.get_host(),
                "-P",
                &url.get_port().to_string(),
            ])
            .args(["-u", url.get_username(), database, "-e", &script])
            .output()
        else {
            continue;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        return Some(text.lines().map(|l| l.trim().parse().unwrap()).collect());
    }
    None
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn client_found_rows_as_sqlx_sets_it_and_without_it() {
    let pool = db!();
    // What sqlx's flag does: an upsert that changes nothing reports the row it found.
    sqlx::query("CREATE TABLE probe (k BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)")
        .execute(&pool)
        .await
        .unwrap();
    let noop = "INSERT INTO probe (k) VALUES (1) ON DUPLICATE KEY UPDATE k = k";
    let bump = "INSERT INTO probe (k) VALUES (2) ON DUPLICATE KEY UPDATE n = n + 1";
    let mut affected = Vec::new();
    for sql in [noop, noop, bump, bump] {
        affected.push(
            sqlx::query(sql)
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected(),
        );
    }
    assert_eq!(
        affected,
        [1, 1, 1, 2],
        "sqlx sets CLIENT_FOUND_ROWS: a no-op reads as an insert"
    );

    // idem's claim, through the store: new, then a duplicate, told apart with the flag on.
    let mut conn = pool.acquire().await.unwrap();
    assert!(MySql::insert_record(&mut conn, record("cfr", b"k1"))
        .await
        .unwrap());
    assert!(!MySql::insert_record(&mut conn, record("cfr", b"k1"))
        .await
        .unwrap());
    let dups: i64 = sqlx::query_scalar("SELECT dup_count FROM idem_records WHERE scope = 'cfr'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        dups, 1,
        "the duplicate path bumps idem's own counter (autocommit here)"
    );
    // The version upsert: new, advanced, equal, behind.
    let entry = |version| VersionEntry {
        scope: "cfr",
        entity: b"e",
        version,
    };
    let mut checks = Vec::new();
    for v in [5, 7, 7, 6] {
        checks.push(MySql::advance_version(&mut conn, entry(v)).await.unwrap());
    }
    assert_eq!(
        checks,
        [
            VersionCheck::Advanced,
            VersionCheck::Advanced,
            VersionCheck::Equal,
            VersionCheck::Behind { latest: 7 }
        ]
    );
    let row: (i64, Option<i64>, i64) =
        sqlx::query_as("SELECT version, prev, bumps FROM idem_versions WHERE scope = 'cfr'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(row, (7, Some(7), 3));
    drop(conn);

    // The same SQL shapes (as in backend/mysql/store.rs) from a client without the flag: sqlx 0.9 sets
    // it on every connection and has no option to clear it.
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let record_sql = "INSERT INTO idem_records (scope, msg_key, processed_at, expires_at) \
         VALUES ('off', 'k', UTC_TIMESTAMP(6), 0) ON DUPLICATE KEY UPDATE dup_count = dup_count + 1";
    let version_sql = |v: i64| {
        format!(
            "INSERT INTO idem_versions (scope, entity, version, updated_ms) VALUES ('off', 'e', {v}, 0) \
             ON DUPLICATE KEY UPDATE bumps = bumps + 1, prev = version, \
             updated_ms = IF(version < {v}, 1, updated_ms), version = GREATEST(version, {v})"
        )
    };
    let statements = [
        noop.replace("(1)", "(3)"),
        noop.replace("(1)", "(3)"),
        record_sql.to_string(),
        record_sql.to_string(),
        version_sql(5),
        version_sql(7),
        version_sql(7),
        version_sql(6),
    ];
    let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
    match rows_without_found_rows(&database, &statements) {
        Some(rows) => {
            // The no-op upsert: 1 / 0 without the flag (1 / 1 with it); idem's: 1 / 2 in both.
            assert_eq!(rows, [1, 0, 1, 2, 1, 2, 2, 2]);
            let row: (i64, Option<i64>, i64) = sqlx::query_as(
                "SELECT version, prev, bumps FROM idem_versions WHERE scope = 'off'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(row, (7, Some(7), 3));
        }
        None => eprintln!("flag-off half skipped: no `mariadb` or `mysql` client on PATH"),
    }
    common::drop_mysql(pool).await;
}

// ---------------------------------------------------------------------------------------------
// SIMULTANEOUS_ASSIGNMENT

#[derive(Clone, Debug)]
struct StatusChanged {
    event_id: String,
    order_id: i64,
    version: i64,
    status: String,
}

fn status(event_id: &str, order_id: i64, version: i64, status: &str) -> StatusChanged {
    StatusChanged {
        event_id: event_id.into(),
        order_id,
        version,
        status: status.into(),
    }
}

async fn upsert_order(tx: &mut Tx<'_, MySql>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES (?, ?, ?) \
         ON DUPLICATE KEY UPDATE status = ?, version = ?",
    )
    .bind(msg.order_id)
    .bind(&msg.status)
    .bind(msg.version)
    .bind(&msg.status)
    .bind(msg.version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[idempotent(
    key = "msg.order_id",
    version = "msg.version",
    scope = "mysql::set_status"
)]
async fn set_status(tx: &mut Tx<'_, MySql>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    upsert_order(tx, msg).await
}

#[idempotent(key = msg.event_id, version = msg.version, entity = msg.order_id, scope = "mysql::on_status")]
async fn on_status(tx: &mut Tx<'_, MySql>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    upsert_order(tx, msg).await
}

async fn order(pool: &MySqlPool, id: i64) -> (String, i64) {
    sqlx::query_as("SELECT status, version FROM orders WHERE id = ?")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Versions in all modes, one by one and batched, and leases, under one sql_mode.
async fn versions_and_leases_decide_right(session: &'static str, expect_mode: bool) {
    let pool = db!(Some(session));
    let mode: String = sqlx::query_scalar("SELECT @@SESSION.sql_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        mode.contains("SIMULTANEOUS_ASSIGNMENT"),
        expect_mode,
        "{mode}"
    );
    setup(&pool).await;

    // key + version
    let s = |v, name| status(&format!("k-{v}"), 1, v, name);
    assert_eq!(
        set_status(&pool, &s(5, "paid")).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        set_status(&pool, &s(7, "shipped")).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        set_status(&pool, &s(7, "shipped")).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        set_status(&pool, &s(6, "late")).await.unwrap(),
        Outcome::Stale { latest: 7 }
    );
    assert_eq!(order(&pool, 1).await, ("shipped".to_string(), 7));
    assert_eq!(
        common::Stored(&pool)
            .version("mysql::set_status", "1")
            .await,
        Some(7)
    );

    // key + version + entity
    let e = |id: &str, v, name| status(id, 2, v, name);
    assert_eq!(
        on_status(&pool, &e("a", 3, "paid")).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        on_status(&pool, &e("a", 3, "paid")).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        on_status(&pool, &e("b", 2, "old")).await.unwrap(),
        Outcome::Stale { latest: 3 }
    );
    assert_eq!(
        on_status(&pool, &e("c", 3, "same")).await.unwrap(),
        Outcome::Stale { latest: 3 }
    );
    assert_eq!(
        on_status(&pool, &e("d", 9, "shipped")).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(order(&pool, 2).await, ("shipped".to_string(), 9));
    assert_eq!(
        common::Stored(&pool).version("mysql::on_status", "2").await,
        Some(9)
    );
    // Stale and duplicate deliveries kept no record.
    let events: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT msg_key FROM idem_records WHERE scope = 'mysql::on_status' ORDER BY msg_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(events, [b"a".to_vec(), b"d".to_vec()]);

    // Batched versions, decided as one after another.
    let mut conn = pool.acquire().await.unwrap();
    let entry = |entity: &'static [u8], version| VersionEntry {
        scope: "b",
        entity,
        version,
    };
    assert_eq!(
        MySql::advance_versions(&mut conn, &[entry(b"x", 5)])
            .await
            .unwrap(),
        [VersionCheck::Advanced]
    );
    let checks = MySql::advance_versions(
        &mut conn,
        &[
            entry(b"x", 4),
            entry(b"x", 6),
            entry(b"x", 6),
            entry(b"y", 1),
            entry(b"x", 5),
            entry(b"z", -3),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        checks,
        [
            VersionCheck::Behind { latest: 5 },
            VersionCheck::Advanced,
            VersionCheck::Equal,
            VersionCheck::Advanced,
            VersionCheck::Behind { latest: 6 },
            VersionCheck::Advanced,
        ]
    );
    let rows: Vec<(Vec<u8>, i64)> = sqlx::query_as(
        "SELECT entity, version FROM idem_versions WHERE scope = 'b' ORDER BY entity",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [(b"x".to_vec(), 6), (b"y".to_vec(), 1), (b"z".to_vec(), -3)]
    );

    // Leases: acquire, in progress elsewhere, taken over once expired, done.
    let lease = |token, lease| LeaseRequest {
        record: record("l", b"m"),
        lease,
        token,
    };
    let long = Duration::from_secs(60);
    assert_eq!(
        MySql::claim_lease(&mut conn, lease(1, Duration::ZERO))
            .await
            .unwrap(),
        LeaseClaim::Acquired
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        MySql::claim_lease(&mut conn, lease(2, long)).await.unwrap(),
        LeaseClaim::Acquired
    );
    assert_eq!(
        MySql::claim_lease(&mut conn, lease(3, long)).await.unwrap(),
        LeaseClaim::InProgress
    );
    let token: i64 = sqlx::query_scalar("SELECT lease_token FROM idem_records WHERE scope = 'l'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        token, 2,
        "the takeover wrote its token; the refused claim did not"
    );
    let hold = |token| LeaseHold {
        record: RecordKey {
            scope: "l",
            key: b"m",
        },
        token,
    };
    assert!(!MySql::complete_lease(&mut conn, hold(1)).await.unwrap());
    assert!(MySql::complete_lease(&mut conn, hold(2)).await.unwrap());
    assert_eq!(
        MySql::claim_lease(&mut conn, lease(4, long)).await.unwrap(),
        LeaseClaim::Done
    );
    assert!(
        !MySql::release_lease(&mut conn, hold(2)).await.unwrap(),
        "a done record is not released"
    );
    let left: (Option<i64>, i64) =
        sqlx::query_as("SELECT lease_until, lease_token FROM idem_records WHERE scope = 'l'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(left, (None, 2));
    drop(conn);
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn versions_and_leases_with_simultaneous_assignment() {
    versions_and_leases_decide_right(WITH_SIMULTANEOUS_ASSIGNMENT, true).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn versions_and_leases_without_simultaneous_assignment() {
    versions_and_leases_decide_right(WITHOUT_SIMULTANEOUS_ASSIGNMENT, false).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn the_assignment_order_is_what_makes_both_modes_agree() {
    // What the order guards against: `prev = version` after `version = …` reads the new
    // version without SIMULTANEOUS_ASSIGNMENT, the old one with it.
    for (session, expected_prev) in [
        (WITHOUT_SIMULTANEOUS_ASSIGNMENT, 9),
        (WITH_SIMULTANEOUS_ASSIGNMENT, 5),
    ] {
        let pool = db!(Some(session));
        let wrong = "INSERT INTO idem_versions (scope, entity, version, updated_ms) VALUES ('w', 'e', ?, 0) \
             ON DUPLICATE KEY UPDATE bumps = bumps + 1, version = GREATEST(version, ?), prev = version";
        for v in [5, 9] {
            sqlx::query(wrong)
                .bind(v)
                .bind(v)
                .execute(&pool)
                .await
                .unwrap();
        }
        let prev: Option<i64> =
            sqlx::query_scalar("SELECT prev FROM idem_versions WHERE scope = 'w'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(prev, Some(expected_prev), "{session}");
        common::drop_mysql(pool).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency: deadlocks between waiting duplicates, many workers, racing versions

#[derive(Clone, Debug)]
struct Flaky {
    id: String,
    /// Taken by the first body that runs: it waits, so that the others queue behind its row
    /// lock, then fails with a transient error of its own.
    fail_once: Arc<AtomicBool>,
    ran: Arc<AtomicU32>,
}

#[derive(Debug)]
enum FlakyError {
    Db(sqlx::Error),
    Injected,
}

impl From<sqlx::Error> for FlakyError {
    fn from(err: sqlx::Error) -> Self {
        FlakyError::Db(err)
    }
}

impl Transient for FlakyError {
    fn is_transient(&self) -> bool {
        match self {
            FlakyError::Db(err) => err.is_transient(),
            FlakyError::Injected => true,
        }
    }
}

#[idempotent(key = "msg.id", scope = "mysql::flaky")]
async fn flaky(tx: &mut Tx<'_, MySql>, msg: &Flaky) -> Result<(), FlakyError> {
    msg.ran.fetch_add(1, Ordering::SeqCst);
    effect(tx, &msg.id).await?;
    if msg.fail_once.swap(false, Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        return Err(FlakyError::Injected);
    }
    Ok(())
}

fn is_deadlock(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|e| e.number() == 1213))
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn duplicates_behind_a_failing_first_delivery_apply_once_and_never_error() {
    duplicates_behind_a_failing_first_delivery(true).await;
}

/// Only the failing delivery is retried by the caller: the waiters' deadlocks never reach
/// theirs, because idem claims again in the transaction it opened.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn waiting_duplicates_never_see_the_deadlock_idem_retries() {
    duplicates_behind_a_failing_first_delivery(false).await;
}

async fn duplicates_behind_a_failing_first_delivery(all_retried: bool) {
    let pool = db!(tables);
    const DUPLICATES: usize = 8;
    for round in 0..3 {
        let msg = Flaky {
            id: format!("m-{round}"),
            fail_once: Arc::new(AtomicBool::new(true)),
            ran: Arc::new(AtomicU32::new(0)),
        };
        let mut tasks = Vec::new();
        for i in 0..DUPLICATES {
            let (pool, msg) = (pool.clone(), msg.clone());
            tasks.push(tokio::spawn(async move {
                if all_retried || i == 0 {
                    let policy = RetryPolicy {
                        attempts: 5,
                        ..RetryPolicy::default()
                    };
                    idem::retry(policy, || flaky(&pool, &msg)).await
                } else {
                    flaky(&pool, &msg).await
                }
            }));
            if i == 0 {
                // The first delivery takes the row lock; the others queue behind it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap().expect("no error is left to the caller"));
        }
        let applied = outcomes
            .iter()
            .filter(|o| **o == Outcome::Applied(()))
            .count();
        let duplicates = outcomes
            .iter()
            .filter(|o| **o == Outcome::Duplicate)
            .count();
        assert_eq!((applied, duplicates), (1, DUPLICATES - 1), "{outcomes:?}");
        // Exactly one effect and one record; the failed body's write was rolled back, and the
        // duplicates' counter bumps went with their rolled-back claims.
        let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE msg = ?")
            .bind(&msg.id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(effects, 1);
        let dup_count: Vec<i64> = sqlx::query_scalar(
            "SELECT dup_count FROM idem_records WHERE scope = 'mysql::flaky' AND msg_key = ?",
        )
        .bind(msg.id.as_bytes())
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(dup_count, [0]);
        assert_eq!(
            msg.ran.load(Ordering::SeqCst),
            2,
            "the failed body and the applied one"
        );
    }
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn in_a_callers_transaction_the_deadlock_reaches_the_caller() {
    let pool = db!(tables);
    const DUPLICATES: usize = 8;
    let msg = Flaky {
        id: "caller".into(),
        fail_once: Arc::new(AtomicBool::new(true)),
        ran: Arc::new(AtomicU32::new(0)),
    };
    let mut tasks = Vec::new();
    for i in 0..DUPLICATES {
        let (pool, msg) = (pool.clone(), msg.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let result = flaky(&mut tx, &msg).await;
            if result.is_ok() {
                tx.commit().await.unwrap();
            }
            result
        }));
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut deadlocks = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => {}
            Err(Error::Store(err)) if is_deadlock(&err) => {
                assert!(err.is_transient() && idem::store::is_transient(&err));
                assert!(<MySql as Store>::retry_claim(&err));
                deadlocks += 1;
            }
            Err(Error::Handler(FlakyError::Injected)) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    // Measured on MariaDB 10.11: all waiters but one are deadlock victims when the first
    // delivery rolls back. Inside a caller's transaction idem cannot retry: the caller sees it.
    assert!(deadlocks >= 1, "expected InnoDB to deadlock some waiters");
    let effects = count(&pool, "SELECT COUNT(*) FROM effects").await;
    assert!(effects <= 1);
    common::drop_mysql(pool).await;
}

/// Batches waiting behind a delivery that rolls back deadlock like single deliveries do; idem
/// opened each batch's transaction, so it claims the batch again.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn batches_behind_a_failing_first_delivery_apply_once_and_never_error() {
    let pool = db!(tables);
    const BATCHES: usize = 6;
    let fail_once = Arc::new(AtomicBool::new(true));
    let ran = Arc::new(AtomicU32::new(0));
    let msg = |id: &str| Flaky {
        id: id.into(),
        fail_once: fail_once.clone(),
        ran: ran.clone(),
    };
    let first = {
        let (pool, shared) = (pool.clone(), msg("shared"));
        tokio::spawn(async move { flaky(&pool, &shared).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut tasks = Vec::new();
    for b in 0..BATCHES {
        let pool = pool.clone();
        let messages = vec![msg(&format!("own-{b}")), msg("shared")];
        tasks.push(tokio::spawn(async move {
            idem::batch(&pool, &messages, async |batch, m| flaky(batch, m).await).await
        }));
    }
    assert!(matches!(
        first.await.unwrap(),
        Err(Error::Handler(FlakyError::Injected))
    ));
    let mut shared_applied = 0;
    for task in tasks {
        let results = task
            .await
            .unwrap()
            .expect("no batch error is left to the caller");
        assert_eq!(results[0].as_ref().unwrap(), &Outcome::Applied(()));
        match results[1].as_ref().unwrap() {
            Outcome::Applied(()) => shared_applied += 1,
            Outcome::Duplicate => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(shared_applied, 1);
    let effects = count(&pool, "SELECT COUNT(*) FROM effects").await;
    assert_eq!(effects, BATCHES as i64 + 1);
    let records = count(&pool, "SELECT COUNT(*) FROM idem_records").await;
    assert_eq!(records, BATCHES as i64 + 1);
    common::drop_mysql(pool).await;
}

#[derive(Clone, Debug)]
struct Credit {
    id: String,
    account: String,
    amount: i64,
}

#[idempotent(key = "msg.id", scope = "mysql::apply_credit")]
async fn apply_credit(tx: &mut Tx<'_, MySql>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO accounts (id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE balance = balance + ?",
    )
    .bind(&msg.account)
    .bind(msg.amount)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn sixteen_workers_apply_each_message_exactly_once() {
    let pool = db!(tables);
    const WORKERS: usize = 16;
    const MESSAGES: i64 = 40;
    let messages: Arc<Vec<Credit>> = Arc::new(
        (0..MESSAGES)
            .map(|i| Credit {
                id: format!("c-{i}"),
                account: format!("acct-{}", i % 4),
                amount: i + 1,
            })
            .collect(),
    );
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (pool, messages) = (pool.clone(), messages.clone());
        tasks.push(tokio::spawn(async move {
            let mut applied = 0;
            for i in 0..messages.len() {
                let msg = &messages[(i + worker * 3) % messages.len()];
                // Workers crediting one account can deadlock in the user's own table (not at
                // the claim): that is the handler's transient error, for idem::retry.
                match idem::retry(
                    RetryPolicy {
                        attempts: 20,
                        ..RetryPolicy::default()
                    },
                    || apply_credit(&pool, msg),
                )
                .await
                {
                    Ok(Outcome::Applied(())) => applied += 1,
                    Ok(Outcome::Duplicate) => {}
                    other => panic!("worker {worker}, {}: {other:?}", msg.id),
                }
            }
            applied
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += task.await.unwrap();
    }
    assert_eq!(applied, MESSAGES);
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM idem_records WHERE scope = 'mysql::apply_credit'"
        )
        .await,
        MESSAGES
    );
    for account in 0..4 {
        let expected: i64 = (0..MESSAGES)
            .filter(|i| i % 4 == account)
            .map(|i| i + 1)
            .sum();
        let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = ?")
            .bind(format!("acct-{account}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(balance, expected);
    }
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn racing_versions_end_in_the_newest_state() {
    let pool = db!(tables);
    const ORDERS: i64 = 12;
    let mut tasks = Vec::new();
    for order_id in 0..ORDERS {
        // Versions 5 and 6 of each order race; the older one is sent first half of the time.
        for (version, name) in [(5, "paid"), (6, "shipped")] {
            let pool = pool.clone();
            let msg = status(&format!("ev-{order_id}-{version}"), order_id, version, name);
            tasks.push(tokio::spawn(async move {
                idem::retry(RetryPolicy::default(), || on_status(&pool, &msg)).await
            }));
        }
        if order_id % 2 == 0 {
            let n = tasks.len();
            tasks.swap(n - 1, n - 2);
        }
    }
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert!(
            matches!(outcome, Outcome::Applied(()) | Outcome::Stale { latest: 6 }),
            "{outcome:?}"
        );
    }
    for order_id in 0..ORDERS {
        assert_eq!(
            order(&pool, order_id).await,
            ("shipped".to_string(), 6),
            "order {order_id}"
        );
        assert_eq!(
            common::Stored(&pool)
                .version("mysql::on_status", &order_id.to_string())
                .await,
            Some(6)
        );
    }
    common::drop_mysql(pool).await;
}

// ---------------------------------------------------------------------------------------------
// Limits, times, purges, migrations, errors

#[idempotent(
    key = "key",
    scope = "mysql::ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss"
)]
async fn at_max_scope(tx: &mut Tx<'_, MySql>, key: Vec<u8>) -> Result<(), sqlx::Error> {
    effect(tx, "max").await
}

#[idempotent(
    key = "key",
    scope = "mysql::ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssx"
)]
async fn over_max_scope(tx: &mut Tx<'_, MySql>, key: Vec<u8>) -> Result<(), sqlx::Error> {
    effect(tx, "over").await
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn scope_and_key_at_their_maxima_work_and_one_byte_over_is_refused() {
    use idem::key::{KeyPart, KeyProblem, MAX_KEY_LEN, MAX_SCOPE_LEN};
    let pool = db!(tables);
    assert_eq!((MAX_SCOPE_LEN, MAX_KEY_LEN), (255, 512));
    let at = vec![0xff_u8; MAX_KEY_LEN];
    assert_eq!(
        at_max_scope(&pool, at.clone()).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        at_max_scope(&pool, at.clone()).await.unwrap(),
        Outcome::Duplicate
    );
    let stored: (i64, i64) =
        sqlx::query_as("SELECT LENGTH(scope), LENGTH(msg_key) FROM idem_records")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, (255, 512));

    let over_key = vec![0xff_u8; MAX_KEY_LEN + 1];
    match at_max_scope(&pool, over_key).await {
        Err(Error::Key(err)) => {
            assert_eq!(err.part(), KeyPart::Key);
            assert_eq!(err.problem(), &KeyProblem::TooLong { len: 513, max: 512 });
        }
        other => panic!("{other:?}"),
    }
    match over_max_scope(&pool, b"k".to_vec()).await {
        Err(Error::Key(err)) => {
            assert_eq!(err.part(), KeyPart::Scope);
            assert!(
                err.to_string()
                    .contains("scope is 256 bytes long; the maximum is 255"),
                "{err}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing of the refused ones was written.
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_records").await, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 1);
    // The columns hold exactly that much: a store call past idem's checks is refused by the
    // database (strict mode), never truncated into another key.
    let mut conn = pool.acquire().await.unwrap();
    let long_scope = "s".repeat(MAX_SCOPE_LEN + 1);
    assert!(MySql::insert_record(&mut conn, record(&long_scope, b"k"))
        .await
        .is_err());
    let long_key = vec![1_u8; MAX_KEY_LEN + 1];
    assert!(MySql::insert_record(&mut conn, record("s", &long_key))
        .await
        .is_err());
    drop(conn);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_records").await, 1);
    common::drop_mysql(pool).await;
}

#[idempotent(key = "id", scope = "mysql::century", retention = "36500d")]
async fn century(tx: &mut Tx<'_, MySql>, id: u32) -> Result<(), sqlx::Error> {
    effect(tx, "century").await
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn a_century_of_retention_and_bounded_purges() {
    let pool = db!(tables);
    assert_eq!(century(&pool, 1).await.unwrap(), Outcome::Applied(()));
    let (expires, now): (i64, i64) = sqlx::query_as(
        "SELECT expires_at, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 \
         FROM idem_records WHERE scope = 'mysql::century'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let century_ms = 36_500 * 86_400_000_i64;
    assert!(
        (expires - now - century_ms).abs() < 60_000,
        "{expires} {now}"
    );
    // Past 2038 and far beyond, as a DATETIME reads it.
    let year: i64 = sqlx::query_scalar(
        "SELECT YEAR(TIMESTAMPADD(MICROSECOND, expires_at * 1000, '1970-01-01')) FROM idem_records \
         WHERE scope = 'mysql::century'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(year >= 2125, "{year}");

    let mut conn = pool.acquire().await.unwrap();
    // A retention too long to add to now is capped, not an overflow.
    let forever = Record {
        scope: "forever",
        key: b"k",
        retention: Duration::MAX,
        fingerprint: None,
    };
    assert!(MySql::insert_record(&mut conn, forever).await.unwrap());
    // 250 expired records, one expired lease-less record in progress (not expired lease).
    let expired: Vec<Vec<u8>> = (0..250).map(|i| format!("old-{i}").into_bytes()).collect();
    let records: Vec<Record<'_>> = expired
        .iter()
        .map(|k| Record {
            scope: "old",
            key: k,
            retention: Duration::ZERO,
            fingerprint: None,
        })
        .collect();
    assert!(MySql::insert_records(&mut conn, &records)
        .await
        .unwrap()
        .iter()
        .all(|new| *new));
    let busy = LeaseRequest {
        record: Record {
            scope: "busy",
            key: b"k",
            retention: Duration::ZERO,
            fingerprint: None,
        },
        lease: Duration::from_secs(60),
        token: 7,
    };
    assert_eq!(
        MySql::claim_lease(&mut conn, busy).await.unwrap(),
        LeaseClaim::Acquired
    );
    drop(conn);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        MySql::purge_expired(&mut *pool.acquire().await.unwrap(), 100)
            .await
            .unwrap(),
        100
    );
    assert_eq!(
        idem::retention::purge_expired(&pool, 100).await.unwrap(),
        150
    );
    // Left: the century, the capped one, and the record whose lease still runs.
    let left: Vec<String> = sqlx::query_scalar("SELECT scope FROM idem_records ORDER BY scope")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["busy", "forever", "mysql::century"]);

    // Versions not advanced for a while go, others stay; a century-long window purges nothing.
    let mut conn = pool.acquire().await.unwrap();
    for (entity, version) in [(&b"a"[..], 1), (b"b", 1)] {
        MySql::advance_version(
            &mut conn,
            VersionEntry {
                scope: "v",
                entity,
                version,
            },
        )
        .await
        .unwrap();
    }
    sqlx::query("UPDATE idem_versions SET updated_ms = updated_ms - 86400000 WHERE entity = 'a'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let century = Duration::from_secs(36_500 * 86_400);
    assert_eq!(
        MySql::purge_versions(&mut conn, century, 10).await.unwrap(),
        0
    );
    assert_eq!(
        MySql::purge_versions(&mut conn, Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        1
    );
    let left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT entity FROM idem_versions")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(left, [b"b".to_vec()]);
    drop(conn);
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn batched_records_are_new_once_and_duplicates_only_bump_idems_counter() {
    let pool = db!();
    let mut conn = pool.acquire().await.unwrap();
    assert!(MySql::insert_record(&mut conn, record("b", b"old"))
        .await
        .unwrap());
    let requested = [
        record("b", b"new"),
        record("b", b"old"),
        record("b", b"new"),
        record("c", b"new"),
    ];
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    assert_eq!(
        MySql::insert_records(&mut tx, &requested).await.unwrap(),
        [true, false, false, true]
    );
    tx.commit().await.unwrap();
    let rows: Vec<(String, Vec<u8>, i64)> = sqlx::query_as(
        "SELECT scope, msg_key, dup_count FROM idem_records ORDER BY scope, msg_key",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("b".to_string(), b"new".to_vec(), 0),
            ("b".to_string(), b"old".to_vec(), 1),
            ("c".to_string(), b"new".to_vec(), 0),
        ]
    );
    drop(conn);
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn concurrent_migrations_take_turns_and_record_once() {
    let pool = db!();
    sqlx::raw_sql(
        "DROP TABLE idem_records; DROP TABLE idem_versions; DROP TABLE idem_attempts; \
         DROP TABLE idem_migrations",
    )
    .execute(&pool)
    .await
    .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { idem::migrate(&pool).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    // One row per migration file, each recorded once.
    let files = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/idem-runtime/migrations/mysql"
    ))
    .unwrap()
    .count() as i64;
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM idem_migrations").await,
        files
    );
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_records").await, 0);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_attempts").await, 0);
    // The lock of this database was released: another session takes it at once. (It is this
    // database's own: the migrations of the other tests' databases on the server take theirs.)
    let free: i64 =
        sqlx::query_scalar("SELECT IS_FREE_LOCK(CONCAT('idem_migrate_', MD5(DATABASE())))")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(free, 1);
    common::drop_mysql(pool).await;
}

/// `migrate` takes a lock of its own database: a migration of another database on the same
/// server goes on while one holds its lock, and one of the same database waits for it.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn a_migration_waits_only_on_its_own_databases_lock() {
    let a = db!();
    let b = db!();
    let mut holder = a.acquire().await.unwrap();
    let held: i64 =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('idem_migrate_', MD5(DATABASE())), 0)")
            .fetch_one(&mut *holder)
            .await
            .unwrap();
    assert_eq!(held, 1, "the test takes database a's migration lock");
    // A server-wide lock would hold this for its 300 s wait.
    tokio::time::timeout(Duration::from_secs(60), idem::migrate(&b))
        .await
        .expect("database b's migration does not wait on database a's lock")
        .unwrap();
    let same = tokio::spawn({
        let a = a.clone();
        async move { idem::migrate(&a).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !same.is_finished(),
        "a migration of database a waits for its lock"
    );
    sqlx::query("SELECT RELEASE_LOCK(CONCAT('idem_migrate_', MD5(DATABASE())))")
        .execute(&mut *holder)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), same)
        .await
        .expect("it goes on once the lock is released")
        .unwrap()
        .unwrap();
    drop(holder);
    common::drop_mysql(a).await;
    common::drop_mysql(b).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn lock_wait_timeouts_and_deadlocks_are_transient() {
    let pool = db!();
    let mut first = pool.begin().await.unwrap();
    let mut second = pool.begin().await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut *second)
        .await
        .unwrap();
    assert!(MySql::insert_record(&mut first, record("t", b"a"))
        .await
        .unwrap());
    let timeout = MySql::insert_record(&mut second, record("t", b"a"))
        .await
        .unwrap_err();
    match &timeout {
        sqlx::Error::Database(db) => {
            let db = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .unwrap();
            assert_eq!((db.number(), db.code()), (1205, Some("HY000")));
        }
        other => panic!("{other:?}"),
    }
    assert!(timeout.is_transient());
    assert!(
        !MySql::retry_claim(&timeout),
        "a lock-wait timeout is left to the caller's retry"
    );
    // A deadlock: each holds one row and asks for the other's.
    assert!(MySql::insert_record(&mut second, record("t", b"b"))
        .await
        .unwrap());
    let crossing = tokio::spawn(async move {
        let result = MySql::insert_record(&mut first, record("t", b"b")).await;
        (first, result)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second_result = MySql::insert_record(&mut second, record("t", b"a")).await;
    let (first, first_result) = crossing.await.unwrap();
    // Both end, so the database can be dropped (a transaction holds its tables' metadata locks).
    first.rollback().await.unwrap();
    second.rollback().await.unwrap();
    let err = [first_result, second_result]
        .into_iter()
        .find_map(Result::err)
        .expect("one of the two is the deadlock's victim");
    assert!(is_deadlock(&err), "{err:?}");
    assert!(err.is_transient() && MySql::retry_claim(&err));
    common::drop_mysql(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn scopes_and_keys_compare_exactly() {
    let pool = db!();
    let mut conn = pool.acquire().await.unwrap();
    // Case, trailing spaces, accents and trailing zero bytes all make another scope or key.
    let scopes = ["a", "A", "a ", "á", "a\u{301}", "😀"];
    for scope in scopes {
        assert!(
            MySql::insert_record(&mut conn, record(scope, b"k"))
                .await
                .unwrap(),
            "{scope:?}"
        );
    }
    for key in [&b"k "[..], b"K", b"k\0"] {
        assert!(
            MySql::insert_record(&mut conn, record("a", key))
                .await
                .unwrap(),
            "{key:?}"
        );
    }
    for scope in scopes {
        assert!(
            !MySql::insert_record(&mut conn, record(scope, b"k"))
                .await
                .unwrap(),
            "{scope:?}"
        );
    }
    let mut stored: Vec<String> =
        sqlx::query_scalar("SELECT scope FROM idem_records WHERE msg_key = 'k'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    stored.sort();
    let mut expected: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(stored, expected);
    drop(conn);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_records").await, 9);
    common::drop_mysql(pool).await;
}

// ---------------------------------------------------------------------------------------------
// RETURNING (MariaDB) and the two-statement upserts (MySQL)

/// The upserts that read their rows back with `RETURNING` on MariaDB and with a second
/// statement where the server has no `RETURNING` (MySQL; forced here) decide alike: records
/// fresh or found, versions advanced, equal or behind, one by one and in a batch. Turning
/// `RETURNING` off process-wide only sends the other tests of this binary down the second,
/// equally correct path for a moment.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn upserts_decide_alike_with_and_without_returning() {
    let pool = db!();
    let mariadb = is_mariadb(&pool).await;
    for returning in [true, false] {
        idem::backend::mysql::use_returning(returning);
        let scope = if returning { "ret::on" } else { "ret::off" };
        let mut tx = pool.begin().await.unwrap();
        assert!(MySql::insert_record(&mut *tx, record(scope, b"a"))
            .await
            .unwrap());
        let other = if returning {
            "ret::on::2"
        } else {
            "ret::off::2"
        };
        let batches = [
            (
                [
                    record(scope, b"a"),
                    record(scope, b"b"),
                    record(scope, b"c"),
                    record(scope, b"b"),
                ],
                [false, true, true, false],
                "found, fresh, fresh, and the batch's own repeat",
            ),
            (
                // Two scopes in one batch (several handlers) take the general statement.
                [
                    record(other, b"a"),
                    record(scope, b"c"),
                    record(other, b"a"),
                    record(scope, b"d"),
                ],
                [true, false, false, true],
                "two scopes",
            ),
            (
                // Fingerprints to write: the general statement with the column; a pair given
                // twice keeps the first one's.
                [
                    fingerprinted(scope, b"g", &[1; 32]),
                    fingerprinted(scope, b"g", &[2; 32]),
                    fingerprinted(other, b"g", &[2; 32]),
                    record(scope, b"h"),
                ],
                [true, false, true, true],
                "fingerprints",
            ),
        ];
        for (batch, expected, what) in batches {
            assert_eq!(
                MySql::insert_records(&mut *tx, &batch).await.unwrap(),
                expected,
                "{what} (returning: {returning})"
            );
        }
        for (at, key, fingerprint) in [
            (scope, &b"g"[..], Some(vec![1; 32])),
            (other, b"g", Some(vec![2; 32])),
            (scope, b"h", None),
        ] {
            let stored: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT fingerprint FROM idem_records WHERE scope = ? AND msg_key = ?",
            )
            .bind(at)
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            assert_eq!(stored, fingerprint, "{at} (returning: {returning})");
        }
        // A key only with a stamp: a new record, then duplicates that read back the stamp its
        // first delivery left (the fingerprint written with it, a value saved after), and a
        // record that has none.
        let first = fingerprinted(scope, b"s", &[3; 32]);
        let claim = MySql::insert_record_or_read_stamp(&mut *tx, first).await;
        assert_eq!(
            claim.unwrap(),
            None,
            "a new record (returning: {returning})"
        );
        let saved = Stamp {
            at: first.stamp_key(),
            fingerprint: Some(&[3; 32]),
            result: Some(b"{\"ok\":1}"),
        };
        MySql::save_stamp(&mut *tx, saved).await.unwrap();
        let again = fingerprinted(scope, b"s", &[4; 32]);
        let claim = MySql::insert_record_or_read_stamp(&mut *tx, again).await;
        let stamp = StoredStamp {
            fingerprint: Some(vec![3; 32]),
            result: Some(b"{\"ok\":1}".to_vec()),
        };
        assert_eq!(claim.unwrap(), Some(Some(stamp)), "returning: {returning}");
        let claim = MySql::insert_record_or_read_stamp(&mut *tx, record(scope, b"h")).await;
        let none = Some(Some(StoredStamp::default()));
        assert_eq!(claim.unwrap(), none, "returning: {returning}");
        // The same in a batch: a new record, the stamped one, one without a stamp. MariaDB
        // reads the found rows' stamps in the upsert; without RETURNING they are left unread
        // (the batch reads them with `load_stamps`).
        let batch = [
            fingerprinted(scope, b"t", &[5; 32]),
            fingerprinted(scope, b"s", &[4; 32]),
            record(scope, b"h"),
        ];
        let found = MySql::insert_records_reading_stamps(&mut *tx, &batch)
            .await
            .unwrap();
        let read = |stamp: StoredStamp| (returning && mariadb).then_some(stamp);
        assert_eq!(
            found,
            [
                Inserted::unread(true),
                Inserted {
                    new: false,
                    stamp: read(StoredStamp {
                        fingerprint: Some(vec![3; 32]),
                        result: Some(b"{\"ok\":1}".to_vec()),
                    }),
                },
                Inserted {
                    new: false,
                    stamp: read(StoredStamp::default()),
                },
            ],
            "returning: {returning}"
        );
        let entry = |entity: &'static [u8], version| VersionEntry {
            scope,
            entity,
            version,
        };
        for (version, expected) in [
            (5, VersionCheck::Advanced),
            (5, VersionCheck::Equal),
            (3, VersionCheck::Behind { latest: 5 }),
            (7, VersionCheck::Advanced),
        ] {
            assert_eq!(
                MySql::advance_version(&mut *tx, entry(b"e", version))
                    .await
                    .unwrap(),
                expected,
                "version {version} (returning: {returning})"
            );
        }
        let checks = MySql::advance_versions(
            &mut *tx,
            &[
                entry(b"e", 6),
                entry(b"f", 2),
                entry(b"e", 9),
                entry(b"f", 1),
            ],
        )
        .await
        .unwrap();
        assert_eq!(
            checks,
            [
                VersionCheck::Behind { latest: 7 },
                VersionCheck::Advanced,
                VersionCheck::Advanced,
                VersionCheck::Behind { latest: 2 },
            ],
            "returning: {returning}"
        );
        tx.commit().await.unwrap();
        let stored: Vec<(Vec<u8>, i64)> = sqlx::query_as(
            "SELECT entity, version FROM idem_versions WHERE scope = ? ORDER BY entity",
        )
        .bind(scope)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(stored, [(b"e".to_vec(), 9), (b"f".to_vec(), 2)]);
        let records: Vec<(Vec<u8>, i64)> = sqlx::query_as(
            "SELECT msg_key, dup_count FROM idem_records WHERE scope = ? ORDER BY msg_key",
        )
        .bind(scope)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            records,
            [
                (b"a".to_vec(), 1),
                (b"b".to_vec(), 0),
                (b"c".to_vec(), 1),
                (b"d".to_vec(), 0),
                (b"g".to_vec(), 0),
                (b"h".to_vec(), 2),
                (b"s".to_vec(), 2),
                (b"t".to_vec(), 0)
            ]
        );
        let others: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_records WHERE scope = ? AND dup_count = 0",
        )
        .bind(other)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            others, 2,
            "the other scope's keys (a, g), each inserted once"
        );
        if returning && mariadb {
            // Still on: MariaDB took every RETURNING form above (no syntax error, no fallback).
            assert!(
                idem::backend::mysql::use_returning(true),
                "RETURNING fell back"
            );
        }
    }
    idem::backend::mysql::use_returning(true);
    common::drop_mysql(pool).await;
}

#[idempotent(key = "msg.id", replay = true, scope = "mysql::receipt")]
async fn receipt(tx: &mut Tx<'_, MySql>, msg: &Credit) -> Result<i64, sqlx::Error> {
    effect(tx, &msg.id).await?;
    Ok(msg.amount * 10)
}

/// How many statements of a kind (`Com_select`, `Com_update`) the server has counted on the
/// pool's one connection.
async fn counted(one: &MySqlPool, counter: &'static str) -> i64 {
    // SHOW takes no parameter; the counter is one of this file's constants.
    let sql = format!("SHOW SESSION STATUS LIKE '{counter}'");
    let (_, value): (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(one)
        .await
        .unwrap();
    value.parse().unwrap()
}

/// Whether the server is MariaDB (not MySQL).
async fn is_mariadb(pool: &MySqlPool) -> bool {
    sqlx::query_scalar::<_, String>("SELECT VERSION()")
        .fetch_one(pool)
        .await
        .unwrap()
        .contains("MariaDB")
}

/// A pool of one connection to `pool`'s database, so that its session counters see every
/// statement of a batch.
async fn one_connection(pool: &MySqlPool) -> MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// `n` credits with ids `{prefix}0`, `{prefix}1`, …, of amounts 0, 1, ….
fn credits(prefix: &str, n: i64) -> Vec<Credit> {
    (0..n)
        .map(|i| Credit {
            id: format!("{prefix}{i}"),
            account: String::new(),
            amount: i,
        })
        .collect()
}

/// A batch of `replay` messages writes their values in one `UPDATE`, and a batch of their
/// duplicates replays every stored value. On MariaDB the duplicates' upsert reads their
/// stamps itself (`RETURNING`): the server counts no `SELECT` for the batch, where the
/// two-statement path (MySQL 8; forced here) sends one.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn a_batch_writes_its_stamps_at_once_and_its_duplicates_read_them_in_its_upsert() {
    let pool = db!(tables);
    let mariadb = is_mariadb(&pool).await;
    let one = one_connection(&pool).await;
    let messages = credits("r", 5);
    let updates = async || {
        // One-table UPDATEs, and multi-table ones (none: a batch's stamps go in one CASE).
        (
            counted(&one, "Com_update").await,
            counted(&one, "Com_update_multi").await,
        )
    };
    let before = updates().await;
    let first = idem::batch(&one, &messages, async |b, m| receipt(b, m).await)
        .await
        .unwrap();
    let after = updates().await;
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 0),
        "the batch's five stamps in one UPDATE"
    );
    let values: Vec<i64> = first
        .into_iter()
        .map(|r| r.unwrap().applied().unwrap())
        .collect();
    assert_eq!(values, [0, 10, 20, 30, 40]);
    // The counter's own read, measured, so that only the batch's statements remain.
    let base = counted(&one, "Com_select").await;
    let own = counted(&one, "Com_select").await - base;
    for returning in [true, false] {
        idem::backend::mysql::use_returning(returning);
        let before = counted(&one, "Com_select").await;
        let again = idem::batch(&one, &messages, async |b, m| receipt(b, m).await).await;
        let after = counted(&one, "Com_select").await;
        idem::backend::mysql::use_returning(true);
        let again: Vec<Outcome<i64>> = again.unwrap().into_iter().map(Result::unwrap).collect();
        let replayed: Vec<Outcome<i64>> = values.iter().map(|v| Outcome::Replayed(*v)).collect();
        assert_eq!(again, replayed, "returning: {returning}");
        let sent = after - before - own;
        let expected = if returning && mariadb { 0 } else { 2 };
        assert_eq!(
            sent, expected,
            "SELECTs of a batch of duplicates (returning: {returning})"
        );
    }
    one.close().await;
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 5);
    common::drop_mysql(pool).await;
}

#[idempotent(key = "msg.id", replay = true, scope = "mysql::large_receipt")]
async fn large_receipt(tx: &mut Tx<'_, MySql>, msg: &Credit) -> Result<String, sqlx::Error> {
    effect(tx, &msg.id).await?;
    // About 60 KB as JSON, under idem::MAX_REPLAY_LEN: 18 of them pass 1 MiB.
    Ok(format!("{}:{}", msg.id, "v".repeat(60_000)))
}

/// A batch of large `replay` values writes them in statements of about 1 MiB each (a server's
/// `max_allowed_packet` can be as small as 4 MiB), and every value replays whole.
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn a_batch_of_large_values_writes_them_in_bounded_statements() {
    let pool = db!(tables);
    let one = one_connection(&pool).await;
    let messages = credits("big", 40);
    let before = counted(&one, "Com_update").await;
    let first = idem::batch(&one, &messages, async |b, m| large_receipt(b, m).await)
        .await
        .unwrap();
    // 40 values of ~60 KB, 17 to a statement (an 18th would pass 1 MiB): 17, 17 and 6.
    assert_eq!(counted(&one, "Com_update").await - before, 3);
    let values: Vec<String> = first
        .into_iter()
        .map(|r| r.unwrap().applied().unwrap())
        .collect();
    let again = idem::batch(&one, &messages, async |b, m| large_receipt(b, m).await)
        .await
        .unwrap();
    let again: Vec<Outcome<String>> = again.into_iter().map(Result::unwrap).collect();
    let replayed: Vec<Outcome<String>> = values.into_iter().map(Outcome::Replayed).collect();
    assert!(again == replayed, "a value did not replay whole");
    one.close().await;
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 40);
    common::drop_mysql(pool).await;
}

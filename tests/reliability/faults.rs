//! Faults on PostgreSQL: a connection terminated mid-transaction, statement timeouts, and
//! serialization failures under SERIALIZABLE and REPEATABLE READ. Each test asserts which error
//! reaches the caller (`idem::Error::Handler` or `idem::Error::Store`), that nothing of the failed
//! delivery was recorded or applied, and that a retry applies the message exactly once.

use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Error, Outcome, Tx};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};
use tokio::sync::{mpsc, Notify};

use crate::common::Stored;
use crate::support::cut::terminate_backend;

/// Opens a fresh schema, or skips (the reason printed) when no server answers.
macro_rules! db {
    () => {
        match crate::common::postgres().await {
            Some(pool) => {
                setup(&pool).await;
                pool
            }
            None => return,
        }
    };
}

#[derive(Clone, Debug)]
struct Msg {
    id: String,
    account: i64,
    version: i64,
}

fn msg(id: &str, account: i64, version: i64) -> Msg {
    Msg {
        id: id.into(),
        account,
        version,
    }
}

/// What a handler body does besides its write, so a test can catch it mid-transaction.
#[derive(Clone, Default)]
struct Probe {
    /// Sends the body's backend pid, after its write.
    pid: Option<mpsc::UnboundedSender<i32>>,
    /// `SET LOCAL statement_timeout` to this many milliseconds, then `pg_sleep(30)`.
    timeout_ms: Option<u32>,
    /// `pg_sleep(30)` (to be terminated while it sleeps).
    sleep: bool,
    /// Waits for this before returning (the transaction stays open).
    hold: Option<Arc<Notify>>,
    /// Returns `Err` at the end (after the hold).
    fail: bool,
}

#[derive(Debug)]
struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the handler was asked to fail")
    }
}

impl std::error::Error for Failed {}

async fn probe_body(tx: &mut Tx<'_, Postgres>, msg: &Msg, probe: &Probe) -> anyhow::Result<()> {
    sqlx::query("INSERT INTO effects (msg_id, account, version) VALUES ($1, $2, $3)")
        .bind(&msg.id)
        .bind(msg.account)
        .bind(msg.version)
        .execute(&mut **tx)
        .await?;
    if let Some(pid) = &probe.pid {
        let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **tx)
            .await?;
        pid.send(backend).unwrap();
    }
    if let Some(ms) = probe.timeout_ms {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL statement_timeout = {ms}"
        )))
        .execute(&mut **tx)
        .await?;
    }
    if probe.sleep || probe.timeout_ms.is_some() {
        sqlx::query("SELECT pg_sleep(30)")
            .execute(&mut **tx)
            .await?;
    }
    if let Some(hold) = &probe.hold {
        hold.notified().await;
    }
    if probe.fail {
        return Err(Failed.into());
    }
    Ok(())
}

/// Key only.
#[idempotent(key = "msg.id", scope = "faults::credit")]
async fn credit(tx: &mut Tx<'_, Postgres>, msg: &Msg, probe: &Probe) -> anyhow::Result<()> {
    probe_body(tx, msg, probe).await
}

/// Key + version: the account is the key and the entity.
#[idempotent(key = "msg.account", version = "msg.version", scope = "faults::set")]
async fn set_version(tx: &mut Tx<'_, Postgres>, msg: &Msg, probe: &Probe) -> anyhow::Result<()> {
    probe_body(tx, msg, probe).await
}

/// Key only, a read then a write: the classic write skew that SERIALIZABLE refuses.
#[idempotent(key = "msg.id", scope = "faults::audit")]
async fn audit(
    tx: &mut Tx<'_, Postgres>,
    msg: &Msg,
    read_done: Option<mpsc::UnboundedSender<()>>,
    before_write: Option<Arc<Notify>>,
) -> anyhow::Result<()> {
    let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE account = $1")
        .bind(msg.account)
        .fetch_one(&mut **tx)
        .await?;
    if let Some(done) = read_done {
        done.send(()).unwrap();
    }
    if let Some(gate) = before_write {
        gate.notified().await;
    }
    sqlx::query("INSERT INTO effects (msg_id, account, version) VALUES ($1, $2, $3)")
        .bind(&msg.id)
        .bind(msg.account)
        .bind(seen)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn setup(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE effects (msg_id TEXT NOT NULL, account BIGINT NOT NULL, version BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// A second pool on the same schema, each connection with these settings.
async fn pool_with(pool: &PgPool, settings: &[(&str, &str)]) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(crate::common::postgres_options(pool, settings).await)
        .await
        .unwrap()
}

/// The SQLSTATE of a database error, wherever it is.
fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The SQLSTATE of the handler's error (an `anyhow::Error` holding a `sqlx::Error`).
fn handler_sqlstate(err: &Error<anyhow::Error>) -> Option<String> {
    match err {
        Error::Handler(e) => e.downcast_ref::<sqlx::Error>().and_then(sqlstate),
        _ => None,
    }
}

/// Effect rows of this message id.
async fn effects(pool: &PgPool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE msg_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn recorded(pool: &PgPool, scope: &str, key: &str) -> bool {
    Stored(pool).records(scope, key).await == 1
}

/// Waits until some backend is blocked by `pid` (waiting on a lock it holds).
async fn wait_until_blocked_by(pool: &PgPool, pid: i32) {
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no backend waited on {pid}");
}

/// The retry applies exactly once: `Applied`, then `Duplicate`, and one effect row.
async fn retry_applies_once(pool: &PgPool, m: &Msg) {
    let calm = Probe::default();
    assert!(
        matches!(credit(pool, m, &calm).await, Ok(Outcome::Applied(()))),
        "the retry applies"
    );
    assert!(matches!(
        credit(pool, m, &calm).await,
        Ok(Outcome::Duplicate)
    ));
    assert_eq!(effects(pool, &m.id).await, 1, "exactly one effect");
    assert!(recorded(pool, "faults::credit", &m.id).await);
}

/// Delivers `m` to [`credit`] on a task of its own, with `probe` told to send its backend's
/// pid; returns once the body has written, with that pid.
async fn started(
    pool: &PgPool,
    m: &Msg,
    probe: Probe,
) -> (
    tokio::task::JoinHandle<Result<Outcome<()>, Error<anyhow::Error>>>,
    i32,
) {
    let (pid_tx, mut pid_rx) = mpsc::unbounded_channel();
    let probe = Probe {
        pid: Some(pid_tx),
        ..probe
    };
    let (pool, m) = (pool.clone(), m.clone());
    let delivery = tokio::spawn(async move { credit(&pool, &m, &probe).await });
    (delivery, pid_rx.recv().await.unwrap())
}

/// Nothing of the failed delivery of `m` stays (no effect, no record), and a retry through
/// `retry_pool` applies it exactly once.
async fn nothing_then_retry_applies_once(pool: &PgPool, retry_pool: &PgPool, m: &Msg) {
    assert_eq!(effects(pool, &m.id).await, 0, "the effect was rolled back");
    assert!(
        !recorded(pool, "faults::credit", &m.id).await,
        "nothing recorded"
    );
    retry_applies_once(retry_pool, m).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn connection_terminated_while_the_body_runs_a_statement() {
    let pool = db!();
    let m = msg("term-1", 1, 0);
    let sleep = Probe {
        sleep: true,
        ..Probe::default()
    };
    let (delivery, pid) = started(&pool, &m, sleep).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // into pg_sleep
    terminate_backend(&pool, pid).await;
    let err = delivery.await.unwrap().unwrap_err();
    // The body's statement failed: its error is the handler's, with SQLSTATE 57P01
    // (admin_shutdown, "terminating connection due to administrator command").
    assert_eq!(handler_sqlstate(&err).as_deref(), Some("57P01"), "{err:?}");
    nothing_then_retry_applies_once(&pool, &pool, &m).await;
    crate::common::drop_postgres(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn connection_terminated_between_the_body_and_the_commit() {
    let pool = db!();
    let m = msg("term-2", 1, 0);
    let hold = Arc::new(Notify::new());
    let held = Probe {
        hold: Some(hold.clone()),
        ..Probe::default()
    };
    let (delivery, pid) = started(&pool, &m, held).await;
    terminate_backend(&pool, pid).await;
    hold.notify_one(); // the body returns Ok; idem commits on a dead connection
    let err = delivery.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, Error::Store(_)),
        "the commit failed: a store error, not the handler's: {err:?}"
    );
    nothing_then_retry_applies_once(&pool, &pool, &m).await;
    crate::common::drop_postgres(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn statement_timeout_in_the_body() {
    let pool = db!();
    let m = msg("timeout-1", 1, 0);
    let probe = Probe {
        timeout_ms: Some(100),
        ..Probe::default()
    };
    let err = credit(&pool, &m, &probe).await.unwrap_err();
    // 57014: query_canceled, "canceling statement due to statement timeout".
    assert_eq!(handler_sqlstate(&err).as_deref(), Some("57014"), "{err:?}");
    nothing_then_retry_applies_once(&pool, &pool, &m).await;
    crate::common::drop_postgres(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn statement_timeout_while_the_claim_waits_for_a_concurrent_delivery() {
    let pool = db!();
    let impatient = pool_with(&pool, &[("statement_timeout", "300ms")]).await;
    let m = msg("timeout-2", 1, 0);
    // The first delivery claims the key and holds its transaction open, then fails.
    let hold = Arc::new(Notify::new());
    let held_then_failed = Probe {
        hold: Some(hold.clone()),
        fail: true,
        ..Probe::default()
    };
    let (first, _) = started(&pool, &m, held_then_failed).await;
    // The redelivery waits on the first one's row lock, until its statement times out.
    let err = credit(&impatient, &m, &Probe::default()).await.unwrap_err();
    match &err {
        Error::Store(e) => assert_eq!(sqlstate(e).as_deref(), Some("57014"), "{err:?}"),
        other => panic!("the claim timed out: a store error, got {other:?}"),
    }
    hold.notify_one();
    let first = first.await.unwrap().unwrap_err();
    assert!(first.handler().is_some(), "{first:?}");
    nothing_then_retry_applies_once(&pool, &impatient, &m).await;
    impatient.close().await;
    crate::common::drop_postgres(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn serialization_failure_under_serializable() {
    let pool = db!();
    let strict = pool_with(&pool, &[("default_transaction_isolation", "serializable")]).await;
    // Two messages about one account, each reading what the other writes (write skew).
    let (first, second) = (msg("ser-1", 7, 0), msg("ser-2", 7, 0));
    let (read_tx, mut read_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let late = {
        let (strict, m, gate) = (strict.clone(), second.clone(), gate.clone());
        tokio::spawn(async move { audit(&strict, &m, Some(read_tx), Some(gate)).await })
    };
    read_rx.recv().await.unwrap(); // the second has read
    assert!(matches!(
        audit(&strict, &first, None, None).await,
        Ok(Outcome::Applied(()))
    ));
    gate.notify_one(); // now the second writes what the first read
    let err = late.await.unwrap().unwrap_err();
    // 40001: serialization_failure, raised by the body's INSERT.
    assert_eq!(handler_sqlstate(&err).as_deref(), Some("40001"), "{err:?}");
    assert_eq!(effects(&pool, "ser-2").await, 0);
    assert!(!recorded(&pool, "faults::audit", "ser-2").await);
    // The retry sees the first message's row and applies once.
    assert!(matches!(
        audit(&strict, &second, None, None).await,
        Ok(Outcome::Applied(()))
    ));
    assert!(matches!(
        audit(&strict, &second, None, None).await,
        Ok(Outcome::Duplicate)
    ));
    assert_eq!(
        (effects(&pool, "ser-1").await, effects(&pool, "ser-2").await),
        (1, 1)
    );
    strict.close().await;
    crate::common::drop_postgres(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn serialization_failure_under_repeatable_read_on_the_version_row() {
    let pool = db!();
    let strict = pool_with(
        &pool,
        &[("default_transaction_isolation", "repeatable read")],
    )
    .await;
    assert!(matches!(
        set_version(&strict, &msg("v1", 3, 1), &Probe::default()).await,
        Ok(Outcome::Applied(()))
    ));
    // Version 2 holds the version row; version 3 waits on it, then finds it changed.
    let (pid_tx, mut pid_rx) = mpsc::unbounded_channel();
    let hold = Arc::new(Notify::new());
    let v2 = {
        let probe = Probe {
            pid: Some(pid_tx),
            hold: Some(hold.clone()),
            ..Probe::default()
        };
        let strict = strict.clone();
        tokio::spawn(async move { set_version(&strict, &msg("v2", 3, 2), &probe).await })
    };
    let holder = pid_rx.recv().await.unwrap();
    let v3 = {
        let strict = strict.clone();
        tokio::spawn(async move { set_version(&strict, &msg("v3", 3, 3), &Probe::default()).await })
    };
    wait_until_blocked_by(&pool, holder).await;
    hold.notify_one();
    assert!(matches!(v2.await.unwrap(), Ok(Outcome::Applied(()))));
    let err = v3.await.unwrap().unwrap_err();
    // The claim's upsert failed ("could not serialize access due to concurrent update"):
    // a store error, before the body ran.
    match &err {
        Error::Store(e) => assert_eq!(sqlstate(e).as_deref(), Some("40001"), "{err:?}"),
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(effects(&pool, "v3").await, 0);
    assert_eq!(Stored(&pool).version("faults::set", "3").await, Some(2));
    // The retry applies version 3 once.
    assert!(matches!(
        set_version(&strict, &msg("v3", 3, 3), &Probe::default()).await,
        Ok(Outcome::Applied(()))
    ));
    assert!(matches!(
        set_version(&strict, &msg("v3", 3, 3), &Probe::default()).await,
        Ok(Outcome::Duplicate)
    ));
    assert_eq!(effects(&pool, "v3").await, 1);
    assert_eq!(Stored(&pool).version("faults::set", "3").await, Some(3));
    strict.close().await;
    crate::common::drop_postgres(pool).await;
}

/// Whether a failed delivery is worth retrying as it is: the database refused this attempt
/// (serialization failure, deadlock, a terminated connection, a timeout) but not the message.
fn transient(err: &Error<anyhow::Error>) -> bool {
    let state = match err {
        Error::Store(e) => sqlstate(e),
        Error::Handler(_) => handler_sqlstate(err),
        _ => return false,
    };
    matches!(
        state.as_deref(),
        Some("40001" | "40P01" | "57P01" | "57014" | "55P03")
    )
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn concurrent_serializable_writers_retried_apply_each_message_once() {
    let pool = db!();
    let strict = pool_with(&pool, &[("default_transaction_isolation", "serializable")]).await;
    const WORKERS: usize = 4;
    const MESSAGES: usize = 24;
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let strict = strict.clone();
        tasks.push(tokio::spawn(async move {
            let (mut applied, mut retries) = (0, 0);
            // Every worker delivers every message (all about one account), in its own order.
            for i in 0..MESSAGES {
                let m = msg(&format!("w-{}", (i + worker * 7) % MESSAGES), 1, 0);
                loop {
                    match audit(&strict, &m, None, None).await {
                        Ok(Outcome::Applied(())) => applied += 1,
                        Ok(Outcome::Duplicate) => {}
                        Ok(other) => panic!("{other:?}"),
                        Err(err) if transient(&err) => {
                            retries += 1;
                            continue;
                        }
                        Err(err) => panic!("{}: {err:?}", m.id),
                    }
                    break;
                }
            }
            (applied, retries)
        }));
    }
    let (mut applied, mut retries) = (0, 0);
    for task in tasks {
        let (a, r) = task.await.unwrap();
        applied += a;
        retries += r;
    }
    assert_eq!(applied, MESSAGES);
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg_id, COUNT(*) FROM effects GROUP BY msg_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), MESSAGES, "0 lost");
    assert!(rows.iter().all(|(_, n)| *n == 1), "0 doubled: {rows:?}");
    eprintln!(
        "{WORKERS} serializable workers x {MESSAGES} messages: {applied} applied, {retries} retries"
    );
    strict.close().await;
    crate::common::drop_postgres(pool).await;
}

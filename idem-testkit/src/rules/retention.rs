//! Retention: records expire, purges remove exactly the expired ones in bounded batches, and
//! version high-water marks outlive them.

use std::time::Duration;

use idem::store::{Record, Store};
use idem::{idempotent, Outcome, Tx};

use crate::backend::{exec, KitDb, Value};
use crate::dialect::Fill;
use crate::fixtures::{records, rows_in};
use crate::{Backend, Dialect, Kit};

/// Inserts `n` records of `scope` whose retention ends `days` from now (negative: expired), with
/// the dialect's statement, or else through the backend's `Store::insert_records` (expired ones
/// with no retention, and a short wait).
async fn fill<B: Backend>(k: &Kit<B>, n: i64, scope: &str, days: i64) {
    let mut conn = k.conn().await;
    let Some(fill) = k.dialect.fill_records else {
        let keys: Vec<Vec<u8>> = (1..=n).map(|i| format!("k{i}").into_bytes()).collect();
        let retention = Duration::from_secs(86_400 * days.max(0) as u64);
        for chunk in keys.chunks(1_000) {
            let records: Vec<Record<'_>> = chunk
                .iter()
                .map(|key| Record {
                    scope,
                    key,
                    retention,
                    fingerprint: None,
                })
                .collect();
            B::Db::insert_records(&mut conn, &records).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        return;
    };
    let binds: Vec<Value> = fill
        .binds
        .iter()
        .map(|bind| match bind {
            Fill::Count => n.into(),
            Fill::Scope => scope.into(),
            Fill::Days => days.into(),
        })
        .collect();
    // The fill SQL is in the dialect's own placeholders already: executed as it is.
    B::Db::execute_sql(&mut conn, fill.sql.to_string(), binds)
        .await
        .unwrap_or_else(|err| panic!("filling idem_records: {err}"));
}

#[idempotent(key = "id", scope = "retention::live", retention = "1d")]
async fn live<DB: KitDb>(tx: &mut Tx<'_, DB>, id: u64, d: &Dialect) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO ledger (id) VALUES ($1)",
        &[(id as i64).into()],
    )
    .await
}

/// A purge removes exactly the expired records, in statements of at most its batch size, while
/// handlers keep applying and deduplicating.
pub async fn purge_removes_exactly_the_expired<B: Backend>() {
    let k = crate::__open!(B);
    let d = k.dialect;
    k.exec("CREATE TABLE ledger (id BIGINT PRIMARY KEY)", &[])
        .await;
    fill(&k, 100_000, "retention::old", -1).await;
    fill(&k, 10_000, "retention::kept", 1).await;
    assert_eq!(records(&k, "retention::old").await, 100_000);

    // Handlers keep applying (and deduplicating) while the purge runs.
    let handlers = {
        let pool = k.pool.clone();
        tokio::spawn(async move {
            let mut applied = 0;
            for round in 0..2 {
                for id in 0..150_u64 {
                    match live(&pool, id, &d).await.unwrap() {
                        Outcome::Applied(()) => applied += 1,
                        Outcome::Duplicate => assert_eq!(round, 1),
                        other => panic!("{other:?}"),
                    }
                }
            }
            applied
        })
    };

    // One bounded statement at a time, as `idem::retention::purge_expired` runs them.
    const BATCH: u64 = 7_000;
    let mut purged = 0;
    let mut statements = 0;
    loop {
        let mut conn = k.conn().await;
        let deleted = B::Db::purge_expired(&mut conn, BATCH).await.unwrap();
        drop(conn);
        assert!(
            deleted <= BATCH,
            "a batch deleted {deleted} rows, more than {BATCH}"
        );
        purged += deleted;
        statements += 1;
        if deleted < BATCH {
            break;
        }
    }
    assert_eq!(purged, 100_000);
    assert_eq!(statements, 100_000 / BATCH + 1);
    assert_eq!(handlers.await.unwrap(), 150);
    assert_eq!(records(&k, "retention::old").await, 0);
    assert_eq!(records(&k, "retention::kept").await, 10_000);
    assert_eq!(records(&k, "retention::live").await, 150);
    assert_eq!(rows_in(&k, "ledger").await, 150);
    // Nothing left to purge; the public function agrees.
    assert_eq!(
        idem::retention::purge_expired(&k.pool, BATCH)
            .await
            .unwrap(),
        0
    );
    k.close().await;
}

#[idempotent(
    key = "msg.0",
    version = "msg.1",
    entity = "msg.2",
    scope = "retention::short",
    retention = "150ms"
)]
async fn short_lived<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: (&str, i64, &str),
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO ledger (id) VALUES ($1)",
        &[msg.1.into()],
    )
    .await
}

/// Version rows outlive purged records, so an old replay stays stale until versions are purged
/// (opt-in, by age).
pub async fn versions_outlive_purged_records<B: Backend>() {
    let k = crate::__open!(B);
    let d = k.dialect;
    k.exec("CREATE TABLE ledger (id BIGINT NOT NULL)", &[])
        .await;
    let pool = &k.pool;
    assert!(short_lived(pool, ("e-2", 2, "acct"), &d)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        short_lived(pool, ("e-2", 2, "acct"), &d).await.unwrap(),
        Outcome::Duplicate
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(idem::retention::purge_expired(pool, 100).await.unwrap(), 1);
    assert_eq!(records(&k, "retention::short").await, 0);
    // The record is gone, so a redelivery of e-2 is no longer a duplicate; but the version
    // row was kept, so it (and anything older) is still rejected as stale.
    assert_eq!(
        short_lived(pool, ("e-2", 2, "acct"), &d).await.unwrap(),
        Outcome::Stale { latest: 2 }
    );
    assert_eq!(
        short_lived(pool, ("e-1", 1, "acct"), &d).await.unwrap(),
        Outcome::Stale { latest: 2 }
    );
    assert_eq!(rows_in(&k, "ledger").await, 1);
    // Purging versions is opt-in, and by age.
    assert_eq!(
        idem::retention::purge_versions(pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        idem::retention::purge_versions(pool, Duration::from_millis(10), 100)
            .await
            .unwrap(),
        1
    );
    assert!(short_lived(pool, ("e-1", 1, "acct"), &d)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(rows_in(&k, "ledger").await, 2);
    k.close().await;
}

/// The background purger purges until stopped, and a stopped one purges nothing.
pub async fn purger_purges_until_stopped<B: Backend>() {
    let k = crate::__open!(B);
    fill(&k, 2_500, "retention::bg", -1).await;
    let purger = idem::retention::Purger::spawn(k.pool.clone(), Duration::from_millis(20), 1_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while records(&k, "retention::bg").await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purger did not purge"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fill(&k, 10, "retention::bg", -1).await;
    while records(&k, "retention::bg").await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purger stopped purging"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(purger.stop().await, 2_510);
    fill(&k, 5, "retention::bg", -1).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        records(&k, "retention::bg").await,
        5,
        "a stopped purger purges nothing"
    );
    k.close().await;
}

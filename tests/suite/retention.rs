//! Retention: records expire, purges remove exactly the expired ones in bounded batches, and
//! version high-water marks outlive them.

use std::time::Duration;

use idem::store::Store;
use idem::{idempotent, Outcome, Tx};
use sqlx::Pool;

use super::super::{database, release, Db, FILL_RECORDS};

macro_rules! db {
    () => {
        match database().await {
            Some(pool) => pool,
            None => return,
        }
    };
}

async fn count(pool: &Pool<Db>, scope: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE scope = $1")
        .bind(scope)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn fill(pool: &Pool<Db>, n: i64, scope: &str, days: i32) {
    sqlx::query(FILL_RECORDS)
        .bind(n)
        .bind(scope)
        .bind(days)
        .execute(pool)
        .await
        .unwrap();
}

#[idempotent(key = "id", scope = "retention::live", retention = "1d")]
async fn live(tx: &mut Tx<'_, Db>, id: u64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (id) VALUES ($1)")
        .bind(id as i64)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn purge_removes_exactly_the_expired_records_in_bounded_batches_while_handlers_run() {
    let pool = db!();
    sqlx::query("CREATE TABLE ledger (id BIGINT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    fill(&pool, 100_000, "retention::old", -1).await;
    fill(&pool, 10_000, "retention::kept", 1).await;

    // Handlers keep applying (and deduplicating) while the purge runs.
    let handlers = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut applied = 0;
            for round in 0..2 {
                for id in 0..150_u64 {
                    match live(&pool, id).await.unwrap() {
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
        let mut conn = pool.acquire().await.unwrap();
        let deleted = <Db as Store>::purge_expired(&mut conn, BATCH)
            .await
            .unwrap();
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
    assert_eq!(count(&pool, "retention::old").await, 0);
    assert_eq!(count(&pool, "retention::kept").await, 10_000);
    assert_eq!(count(&pool, "retention::live").await, 150);
    let ledger: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(ledger, 150);
    // Nothing left to purge; the public function agrees.
    assert_eq!(
        idem::retention::purge_expired(&pool, BATCH).await.unwrap(),
        0
    );
    release(pool).await;
}

#[idempotent(
    key = "msg.0",
    version = "msg.1",
    entity = "msg.2",
    scope = "retention::short",
    retention = "150ms"
)]
async fn short_lived(tx: &mut Tx<'_, Db>, msg: (&str, i64, &str)) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(())
}

#[tokio::test]
async fn versions_outlive_purged_records_so_old_replays_stay_stale() {
    let pool = db!();
    assert!(short_lived(&pool, ("e-2", 2, "acct"))
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        short_lived(&pool, ("e-2", 2, "acct")).await.unwrap(),
        Outcome::Duplicate
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(idem::retention::purge_expired(&pool, 100).await.unwrap(), 1);
    assert_eq!(count(&pool, "retention::short").await, 0);
    // The record is gone, so a redelivery of e-2 is no longer a duplicate; but the version
    // row was kept, so it (and anything older) is still rejected as stale.
    assert_eq!(
        short_lived(&pool, ("e-2", 2, "acct")).await.unwrap(),
        Outcome::Stale { latest: 2 }
    );
    assert_eq!(
        short_lived(&pool, ("e-1", 1, "acct")).await.unwrap(),
        Outcome::Stale { latest: 2 }
    );
    // Purging versions is opt-in, and by age.
    assert_eq!(
        idem::retention::purge_versions(&pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        idem::retention::purge_versions(&pool, Duration::from_millis(10), 100)
            .await
            .unwrap(),
        1
    );
    assert!(short_lived(&pool, ("e-1", 1, "acct"))
        .await
        .unwrap()
        .is_applied());
    release(pool).await;
}

#[tokio::test]
async fn the_background_purger_purges_until_stopped() {
    let pool = db!();
    fill(&pool, 2_500, "retention::bg", -1).await;
    let purger = idem::retention::Purger::spawn(pool.clone(), Duration::from_millis(20), 1_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while count(&pool, "retention::bg").await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purger did not purge"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fill(&pool, 10, "retention::bg", -1).await;
    while count(&pool, "retention::bg").await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purger stopped purging"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(purger.stop().await, 2_510);
    fill(&pool, 5, "retention::bg", -1).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        count(&pool, "retention::bg").await,
        5,
        "a stopped purger purges nothing"
    );
    release(pool).await;
}

//! Readiness through a database outage: a private PostgreSQL cluster of the test's own
//! (`PostgresServer`; the shared server is never touched) crashed under a running consumer and
//! started again. The consumer checks every 500 ms; readiness turns false within two check
//! rounds of the crash and true within two rounds of the restart. The batches waiting on the
//! database meanwhile stay live (a store pause starts a new attempt), and every message,
//! published before and during the outage, is applied once.

use std::time::Duration;

use idem::consume::{json, memory::MemoryQueue, Consumer, Health, NotReady};
use idem::{idempotent, Batch, Tx};
use idem_testkit::servers::PostgresServer;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

const EVERY: Duration = Duration::from_millis(500);

#[derive(serde::Serialize, serde::Deserialize)]
struct Credit {
    id: String,
    amount: i64,
}

#[idempotent(key = "msg.id", scope = "health::credit")]
async fn credit(tx: &mut Tx<'_, Postgres>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO credits (id, amount) VALUES ($1, $2)")
        .bind(&msg.id)
        .bind(msg.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn publish(queue: &MemoryQueue, prefix: &str, n: i64) {
    for i in 0..n {
        let msg = Credit {
            id: format!("{prefix}-{i}"),
            amount: i,
        };
        queue.publish(serde_json::to_vec(&msg).unwrap());
    }
}

/// Waits (at most 60 s) until `ready()` is `Ok` (`want`) or `Err`, and returns the number of
/// the check round whose result it read, with that result.
async fn round_when(health: &Health, want: bool) -> (u64, Result<(), NotReady>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let before = health.checks();
        let ready = health.ready();
        if health.checks() == before && ready.is_ok() == want {
            return (before, ready);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness did not turn {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn applied(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM credits")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_a_database_outage_within_two_checks_and_every_message_applies_once() {
    let Some(cluster) = PostgresServer::start("idem_pg_health", "database outage health test")
    else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(cluster.options())
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE credits (id TEXT NOT NULL, amount BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let queue = MemoryQueue::new();
    publish(&queue, "before", 40);
    let consumer = Consumer::new(pool.clone())
        .batch(10)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(300))
        .health_of(&queue)
        .health_every(EVERY)
        .stuck_after(Duration::from_secs(2));
    let health = consumer.health();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(consumer.run(
        queue.deliveries(),
        json::<Credit>,
        async |b: &mut Batch<Postgres>, m: &Credit| credit(b, m).await,
        async {
            let _ = stopped.await;
        },
    ));
    let (_, ready) = round_when(&health, true).await;
    assert_eq!(ready, Ok(()));
    while queue.open() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(applied(&pool).await, (40, 40));

    let crashed_at = health.checks();
    tokio::task::block_in_place(|| cluster.crash());
    // Taken while the database is down: the consumer pauses them and runs them again.
    publish(&queue, "during", 40);
    let (round, why) = round_when(&health, false).await;
    assert!(
        round <= crashed_at + 2,
        "not ready only at check round {round}, {} after the crash",
        round - crashed_at
    );
    assert!(
        matches!(
            &why,
            Err(NotReady::Unreachable {
                database: Some(_),
                broker: None
            })
        ),
        "{why:?}"
    );
    // Down for longer than the stuck bound (2 s): waiting on the database is not stuck.
    while health.checks() < round + 6 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health.live(), Ok(()), "a store pause is not a stuck batch");
    assert_eq!(
        queue.acked(),
        40,
        "nothing settles while the database is down"
    );

    tokio::task::block_in_place(|| cluster.restart());
    let back_at = health.checks();
    let (round, _) = round_when(&health, true).await;
    assert!(
        round <= back_at + 2,
        "ready again only at check round {round}, {} after the restart",
        round - back_at
    );
    while queue.open() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    let counts = run.await.unwrap();
    assert_eq!(applied(&pool).await, (80, 80), "{counts:?}");
    assert_eq!(counts.applied, 80, "{counts:?}");
    assert!(counts.store_pauses > 0, "{counts:?}");
    assert_eq!(queue.acked(), 80);
    assert!(queue.dead_letters().is_empty());
    assert_eq!(health.ready(), Err(NotReady::Stopped));
    pool.close().await;
}

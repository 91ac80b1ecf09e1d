//! A Redis Streams consumer on PostgreSQL, to copy: `cargo run --example redis_consumer
//! --features postgres,redis -- --once`. It joins a consumer group (creating it and the stream),
//! appends three point awards (one twice) and counts each once, acking (`XACK`) after the
//! commit: applied 3, duplicate 1 (run it again: all duplicates). `--once` stops after 3 s
//! without an entry, else ctrl-c does. `IDEM_POSTGRES_URL`, `IDEM_REDIS_URL`: other than local.

use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::redis::{headers, Source};
use idem::{idempotent, Batch, Tx};
use redis::streams::StreamMaxlen;
use redis::AsyncCommands as _;
use sqlx::{PgPool, Postgres};

const STREAM: &str = "idem-example:points";

#[derive(serde::Deserialize)]
struct PointsEarned {
    id: String,
    user: String,
    points: i64,
}

/// Key only: each award counts once, however often it is delivered.
#[idempotent(key = "msg.id", scope = "loyalty::earn")]
async fn earn(tx: &mut Tx<'_, Postgres>, msg: &PointsEarned) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO example_points AS p VALUES ($1, $2) \
               ON CONFLICT (username) DO UPDATE SET points = p.points + $2";
    let earn = sqlx::query(sql).bind(&msg.user).bind(msg.points);
    earn.execute(&mut **tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_string());
    let db = env("IDEM_POSTGRES_URL", "postgres://postgres@localhost/test");
    let pool = PgPool::connect(&db).await?;
    idem::migrate(&pool).await?; // idem's tables; safe to repeat
    let table = "CREATE TABLE IF NOT EXISTS example_points (username TEXT PRIMARY KEY, points INT)";
    sqlx::query(table).execute(&pool).await?;

    // One consumer of the group `loyalty`, named as the process (a restart under the same name
    // resumes what it read and left unsettled; others take it over after `claim_idle`).
    let url = env("IDEM_REDIS_URL", "redis://localhost:6379");
    let source = Source::builder(&url, STREAM, "loyalty", "worker-1")
        .prefetch(100) // entries per XREADGROUP: batch × concurrency
        .connect() // creates the group (and the stream) if need be
        .await?;

    // A stand-in for your producer: the message goes in the entry's `payload` field. The
    // stream is capped at about 10,000 entries.
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for id in ["p-1", "p-2", "p-2", "p-3"] {
        let body = format!(r#"{{"id": "{id}", "user": "ada", "points": 10}}"#);
        let cap = StreamMaxlen::Approx(10_000);
        let _: String = redis
            .xadd_maxlen(STREAM, cap, "*", &[(headers::PAYLOAD, body)])
            .await?;
    }

    // `--once` (a batch job, and CI): the stream ends after 3 s without an entry.
    let once = std::env::args().any(|a| a == "--once");
    let idle = Duration::from_secs(if once { 3 } else { u64::MAX });
    let deliveries = futures_util::stream::unfold(source.deliveries(), move |mut d| async move {
        Some((tokio::time::timeout(idle, d.next()).await.ok()??, d))
    });
    let shutdown = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    let handler = async |b: &mut Batch<Postgres>, m: &PointsEarned| earn(b, m).await;
    let counts = Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .max_deliveries(5) // then dead-lettered to `<stream>:dead`, with `idem-reason`
        .run(deliveries, json::<PointsEarned>, handler, shutdown)
        .await;
    source.close().await?; // stop reading: what was read and not settled stays pending
    println!("{counts:?}");
    Ok(())
}

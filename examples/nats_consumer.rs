//! A NATS JetStream consumer on PostgreSQL, to copy: `cargo run --example nats_consumer
//! --features postgres,nats -- --once`. It creates a stream with a durable consumer, publishes
//! an item's stock levels (one twice, an older one after a newer) and keeps the latest, acking
//! each after the commit: applied 2, duplicate 1, stale 1. `--once` stops after 3 s without a
//! delivery, else ctrl-c does. `IDEM_POSTGRES_URL`, `IDEM_NATS_URL`: other than local servers.

use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::nats::async_nats::jetstream::{self, consumer::pull};
use idem::nats::Source;
use idem::{idempotent, Batch, Tx};
use sqlx::{PgPool, Postgres};

const STREAM: &str = "IDEM_EXAMPLE_STOCK";
const DEAD: &str = "IDEM_EXAMPLE_STOCK_DEAD";
const CONSUMER: &str = "stock";

#[derive(serde::Deserialize)]
struct StockLevel {
    id: String,
    sku: String,
    version: i64,
    on_hand: i64,
}

/// Key + version + entity: an item's level only moves forward; an older one is `Stale`.
#[idempotent(
    key = "msg.id",
    version = "msg.version",
    entity = "msg.sku",
    scope = "stock::level"
)]
async fn level(tx: &mut Tx<'_, Postgres>, msg: &StockLevel) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO example_stock VALUES ($1, $2) \
               ON CONFLICT (sku) DO UPDATE SET on_hand = $2";
    let level = sqlx::query(sql).bind(&msg.sku).bind(msg.on_hand);
    level.execute(&mut **tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_string());
    let db = env("IDEM_POSTGRES_URL", "postgres://postgres@localhost/test");
    let pool = PgPool::connect(&db).await?;
    idem::migrate(&pool).await?; // idem's tables; safe to repeat
    let table = "CREATE TABLE IF NOT EXISTS example_stock (sku TEXT PRIMARY KEY, on_hand INT)";
    sqlx::query(table).execute(&pool).await?;

    // The stream, a stream for the dead letters (with no subjects given, a stream takes its
    // name as its subject), and a durable pull consumer that delivers a message at most 5 times.
    let url = env("IDEM_NATS_URL", "nats://localhost:4222");
    let js = jetstream::new(idem::nats::async_nats::connect(&url).await?);
    js.get_or_create_stream(DEAD).await?;
    let stream = js.get_or_create_stream(STREAM).await?;
    let config = pull::Config {
        durable_name: Some(CONSUMER.to_string()),
        max_deliver: 5,
        ..Default::default()
    };
    stream.get_or_create_consumer(CONSUMER, config).await?;

    // A stand-in for your producer. Give each message a `Nats-Msg-Id` where you can: JetStream
    // then drops a retry within its duplicate window. The copy here has none, as a retry after
    // the window: idem catches it, and the redeliveries no window sees.
    for (id, version, on_hand) in [("s-2", 2, 9), ("s-2", 2, 9), ("s-1", 1, 12), ("s-3", 3, 7)] {
        let body = format!(
            r#"{{"id": "{id}", "sku": "A-1", "version": {version}, "on_hand": {on_hand}}}"#
        );
        js.publish(STREAM, body.into()).await?.await?;
    }

    let source = Source::builder(&url, STREAM, CONSUMER)
        .prefetch(100) // batch × concurrency
        .dead_letters(DEAD) // default: `idem.dead-letter.<stream>.<consumer>`
        .connect() // checks the stream, the consumer and where dead letters go
        .await?;
    // `--once` (a batch job, and CI): the stream ends after 3 s without a delivery.
    let once = std::env::args().any(|a| a == "--once");
    let idle = Duration::from_secs(if once { 3 } else { u64::MAX });
    let deliveries = futures_util::stream::unfold(source.deliveries(), move |mut d| async move {
        Some((tokio::time::timeout(idle, d.next()).await.ok()??, d))
    });
    let shutdown = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    let handler = async |b: &mut Batch<Postgres>, m: &StockLevel| level(b, m).await;
    let counts = Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .max_deliveries(4) // `max_deliver - 1`: the last delivery only dead-letters
        .run(deliveries, json::<StockLevel>, handler, shutdown)
        .await;
    source.close().await?; // stop pulling, give back the last pull, flush
    println!("{counts:?}");
    Ok(())
}

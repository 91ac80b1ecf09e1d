//! A RabbitMQ consumer on PostgreSQL, to copy: `cargo run --example rabbitmq_consumer
//! --features postgres,rabbitmq -- --once`. It declares a quorum queue with its dead letters,
//! publishes three payments (one twice) and credits each once, acking after the commit: applied
//! 3, duplicate 1 (run it again: all duplicates). `--once` stops after 3 s without a delivery,
//! else ctrl-c does. `IDEM_POSTGRES_URL`, `IDEM_RABBITMQ_URL`: other than the local servers.

use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::rabbitmq::lapin::{options::*, types::*, BasicProperties, Connection, ExchangeKind};
use idem::{idempotent, Batch, Tx};
use sqlx::{PgPool, Postgres};

const QUEUE: &str = "idem-example-payments";
const DEAD: &str = "idem-example-payments.dead"; // the default dead-letter exchange
const LETTERS: &str = "idem-example-payments.dead-letters"; // a queue that keeps them

#[derive(serde::Deserialize)]
struct Payment {
    id: String,
    account: String,
    cents: i64,
}

/// Key only: each payment is credited once, however often it is delivered.
#[idempotent(key = "msg.id", scope = "billing::credit")]
async fn credit(tx: &mut Tx<'_, Postgres>, msg: &Payment) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO example_balances AS b VALUES ($1, $2) \
               ON CONFLICT (account) DO UPDATE SET cents = b.cents + $2";
    let credit = sqlx::query(sql).bind(&msg.account).bind(msg.cents);
    credit.execute(&mut **tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_string());
    let db = env("IDEM_POSTGRES_URL", "postgres://postgres@localhost/test");
    let pool = PgPool::connect(&db).await?;
    idem::migrate(&pool).await?; // idem's tables; safe to repeat
    let table = "CREATE TABLE IF NOT EXISTS example_balances (account TEXT PRIMARY KEY, cents INT)";
    sqlx::query(table).execute(&pool).await?;

    // The queue (quorum: it counts deliveries), and where its dead letters go (routing key: QUEUE).
    let url = env("IDEM_RABBITMQ_URL", "amqp://guest:guest@localhost:5672/%2f");
    let connection = Connection::connect(&url, Default::default()).await?;
    let channel = connection.create_channel().await?;
    let (durable, mut quorum) = (QueueDeclareOptions::durable(), FieldTable::default());
    let kind = AMQPValue::LongString("quorum".into());
    quorum.insert("x-queue-type".into(), kind);
    channel.queue_declare(QUEUE.into(), durable, quorum).await?;
    let (direct, none) = (ExchangeKind::Direct, FieldTable::default());
    let exchange = ExchangeDeclareOptions::default();
    channel
        .exchange_declare(DEAD.into(), direct, exchange, none.clone())
        .await?;
    channel
        .queue_declare(LETTERS.into(), durable, none.clone())
        .await?;
    let bind = QueueBindOptions::default();
    channel
        .queue_bind(LETTERS.into(), DEAD.into(), QUEUE.into(), bind, none)
        .await?;

    // A stand-in for your producer, with publisher confirms.
    channel.confirm_select(Default::default()).await?;
    for id in ["pay-1", "pay-2", "pay-2", "pay-3"] {
        let body = format!(r#"{{"id": "{id}", "account": "ada", "cents": 1250}}"#).into_bytes();
        let props = BasicProperties::default().with_delivery_mode(2); // persistent
        channel
            .basic_publish("".into(), QUEUE.into(), Default::default(), &body, props)
            .await?;
    }
    channel.wait_for_confirms().await?;
    connection.close(200, "OK".into()).await?;

    let source = idem::rabbitmq::Source::builder(&url, QUEUE)
        .prefetch(100) // batch × concurrency
        .connect() // checks the queue and its dead-letter exchange
        .await?;
    // `--once` (a batch job, and CI): the stream ends after 3 s without a delivery.
    let once = std::env::args().any(|a| a == "--once");
    let idle = Duration::from_secs(if once { 3 } else { u64::MAX });
    let deliveries = futures_util::stream::unfold(source.deliveries(), move |mut d| async move {
        Some((tokio::time::timeout(idle, d.next()).await.ok()??, d))
    });
    let shutdown = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    let handler = async |b: &mut Batch<Postgres>, m: &Payment| credit(b, m).await;
    let counts = Consumer::new(pool)
        .batch(50)
        .concurrency(2)
        .max_deliveries(5) // then dead-lettered, the reason in the `idem-reason` header
        .run(deliveries, json::<Payment>, handler, shutdown)
        .await;
    source.close().await?; // stop taking, settle what is in flight, leave
    println!("{counts:?}");
    Ok(())
}

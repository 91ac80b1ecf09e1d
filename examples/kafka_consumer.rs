//! A Kafka consumer on PostgreSQL, to copy: `cargo run --example kafka_consumer --features
//! postgres,kafka -- --once`. It creates a topic and its dead-letter topic, produces a user's
//! e-mail changes (one twice, an older one after a newer) keyed by user, and keeps the latest,
//! committing offsets only up to what has committed: applied 2, duplicate 1, stale 1. `--once`
//! stops after 10 s without a record, else ctrl-c does. `IDEM_POSTGRES_URL`,
//! `IDEM_KAFKA_BROKERS`: other than the local servers.

use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication::Fixed};
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem::kafka::rdkafka::{client::DefaultClientContext, ClientConfig};
use idem::kafka::Source;
use idem::{idempotent, Batch, Tx};
use sqlx::{PgPool, Postgres};

const TOPIC: &str = "idem-example-emails";
const DEAD: &str = "idem-example-emails.dead"; // the source's default dead-letter topic

#[derive(serde::Deserialize)]
struct EmailChanged {
    id: String,
    user: String,
    version: i64,
    email: String,
}

/// Key + version + entity: a user's e-mail only moves forward; an older one is `Stale`. Kafka
/// keeps no delivery count: after 5 failures idem's own count dead-letters the message.
#[idempotent(
    key = "msg.id",
    version = "msg.version",
    entity = "msg.user",
    scope = "users::email",
    max_attempts = 5
)]
async fn email(tx: &mut Tx<'_, Postgres>, msg: &EmailChanged) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO example_emails VALUES ($1, $2) \
               ON CONFLICT (username) DO UPDATE SET email = $2";
    let email = sqlx::query(sql).bind(&msg.user).bind(&msg.email);
    email.execute(&mut **tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_string());
    let db = env("IDEM_POSTGRES_URL", "postgres://postgres@localhost/test");
    let pool = PgPool::connect(&db).await?;
    idem::migrate(&pool).await?; // idem's tables; safe to repeat
    let table = "CREATE TABLE IF NOT EXISTS example_emails (username TEXT PRIMARY KEY, email TEXT)";
    sqlx::query(table).execute(&pool).await?;

    // The topic and its dead-letter topic (each answers "already exists" after the first run).
    let brokers = env("IDEM_KAFKA_BROKERS", "localhost:9092");
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &brokers);
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let topics = [
        NewTopic::new(TOPIC, 3, Fixed(1)),
        NewTopic::new(DEAD, 1, Fixed(1)),
    ];
    admin.create_topics(&topics, &AdminOptions::new()).await?;

    // A stand-in for your producer, keyed by user: a user's records stay in order on one
    // partition. (One record per batch: the tansu test broker needs it; Kafka does not.)
    let producer: FutureProducer = config.clone().set("batch.num.messages", "1").create()?;
    for (id, version) in [("e-2", 2), ("e-2", 2), ("e-1", 1), ("e-3", 3)] {
        let email = format!("ada+{version}@example.org");
        let body =
            format!(r#"{{"id": "{id}", "user": "ada", "version": {version}, "email": "{email}"}}"#);
        let record = FutureRecord::to(TOPIC).key("ada").payload(&body);
        let sent = producer.send(record, Duration::from_secs(10)).await;
        sent.map_err(|(err, _)| err)?;
    }

    let source = Source::builder(&brokers, TOPIC, "emails")
        .connect() // checks the topic and its dead-letter topic
        .await?;
    // `--once` (a batch job, and CI): the stream ends after 10 s without a record.
    let once = std::env::args().any(|a| a == "--once");
    let idle = Duration::from_secs(if once { 10 } else { u64::MAX });
    let deliveries = futures_util::stream::unfold(source.deliveries(), move |mut d| async move {
        Some((tokio::time::timeout(idle, d.next()).await.ok()??, d))
    });
    let shutdown = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    let handler = async |b: &mut Batch<Postgres>, m: &EmailChanged| email(b, m).await;
    let counts = Consumer::new(pool)
        .batch(100)
        .concurrency(4) // records complete out of order; offsets commit only what is settled
        .run(deliveries, json::<EmailChanged>, handler, shutdown)
        .await;
    source.close().await?; // wait for what is out, commit the offsets, leave the group
    println!("{counts:?}");
    Ok(())
}

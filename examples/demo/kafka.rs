//! The order events of `examples/orders.rs` through Kafka into SQLite, end to end, checked.
//!
//! ```text
//! tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
//!     --storage-engine memory://tansu/     # or any Kafka; IDEM_KAFKA_BROKERS points elsewhere
//! cargo run --example kafka_demo --features sqlite,kafka [-- <seed> <orders>]
//! ```
//!
//! A producer writes order events to a topic of this run (3 partitions, keyed by order): orders
//! placed (key only: counted into the customer's total once) and status changes (key, version
//! and entity: an order only moves forward), over a fifth of them twice and neighbours swapped,
//! so duplicates and stale versions arrive. idem's consumer takes them in batches of 50, four
//! transactions at a time, and commits each partition's offset only up to what has settled.
//! The program prints the counts, checks the database against an exactly-once oracle and the
//! group's committed offsets against the topic's ends, deletes its topics, and exits 1 on any
//! mismatch (2 when no broker answers). The consumer to copy is `examples/kafka_consumer.rs`.

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use harness::orders::{self, Check, Event};
use harness::Run;
use idem::consume::{json, Consumer};
use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::rdkafka::error::KafkaError;
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use idem::kafka::rdkafka::{Offset, TopicPartitionList};
use idem::kafka::Source;

const PARTITIONS: i32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (seed, orders) = harness::args(300)?;
    let brokers =
        std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_string());

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let run = Run::new("kafka-demo")?;
    let topic = format!("idem-demo-orders-{}", run.id);
    let dead = format!("{topic}.dead");
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let new = [
        NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
    ];
    let created =
        tokio::time::timeout(Duration::from_secs(15), admin.create_topics(&new, &options));
    let why = match created.await {
        Ok(Ok(results)) => results
            .into_iter()
            .find_map(|r| r.err())
            .map(|(_, e)| e.to_string()),
        Ok(Err(err)) => Some(err.to_string()),
        Err(_) => Some("no answer within 15 s".to_string()),
    };
    if let Some(why) = why {
        let start = "`cargo install tansu --version 0.6.0 --locked --features dynostore`, then \
                     `tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url \
                     tcp://127.0.0.1:9092 --storage-engine memory://tansu/`; or point \
                     IDEM_KAFKA_BROKERS at another broker.";
        return Ok(harness::no_server("Kafka broker", &brokers, why, start));
    }
    let result = demo(&brokers, &topic, &run, seed, orders).await;
    let _ = admin.delete_topics(&[&topic, &dead], &options).await;
    result
}

/// The run itself.
async fn demo(
    brokers: &str,
    topic: &str,
    run: &Run,
    seed: u64,
    orders: i64,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let pool = orders::database(&run.path("orders.db")).await?;
    let stream = orders::generate(seed, orders);
    let total = stream.deliveries.len() as u64;
    println!(
        "topic {topic}: {}; batch 50 × 4 in flight",
        stream.summary()
    );

    // The producer, keyed by order so an order's events share a partition. One record per
    // batch: the tansu test broker mishandles batches of several records (RELIABILITY.md,
    // "The Kafka test broker").
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("batch.num.messages", "1")
        .set("linger.ms", "0")
        .set("acks", "all")
        .create()?;
    for chunk in stream.deliveries.chunks(100) {
        let sends = chunk.iter().map(|event| {
            let payload = serde_json::to_vec(event).expect("an event encodes");
            let key = event.order_id().to_string();
            let producer = &producer;
            async move {
                let record = FutureRecord::to(topic).key(&key).payload(&payload);
                producer.send(record, TIMEOUT).await.map_err(|(e, _)| e)
            }
        });
        for sent in futures_util::future::join_all(sends).await {
            sent?;
        }
    }
    producer.flush(TIMEOUT)?;

    // The consumer; the demo stops once the group committed every record.
    let started = Instant::now();
    let group = format!("{topic}-billing");
    let source = Source::builder(brokers, topic, &group)
        .commit_interval(Duration::from_millis(200))
        .connect() // checks the topic and its dead-letter topic, `<topic>.dead`
        .await?;
    let all_committed = async || {
        let offsets = offsets(brokers, topic, &group).await;
        offsets.is_ok_and(|(committed, ends)| committed == ends)
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(4)
        .run(
            source.deliveries(),
            json::<Event>,
            async |b, e| orders::handle(b, e).await,
            harness::until("every offset committed", all_committed),
        )
        .await;
    source.close().await?;
    harness::print_counts(&counts, started.elapsed());

    let mut check = Check::default();
    check.counts(&counts, total);
    let want = check.database(&pool, &stream.events).await?;
    pool.close().await;
    let (committed, ends) = offsets(brokers, topic, &group).await?;
    check.that(
        committed == ends && ends.iter().sum::<i64>() as u64 == total,
        || format!("committed offsets {committed:?}, topic ends {ends:?}"),
    );
    Ok(check.finish(&format!(
        "{} customers and {} orders equal the exactly-once oracle; offsets committed to {ends:?}",
        want.customers.len(),
        want.orders.len()
    )))
}

/// The group's committed offsets and the topic's ends, per partition.
async fn offsets(
    brokers: &str,
    topic: &str,
    group: &str,
) -> Result<(Vec<i64>, Vec<i64>), Box<dyn std::error::Error>> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()?;
    let topic = topic.to_string();
    let found = tokio::task::spawn_blocking(move || {
        let mut list = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            list.add_partition(&topic, p);
        }
        let committed = client.committed_offsets(list, TIMEOUT)?;
        let committed = committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .collect();
        let mut ends = Vec::new();
        for p in 0..PARTITIONS {
            ends.push(client.fetch_watermarks(&topic, p, TIMEOUT)?.1);
        }
        Ok::<_, KafkaError>((committed, ends))
    })
    .await??;
    Ok(found)
}

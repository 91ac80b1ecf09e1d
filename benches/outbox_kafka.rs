//! The relay's throughput to Kafka through [`idem::kafka::OutboxPublisher`]: a batch's records
//! all enqueued, then their delivery reports awaited (`pipelined`), against the same publisher
//! handed one message at a time, each report awaited before the next record (`sequential`).
//! Both run under the real `Relay` (batch 100) on a SQLite file, draining `BENCH_ROWS` (2,000)
//! rows over 20 keys into a 3-partition topic of their own; `BENCH_ROUNDS` (5) rounds alternate
//! the order. One record per produced batch (`batch.num.messages=1`), as tansu 0.6.0 needs.
//!
//! ```text
//! IDEM_KAFKA_BROKERS=127.0.0.1:9092 cargo bench --bench outbox_kafka --features sqlite,postgres,kafka --profile dev
//! ```
//!
//! Needs `IDEM_KAFKA_BROKERS`. No timing is asserted; it only measures.

#[allow(dead_code)] // shared by every bench; this one uses the relay helpers
mod support;

use std::time::Duration;

use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::OutboxPublisher;
use support::relay::{drain_as, rounds, seed, unique};

const PARTITIONS: i32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let Ok(brokers) = std::env::var("IDEM_KAFKA_BROKERS") else {
        return eprintln!("skipped: IDEM_KAFKA_BROKERS is not set");
    };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    rounds(async |pool, rows, sequential| {
        let topic = unique("idem_bench_outbox");
        let created = admin
            .create_topics(
                &[NewTopic::new(
                    &topic,
                    PARTITIONS,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .unwrap();
        for result in created {
            result.unwrap();
        }
        seed(&pool, "kafka_outbox_bench::seed", &topic, rows).await;
        let publisher = OutboxPublisher::builder(&brokers)
            .producer_config("batch.num.messages", "1")
            .producer_config("linger.ms", "0")
            .connect()
            .await
            .unwrap();
        let secs = drain_as(pool, publisher, rows, sequential).await;
        let offsets: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        let watermarks = topic.clone();
        let produced: i64 = tokio::task::spawn_blocking(move || {
            (0..PARTITIONS)
                .map(|p| offsets.fetch_watermarks(&watermarks, p, TIMEOUT).unwrap().1)
                .sum()
        })
        .await
        .unwrap();
        assert_eq!(produced, rows as i64, "every row produced once");
        let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
        Some(secs)
    })
    .await;
}

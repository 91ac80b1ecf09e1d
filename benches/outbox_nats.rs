//! The relay's throughput to JetStream through [`idem::nats::OutboxPublisher`]: a batch's
//! publishes pipelined, then its PubAcks awaited (`pipelined`), against the same publisher
//! handed one message at a time, each ack awaited before the next publish (`sequential`).
//! Both run under the real `Relay` (batch 100) on a SQLite file, draining `BENCH_ROWS` (2,000)
//! rows over 20 keys into a stream of their own; `BENCH_ROUNDS` (5) rounds alternate the order.
//!
//! ```text
//! cargo bench --bench outbox_nats --features sqlite,postgres,nats --profile dev
//! ```
//!
//! Needs `IDEM_NATS_URL` (default the local server). No timing is asserted; it only measures.

#[allow(dead_code)] // shared by every bench; this one uses the relay helpers
mod support;

use std::time::Duration;

use idem::nats::async_nats::{self, jetstream};
use idem::nats::OutboxPublisher;
use support::relay::{drain_as, rounds, seed, unique};

#[tokio::main]
async fn main() {
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
    let client = match options.connect(url.as_str()).await {
        Ok(client) => client,
        Err(err) => return eprintln!("skipped: no NATS server at {url} ({err})"),
    };
    let js = jetstream::new(client);
    rounds(async |pool, rows, sequential| {
        let stream = unique("IDEM_BENCH");
        let subject = format!("{}.bench", stream.to_lowercase().replace('_', "-"));
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
        seed(&pool, "nats_outbox_bench::seed", &subject, rows).await;
        let publisher = OutboxPublisher::builder(url.as_str())
            .connect()
            .await
            .unwrap();
        let secs = drain_as(pool, publisher, rows, sequential).await;
        let mut stored = js.get_stream(&stream).await.unwrap();
        let messages = stored.info().await.unwrap().state.messages;
        assert_eq!(messages, rows as u64, "every row stored once");
        let _ = js.delete_stream(&stream).await;
        Some(secs)
    })
    .await;
}

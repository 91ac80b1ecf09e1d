//! The order events of `examples/orders.rs` through RabbitMQ into SQLite, end to end, checked.
//!
//! ```text
//! rabbitmq-server -detached          # or any broker; IDEM_RABBITMQ_URL points elsewhere
//! cargo run --example rabbitmq_demo --features sqlite,rabbitmq [-- <seed> <orders>]
//! ```
//!
//! A producer publishes order events to a queue of this run: orders placed (key only: counted
//! into the customer's total once) and status changes (key + version + entity: an order only
//! moves forward), over a fifth of them twice and neighbours swapped, so duplicates and stale
//! versions arrive. idem's consumer takes them in batches of 50, four transactions at a time,
//! and acks each delivery only after its transaction committed. The program prints the counts,
//! checks the database against an exactly-once oracle and the queue for leftovers, deletes its
//! queues and exchange, and exits 1 on any mismatch (2 when no broker answers). The consumer to
//! copy is `examples/rabbitmq_consumer.rs`.

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::process::ExitCode;
use std::time::Instant;

use futures_util::StreamExt as _;
use harness::orders::{self, Check, Event};
use harness::{rabbitmq, Run, Tally};
use idem::consume::{json, Consumer};
use idem::rabbitmq::lapin::options::BasicPublishOptions;
use idem::rabbitmq::lapin::{BasicProperties, Channel};
use idem::rabbitmq::Source;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (seed, orders) = harness::args(500)?;
    let url = rabbitmq::url();
    let (admin, channel) = match rabbitmq::connect(&url).await? {
        Ok(connected) => connected,
        Err(exit) => return Ok(exit),
    };
    let run = Run::new("rabbitmq-demo")?;
    let queue = format!("idem-demo-orders-{}", run.id);
    rabbitmq::declare(&channel, &queue).await?;
    let result = demo(&url, &channel, &queue, &run, seed, orders).await;
    rabbitmq::delete(&channel, &queue).await?;
    let _ = admin.close(200, "OK".into()).await;
    result
}

/// The run itself.
async fn demo(
    url: &str,
    channel: &Channel,
    queue: &str,
    run: &Run,
    seed: u64,
    orders: i64,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let pool = orders::database(&run.path("orders.db")).await?;
    let stream = orders::generate(seed, orders);
    let total = stream.deliveries.len() as u64;
    println!(
        "queue {queue}: {}; batch 50 × 4 in flight",
        stream.summary()
    );

    // The producer publishes while the consumer runs, with publisher confirms.
    let producer = {
        let (channel, queue) = (channel.clone(), queue.to_string());
        let published = stream.deliveries.clone();
        tokio::spawn(async move {
            for event in published {
                let properties = BasicProperties::default()
                    .with_message_id(event.id().into())
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2);
                let body = serde_json::to_vec(&event).expect("an event encodes");
                let options = BasicPublishOptions::default();
                channel
                    .basic_publish("".into(), queue.as_str().into(), options, &body, properties)
                    .await?;
            }
            channel.wait_for_confirms().await.map(|_| ())
        })
    };

    // The consumer: prefetch = batch × concurrency; dead letters to `<queue>.dead`.
    let started = Instant::now();
    let source = Source::builder(url, queue).prefetch(200).connect().await?;
    let tally = Tally::default();
    let deliveries = {
        let tally = tally.clone();
        source.deliveries().map(move |d| d.map(|d| tally.wrap(d)))
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(4)
        .max_deliveries(5)
        .run(
            deliveries,
            json::<Event>,
            async |b, e| orders::handle(b, e).await,
            harness::until("every delivery settled", async || tally.get() >= total),
        )
        .await;
    source.close().await?; // basic.cancel, then the channels and the connection (200 OK)
    producer.await??;
    harness::print_counts(&counts, started.elapsed());

    let mut check = Check::default();
    check.counts(&counts, total);
    let want = check.database(&pool, &stream.events).await?;
    pool.close().await;
    let left = rabbitmq::left(channel, queue).await?;
    check.that(left == (0, 0), || {
        format!("left in the queue and the dead-letter queue: {left:?}")
    });
    Ok(check.finish(&format!(
        "{} customers and {} orders equal the exactly-once oracle; the queue is empty",
        want.customers.len(),
        want.orders.len()
    )))
}

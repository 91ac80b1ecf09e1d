//! The order events of `examples/orders.rs` through NATS JetStream into SQLite, checked.
//!
//! ```text
//! nats-server -js &                      # the local server, JetStream on (127.0.0.1:4222)
//! cargo run --example nats_demo --features sqlite,nats [-- <seed> <orders>]
//! ```
//!
//! A producer publishes order events to a stream of its own, each with `Nats-Msg-Id` (its event
//! id), neighbours swapped, and over a fifth of them again: half of those copies with the same
//! id (a retry JetStream drops within its duplicate window), half under a new id (a retry after
//! the window, which JetStream stores). A consumer reads them through `idem::nats` into the two
//! `#[idempotent]` handlers, in batches, and acks each only after its transaction committed.
//! The program prints what happened, checks the database against an exactly-once oracle,
//! deletes its streams, and exits 1 on a mismatch (2 when no server answers). `IDEM_NATS_URL`
//! names another server. The consumer to copy is `examples/nats_consumer.rs`.

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use harness::orders::{self, Check, Event};
use harness::Run;
use idem::consume::{json, Consumer};
use idem::nats::async_nats::{self, jetstream};
use idem::nats::Source;
use jetstream::message::PublishMessage;

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (seed, orders) = harness::args(100)?;
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(&url);
    let start = "a server with JetStream on, e.g. `nats-server -js`; or set IDEM_NATS_URL.";
    let client = match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(err)) => return Ok(harness::no_server("NATS server", &url, err, start)),
        Err(_) => return Ok(harness::no_server("NATS server", &url, "3 s", start)),
    };
    let js = jetstream::new(client);
    let run = Run::new("nats-demo")?;
    let stream = format!("IDEM_DEMO_{}", run.id.replace('-', "_"));
    let result = demo(&url, &js, &stream, &run, seed, orders).await;
    // The demo's streams go, whatever happened.
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_DLQ")).await;
    result
}

/// The run itself.
async fn demo(
    url: &str,
    js: &jetstream::Context,
    name: &str,
    run: &Run,
    seed: u64,
    orders: i64,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    // The stream, a durable pull consumer, and a stream that keeps dead letters (on the
    // default dead-letter subject, which lies outside the orders stream).
    let subjects = format!("idem-demo-{}", run.id);
    js.create_stream(jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![format!("{subjects}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    js.create_stream(jetstream::stream::Config {
        name: format!("{name}_DLQ"),
        subjects: vec![Source::default_dead_letter_subject(name, "billing")],
        ..Default::default()
    })
    .await?;
    let config = jetstream::consumer::pull::Config {
        durable_name: Some("billing".into()),
        ack_wait: Duration::from_secs(10),
        max_deliver: 10,
        ..Default::default()
    };
    let mut consumer = js.create_consumer_on_stream(config, name).await?;

    // The producer. `Nats-Msg-Id` (the event's own id) lets JetStream drop a retried publish
    // that it stored within the stream's duplicate window: a first line of defence, cheap and
    // worth having. It is not enough on its own, which is why the consumer is idempotent: the
    // window ends (a retry after it is stored again: simulated here by a new id), and
    // JetStream's redeliveries to the consumer (ack_wait expired, a crash before the ack, an
    // ack lost on the way) are not publishes, so no window ever sees them.
    let stream = orders::generate(seed, orders);
    let (mut seen, mut retries, mut dropped, mut republished) = (HashSet::new(), 0, 0, 0);
    for event in &stream.deliveries {
        let subject = format!("{subjects}.orders.{}", event.id());
        let mut id = event.id().to_string();
        if !seen.insert(event.id()) {
            retries += 1;
            if retries % 2 == 0 {
                // A retry after the window (or by a producer that made a new id): stored.
                id.push_str("-retry");
                republished += 1;
            }
        }
        let payload = serde_json::to_vec(event)?;
        let message = PublishMessage::build()
            .payload(payload.into())
            .message_id(id);
        let ack = js.send_publish(subject, message).await?.await?;
        if ack.duplicate {
            dropped += 1;
        }
    }
    let delivered = (stream.events.len() + republished) as u64;
    println!(
        "{}; JetStream dropped {dropped} retries by Nats-Msg-Id and stored {republished} later \
         copies",
        stream.summary()
    );

    // The consumer, until JetStream has nothing left for it.
    let pool = orders::database(&run.path("orders.db")).await?;
    let started = Instant::now();
    let source = Source::builder(url, name, "billing")
        .prefetch(50)
        .connect()
        .await?;
    let settled = async || match consumer.info().await {
        Ok(info) => info.num_pending == 0 && info.num_ack_pending == 0,
        Err(_) => false,
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(2)
        .run(
            source.deliveries(),
            json::<Event>,
            async |b, e| orders::handle(b, e).await,
            harness::until("every message acked", settled),
        )
        .await;
    source.close().await?; // stop pulling, give back the last pull, flush
    harness::print_counts(&counts, started.elapsed());

    let mut check = Check::default();
    check.that(dropped == retries - republished, || {
        format!(
            "JetStream dropped {dropped} of {} same-id retries",
            retries - republished
        )
    });
    check.counts(&counts, delivered);
    let want = check.database(&pool, &stream.events).await?;
    pool.close().await;
    Ok(check.finish(&format!(
        "{} customers and {} orders equal the exactly-once oracle",
        want.customers.len(),
        want.orders.len()
    )))
}

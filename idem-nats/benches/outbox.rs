//! The relay's throughput to JetStream through [`idem_nats::OutboxPublisher`]: a batch's
//! publishes pipelined, then its PubAcks awaited (`pipelined`), against the same publisher
//! handed one message at a time, each ack awaited before the next publish (`sequential`).
//! Both run under the real `Relay` (batch 100) on a SQLite file, draining `BENCH_ROWS` (2,000)
//! rows over 20 keys into a stream of their own; `BENCH_ROUNDS` (5) rounds alternate the order.
//!
//! ```text
//! cargo bench -p idem-nats --bench outbox --profile dev
//! ```
//!
//! Needs `IDEM_NATS_URL` (default the local server). No timing is asserted; it only measures.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::Context;
use idem_nats::OutboxPublisher;
use sqlx::SqlitePool;

/// Hands the inner publisher one message at a time: each confirm awaited before the next.
struct Sequential<P>(P);

impl<P: Publisher> Publisher for Sequential<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        for i in 0..batch.len() {
            self.0.publish(&batch[i..=i]).await?;
        }
        Ok(())
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `rows` outbox rows to `destination` over 20 keys, committed.
async fn seed(pool: &SqlitePool, destination: &str, rows: usize) {
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let ctx = Context::new("nats_outbox_bench::seed", i.to_be_bytes().to_vec(), None);
        ctx.outgoing(destination)
            .partition_key(format!("key-{}", i % 20))
            .publish(&mut tx, &serde_json::json!({ "n": i }))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Seconds to drain `rows` rows through the relay with `publisher`.
async fn drain<P: Publisher>(pool: SqlitePool, publisher: P, rows: usize) -> f64 {
    let mut relay = Relay::new(pool, publisher).batch(100);
    let started = Instant::now();
    let mut published = 0;
    while published < rows {
        let n = relay.step().await.unwrap();
        assert!(n > 0, "the relay stopped at {published} of {rows}");
        published += n;
    }
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let Some(client) = common::connect().await else {
        return;
    };
    let (rows, rounds) = (env("BENCH_ROWS", 2_000), env("BENCH_ROUNDS", 5));
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for step in 0..2 {
            let variant = (round + step) % 2;
            let fx = common::Fixture::new(client.clone(), Default::default()).await;
            let pool = common::sqlite().await;
            let subject = format!("{}.bench", fx.prefix);
            seed(&pool, &subject, rows).await;
            let publisher = OutboxPublisher::new(fx.js.clone());
            let secs = match variant {
                0 => drain(pool.clone(), publisher, rows).await,
                _ => drain(pool.clone(), Sequential(publisher), rows).await,
            };
            let mut stream = fx.js.get_stream(&fx.stream).await.unwrap();
            let stored = stream.info().await.unwrap().state.messages;
            assert_eq!(stored, rows as u64, "every row stored once");
            times[variant].push(secs);
            pool.close().await;
            fx.delete().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    report("pipelined", "sequential", rows, &times);
}

/// Messages per second of each variant (median, range) and the ratio sequential / pipelined.
fn report(a: &str, b: &str, rows: usize, times: &[Vec<f64>; 2]) {
    let rate = |t: &[f64]| -> Vec<f64> { t.iter().map(|s| rows as f64 / s).collect() };
    let stats = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(|x, y| x.total_cmp(y));
        (s[s.len() / 2], s[0], s[s.len() - 1])
    };
    for (name, t) in [(a, &times[0]), (b, &times[1])] {
        let (median, lo, hi) = stats(&rate(t));
        println!("{name:>10}: {median:>8.0} msg/s (rounds {lo:.0}–{hi:.0})");
    }
    let ratios: Vec<f64> = times[1].iter().zip(&times[0]).map(|(s, p)| s / p).collect();
    let total = times[1].iter().sum::<f64>() / times[0].iter().sum::<f64>();
    let (median, lo, hi) = stats(&ratios);
    println!(
        "time {b} / {a}: {total:.2} over the run, median {median:.2} (rounds {lo:.2}–{hi:.2})"
    );
}

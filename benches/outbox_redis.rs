//! The relay's throughput to Redis Streams through [`idem::redis::OutboxPublisher`]: a batch's
//! `XADD`s in one pipeline (`pipelined`), against the same publisher handed one message at a
//! time, each reply awaited before the next `XADD` (`sequential`). Both run under the real
//! `Relay` (batch 100) on a SQLite file, draining `BENCH_ROWS` (2,000) rows over 20 keys into a
//! stream of their own; `BENCH_ROUNDS` (5) rounds alternate the order.
//!
//! ```text
//! cargo bench --bench outbox_redis --features sqlite,postgres,redis --profile dev
//! ```
//!
//! Needs `IDEM_REDIS_URL` (default the local server). No timing is asserted; it only measures.

#[allow(dead_code)] // shared by every bench; this one uses the relay helpers
mod support;

use idem::redis::OutboxPublisher;
use redis::AsyncCommands as _;
use support::relay::{drain_as, rounds, seed, unique};

#[tokio::main]
async fn main() {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = match client.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(err) => return eprintln!("skipped: no Redis at {url} ({err})"),
    };
    rounds(async |pool, rows, sequential| {
        let stream = unique("idem_bench_outbox");
        seed(&pool, "redis_outbox_bench::seed", &stream, rows).await;
        let publisher = OutboxPublisher::builder(url.as_str())
            .connect()
            .await
            .unwrap();
        let secs = drain_as(pool, publisher, rows, sequential).await;
        let added: usize = conn.xlen(&stream).await.unwrap();
        assert_eq!(added, rows, "every row added once");
        let _: i64 = conn.del(&stream).await.unwrap();
        Some(secs)
    })
    .await;
}

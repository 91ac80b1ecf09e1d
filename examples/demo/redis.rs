//! The order events of `examples/orders.rs` through Redis Streams into SQLite, checked.
//!
//! ```text
//! cargo run --example redis_demo --features sqlite,redis [-- <seed> <orders>]   # Redis on 127.0.0.1:6379
//! ```
//!
//! A producer appends order events to a stream of its own, each in the entry's `payload` field
//! (`idem::redis::headers::PAYLOAD`): over a fifth of them twice (a producer's retry) and
//! neighbours swapped (reordering). Two consumers of one group take batches into the two
//! `#[idempotent]` handlers, and the final tables are checked against what exactly-once,
//! in-order processing gives. It exits 1 on a mismatch, and 2, saying what to start, when no
//! Redis answers (`IDEM_REDIS_URL` names another). The consumer to copy is
//! `examples/redis_consumer.rs`.

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use harness::orders::{self, Check, Event};
use harness::Run;
use idem::consume::{json, Consumer, Counts};
use idem::redis::Source;
use redis::AsyncCommands as _;
use sqlx::SqlitePool;

const GROUP: &str = "orders";

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (seed, orders) = harness::args(200)?;
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str())?;
    let mut conn = match client.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(err) => {
            let start = "`redis-server --daemonize yes --port 6379`; or set IDEM_REDIS_URL.";
            return Ok(harness::no_server("Redis", &url, err, start));
        }
    };
    let run = Run::new("redis-demo")?;
    let key = format!("idem_demo:orders:{}", run.id);

    // The producer.
    let stream = orders::generate(seed, orders);
    for event in &stream.deliveries {
        let fields = [(idem::redis::headers::PAYLOAD, serde_json::to_vec(event)?)];
        let _: String = conn.xadd(&key, "*", &fields).await?;
    }
    let total = stream.deliveries.len() as u64;
    println!("stream {key}: {}; 2 consumers", stream.summary());

    // Two consumers of one group, as two processes would be; each stops once the group has
    // read every entry and has nothing pending.
    let pool = orders::database(&run.path("orders.db")).await?;
    let started = Instant::now();
    let a = consume(&pool, &client, &url, &key, "a", total);
    let b = consume(&pool, &client, &url, &key, "b", total);
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a?, b?);
    let _: i64 = conn.del(&key).await?;
    let elapsed = started.elapsed();
    for (name, counts) in [("a", &a), ("b", &b)] {
        print!("consumer {name}: ");
        harness::print_counts(counts, elapsed);
    }
    // Both consumers' outcomes, for the checks.
    let mut counts = a;
    counts.applied += b.applied;
    counts.duplicate += b.duplicate;
    counts.stale += b.stale;
    counts.dead_lettered += b.dead_lettered;

    let mut check = Check::default();
    check.counts(&counts, total);
    let want = check.database(&pool, &stream.events).await?;
    pool.close().await;
    Ok(check.finish(&format!(
        "{} customers and {} orders: the same as exactly-once, in-order processing",
        want.customers.len(),
        want.orders.len()
    )))
}

/// One consumer of the group, named `name`, until the group is drained.
async fn consume(
    pool: &SqlitePool,
    client: &redis::Client,
    url: &str,
    key: &str,
    name: &str,
    total: u64,
) -> Result<Counts, Box<dyn std::error::Error>> {
    let source = Source::builder(url, key, GROUP, name)
        .prefetch(50)
        .block(Duration::from_millis(50))
        .connect()
        .await?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // The group has read all `total` entries and has nothing pending.
    let drained = async || {
        let groups: redis::RedisResult<redis::streams::StreamInfoGroupsReply> =
            conn.xinfo_groups(key).await;
        let Ok(groups) = groups else { return false };
        groups.groups.iter().any(|g| {
            g.name == GROUP && g.entries_read.unwrap_or(0) as u64 >= total && g.pending == 0
        })
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(2)
        .run(
            source.deliveries(),
            json::<Event>,
            async |b, e| orders::handle(b, e).await,
            harness::until("the group to drain", drained),
        )
        .await;
    source.close().await?; // stop reading: anything read and not settled stays pending
    Ok(counts)
}

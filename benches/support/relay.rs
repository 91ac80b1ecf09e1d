//! The relay benches of the brokers' outbox publishers (`outbox_nats.rs`, `outbox_kafka.rs`,
//! `outbox_redis.rs`): rows seeded over 20 keys, drained through the real `Relay` (batch 100)
//! with the publisher as it is (`pipelined`) and handed one message at a time (`sequential`),
//! rounds alternating the order, and the report.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::Context;
use sqlx::sqlite::SqliteSynchronous;
use sqlx::SqlitePool;

use super::backends::SqliteDb;
use super::env_usize;

/// Hands the inner publisher one message at a time: each confirm awaited before the next.
pub struct Sequential<P>(pub P);

impl<P: Publisher> Publisher for Sequential<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        for i in 0..batch.len() {
            self.0.publish(&batch[i..=i]).await?;
        }
        Ok(())
    }
}

/// `rows` outbox rows to `destination` over 20 keys, committed, under `scope`.
pub async fn seed(pool: &SqlitePool, scope: &'static str, destination: &str, rows: usize) {
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let ctx = Context::new(scope, i.to_be_bytes().to_vec(), None);
        ctx.outgoing(destination)
            .partition_key(format!("key-{}", i % 20))
            .publish(&mut tx, &serde_json::json!({ "n": i }))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Seconds to drain `rows` rows through the relay with `publisher`.
pub async fn drain<P: Publisher>(pool: SqlitePool, publisher: P, rows: usize) -> f64 {
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

/// [`drain`] with `publisher` as it is (`pipelined`), or wrapped in [`Sequential`].
pub async fn drain_as<P: Publisher>(
    pool: SqlitePool,
    publisher: P,
    rows: usize,
    sequential: bool,
) -> f64 {
    if sequential {
        drain(pool, Sequential(publisher), rows).await
    } else {
        drain(pool, publisher, rows).await
    }
}

/// A name no other round of any run has: `prefix`, the process id and the clock.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// `BENCH_ROUNDS` (5) rounds of both variants, in alternating order, each on a SQLite file of
/// its own (WAL, `synchronous=NORMAL`). `round(pool, rows, sequential)` sets up the broker's
/// side, [`seed`]s `BENCH_ROWS` (2,000) rows, [`drain_as`] them with its publisher, checks the
/// broker holds each once, and returns the seconds the drain took; `None` (the broker is not
/// there) ends the bench. Then the report.
pub async fn rounds(mut round: impl AsyncFnMut(SqlitePool, usize, bool) -> Option<f64>) {
    let (rows, rounds) = (env_usize("BENCH_ROWS", 2_000), env_usize("BENCH_ROUNDS", 5));
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for n in 0..rounds {
        for step in 0..2 {
            let variant = (n + step) % 2;
            let db = SqliteDb::open_with(4, SqliteSynchronous::Normal)
                .await
                .unwrap();
            let secs = round(db.pool.clone(), rows, variant == 1).await;
            db.close().await;
            let Some(secs) = secs else {
                return;
            };
            times[variant].push(secs);
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

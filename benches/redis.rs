//! End to end through the local Redis (Streams): publish → consume → commit → ack, on SQLite
//! (file, WAL, `synchronous=FULL`) and PostgreSQL. The five consumers of `benches/rabbitmq.rs`,
//! on the same credit messages (key only, one UPDATE as the effect):
//!
//! 1. `hand/1`: a hand-written consumer of a group with the classic pattern: `XREADGROUP` of up
//!    to 100 entries, then per entry a transaction that inserts the message id into a processed
//!    table (`ON CONFLICT DO NOTHING`) and applies the effect, a commit, and an `XACK`;
//! 2. `idem b1`: idem's consumer with `batch(1)` on `idem::redis::Source` (`prefetch(100)`);
//! 3. `idem b100 c1` and `idem b100 c4`: `batch(100)` with `concurrency(1)` and `(4)`;
//! 4. `hand/100`: a hand-written batched consumer: one `XREADGROUP` of up to 100 entries in one
//!    transaction, the same two statements per entry, a commit, one `XACK` of all their ids.
//!
//! ```text
//! cargo bench --bench redis --features sqlite,postgres,redis
//! ```
//!
//! Rounds interleave the consumers in an order shuffled each round (`BENCH_ORDER`); each round adds
//! `BENCH_E2E_MSGS` (2,000) new entries to each consumer's own stream, then times that consumer
//! from connect to the last ack. `BENCH_E2E_ROUNDS` (10) rounds: 20,000 messages per consumer.
//! Ratios are over the whole run and the median of the per-round ratios.
//! `BENCH_ONLY=sqlite|postgres`, `IDEM_REDIS_URL`, `IDEM_POSTGRES_URL`. No timing is asserted; this
//! binary only measures.

#[allow(dead_code)] // shared by every bench; this one uses the backends and the e2e helpers
mod support;

use std::time::Duration;

use anyhow::{ensure, Context as _};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands as _;

use support::e2e::{self, Acked, Backend, Db, Turn, CONSUMERS};
use support::workload::{Credit, Gen};

const GROUP: &str = "bench";

fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

async fn publish(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    msgs: &[Credit],
) -> anyhow::Result<()> {
    for chunk in msgs.chunks(500) {
        let mut pipe = redis::pipe();
        for m in chunk {
            pipe.xadd(stream, "*", &[("payload", e2e::encode(m))])
                .ignore();
        }
        let () = pipe.query_async(conn).await?;
    }
    Ok(())
}

/// (1) and (4): the hand-written consumers, `batch` entries per transaction.
async fn hand<DB: Backend>(turn: &Turn<'_, DB>, stream: &str, batch: usize) -> anyhow::Result<()> {
    let client = redis::Client::open(redis_url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let options = StreamReadOptions::default()
        .group(GROUP, "hand")
        .count(100)
        .block(500);
    let mut done = 0;
    while done < turn.n {
        let reply: Option<StreamReadReply> =
            conn.xread_options(&[stream], &[">"], &options).await?;
        let entries: Vec<_> = reply
            .map(|r| r.keys)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|k| k.ids)
            .collect();
        for chunk in entries.chunks(batch) {
            let mut tx = turn.pool.begin().await?;
            for entry in chunk {
                let payload: Vec<u8> = entry.get("payload").context("no payload")?;
                DB::classic(&mut tx, "redis", &e2e::decode(&payload)?).await?;
            }
            tx.commit().await?;
            let ids: Vec<&str> = chunk.iter().map(|e| e.id.as_str()).collect();
            let acked: u64 = conn.xack(stream, GROUP, &ids).await?;
            ensure!(
                acked == ids.len() as u64,
                "XACK acked {acked} of {}",
                ids.len()
            );
            done += chunk.len() as u64;
        }
    }
    Ok(())
}

/// (2) and (3): idem's consumer.
async fn idem<DB: Backend>(turn: &Turn<'_, DB>, stream: &str) -> anyhow::Result<()> {
    let source = idem::redis::Source::builder(redis_url(), stream, GROUP, "idem")
        .prefetch(100)
        .connect()
        .await?;
    DB::idem(turn, source.deliveries(), Acked::wrap).await
}

/// Runs a consumer's turn on its stream; its time.
async fn time_one<DB: Backend>(turn: Turn<'_, DB>, stream: &str) -> anyhow::Result<Duration> {
    let hand = async |batch| hand(&turn, stream, batch).await;
    turn.time(hand, async || idem(&turn, stream).await).await
}

async fn bench_backend(backend: &str, msgs: usize, rounds: usize) -> anyhow::Result<()> {
    let db = Db::open(backend).await?;
    let url = redis_url();
    let mut conn = async {
        redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await
    }
    .await
    .with_context(|| format!("no Redis at {url}: start one (redis-server --daemonize yes)"))?;
    let streams: Vec<String> = (0..CONSUMERS.len())
        .map(|i| format!("idem_bench:{}:{backend}:{i}", std::process::id()))
        .collect();
    for stream in &streams {
        let () = conn.xgroup_create_mkstream(stream, GROUP, "$").await?;
    }

    let mut gen = Gen::new(13);
    let result = e2e::interleave(rounds, |which| {
        let msgs = gen.take(msgs);
        let (stream, db, mut conn) = (&streams[which], &db, conn.clone());
        async move {
            publish(&mut conn, stream, &msgs).await?;
            let n = msgs.len() as u64;
            e2e::on_pool!(db, |pool| time_one(Turn { pool, which, n }, stream).await)
        }
    })
    .await;
    for stream in &streams {
        let _: redis::RedisResult<i64> = conn.del(stream).await;
    }
    db.close().await;
    let (totals, ratios) = result?;
    let heading = format!("Redis Streams, {backend}");
    e2e::print_table(&heading, msgs, rounds, &totals, &ratios, true);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    e2e::main("BENCH_E2E_MSGS", "BENCH_E2E_ROUNDS", bench_backend)
}

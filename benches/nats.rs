//! End to end through the local NATS server (JetStream): publish → consume → commit → ack, on
//! SQLite (file, WAL, `synchronous=FULL`) and PostgreSQL. The five consumers of
//! `benches/rabbitmq.rs`, on the same credit messages (key only, one UPDATE as the effect):
//!
//! 1. `hand/1`: a hand-written async-nats pull consumer with the classic pattern: per message,
//!    a transaction that inserts the message id into a processed table (`ON CONFLICT DO
//!    NOTHING`) and applies the effect, a commit, and an ack (`+ACK`, not awaited by the server,
//!    as users write it; pulls of 100);
//! 2. `idem b1`: idem's consumer with `batch(1)` on `idem::nats::Source` (`fetch(100)`; its acks
//!    are confirmed by the server, `double_ack`);
//! 3. `idem b100 c1` and `idem b100 c4`: `batch(100)` with `concurrency(1)` and `(4)`;
//! 4. `hand/100`: a hand-written batched consumer: up to 100 messages (5 ms linger) in one
//!    transaction, the same two statements per message, a commit, then an ack per message
//!    (JetStream has no "ack up to here" under the explicit ack policy; pulls of 200).
//!
//! ```text
//! cargo bench --bench nats --features sqlite,postgres,nats
//! ```
//!
//! Rounds interleave the consumers in an order shuffled each round (`BENCH_ORDER`); each round
//! publishes `BENCH_E2E_MSGS` (2,000) new messages on each consumer's own subject (its durable
//! consumer filters on it), then times that consumer from connect to the last ack.
//! `BENCH_E2E_ROUNDS` (10) rounds: 20,000 messages per consumer. Ratios are over the whole run and
//! the median of the per-round ratios. `BENCH_ONLY=sqlite|postgres`, `IDEM_NATS_URL`,
//! `IDEM_POSTGRES_URL`. No timing is asserted; this binary only measures.

#[allow(dead_code)] // shared by every bench; this one uses the backends and the e2e helpers
mod support;

use std::time::Duration;

use anyhow::{anyhow, Context as _};
use idem::nats::async_nats::{self, jetstream};
use jetstream::consumer::PullConsumer;

use support::e2e::{self, Acked, Backend, Db, Turn, CONSUMERS};
use support::workload::{Credit, Gen};

/// How long a pull request waits on the server. Short, so a pull left open by a consumer that
/// stopped cannot take the next round's messages (they would come back only after `ack_wait`);
/// the bench waits this long (untimed) after each consumer.
const EXPIRES: Duration = Duration::from_millis(200);

fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

/// The stream of one backend's run, and the subject prefix of its consumers.
struct Names {
    stream: String,
    prefix: String,
}

impl Names {
    fn subject(&self, which: usize) -> String {
        format!("{}.{which}", self.prefix)
    }
    fn consumer(which: usize) -> String {
        format!("c{which}")
    }
}

async fn publish(js: &jetstream::Context, subject: &str, msgs: &[Credit]) -> anyhow::Result<()> {
    let mut acks = Vec::with_capacity(256);
    for m in msgs {
        acks.push(
            js.publish(subject.to_string(), e2e::encode(m).into())
                .await?,
        );
        if acks.len() == 256 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// (1) and (4): the hand-written consumers, `batch` messages per transaction.
async fn hand<DB: Backend>(turn: &Turn<'_, DB>, names: &Names, batch: usize) -> anyhow::Result<()> {
    let client = async_nats::connect(nats_url()).await?;
    let js = jetstream::new(client.clone());
    let consumer: PullConsumer = js
        .get_consumer_from_stream(Names::consumer(turn.which), &names.stream)
        .await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(if batch == 1 { 100 } else { 2 * batch })
        .expires(EXPIRES)
        .messages()
        .await?;
    let mut done = 0;
    while done < turn.n {
        let batched = e2e::gather(&mut messages, batch).await?;
        let mut tx = turn.pool.begin().await?;
        for m in &batched {
            DB::classic(&mut tx, "nats", &e2e::decode(&m.payload)?).await?;
        }
        tx.commit().await?;
        for m in &batched {
            m.ack().await.map_err(|e| anyhow!(e))?;
        }
        done += batched.len() as u64;
    }
    drop(messages);
    client.flush().await?;
    Ok(())
}

/// (2) and (3): idem's consumer.
async fn idem<DB: Backend>(turn: &Turn<'_, DB>, names: &Names) -> anyhow::Result<()> {
    let consumer = Names::consumer(turn.which);
    let source = idem::nats::Source::builder(nats_url(), &names.stream, consumer)
        .prefetch(100)
        .expires(EXPIRES)
        .connect()
        .await?;
    DB::idem(turn, source.deliveries(), Acked::wrap).await?;
    source.client().flush().await?;
    Ok(())
}

/// Runs a consumer's turn on its subject; its time.
async fn time_one<DB: Backend>(turn: Turn<'_, DB>, names: &Names) -> anyhow::Result<Duration> {
    let hand = async |batch| hand(&turn, names, batch).await;
    turn.time(hand, async || idem(&turn, names).await).await
}

async fn bench_backend(backend: &str, msgs: usize, rounds: usize) -> anyhow::Result<()> {
    let db = Db::open(backend).await?;
    let url = nats_url();
    let client = async_nats::connect(&url).await.with_context(|| {
        format!("no NATS server at {url}: start one with JetStream on (nats-server -js)")
    })?;
    let js = jetstream::new(client.clone());
    let tag = format!(
        "IDEM_BENCH_{}_{}",
        std::process::id(),
        backend.to_uppercase()
    );
    let names = Names {
        prefix: tag.to_lowercase().replace('_', "-"),
        stream: tag,
    };
    js.create_stream(jetstream::stream::Config {
        name: names.stream.clone(),
        subjects: vec![format!("{}.>", names.prefix)],
        ..Default::default()
    })
    .await?;
    for which in 0..CONSUMERS.len() {
        js.create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some(Names::consumer(which)),
                filter_subject: names.subject(which),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 10_000,
                ..Default::default()
            },
            names.stream.as_str(),
        )
        .await?;
    }

    let mut gen = Gen::new(11);
    let result = e2e::interleave(rounds, |which| {
        let msgs = gen.take(msgs);
        let (js, names, db) = (&js, &names, &db);
        async move {
            publish(js, &names.subject(which), &msgs).await?;
            let n = msgs.len() as u64;
            let took = e2e::on_pool!(db, |pool| time_one(Turn { pool, which, n }, names).await)?;
            tokio::time::sleep(EXPIRES + Duration::from_millis(100)).await;
            Ok(took)
        }
    })
    .await;
    let _ = js.delete_stream(&names.stream).await;
    db.close().await;
    let (totals, ratios) = result?;
    let heading = format!("NATS JetStream, {backend}");
    e2e::print_table(&heading, msgs, rounds, &totals, &ratios, true);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    e2e::main("BENCH_E2E_MSGS", "BENCH_E2E_ROUNDS", bench_backend)
}

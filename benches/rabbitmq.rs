//! End to end through the local RabbitMQ: publish → consume → commit → ack, on SQLite (file,
//! WAL, `synchronous=FULL`) and PostgreSQL. Five consumers of the same credit messages (key
//! only, one UPDATE as the business effect):
//!
//! 1. `hand/1`: a hand-written lapin consumer with the classic pattern: per message, a
//!    transaction that inserts the message id into a processed table (`ON CONFLICT DO NOTHING`)
//!    and applies the effect, a commit, and an ack (prefetch 100);
//! 2. `idem b1`: idem's consumer with `batch(1)`, `concurrency(1)` (prefetch 100);
//! 3. `idem b100 c1` and `idem b100 c4`: `batch(100)` with `concurrency(1)` and `(4)` (prefetch
//!    2 × batch × concurrency);
//! 4. `hand/100`: a hand-written batched consumer: up to 100 deliveries (5 ms linger) in one
//!    transaction, the same two statements per message, a commit, one `multiple` ack (prefetch
//!    200).
//!
//! ```text
//! export CARGO_TARGET_DIR=/work/target-bench
//! cargo bench --bench rabbitmq --features sqlite,postgres,rabbitmq
//! ```
//!
//! Rounds interleave the consumers in an order shuffled each round (`BENCH_ORDER`); each round
//! publishes `BENCH_RMQ_MSGS` (2,000) new messages to each consumer's own queue, then times that
//! consumer from connect to the last ack. `BENCH_RMQ_ROUNDS` (10) rounds: 20,000 messages per
//! consumer. Ratios are over the whole run and the median of the per-round ratios.
//! `BENCH_ONLY=sqlite|postgres`, `IDEM_RABBITMQ_URL`, `IDEM_POSTGRES_URL`. No timing is asserted;
//! this binary only measures.

#[allow(dead_code)] // shared by every bench; this one uses the backends and the e2e helpers
mod support;

use std::time::Duration;

use anyhow::{ensure, Context as _};
use idem::rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use idem::rabbitmq::lapin::types::FieldTable;
use idem::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use support::e2e::{self, Acked, Backend, Db, Turn, CONSUMERS};
use support::workload::{Credit, Gen};

fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

async fn publish(channel: &Channel, queue: &str, msgs: &[Credit]) -> anyhow::Result<()> {
    for m in msgs {
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &e2e::encode(m),
                BasicProperties::default()
                    .with_message_id(m.id.as_str().into())
                    .with_delivery_mode(2),
            )
            .await?;
    }
    let returned = channel.wait_for_confirms().await?;
    ensure!(returned.is_empty(), "messages returned");
    Ok(())
}

/// A bench consumer's queue and the dead-letter exchange idem's source checks.
struct Queue<'a> {
    url: &'a str,
    name: &'a str,
    dlx: &'a str,
}

/// (1) and (4): the hand-written consumers, `batch` deliveries per transaction.
async fn hand<DB: Backend>(
    turn: &Turn<'_, DB>,
    queue: &Queue<'_>,
    batch: usize,
) -> anyhow::Result<()> {
    let connection = Connection::connect(queue.url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let prefetch = if batch == 1 { 100 } else { 2 * batch as u16 };
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.name.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut done = 0;
    while done < turn.n {
        let deliveries = e2e::gather(&mut consumer, batch).await?;
        let mut tx = turn.pool.begin().await?;
        for d in &deliveries {
            DB::classic(&mut tx, "rmq", &e2e::decode(&d.data)?).await?;
        }
        tx.commit().await?;
        let last = deliveries.last().expect("one delivery at least");
        ensure!(
            last.acker
                .ack(BasicAckOptions {
                    multiple: batch > 1
                })
                .await?,
            "ack not sent"
        );
        done += deliveries.len() as u64;
    }
    connection.close(200, "OK".into()).await?;
    Ok(())
}

/// (2) and (3): idem's consumer, a batch's acks in one `multiple` ack.
async fn idem<DB: Backend>(turn: &Turn<'_, DB>, queue: &Queue<'_>) -> anyhow::Result<()> {
    let (batch, concurrency) = e2e::idem_shape(turn.which);
    let prefetch = if batch == 1 {
        100
    } else {
        2 * batch * concurrency
    };
    let source = idem::rabbitmq::Source::builder(queue.url, queue.name)
        .prefetch(prefetch)
        .dead_letters(queue.dlx)
        .connect()
        .await?;
    DB::idem(turn, source.deliveries(), Acked::wrap_batched).await
}

/// Runs a consumer's turn on its queue; its time.
async fn time_one<DB: Backend>(turn: Turn<'_, DB>, queue: &Queue<'_>) -> anyhow::Result<Duration> {
    let hand = async |batch| hand(&turn, queue, batch).await;
    turn.time(hand, async || idem(&turn, queue).await).await
}

async fn bench_backend(backend: &str, msgs: usize, rounds: usize) -> anyhow::Result<()> {
    let db = Db::open(backend).await?;
    let url = rabbit_url();
    let admin = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("no RabbitMQ at {url}: start one (rabbitmq-server -detached)"))?;
    let channel = admin.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let tag = format!("idem_bench_{}_{backend}", std::process::id());
    let dlx = format!("{tag}.dlx");
    channel
        .exchange_declare(
            dlx.as_str().into(),
            idem::rabbitmq::lapin::ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let queues: Vec<String> = (0..CONSUMERS.len()).map(|i| format!("{tag}_{i}")).collect();
    for q in &queues {
        channel
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await?;
    }

    let mut gen = Gen::new(7);
    let result = e2e::interleave(rounds, |which| {
        let msgs = gen.take(msgs);
        let (channel, db) = (&channel, &db);
        let (url, name, dlx) = (url.as_str(), queues[which].as_str(), dlx.as_str());
        async move {
            publish(channel, name, &msgs).await?;
            let (queue, n) = (Queue { url, name, dlx }, msgs.len() as u64);
            e2e::on_pool!(db, |pool| time_one(Turn { pool, which, n }, &queue).await)
        }
    })
    .await;

    for q in &queues {
        channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await?;
    admin.close(200, "OK".into()).await?;
    db.close().await;
    let (totals, ratios) = result?;
    e2e::print_table(backend, msgs, rounds, &totals, &ratios, false);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    e2e::main("BENCH_RMQ_MSGS", "BENCH_RMQ_ROUNDS", bench_backend)
}

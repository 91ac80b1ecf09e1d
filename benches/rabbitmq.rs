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

#[allow(dead_code)] // shared by every bench; this one uses the backends and the key-only handler
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use futures_util::StreamExt as _;
use idem::consume::{Consumer, Delivery, Settle, SettleError};
use idem::rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use idem::rabbitmq::lapin::types::FieldTable;
use idem::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use support::backends::{create_tables_postgres, create_tables_sqlite, PostgresDb, SqliteDb};
use support::order::Rounds;
use support::stats::median;
use support::workload::{Credit, Gen};

const CONSUMERS: [&str; 5] = [
    "hand/1",
    "idem b1",
    "idem b100 c1",
    "idem b100 c4",
    "hand/100",
];

fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// The message on the wire.
#[derive(Serialize, Deserialize)]
struct Wire {
    id: String,
    account: i64,
    amount: i64,
    version: i64,
}

fn decode(bytes: &[u8]) -> Result<Credit, serde_json::Error> {
    let w: Wire = serde_json::from_slice(bytes)?;
    Ok(Credit {
        id: w.id,
        account: w.account,
        amount: w.amount,
        version: w.version,
    })
}

async fn publish(channel: &Channel, queue: &str, msgs: &[Credit]) -> anyhow::Result<()> {
    for m in msgs {
        let body = serde_json::to_vec(&Wire {
            id: m.id.clone(),
            account: m.account,
            amount: m.amount,
            version: m.version,
        })?;
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
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

/// Counts what idem's consumer acked: the bench's stop signal.
struct Counted<D> {
    inner: D,
    acked: Arc<(AtomicU64, Notify)>,
}

impl<D: Delivery> Delivery for Counted<D> {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let ack = matches!(settle, Settle::Ack);
        let result = self.inner.settle(settle).await;
        if ack && result.is_ok() {
            self.acked.0.fetch_add(1, Ordering::SeqCst);
            self.acked.1.notify_waiters();
        }
        result
    }
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(acked) = deliveries.first().map(|d| d.acked.clone()) else {
            return Vec::new();
        };
        let results = D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await;
        let n = results.iter().filter(|r| r.is_ok()).count() as u64;
        acked.0.fetch_add(n, Ordering::SeqCst);
        acked.1.notify_waiters();
        results
    }
}

macro_rules! consumers {
    ($db:ty, $h:ident) => {
        use super::*;
        use idem::Tx;
        use sqlx::Pool;

        type Db = $db;

        /// The classic pattern's two statements, in the caller's transaction.
        async fn classic(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            let fresh = sqlx::query(
                "INSERT INTO bench_processed (consumer, message_id) VALUES ('rmq', $1) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(&msg.id)
            .execute(&mut **tx)
            .await?
            .rows_affected()
                == 1;
            if fresh {
                support::handlers::$h::effect(tx, msg).await?;
            }
            Ok(())
        }

        /// (1) and (4): the hand-written consumers, `batch` deliveries per transaction.
        pub async fn hand(
            pool: &Pool<Db>,
            url: &str,
            queue: &str,
            n: u64,
            batch: usize,
        ) -> anyhow::Result<()> {
            let connection = Connection::connect(url, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            let prefetch = if batch == 1 { 100 } else { 2 * batch as u16 };
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await?;
            let mut consumer = channel
                .basic_consume(
                    queue.into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let mut done = 0;
            while done < n {
                let first = consumer.next().await.context("consumer ended")??;
                let mut deliveries = vec![first];
                let linger = tokio::time::Instant::now() + Duration::from_millis(5);
                while deliveries.len() < batch {
                    match tokio::time::timeout_at(linger, consumer.next()).await {
                        Ok(Some(Ok(d))) => deliveries.push(d),
                        _ => break,
                    }
                }
                let mut tx = pool.begin().await?;
                for d in &deliveries {
                    classic(&mut tx, &decode(&d.data)?).await?;
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

        /// (2) and (3): idem's consumer.
        pub async fn idem(
            pool: &Pool<Db>,
            url: &str,
            queue: &str,
            dlx: &str,
            n: u64,
            batch: usize,
            concurrency: usize,
        ) -> anyhow::Result<()> {
            let prefetch = if batch == 1 {
                100
            } else {
                2 * batch * concurrency
            };
            let source = idem::rabbitmq::Source::builder(url, queue)
                .prefetch(prefetch)
                .dead_letters(dlx)
                .connect()
                .await?;
            let acked = Arc::new((AtomicU64::new(0), Notify::new()));
            let counted = {
                let acked = acked.clone();
                source.deliveries().map(move |d| {
                    d.map(|inner| Counted {
                        inner,
                        acked: acked.clone(),
                    })
                })
            };
            let until = {
                let acked = acked.clone();
                async move {
                    loop {
                        let changed = acked.1.notified();
                        if acked.0.load(Ordering::SeqCst) >= n {
                            return;
                        }
                        changed.await;
                    }
                }
            };
            let counts = Consumer::new(pool.clone())
                .batch(batch)
                .concurrency(concurrency)
                .linger(Duration::from_millis(5))
                .run(
                    counted,
                    decode,
                    async |b, m| support::handlers::$h::credit_key(b, m).await,
                    until,
                )
                .await;
            ensure!(counts.applied == n, "applied {counts:?}, expected {n}");
            Ok(())
        }
    };
}

mod sq {
    consumers!(sqlx::Sqlite, sq);
}

mod pg {
    consumers!(sqlx::Postgres, pg);
}

/// Runs consumer `which` on `n` messages of its queue; its time.
async fn time_one(
    backend: &str,
    pools: &(Option<sqlx::SqlitePool>, Option<sqlx::PgPool>),
    which: usize,
    queue: &str,
    dlx: &str,
    n: u64,
) -> anyhow::Result<Duration> {
    let url = rabbit_url();
    let started = Instant::now();
    match (backend, pools) {
        ("sqlite", (Some(p), _)) => match which {
            0 => sq::hand(p, &url, queue, n, 1).await?,
            1 => sq::idem(p, &url, queue, dlx, n, 1, 1).await?,
            2 => sq::idem(p, &url, queue, dlx, n, 100, 1).await?,
            3 => sq::idem(p, &url, queue, dlx, n, 100, 4).await?,
            _ => sq::hand(p, &url, queue, n, 100).await?,
        },
        ("postgres", (_, Some(p))) => match which {
            0 => pg::hand(p, &url, queue, n, 1).await?,
            1 => pg::idem(p, &url, queue, dlx, n, 1, 1).await?,
            2 => pg::idem(p, &url, queue, dlx, n, 100, 1).await?,
            3 => pg::idem(p, &url, queue, dlx, n, 100, 4).await?,
            _ => pg::hand(p, &url, queue, n, 100).await?,
        },
        _ => unreachable!(),
    }
    Ok(started.elapsed())
}

async fn bench_backend(backend: &str, msgs: usize, rounds: usize) -> anyhow::Result<()> {
    let (sqlite, postgres) = match backend {
        "sqlite" => {
            let db = SqliteDb::open(8).await?;
            create_tables_sqlite(&db.pool).await?;
            (Some(db), None)
        }
        _ => {
            let db = PostgresDb::open(8).await?;
            create_tables_postgres(&db.pool).await?;
            (None, Some(db))
        }
    };
    let pools = (
        sqlite.as_ref().map(|d| d.pool.clone()),
        postgres.as_ref().map(|d| d.pool.clone()),
    );
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
    let mut totals = [Duration::ZERO; CONSUMERS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); CONSUMERS.len()];
    let mut order = Rounds::from_env();
    for round in 0..rounds {
        let mut times = [Duration::ZERO; CONSUMERS.len()];
        for which in order.next(round, CONSUMERS.len()) {
            publish(&channel, &queues[which], &gen.take(msgs)).await?;
            times[which] =
                time_one(backend, &pools, which, &queues[which], &dlx, msgs as u64).await?;
        }
        for (i, t) in times.iter().enumerate() {
            totals[i] += *t;
            ratios[i].push(times[0].as_secs_f64() / t.as_secs_f64());
        }
    }
    let n = (msgs * rounds) as f64;
    println!(
        "\n{backend}: {} messages per consumer ({rounds} rounds of {msgs})",
        msgs * rounds
    );
    println!(
        "{:<14} {:>9} {:>22} {:>20}",
        "consumer", "msg/s", "× hand/1 (whole run)", "× hand/1 (median)"
    );
    for (i, name) in CONSUMERS.iter().enumerate() {
        println!(
            "{:<14} {:>9.0} {:>22.2} {:>20.2}",
            name,
            n / totals[i].as_secs_f64(),
            totals[0].as_secs_f64() / totals[i].as_secs_f64(),
            median(&ratios[i])
        );
    }
    println!(
        "idem b1 / hand/1 cost: {:.3}; idem b100 c4 / hand/100 throughput: {:.3}",
        totals[1].as_secs_f64() / totals[0].as_secs_f64(),
        totals[4].as_secs_f64() / totals[3].as_secs_f64()
    );

    for q in &queues {
        channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await?;
    admin.close(200, "OK".into()).await?;
    if let Some(db) = sqlite {
        db.close().await;
    }
    if let Some(db) = postgres {
        db.close().await;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    support::run(|| async {
        let msgs = support::env_usize("BENCH_RMQ_MSGS", 2_000);
        let rounds = support::env_usize("BENCH_RMQ_ROUNDS", 10);
        let only = std::env::var("BENCH_ONLY").ok();
        for backend in ["sqlite", "postgres"] {
            if only.as_deref().is_none_or(|o| o == backend) {
                bench_backend(backend, msgs, rounds).await?;
            }
        }
        Ok(())
    })
}

//! The outbox on the local PostgreSQL and RabbitMQ:
//!
//! 1. **Publish cost in a handler**: `BENCH_OUTBOX_TASKS` (16) concurrent tasks run a key-only
//!    `#[idempotent]` handler (one UPDATE as the effect), one transaction per message, as
//!    `plain`; the same handler plus one `ctx.publish` as `outbox`; and plus `pg_notify` in the
//!    same transaction as `outbox+notify` (what a NOTIFY wake-up of the relay would cost).
//! 2. **Relay throughput** to RabbitMQ with publisher confirms: `idem::outbox::Relay` (batch
//!    100, RabbitMQ `OutboxPublisher`), with its default 32 partitions a turn and with one
//!    partition a turn (as it published before a batch spanned partitions), against a
//!    hand-written relay (`SELECT ... ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED`, publish
//!    the batch on one confirm channel, wait for the confirms, `UPDATE ... SET sent`, commit);
//!    the hand-written one also publishing `mandatory`, and `mandatory` plus the partition key
//!    and the id as headers (what `OutboxPublisher` sends). Each drains `BENCH_OUTBOX_ROWS` (5,000) rows
//!    over 100 keys into a queue of its own.
//!
//! ```text
//! cargo bench --bench outbox --features sqlite,postgres,rabbitmq
//! ```
//!
//! Rounds interleave the variants in an order shuffled each round (`BENCH_ORDER`);
//! `BENCH_OUTBOX_ROUNDS` (6) rounds of `BENCH_OUTBOX_MSGS` (1,600) messages per handler variant.
//! Ratios are over the whole run and the median of the per-round ratios. `IDEM_POSTGRES_URL`,
//! `IDEM_RABBITMQ_URL`. No timing is asserted; this binary only measures.

#[allow(dead_code)] // shared by every bench; this one uses the PostgreSQL backend and workload
mod support;

use std::time::Instant;

use anyhow::ensure;
use idem::outbox::Relay;
use idem::rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use idem::rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem::rabbitmq::{headers, OutboxPublisher};
use idem::{idempotent, Context, Tx};
use serde::Serialize;
use sqlx::{PgPool, Postgres};

use support::backends::{create_tables_postgres, PostgresDb};
use support::order::Rounds;
use support::stats::{median, spread};
use support::workload::{Credit, Gen};

fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// What the `outbox` handlers publish.
#[derive(Serialize)]
struct Credited<'a> {
    id: &'a str,
    account: i64,
    amount: i64,
}

async fn effect(tx: &mut Tx<'_, Postgres>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE bench_accounts SET balance = balance + $1 WHERE id = $2")
        .bind(msg.amount)
        .bind(msg.account)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(key = "msg.id", scope = "bench::plain")]
async fn plain(tx: &mut Tx<'_, Postgres>, msg: &Credit) -> Result<(), sqlx::Error> {
    effect(tx, msg).await
}

/// The effect, and one message through the outbox in the same transaction.
async fn credit_and_publish(
    tx: &mut Tx<'_, Postgres>,
    msg: &Credit,
    ctx: &Context,
) -> Result<(), sqlx::Error> {
    effect(tx, msg).await?;
    let out = Credited {
        id: &msg.id,
        account: msg.account,
        amount: msg.amount,
    };
    ctx.outgoing("bench.credited")
        .partition_key(msg.account.to_string())
        .publish(tx, &out)
        .await?;
    Ok(())
}

#[idempotent(key = "msg.id", scope = "bench::outbox")]
async fn outbox(tx: &mut Tx<'_, Postgres>, msg: &Credit, ctx: &Context) -> Result<(), sqlx::Error> {
    credit_and_publish(tx, msg, ctx).await
}

#[idempotent(key = "msg.id", scope = "bench::outbox_notify")]
async fn outbox_notify(
    tx: &mut Tx<'_, Postgres>,
    msg: &Credit,
    ctx: &Context,
) -> Result<(), sqlx::Error> {
    credit_and_publish(tx, msg, ctx).await?;
    sqlx::query("SELECT pg_notify('idem_outbox', '')")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

const HANDLERS: [&str; 3] = ["plain", "outbox", "outbox+notify"];
/// Concurrent handler tasks: `BENCH_OUTBOX_TASKS` (16; 1 shows the cost without contention).
fn tasks() -> usize {
    support::env_usize("BENCH_OUTBOX_TASKS", 16).max(1)
}

/// Runs `messages` through one variant with [`tasks`] concurrent tasks; returns messages/s.
async fn handlers_round(
    pool: &PgPool,
    variant: usize,
    messages: Vec<Credit>,
) -> anyhow::Result<f64> {
    let n = messages.len();
    let tasks = tasks();
    let mut chunks: Vec<Vec<Credit>> = vec![Vec::new(); tasks];
    for (i, msg) in messages.into_iter().enumerate() {
        chunks[i % tasks].push(msg);
    }
    let started = Instant::now();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for msg in &chunk {
                    match variant {
                        0 => plain(&pool, msg).await.map(|_| ()),
                        1 => outbox(&pool, msg).await.map(|_| ()),
                        _ => outbox_notify(&pool, msg).await.map(|_| ()),
                    }
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

const RELAYS: [&str; 5] = [
    "idem Relay",
    "idem 1 part/turn",
    "hand-written",
    "hand, mandatory",
    "hand, idem props",
];
/// The index of the hand-written relay in [`RELAYS`]; after it, the same relay publishing
/// `mandatory` (unroutable messages come back instead of being confirmed), then also with the
/// partition key and the id as headers: as idem's `OutboxPublisher` publishes.
const HAND: usize = 2;

/// Writes `rows` messages over 100 keys to `table` (idem's outbox through `ctx.publish`, or the
/// hand-written relay's table), one transaction per 500.
async fn seed(
    pool: &PgPool,
    hand: bool,
    queue: &str,
    rows: usize,
    round: usize,
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    for i in 0..rows {
        let key = format!("key-{}", i % 100);
        let payload = serde_json::to_vec(&serde_json::json!({ "key": key, "n": i }))?;
        if hand {
            sqlx::query(
                "INSERT INTO hand_outbox (id, destination, partition_key, payload) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(format!("hand-{round}-{i}"))
            .bind(queue)
            .bind(&key)
            .bind(payload)
            .execute(&mut *tx)
            .await?;
        } else {
            let ctx = Context::new("bench::seed", format!("{round}-{i}").into_bytes(), None);
            ctx.outgoing(queue)
                .partition_key(key)
                .publish(&mut tx, &serde_json::json!({ "n": i }))
                .await?;
        }
        if i % 500 == 499 {
            tx.commit().await?;
            tx = pool.begin().await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The hand-written relay: batches of 100 under `FOR UPDATE SKIP LOCKED`, published with
/// confirms, marked in the same transaction; `mandatory`, and the partition key and the id as
/// `header`s, as idem's `OutboxPublisher` publishes. Returns messages published.
async fn hand_relay(
    pool: &PgPool,
    channel: &Channel,
    mandatory: bool,
    header: bool,
) -> anyhow::Result<usize> {
    let mut total = 0;
    loop {
        let mut tx = pool.begin().await?;
        let rows: Vec<(i64, String, String, String, Vec<u8>)> = sqlx::query_as(
            "SELECT seq, id, destination, partition_key, payload FROM hand_outbox WHERE NOT sent \
             ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED",
        )
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(total);
        }
        let mut confirms = Vec::with_capacity(rows.len());
        for (_, id, destination, key, payload) in &rows {
            let mut properties = BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            if header {
                let mut fields = FieldTable::default();
                fields.insert(
                    headers::PARTITION_KEY.into(),
                    AMQPValue::LongString(key.as_bytes().to_vec().into()),
                );
                fields.insert(
                    headers::MESSAGE_ID.into(),
                    AMQPValue::LongString(id.as_bytes().to_vec().into()),
                );
                properties = properties.with_headers(fields);
            }
            let options = BasicPublishOptions {
                mandatory,
                ..BasicPublishOptions::default()
            };
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        destination.as_str().into(),
                        options,
                        payload,
                        properties,
                    )
                    .await?,
            );
        }
        for confirm in confirms {
            ensure!(confirm.await?.is_ack(), "nack");
        }
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        sqlx::query("UPDATE hand_outbox SET sent = true WHERE seq = ANY($1)")
            .bind(&seqs)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        total += rows.len();
    }
}

fn main() -> anyhow::Result<()> {
    support::run(bench)
}

async fn bench() -> anyhow::Result<()> {
    let rounds = support::env_usize("BENCH_OUTBOX_ROUNDS", 6);
    let msgs = support::env_usize("BENCH_OUTBOX_MSGS", 1_600);
    let rows = support::env_usize("BENCH_OUTBOX_ROWS", 5_000);
    let tasks = tasks();
    let db = PostgresDb::open(u32::try_from(tasks).unwrap_or(64) + 4).await?;
    create_tables_postgres(&db.pool).await?;
    sqlx::query(
        "CREATE TABLE hand_outbox (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, \
         destination TEXT NOT NULL, partition_key TEXT NOT NULL, payload BYTEA NOT NULL, sent BOOLEAN NOT NULL DEFAULT false)",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("CREATE INDEX hand_outbox_pending ON hand_outbox (seq) WHERE NOT sent")
        .execute(&db.pool)
        .await?;

    // 1. Publish cost in a handler.
    println!("\n1. handler cost, {tasks} concurrent tasks, {msgs} messages per variant per round");
    let mut gen = Gen::new(7);
    let mut rates = vec![Vec::new(); HANDLERS.len()];
    let mut order = Rounds::from_env();
    for round in 0..rounds {
        for variant in order.next(round, HANDLERS.len()) {
            let rate = handlers_round(&db.pool, variant, gen.take(msgs)).await?;
            rates[variant].push(rate);
        }
        // Keep the outbox from growing between rounds: the relay's job, done here by hand.
        sqlx::query("DELETE FROM idem_outbox")
            .execute(&db.pool)
            .await?;
    }
    for (name, r) in HANDLERS.iter().zip(&rates) {
        println!(
            "  {name:<14} median {:>7.0} msg/s (rounds {})",
            median(r),
            spread(r)
        );
    }
    for (a, b) in [(1, 0), (2, 1)] {
        let per_round: Vec<f64> = rates[b].iter().zip(&rates[a]).map(|(x, y)| x / y).collect();
        let whole = rates[b].iter().sum::<f64>() / rates[a].iter().sum::<f64>();
        println!(
            "  time {} / {}: {:.3} (median of rounds {:.3}, rounds {})",
            HANDLERS[a],
            HANDLERS[b],
            whole,
            median(&per_round),
            spread(&per_round)
        );
    }

    // 2. Relay throughput.
    println!("\n2. relay throughput to RabbitMQ with confirms, {rows} rows per relay per round");
    let url = rabbit_url();
    let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let queues = [
        format!("{}-relay", db.schema),
        format!("{}-relay1", db.schema),
        format!("{}-hand", db.schema),
        format!("{}-hand-mandatory", db.schema),
        format!("{}-hand-props", db.schema),
    ];
    for queue in &queues {
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    let mut relay_rates = vec![Vec::new(); RELAYS.len()];
    for round in 0..rounds {
        for variant in order.next(round, RELAYS.len()) {
            let hand = variant >= HAND;
            // The round and the variant make the ids: each variant seeds rows of its own.
            seed(
                &db.pool,
                hand,
                &queues[variant],
                rows,
                round * RELAYS.len() + variant,
            )
            .await?;
            let started = Instant::now();
            let published = if hand {
                hand_relay(&db.pool, &channel, variant > HAND, variant > HAND + 1).await?
            } else {
                // Connected inside the clock, as the relay's first batch connected before.
                let publisher = OutboxPublisher::builder(url.as_str()).connect().await?;
                let mut relay = Relay::new(db.pool.clone(), publisher)
                    .batch(100)
                    .batches_per_turn(1_000)
                    .partitions_per_turn(if variant == 0 { 32 } else { 1 });
                let mut total = 0;
                loop {
                    let n = relay.step().await?;
                    if n == 0 {
                        break total;
                    }
                    total += n;
                }
            };
            let elapsed = started.elapsed().as_secs_f64();
            ensure!(
                published == rows,
                "{} published {published} of {rows}",
                RELAYS[variant]
            );
            relay_rates[variant].push(rows as f64 / elapsed);
            channel
                .queue_purge(
                    queues[variant].as_str().into(),
                    QueuePurgeOptions::default(),
                )
                .await?;
        }
    }
    for (name, r) in RELAYS.iter().zip(&relay_rates) {
        println!(
            "  {name:<14} median {:>7.0} msg/s (rounds {})",
            median(r),
            spread(r)
        );
    }
    for (a, b) in [
        (0, HAND),
        (1, HAND),
        (0, 1),
        (0, HAND + 2),
        (HAND + 1, HAND),
        (HAND + 2, HAND),
    ] {
        let per_round: Vec<f64> = relay_rates[a]
            .iter()
            .zip(&relay_rates[b])
            .map(|(x, y)| x / y)
            .collect();
        let whole = relay_rates[a].iter().sum::<f64>() / relay_rates[b].iter().sum::<f64>();
        println!(
            "  throughput {} / {}: {whole:.3} (median of rounds {:.3}, rounds {})",
            RELAYS[a],
            RELAYS[b],
            median(&per_round),
            spread(&per_round)
        );
    }
    for queue in &queues {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    let _ = connection.close(200, "OK".into()).await;
    db.close().await;
    Ok(())
}

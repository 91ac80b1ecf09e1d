//! Two services chained through RabbitMQ with the transactional outbox, end to end.
//!
//! ```text
//! rabbitmq-server -detached          # or any broker; IDEM_RABBITMQ_URL points elsewhere
//! cargo run --example pipeline --features sqlite,rabbitmq [-- <seed> <orders>]
//! ```
//!
//! Service A consumes orders (published with over a fifth copies and neighbours swapped) with an
//! `#[idempotent]` handler that records the order and publishes a payment through the outbox,
//! in the same transaction (`ctx.outgoing(..).publish(tx, ..)`). A's relay publishes the
//! payments after the commit, with publisher confirms and the derived id as AMQP `message_id`.
//! Then the demo makes the relay publish every tenth payment again, as a relay that crashed
//! after the broker's confirm and before marking the rows would. Service B consumes payments
//! with an `#[idempotent]` handler keyed on that `message_id`, so each payment is applied once.
//! The program checks B's accounts against an exactly-once oracle and the counts of both
//! services, deletes its queues, and exits 1 on a mismatch (2 when no broker answers).

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use harness::orders::{self, Check, Rng, Stream};
use harness::{rabbitmq, Run, Tally};
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::outbox::Relay;
use idem::rabbitmq::lapin::options::BasicPublishOptions;
use idem::rabbitmq::lapin::{BasicProperties, Channel};
use idem::rabbitmq::{OutboxPublisher, Source};
use idem::{idempotent, Context, Tx};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool};

/// What service A consumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: String,
    amount: i64,
}

/// What service A publishes through the outbox, and service B consumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    order_id: String,
    customer: String,
    amount: i64,
}

/// A payment as service B's handler sees it: with the AMQP `message_id` the outbox set.
#[derive(Debug, Deserialize)]
struct Incoming {
    message_id: String,
    payment: Payment,
}

/// Service A: records the order and publishes its payment, both in one transaction. The
/// payment's id derives from this scope and the order id, so a redelivery that runs again
/// publishes the same id; partitioned by customer, so a customer's payments stay in order.
#[idempotent(key = "order.order_id", scope = "pipeline::a::on_order")]
async fn on_order(
    tx: &mut Tx<'_, Sqlite>,
    order: &Order,
    ctx: &Context,
    payments: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO orders (id, customer, amount) VALUES (?1, ?2, ?3)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(order.amount)
        .execute(&mut **tx)
        .await?;
    let payment = Payment {
        order_id: order.order_id.clone(),
        customer: order.customer.clone(),
        amount: order.amount,
    };
    ctx.outgoing(payments)
        .partition_key(order.customer.clone())
        .label("payment")
        .publish(tx, &payment)
        .await?;
    Ok(())
}

/// Service B: credits the customer once per payment, deduplicated on the outbox's message id.
#[idempotent(key = "msg.message_id", scope = "pipeline::b::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Incoming) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO accounts (customer, payments, paid) VALUES (?1, 1, ?2) \
         ON CONFLICT (customer) DO UPDATE SET payments = payments + 1, paid = paid + excluded.paid",
    )
    .bind(&msg.payment.customer)
    .bind(msg.payment.amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The orders, and what the producer publishes: copies and swapped neighbours.
fn generate(seed: u64, n: usize) -> Stream<Order> {
    let mut rng = Rng::new(seed);
    let orders: Vec<Order> = (0..n)
        .map(|i| Order {
            order_id: format!("order-{i}"),
            customer: orders::CUSTOMERS[rng.below(orders::CUSTOMERS.len())].to_string(),
            amount: 5 + rng.below(95) as i64,
        })
        .collect();
    Stream::deliver(orders, &mut rng)
}

/// A payment delivery for service B, showing its handler the AMQP `message_id` beside the
/// payload (idem's consume loop decodes the payload alone).
struct WithMessageId {
    inner: idem::rabbitmq::Delivery,
    payload: Vec<u8>,
}

impl WithMessageId {
    fn new(inner: idem::rabbitmq::Delivery) -> Self {
        let properties = &inner.message().properties;
        let id = properties.message_id().as_ref().map(|id| id.to_string());
        let payment: serde_json::Value =
            serde_json::from_slice(&inner.message().data).unwrap_or(serde_json::Value::Null);
        let incoming =
            serde_json::json!({ "message_id": id.unwrap_or_default(), "payment": payment });
        let payload = serde_json::to_vec(&incoming).unwrap_or_default();
        WithMessageId { inner, payload }
    }
}

impl Delivery for WithMessageId {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn headers(&self) -> Vec<(String, String)> {
        self.inner.headers()
    }
    fn origin(&self) -> idem::recover::Origin {
        self.inner.origin()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.inner.settle(settle).await
    }
}

/// A SQLite database of one service, with idem's tables and `schema`.
async fn database(run: &Run, file: &str, schema: &str) -> Result<SqlitePool, sqlx::Error> {
    let pool = orders::open(&run.path(file)).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema.to_string()))
        .execute(&pool)
        .await?;
    Ok(pool)
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (seed, orders) = harness::args(300)?;
    let url = rabbitmq::url();
    let (admin, channel) = match rabbitmq::connect(&url).await? {
        Ok(connected) => connected,
        Err(exit) => return Ok(exit),
    };
    let run = Run::new("pipeline")?;
    let queues = [
        format!("idem-pipeline-orders-{}", run.id),
        format!("idem-pipeline-payments-{}", run.id),
    ];
    for queue in &queues {
        rabbitmq::declare(&channel, queue).await?;
    }
    let result = demo(&url, &channel, &queues, &run, seed, orders as usize).await;
    for queue in &queues {
        rabbitmq::delete(&channel, queue).await?;
    }
    let _ = admin.close(200, "OK".into()).await;
    result
}

/// The run itself.
async fn demo(
    url: &str,
    channel: &Channel,
    [orders_queue, payments_queue]: &[String; 2],
    run: &Run,
    seed: u64,
    n: usize,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let a = database(
        run,
        "a.db",
        "CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount INTEGER NOT NULL)",
    )
    .await?;
    let b = database(
        run,
        "b.db",
        "CREATE TABLE accounts (customer TEXT PRIMARY KEY, payments INTEGER NOT NULL, paid INTEGER NOT NULL)",
    )
    .await?;
    let stream = generate(seed, n);
    println!("orders to A: {}", stream.summary());
    for order in &stream.deliveries {
        let properties = BasicProperties::default().with_delivery_mode(2);
        let (options, body) = (BasicPublishOptions::default(), serde_json::to_vec(order)?);
        channel
            .basic_publish(
                "".into(),
                orders_queue.as_str().into(),
                options,
                &body,
                properties,
            )
            .await?;
    }
    channel.wait_for_confirms().await?;

    // Service A, its relay, and service B run side by side.
    let (a_settled, b_settled) = (Tally::default(), Tally::default());
    let a_target = stream.deliveries.len() as u64;
    let b_target = Arc::new(AtomicU64::new(u64::MAX)); // known once the replays are injected
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    // The consume loop runs on the task that awaits it: the three run side by side here.
    let publisher = OutboxPublisher::builder(url).connect().await?;
    let relay = Relay::new(a.clone(), publisher).batch(50).run(async {
        let _ = relay_stopped.await;
    });
    let orders_in = Source::builder(url, orders_queue.as_str())
        .prefetch(100)
        .connect()
        .await?;
    let payments_in = Source::builder(url, payments_queue.as_str())
        .prefetch(100)
        .connect()
        .await?;
    let service_a = async {
        let tally = a_settled.clone();
        let deliveries = orders_in
            .deliveries()
            .map(move |d| d.map(|d| tally.wrap(d)));
        let payments = payments_queue.as_str();
        let counts = Consumer::new(a.clone())
            .batch(25)
            .concurrency(2)
            .run(
                deliveries,
                json::<Order>,
                async |batch, order| on_order(batch, order, payments).await,
                harness::until("A to settle every order", async || {
                    a_settled.get() >= a_target
                }),
            )
            .await;
        // Every payment sent once; then every tenth goes again, as after a relay that crashed
        // between the broker's confirm and marking its rows: same rows, same ids.
        let unsent = "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL";
        while sqlx::query_scalar::<_, i64>(unsent).fetch_one(&a).await? > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let replayed = sqlx::query("UPDATE idem_outbox SET sent_at = NULL WHERE seq % 10 = 0")
            .execute(&a)
            .await?
            .rows_affected();
        b_target.store(n as u64 + replayed, Ordering::SeqCst);
        Ok::<_, sqlx::Error>((counts, replayed))
    };
    let service_b = async {
        let tally = b_settled.clone();
        let deliveries = payments_in
            .deliveries()
            .map(move |d| d.map(|d| tally.wrap(WithMessageId::new(d))));
        let counts = Consumer::new(b.clone())
            .batch(25)
            .concurrency(2)
            .run(
                deliveries,
                json::<Incoming>,
                async |batch, msg| on_payment(batch, msg).await,
                harness::until("B to settle every payment", async || {
                    b_settled.get() >= b_target.load(Ordering::SeqCst)
                }),
            )
            .await;
        let _ = stop_relay.send(());
        counts
    };
    let (relay_stats, a_result, b_counts) = tokio::join!(relay, service_a, service_b);
    let (a_counts, replayed) = a_result?;
    orders_in.close().await?;
    payments_in.close().await?;
    println!(
        "A: applied {}, duplicate {}; relay: published {} ({} again); B: applied {}, duplicate {}",
        a_counts.applied,
        a_counts.duplicate,
        relay_stats.published,
        replayed,
        b_counts.applied,
        b_counts.duplicate
    );

    // The oracle: each order's payment credited exactly once.
    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for order in &stream.events {
        let account = expected.entry(order.customer.clone()).or_default();
        account.0 += 1;
        account.1 += order.amount;
    }
    let actual: BTreeMap<String, (i64, i64)> =
        sqlx::query_as::<_, (String, i64, i64)>("SELECT customer, payments, paid FROM accounts")
            .fetch_all(&b)
            .await?
            .into_iter()
            .map(|(c, n, p)| (c, (n, p)))
            .collect();
    let mut check = Check::default();
    check.that(actual == expected, || {
        format!("B's accounts: want {expected:?}, got {actual:?}")
    });
    let (unique, published) = (n as u64, stream.deliveries.len() as u64);
    check.that(
        (a_counts.applied, a_counts.duplicate) == (unique, published - unique),
        || format!("A's counts {a_counts:?}"),
    );
    check.that(
        (b_counts.applied, b_counts.duplicate) == (unique, replayed),
        || format!("B's counts {b_counts:?}"),
    );
    check.that(relay_stats.published == unique + replayed, || {
        format!("the relay published {relay_stats:?}")
    });
    a.close().await;
    b.close().await;
    Ok(check.finish(&format!(
        "{unique} payments applied once each at B ({replayed} republished with the same ids were \
         duplicates); {} customers' accounts equal the oracle",
        expected.len()
    )))
}

//! Two services chained through RabbitMQ with the transactional outbox, end to end.
//!
//! ```text
//! rabbitmq-server -detached          # or any broker; IDEM_RABBITMQ_URL points elsewhere
//! cargo run --example pipeline --features sqlite,rabbitmq [-- <seed> <orders>]
//! ```
//!
//! Service A consumes orders (published with about 30% copies and neighbours swapped) with an
//! `#[idempotent]` handler that records the order and publishes a payment through the outbox,
//! in the same transaction (`ctx.outgoing(..).publish(tx, ..)`). A's relay publishes the
//! payments after the commit, with publisher confirms and the derived id as AMQP `message_id`.
//! Then the demo makes the relay publish every tenth payment again, as a relay that crashed
//! after the broker's confirm and before marking the rows would. Service B consumes payments
//! with an `#[idempotent]` handler keyed on that `message_id`, so each payment is applied once.
//! The program checks B's accounts against an exactly-once oracle and the counts of both
//! services, deletes its queues, and exits 1 on a mismatch (2 when no broker answers).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::outbox::Relay;
use idem::rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem::rabbitmq::lapin::types::FieldTable;
use idem::rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use idem::rabbitmq::{OutboxPublisher, Source};
use idem::{idempotent, Context, Tx};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
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

/// A small deterministic generator (xorshift64*), so a seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

const CUSTOMERS: [&str; 6] = ["ada", "brian", "chen", "dagny", "emeka", "farah"];

/// The orders, and what the producer publishes: about 30% copies, neighbours swapped.
fn generate(seed: u64, n: usize) -> (Vec<Order>, Vec<Order>) {
    let mut rng = Rng(seed.max(1));
    let orders: Vec<Order> = (0..n)
        .map(|i| Order {
            order_id: format!("order-{i}"),
            customer: CUSTOMERS[rng.below(CUSTOMERS.len() as u64) as usize].to_string(),
            amount: 5 + rng.below(95) as i64,
        })
        .collect();
    let mut published = Vec::new();
    for order in &orders {
        published.push(order.clone());
        if rng.below(100) < 43 {
            let at = published.len() - rng.below(published.len().min(8) as u64) as usize;
            published.insert(at, order.clone());
        }
    }
    for i in 1..published.len() {
        if rng.below(100) < 15 {
            published.swap(i - 1, i);
        }
    }
    (orders, published)
}

/// A delivery that counts its settlement, and for service B shows its handler the AMQP
/// `message_id` beside the payload (idem's consume loop decodes the payload alone).
struct Tracked {
    inner: idem::rabbitmq::Delivery,
    payload: Option<Vec<u8>>,
    settled: Arc<AtomicU64>,
}

impl Tracked {
    fn with_message_id(inner: idem::rabbitmq::Delivery, settled: Arc<AtomicU64>) -> Self {
        let id = inner
            .message()
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let payment: serde_json::Value =
            serde_json::from_slice(&inner.message().data).unwrap_or(serde_json::Value::Null);
        let payload =
            serde_json::to_vec(&serde_json::json!({ "message_id": id, "payment": payment }))
                .unwrap_or_default();
        Tracked {
            inner,
            payload: Some(payload),
            settled,
        }
    }
}

impl Delivery for Tracked {
    fn payload(&self) -> &[u8] {
        self.payload
            .as_deref()
            .unwrap_or_else(|| self.inner.payload())
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let for_good = matches!(settle, Settle::Ack | Settle::DeadLetter { .. });
        let result = self.inner.settle(settle).await;
        if result.is_ok() && for_good {
            self.settled.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

/// Completes once `counter` reaches `target` (read each time, so it may be set later), or
/// after two minutes, so that a bug ends the demo instead of hanging it.
async fn reached(counter: Arc<AtomicU64>, target: Arc<AtomicU64>) {
    let started = Instant::now();
    while counter.load(Ordering::SeqCst) < target.load(Ordering::SeqCst) {
        if started.elapsed() > Duration::from_secs(120) {
            eprintln!("gave up waiting after 120 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn database(path: &std::path::Path, schema: &str) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    idem::migrate(&pool).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema.to_string()))
        .execute(&pool)
        .await?;
    Ok(pool)
}

struct Names {
    orders: String,
    payments: String,
    dlx: String,
}

impl Names {
    fn queues(&self) -> Vec<String> {
        vec![
            self.orders.clone(),
            self.payments.clone(),
            format!("{}.dead", self.orders),
            format!("{}.dead", self.payments),
        ]
    }
}

async fn declare(channel: &Channel, names: &Names) -> Result<(), idem::rabbitmq::lapin::Error> {
    for queue in names.queues() {
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await?;
    }
    channel
        .exchange_declare(
            names.dlx.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    for queue in [&names.orders, &names.payments] {
        channel
            .queue_bind(
                format!("{queue}.dead").as_str().into(),
                names.dlx.as_str().into(),
                queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(())
}

async fn delete(channel: &Channel, names: &Names) -> Result<(), idem::rabbitmq::lapin::Error> {
    for queue in names.queues() {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(names.dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let orders: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300);
    let url = std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());
    let admin = match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(admin) => admin,
        Err(err) => {
            let shown = match (url.find("://"), url.rfind('@')) {
                (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
                _ => url.clone(),
            };
            eprintln!("No RabbitMQ answered at {shown}: {err}");
            eprintln!(
                "Start one first: `rabbitmq-server -detached`, or `docker run -d -p 5672:5672 \
                 rabbitmq:3`; or point IDEM_RABBITMQ_URL at another broker."
            );
            std::process::exit(2);
        }
    };
    let channel = admin.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let run = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos()
    );
    let names = Names {
        orders: format!("idem-pipeline-orders-{run}"),
        payments: format!("idem-pipeline-payments-{run}"),
        dlx: format!("idem-pipeline-{run}.dlx"),
    };
    declare(&channel, &names).await?;
    let dir = std::env::temp_dir().join(format!("idem-pipeline-{run}"));
    std::fs::create_dir_all(&dir)?;
    let result = demo(&url, &channel, &names, &dir, seed, orders).await;
    delete(&channel, &names).await?;
    let _ = admin.close(200, "OK".into()).await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(1),
        Err(err) => Err(err),
    }
}

/// The run itself; `Ok(false)` on a mismatch.
async fn demo(
    url: &str,
    channel: &Channel,
    names: &Names,
    dir: &std::path::Path,
    seed: u64,
    n: usize,
) -> Result<bool, Box<dyn std::error::Error>> {
    let a = database(
        &dir.join("a.db"),
        "CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount INTEGER NOT NULL)",
    )
    .await?;
    let b = database(
        &dir.join("b.db"),
        "CREATE TABLE accounts (customer TEXT PRIMARY KEY, payments INTEGER NOT NULL, paid INTEGER NOT NULL)",
    )
    .await?;
    let (orders, published) = generate(seed, n);
    println!(
        "{} orders, {} published to A ({} copies, neighbours swapped)",
        orders.len(),
        published.len(),
        published.len() - orders.len()
    );
    for order in &published {
        channel
            .basic_publish(
                "".into(),
                names.orders.as_str().into(),
                BasicPublishOptions::default(),
                &serde_json::to_vec(order)?,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
    }
    channel.wait_for_confirms().await?;

    // Service A, its relay, and service B run side by side.
    let a_settled = Arc::new(AtomicU64::new(0));
    let a_target = Arc::new(AtomicU64::new(published.len() as u64));
    let b_settled = Arc::new(AtomicU64::new(0));
    let b_target = Arc::new(AtomicU64::new(u64::MAX)); // known once the replays are injected
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    // The consume loop runs on the task that awaits it: the three run side by side here.
    let publisher = OutboxPublisher::builder(url).connect().await?;
    let relay = Relay::new(a.clone(), publisher).batch(50).run(async {
        let _ = relay_stopped.await;
    });
    let orders_in = Source::builder(url, names.orders.as_str())
        .prefetch(100)
        .dead_letters(names.dlx.as_str())
        .connect()
        .await?;
    let payments_in = Source::builder(url, names.payments.as_str())
        .prefetch(100)
        .dead_letters(names.dlx.as_str())
        .connect()
        .await?;
    let service_a = async {
        let settled = a_settled.clone();
        let deliveries = orders_in.deliveries().map(move |d| {
            d.map(|inner| Tracked {
                inner,
                payload: None,
                settled: settled.clone(),
            })
        });
        let payments = names.payments.as_str();
        let counts = Consumer::new(a.clone())
            .batch(25)
            .concurrency(2)
            .run(
                deliveries,
                json::<Order>,
                async |batch, order| on_order(batch, order, payments).await,
                reached(a_settled.clone(), a_target.clone()),
            )
            .await;
        // Every payment sent once; then every tenth goes again, as after a relay that crashed
        // between the broker's confirm and marking its rows: same rows, same ids.
        while sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
            .fetch_one(&a)
            .await?
            > 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let replayed = sqlx::query("UPDATE idem_outbox SET sent_at = NULL WHERE seq % 10 = 0")
            .execute(&a)
            .await?
            .rows_affected();
        b_target.store(orders.len() as u64 + replayed, Ordering::SeqCst);
        Ok::<_, sqlx::Error>((counts, replayed))
    };
    let service_b = async {
        let settled = b_settled.clone();
        let deliveries = payments_in
            .deliveries()
            .map(move |d| d.map(|inner| Tracked::with_message_id(inner, settled.clone())));
        let counts = Consumer::new(b.clone())
            .batch(25)
            .concurrency(2)
            .run(
                deliveries,
                json::<Incoming>,
                async |batch, msg| on_payment(batch, msg).await,
                reached(b_settled.clone(), b_target.clone()),
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
    for order in &orders {
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
    let mut ok = true;
    if actual != expected {
        eprintln!("MISMATCH: B's accounts differ from the exactly-once oracle");
        eprintln!("  want {expected:?}\n  got  {actual:?}");
        ok = false;
    }
    let unique = orders.len() as u64;
    if (a_counts.applied, a_counts.duplicate) != (unique, published.len() as u64 - unique) {
        eprintln!("MISMATCH: A's counts {a_counts:?}");
        ok = false;
    }
    if (b_counts.applied, b_counts.duplicate) != (unique, replayed) {
        eprintln!("MISMATCH: B's counts {b_counts:?}");
        ok = false;
    }
    if relay_stats.published != unique + replayed {
        eprintln!("MISMATCH: the relay published {relay_stats:?}");
        ok = false;
    }
    if ok {
        println!(
            "OK: {} payments applied once each at B ({} republished with the same ids were \
             duplicates); {} customers' accounts equal the oracle",
            unique,
            replayed,
            expected.len()
        );
    }
    a.close().await;
    b.close().await;
    Ok(ok)
}

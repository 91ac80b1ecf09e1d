//! An order-events consumer on RabbitMQ and SQLite, end to end.
//!
//! ```text
//! rabbitmq-server -detached          # or any broker; IDEM_RABBITMQ_URL points elsewhere
//! cargo run --example rabbitmq --features sqlite,rabbitmq [-- <seed> <orders>]
//! ```
//!
//! A producer publishes order events to a queue of this run: orders placed (key only: counted
//! into the customer's total once) and status changes (key + version + entity: an order only
//! moves forward), with about 30% published twice and neighbours swapped, so duplicates and
//! stale versions arrive. idem's consumer takes them in batches of 50, four transactions at a
//! time, and acks each delivery only after its transaction committed. The program prints the
//! counts, checks the database against an exactly-once oracle and the queue for leftovers,
//! deletes its queues and exchange, and exits 1 on any mismatch (2 when no broker answers).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem::rabbitmq::lapin::types::FieldTable;
use idem::rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use idem::rabbitmq::Source;
use idem::{idempotent, Batch, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};
use tokio::sync::Notify;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type")]
enum OrderEvent {
    Placed {
        event_id: String,
        customer: String,
        amount: i64,
    },
    StatusChanged {
        event_id: String,
        order_id: i64,
        version: i64,
        status: String,
    },
}

impl OrderEvent {
    fn event_id(&self) -> &str {
        match self {
            OrderEvent::Placed { event_id, .. } | OrderEvent::StatusChanged { event_id, .. } => {
                event_id
            }
        }
    }
}

#[idempotent(key = "event_id", scope = "rabbitmq_demo::on_placed")]
async fn on_placed(
    tx: &mut Tx<'_, Sqlite>,
    event_id: &str,
    customer: &str,
    amount: i64,
) -> Result<(), sqlx::Error> {
    let _ = event_id;
    sqlx::query(
        "INSERT INTO customers (name, orders, total) VALUES (?1, 1, ?2) \
         ON CONFLICT (name) DO UPDATE SET orders = orders + 1, total = total + excluded.total",
    )
    .bind(customer)
    .bind(amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[idempotent(
    key = "event_id",
    version = "version",
    entity = "order_id",
    scope = "rabbitmq_demo::on_status"
)]
async fn on_status(
    tx: &mut Tx<'_, Sqlite>,
    event_id: &str,
    order_id: i64,
    version: i64,
    status: &str,
) -> Result<(), sqlx::Error> {
    let _ = event_id;
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(order_id)
    .bind(status)
    .bind(version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The consumer's handler: one `#[idempotent]` handler per event type.
async fn handle(
    b: &mut Batch<Sqlite>,
    event: &OrderEvent,
) -> Result<Outcome<()>, idem::Error<sqlx::Error>> {
    match event {
        OrderEvent::Placed {
            event_id,
            customer,
            amount,
        } => on_placed(b, event_id, customer, *amount).await,
        OrderEvent::StatusChanged {
            event_id,
            order_id,
            version,
            status,
        } => on_status(b, event_id, *order_id, *version, status).await,
    }
}

const STATUSES: [&str; 4] = ["placed", "paid", "packed", "shipped"];
const CUSTOMERS: [&str; 5] = ["ada", "brian", "chen", "dagny", "emeka"];

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

/// The events, and what the producer publishes: some twice, neighbours swapped.
fn generate(seed: u64, orders: i64) -> (Vec<OrderEvent>, Vec<OrderEvent>) {
    let mut rng = Rng(seed.max(1));
    let mut events = Vec::new();
    for order_id in 1..=orders {
        events.push(OrderEvent::Placed {
            event_id: format!("placed-{order_id}"),
            customer: CUSTOMERS[rng.below(5) as usize].to_string(),
            amount: 10 + rng.below(90) as i64,
        });
        for (version, status) in STATUSES.iter().take(1 + rng.below(4) as usize).enumerate() {
            events.push(OrderEvent::StatusChanged {
                event_id: format!("status-{order_id}-{version}"),
                order_id,
                version: version as i64 + 1,
                status: status.to_string(),
            });
        }
    }
    let mut published = Vec::new();
    for event in &events {
        published.push(event.clone());
        if rng.below(100) < 43 {
            // Published again a little later: about 30% of what is published is a copy.
            let at = published.len() - rng.below(published.len().min(8) as u64) as usize;
            published.insert(at, event.clone());
        }
    }
    for i in 1..published.len() {
        if rng.below(100) < 15 {
            published.swap(i - 1, i);
        }
    }
    (events, published)
}

/// What applying each event exactly once ends in: customers' (orders, total), orders' latest
/// (status, version).
type State = (BTreeMap<String, (i64, i64)>, BTreeMap<i64, (String, i64)>);

fn oracle(events: &[OrderEvent]) -> State {
    let mut state = State::default();
    for event in events {
        match event {
            OrderEvent::Placed {
                customer, amount, ..
            } => {
                let c = state.0.entry(customer.clone()).or_default();
                c.0 += 1;
                c.1 += amount;
            }
            OrderEvent::StatusChanged {
                order_id,
                version,
                status,
                ..
            } => {
                let o = state.1.entry(*order_id).or_insert((String::new(), 0));
                if *version > o.1 {
                    *o = (status.clone(), *version);
                }
            }
        }
    }
    state
}

async fn database_state(pool: &SqlitePool) -> Result<State, sqlx::Error> {
    let customers: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT name, orders, total FROM customers")
            .fetch_all(pool)
            .await?;
    let orders: Vec<(i64, String, i64)> = sqlx::query_as("SELECT id, status, version FROM orders")
        .fetch_all(pool)
        .await?;
    Ok((
        customers.into_iter().map(|(n, o, t)| (n, (o, t))).collect(),
        orders.into_iter().map(|(i, s, v)| (i, (s, v))).collect(),
    ))
}

/// How the demo knows it is done: a delivery wrapper that counts what was acked or
/// dead-lettered. (A service runs until its shutdown signal instead, e.g. `ctrl_c()`.)
struct Settled<D> {
    inner: D,
    done: Arc<(AtomicU64, Notify)>,
}

impl<D: Delivery> Delivery for Settled<D> {
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
        let for_good = matches!(settle, Settle::Ack | Settle::DeadLetter { .. });
        let result = self.inner.settle(settle).await;
        if result.is_ok() && for_good {
            self.done.0.fetch_add(1, Ordering::SeqCst);
            self.done.1.notify_waiters();
        }
        result
    }
    /// A wrapper forwards the batch ack, so the adapter's one `multiple` ack is kept.
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(done) = deliveries.first().map(|d| d.done.clone()) else {
            return Vec::new();
        };
        let results = D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await;
        let acked = results.iter().filter(|r| r.is_ok()).count() as u64;
        done.0.fetch_add(acked, Ordering::SeqCst);
        done.1.notify_waiters();
        results
    }
}

struct Names {
    queue: String,
    dlx: String,
    dlq: String,
}

async fn declare(channel: &Channel, names: &Names) -> Result<(), idem::rabbitmq::lapin::Error> {
    for queue in [&names.queue, &names.dlq] {
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
    channel
        .queue_bind(
            names.dlq.as_str().into(),
            names.dlx.as_str().into(),
            names.queue.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

async fn delete(channel: &Channel, names: &Names) -> Result<(), idem::rabbitmq::lapin::Error> {
    for queue in [&names.queue, &names.dlq] {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(names.dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await
}

async fn ready(channel: &Channel, queue: &str) -> Result<u32, idem::rabbitmq::lapin::Error> {
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await?;
    Ok(q.message_count())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let orders: i64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(500);
    let url = std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());

    let admin = match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(admin) => admin,
        Err(err) => {
            // The URL without its password.
            let shown = match (url.find("://"), url.rfind('@')) {
                (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
                _ => url.clone(),
            };
            eprintln!("No RabbitMQ answered at {shown}: {err}");
            eprintln!(
                "Start one first: `rabbitmq-server -detached` (Debian/Ubuntu: `apt-get install \
                 rabbitmq-server`), or `docker run -d -p 5672:5672 rabbitmq:3`; or point \
                 IDEM_RABBITMQ_URL at another broker."
            );
            std::process::exit(2);
        }
    };
    let channel = admin.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let queue = format!("idem-demo-orders-{}-{run}", std::process::id());
    let names = Names {
        // The source's default dead-letter exchange, `<queue>.dead`.
        dlx: format!("{queue}.dead"),
        dlq: format!("{queue}.dead-letters"),
        queue,
    };
    declare(&channel, &names).await?;

    let dir = std::env::temp_dir().join(format!("idem-rabbitmq-demo-{}-{run}", std::process::id()));
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
    orders: i64,
) -> Result<bool, Box<dyn std::error::Error>> {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("orders.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    idem::migrate(&pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE customers (name TEXT PRIMARY KEY, orders INTEGER NOT NULL, total INTEGER NOT NULL);
         CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);",
    )
    .execute(&pool)
    .await?;

    let (events, published) = generate(seed, orders);
    let total = published.len() as u64;
    println!(
        "queue {}: {} events, {} published ({} copies), neighbours swapped; batch 50 × 4 in flight",
        names.queue,
        events.len(),
        total,
        published.len() - events.len()
    );

    // The producer publishes while the consumer runs, with publisher confirms.
    let producer = {
        let channel = channel.clone();
        let queue = names.queue.clone();
        tokio::spawn(async move {
            for event in published {
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &serde_json::to_vec(&event).expect("an event encodes"),
                        BasicProperties::default()
                            .with_message_id(event.event_id().into())
                            .with_content_type("application/json".into())
                            .with_delivery_mode(2),
                    )
                    .await?;
            }
            channel.wait_for_confirms().await.map(|_| ())
        })
    };

    // The consumer: prefetch = batch × concurrency; dead letters to `<queue>.dead`.
    let started = Instant::now();
    let source = Source::builder(url, names.queue.as_str())
        .prefetch(200)
        .connect()
        .await?;
    let done = Arc::new((AtomicU64::new(0), Notify::new()));
    let deliveries = {
        let done = done.clone();
        source.deliveries().map(move |d| {
            d.map(|inner| Settled {
                inner,
                done: done.clone(),
            })
        })
    };
    let all_settled = {
        let done = done.clone();
        async move {
            loop {
                let changed = done.1.notified();
                if done.0.load(Ordering::SeqCst) >= total {
                    return;
                }
                // Bounded, so that a bug ends the demo instead of hanging it.
                if started.elapsed() > Duration::from_secs(120) {
                    eprintln!("gave up waiting after 120 s");
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
            }
        }
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(4)
        .max_deliveries(5)
        .run(
            deliveries,
            json::<OrderEvent>,
            async |b, e| handle(b, e).await,
            all_settled,
        )
        .await;
    source.close().await?; // basic.cancel, then the channels and the connection (200 OK)
    producer.await??;
    let elapsed = started.elapsed();

    println!(
        "applied {}, duplicate {}, stale {}, failed {}, dead-lettered {}, settle failures {} in {:.2?}",
        counts.applied,
        counts.duplicate,
        counts.stale,
        counts.failed,
        counts.dead_lettered,
        counts.settle_failures,
        elapsed
    );

    let expected = oracle(&events);
    let actual = database_state(&pool).await?;
    pool.close().await;
    // The consumer's connection is closed; give the broker a moment to show its queues.
    let mut left = (
        ready(channel, &names.queue).await?,
        ready(channel, &names.dlq).await?,
    );
    for _ in 0..20 {
        if left == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = (
            ready(channel, &names.queue).await?,
            ready(channel, &names.dlq).await?,
        );
    }
    let mut ok = true;
    if actual != expected {
        eprintln!("MISMATCH: the database differs from the exactly-once oracle");
        for (name, want) in &expected.0 {
            if actual.0.get(name) != Some(want) {
                eprintln!(
                    "  customer {name}: want {want:?}, got {:?}",
                    actual.0.get(name)
                );
            }
        }
        for (id, want) in &expected.1 {
            if actual.1.get(id) != Some(want) {
                eprintln!("  order {id}: want {want:?}, got {:?}", actual.1.get(id));
            }
        }
        ok = false;
    }
    if counts.applied + counts.duplicate + counts.stale != total || counts.dead_lettered != 0 {
        eprintln!("MISMATCH: {total} published, but the counts are {counts:?}");
        ok = false;
    }
    if left != (0, 0) {
        eprintln!("MISMATCH: left in the queue and the dead-letter queue: {left:?}");
        ok = false;
    }
    if ok {
        println!(
            "OK: {} customers and {} orders equal the exactly-once oracle; the queue is empty",
            expected.0.len(),
            expected.1.len()
        );
    }
    Ok(ok)
}

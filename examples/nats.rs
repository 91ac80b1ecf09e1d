//! An order-events consumer on NATS JetStream and SQLite.
//!
//! ```text
//! nats-server -js &                      # the local server, JetStream on (127.0.0.1:4222)
//! cargo run --example nats --features sqlite,nats
//! ```
//!
//! A producer publishes order events to a stream of its own: each with `Nats-Msg-Id`, some
//! twice (a retry JetStream drops within its duplicate window), some again under a new id (a
//! retry after the window, which JetStream stores), and status versions out of order. A
//! consumer reads them through `idem::nats` into two `#[idempotent]` handlers, in batches, and
//! acks each only after its transaction committed. The program prints what happened, checks
//! the database against an exactly-once oracle, deletes its streams, and exits non-zero on a
//! mismatch. `IDEM_NATS_URL` names another server.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::consume::{json, Consumer};
use idem::nats::async_nats::{self, jetstream};
use idem::nats::Source;
use idem::{idempotent, Batch, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Event {
    /// A new order: counted into its customer's total exactly once (key only).
    Placed {
        event_id: String,
        customer: String,
        amount: i64,
    },
    /// A status change, versioned per order (key + version + entity).
    Status {
        event_id: String,
        order_id: i64,
        version: i64,
        status: String,
    },
}

impl Event {
    fn id(&self) -> &str {
        match self {
            Event::Placed { event_id, .. } | Event::Status { event_id, .. } => event_id,
        }
    }
}

#[idempotent(key = "event_id", scope = "nats_example::on_placed")]
async fn on_placed(
    tx: &mut Tx<'_, Sqlite>,
    event_id: &str,
    customer: &str,
    amount: i64,
) -> Result<(), sqlx::Error> {
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
    scope = "nats_example::on_status"
)]
async fn on_status(
    tx: &mut Tx<'_, Sqlite>,
    event_id: &str,
    order_id: i64,
    version: i64,
    status: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO orders (id, status) VALUES (?1, ?2) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status",
    )
    .bind(order_id)
    .bind(status)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// One delivery, to the handler its event type needs.
async fn handle(
    batch: &mut Batch<Sqlite>,
    event: &Event,
) -> Result<Outcome<()>, idem::Error<sqlx::Error>> {
    match event {
        Event::Placed {
            event_id,
            customer,
            amount,
        } => on_placed(batch, event_id.as_str(), customer.as_str(), *amount).await,
        Event::Status {
            event_id,
            order_id,
            version,
            status,
        } => {
            on_status(
                batch,
                event_id.as_str(),
                *order_id,
                *version,
                status.as_str(),
            )
            .await
        }
    }
}

const STATUSES: [&str; 4] = ["created", "paid", "shipped", "delivered"];

/// The events of `orders` orders: a placement, then four status versions each.
fn events(orders: i64) -> Vec<Event> {
    let mut events = Vec::new();
    for order in 1..=orders {
        events.push(Event::Placed {
            event_id: format!("placed-{order}"),
            customer: format!("customer-{}", order % 7),
            amount: 10 * order,
        });
        for (v, status) in STATUSES.iter().enumerate() {
            events.push(Event::Status {
                event_id: format!("status-{order}-{}", v + 1),
                order_id: order,
                version: v as i64 + 1,
                status: status.to_string(),
            });
        }
    }
    events
}

/// Customers as `(name, orders, total)`.
type Customers = Vec<(String, i64, i64)>;
/// Orders as `(id, status)`.
type Orders = Vec<(i64, String)>;

/// The state the events leave when each is applied exactly once, in version order.
fn oracle(events: &[Event]) -> (Customers, Orders) {
    let mut customers: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut orders: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    for event in events {
        match event {
            Event::Placed {
                customer, amount, ..
            } => {
                let entry = customers.entry(customer.clone()).or_default();
                entry.0 += 1;
                entry.1 += amount;
            }
            Event::Status {
                order_id,
                version,
                status,
                ..
            } => {
                let entry = orders.entry(*order_id).or_insert((0, String::new()));
                if *version > entry.0 {
                    *entry = (*version, status.clone());
                }
            }
        }
    }
    (
        customers.into_iter().map(|(n, (o, t))| (n, o, t)).collect(),
        orders.into_iter().map(|(id, (_, s))| (id, s)).collect(),
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(&url);
    let client = match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(err)) => return no_server(&url, &err.to_string()),
        Err(_) => return no_server(&url, "no answer within 3 s"),
    };
    let js = jetstream::new(client);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let stream = format!("IDEM_EXAMPLE_{}_{nanos}", std::process::id());
    let subjects = format!("idem-example-{}-{nanos}", std::process::id());
    let result = run(&url, &js, &stream, &subjects).await;
    // The example's streams go, whatever happened.
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(format!("{stream}_DLQ")).await;
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn no_server(url: &str, why: &str) -> ExitCode {
    eprintln!(
        "error: no NATS server answers at {url} ({why}).\n\
         Start one with JetStream on, e.g. `nats-server -js`, or set IDEM_NATS_URL."
    );
    ExitCode::from(2)
}

async fn run(
    url: &str,
    js: &jetstream::Context,
    stream: &str,
    subjects: &str,
) -> Result<bool, Box<dyn std::error::Error>> {
    // The stream, a durable pull consumer, and a stream that keeps dead letters (on the
    // default dead-letter subject, which lies outside the orders stream).
    js.create_stream(jetstream::stream::Config {
        name: stream.to_string(),
        subjects: vec![format!("{subjects}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    js.create_stream(jetstream::stream::Config {
        name: format!("{stream}_DLQ"),
        subjects: vec![Source::default_dead_letter_subject(stream, "billing")],
        ..Default::default()
    })
    .await?;
    js.create_consumer_on_stream(
        jetstream::consumer::pull::Config {
            durable_name: Some("billing".into()),
            ack_wait: Duration::from_secs(10),
            max_deliver: 10,
            ..Default::default()
        },
        stream,
    )
    .await?;

    // The producer. `Nats-Msg-Id` (the event's own id) lets JetStream drop a retried publish
    // that it stored within the stream's duplicate window: a first line of defence, cheap and
    // worth having. It is not enough on its own, which is why the consumer is idempotent:
    // the window ends (a retry after it is stored again: simulated here by a new id), and
    // JetStream's redeliveries to the consumer (ack_wait expired, a crash before the ack, an
    // ack lost on the way) are not publishes, so no window ever sees them.
    let events = events(60);
    let mut published = Vec::new();
    let mut dropped_by_jetstream = 0;
    let mut republished = 0;
    let mut order: Vec<usize> = (0..events.len()).collect();
    // Reordering: status versions swapped with their neighbours.
    for i in (2..order.len()).step_by(3) {
        order.swap(i - 1, i);
    }
    for (n, &i) in order.iter().enumerate() {
        let event = &events[i];
        let subject = format!("{subjects}.orders.{}", event.id());
        let payload = serde_json::to_vec(event)?;
        let publish = |id: String| {
            jetstream::message::PublishMessage::build()
                .payload(payload.clone().into())
                .message_id(id)
        };
        js.send_publish(subject.clone(), publish(event.id().to_string()))
            .await?
            .await?;
        published.push(event.clone());
        if n % 4 == 0 {
            // A producer's retry within the window: JetStream drops it.
            let ack = js
                .send_publish(subject.clone(), publish(event.id().to_string()))
                .await?
                .await?;
            if ack.duplicate {
                dropped_by_jetstream += 1;
            }
        }
        if n % 5 == 0 {
            // A retry after the window (or by a producer that made a new id): stored again.
            js.send_publish(subject, publish(format!("{}-retry", event.id())))
                .await?
                .await?;
            republished += 1;
        }
    }
    println!(
        "published {} events; JetStream dropped {dropped_by_jetstream} retries by Nats-Msg-Id \
         and stored {republished} later copies",
        published.len()
    );

    // The consumer.
    let path = std::env::temp_dir().join(format!("{stream}.db"));
    let pool = database(&path).await?;
    let source = Source::builder(url, stream, "billing")
        .prefetch(50)
        .connect()
        .await?;
    let mut consumer = js
        .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>("billing", stream)
        .await?;
    let settled = async move {
        loop {
            match consumer.info().await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => return,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    };
    let timeout = async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        eprintln!("error: the consumer did not settle every message within 60 s");
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(2)
        .run(source.deliveries(), json::<Event>, handle, async {
            tokio::select! { () = settled => {}, () = timeout => {} }
        })
        .await;
    source.close().await?; // stop pulling, give back the last pull, flush
    println!(
        "consumed: {} applied, {} duplicates, {} stale, {} failed, {} dead-lettered, {} settle failures",
        counts.applied,
        counts.duplicate,
        counts.stale,
        counts.failed,
        counts.dead_lettered,
        counts.settle_failures
    );

    let customers: Customers =
        sqlx::query_as("SELECT name, orders, total FROM customers ORDER BY name")
            .fetch_all(&pool)
            .await?;
    let orders: Orders = sqlx::query_as("SELECT id, status FROM orders ORDER BY id")
        .fetch_all(&pool)
        .await?;
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    let (want_customers, want_orders) = oracle(&published);
    let delivered = published.len() as u64 + republished;
    let ok = customers == want_customers
        && orders == want_orders
        && counts.applied + counts.duplicate + counts.stale == delivered
        && counts.dead_lettered == 0;
    if ok {
        println!(
            "ok: {} customers and {} orders equal the exactly-once oracle",
            customers.len(),
            orders.len()
        );
    } else {
        eprintln!("MISMATCH against the exactly-once oracle");
        eprintln!("customers: {customers:?}\n     want: {want_customers:?}");
        eprintln!("orders: {orders:?}\n  want: {want_orders:?}");
    }
    Ok(ok)
}

async fn database(path: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
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
    sqlx::query("CREATE TABLE customers (name TEXT PRIMARY KEY, orders INTEGER, total INTEGER)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

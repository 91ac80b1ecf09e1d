//! An order-events consumer on Kafka and SQLite, end to end.
//!
//! ```text
//! tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
//!     --storage-engine memory://tansu/     # or any Kafka; IDEM_KAFKA_BROKERS points elsewhere
//! cargo run --example kafka --features sqlite,kafka [-- <seed> <orders>]
//! ```
//!
//! A producer writes order events to a topic of this run (3 partitions, keyed by order):
//! orders placed (key only: counted into the customer's total once) and status changes (key +
//! version + entity: an order only moves forward), with about 30% written twice and neighbours
//! swapped, so duplicates and stale versions arrive. idem's consumer takes them in batches of
//! 50, four transactions at a time, and commits each partition's offset only up to what has
//! settled. The program prints the counts, checks the database against an exactly-once oracle
//! and the group's committed offsets against the topic's ends, deletes its topics, and exits 1
//! on any mismatch (2 when no broker answers).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::consume::{json, Consumer};
use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use idem::kafka::rdkafka::{Offset, TopicPartitionList};
use idem::kafka::Source;
use idem::{idempotent, Batch, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

const PARTITIONS: i32 = 3;
const TIMEOUT: Duration = Duration::from_secs(10);

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

#[idempotent(key = "event_id", scope = "kafka_demo::on_placed")]
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
    scope = "kafka_demo::on_status"
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

/// The group's committed offsets and the topic's ends, per partition.
async fn offsets(
    brokers: &str,
    topic: &str,
    group: &str,
) -> Result<(Vec<i64>, Vec<i64>), Box<dyn std::error::Error>> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()?;
    let topic = topic.to_string();
    let found = tokio::task::spawn_blocking(move || {
        let mut list = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            list.add_partition(&topic, p);
        }
        let committed = client.committed_offsets(list, TIMEOUT)?;
        let committed = committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .collect();
        let mut ends = Vec::new();
        for p in 0..PARTITIONS {
            ends.push(client.fetch_watermarks(&topic, p, TIMEOUT)?.1);
        }
        Ok::<_, idem::kafka::rdkafka::error::KafkaError>((committed, ends))
    })
    .await??;
    Ok(found)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let orders: i64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300);
    let brokers =
        std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_string());

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let topic = format!("idem-demo-orders-{}-{run}", std::process::id());
    let dead = format!("{topic}.dead");
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let created = tokio::time::timeout(
        Duration::from_secs(15),
        admin.create_topics(
            &[
                NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
                NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
            ],
            &options,
        ),
    )
    .await;
    let why = match created {
        Ok(Ok(results)) => results
            .into_iter()
            .find_map(|r| r.err())
            .map(|(_, e)| e.to_string()),
        Ok(Err(err)) => Some(err.to_string()),
        Err(_) => Some("no answer within 15 s".to_string()),
    };
    if let Some(why) = why {
        eprintln!("No Kafka broker answered at {brokers}: {why}");
        eprintln!(
            "Start one first: `cargo install tansu --version 0.6.0 --locked --features dynostore`, \
             then `tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url \
             tcp://127.0.0.1:9092 --storage-engine memory://tansu/`; or point IDEM_KAFKA_BROKERS \
             at another broker."
        );
        std::process::exit(2);
    }

    let dir = std::env::temp_dir().join(format!("idem-kafka-demo-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = demo(&brokers, &topic, &dir, seed, orders).await;
    let _ = admin.delete_topics(&[&topic, &dead], &options).await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(1),
        Err(err) => Err(err),
    }
}

/// The run itself; `Ok(false)` on a mismatch.
async fn demo(
    brokers: &str,
    topic: &str,
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
        "topic {topic}: {} events, {} produced ({} copies), neighbours swapped; batch 50 × 4 in flight",
        events.len(),
        total,
        published.len() - events.len()
    );

    // The producer, keyed by order so an order's events share a partition. One record per
    // batch: the tansu test broker mishandles batches of several records (see the README).
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("batch.num.messages", "1")
        .set("linger.ms", "0")
        .set("acks", "all")
        .create()?;
    for chunk in published.chunks(100) {
        let sends = chunk.iter().map(|event| {
            let payload = serde_json::to_vec(event).expect("an event encodes");
            let key = match event {
                OrderEvent::Placed { .. } => event.event_id().to_string(),
                OrderEvent::StatusChanged { order_id, .. } => order_id.to_string(),
            };
            let producer = &producer;
            async move {
                let record = FutureRecord::to(topic).key(&key).payload(&payload);
                producer.send(record, TIMEOUT).await.map_err(|(e, _)| e)
            }
        });
        for sent in futures_util::future::join_all(sends).await {
            sent?;
        }
    }
    producer.flush(TIMEOUT)?;

    // The consumer; the demo stops once the group committed every record (a service runs
    // until its shutdown signal instead, e.g. `ctrl_c()`).
    let started = Instant::now();
    let group = format!("{topic}-billing");
    let source = Source::builder(brokers, topic, &group)
        .commit_interval(Duration::from_millis(200))
        .connect() // checks the topic and its dead-letter topic, `<topic>.dead`
        .await?;
    let all_committed = async {
        loop {
            if let Ok((committed, ends)) = offsets(brokers, topic, &group).await {
                if committed == ends {
                    return;
                }
            }
            // Bounded, so that a bug ends the demo instead of hanging it.
            if started.elapsed() > Duration::from_secs(120) {
                eprintln!("gave up waiting after 120 s");
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(4)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| handle(b, e).await,
            all_committed,
        )
        .await;
    source.close().await?;
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
    let (committed, ends) = offsets(brokers, topic, &group).await?;
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
        eprintln!("MISMATCH: {total} produced, but the counts are {counts:?}");
        ok = false;
    }
    if committed != ends || ends.iter().sum::<i64>() as u64 != total {
        eprintln!("MISMATCH: committed offsets {committed:?}, topic ends {ends:?}");
        ok = false;
    }
    if ok {
        println!(
            "OK: {} customers and {} orders equal the exactly-once oracle; offsets committed to {ends:?}",
            expected.0.len(),
            expected.1.len()
        );
    }
    Ok(ok)
}

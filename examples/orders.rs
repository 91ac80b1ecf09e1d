//! The main demo: an order-events consumer on SQLite that sees duplicates and reordering.
//!
//! ```text
//! cargo run --example orders [-- <seed> <orders>]
//! cargo run --example orders --features metrics -- --metrics [<seed> <orders>]
//! ```
//!
//! It generates a delivery stream with redeliveries (duplicates) and swapped neighbours
//! (reordering), feeds it to four concurrent workers through two `#[idempotent]` handlers, prints
//! what happened, and checks the final database against an exactly-once oracle. It exits non-zero
//! if they differ.
//!
//! With `--metrics` (and idem's feature `metrics`), it installs a small in-process recorder of
//! the `metrics` facade and prints idem's counters and histograms at the end, checking that
//! `idem_messages_total` agrees with the outcomes the handlers returned.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Outcome, Tx};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

/// A new order: counted into its customer's total exactly once (key only).
#[derive(Clone, Debug)]
struct OrderPlaced {
    event_id: String,
    customer: String,
    amount: i64,
}

/// A status change of an order, versioned per order (key + version + entity).
#[derive(Clone, Debug)]
struct StatusChanged {
    event_id: String,
    order_id: i64,
    version: i64,
    status: &'static str,
}

#[derive(Clone, Debug)]
enum Event {
    Placed(OrderPlaced),
    Status(StatusChanged),
}

#[idempotent(key = "msg.event_id", scope = "orders::on_placed")]
async fn on_placed(tx: &mut Tx<'_, Sqlite>, msg: &OrderPlaced) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO customers (name, orders, total) VALUES (?1, 1, ?2) \
         ON CONFLICT (name) DO UPDATE SET orders = orders + 1, total = total + excluded.total",
    )
    .bind(&msg.customer)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[idempotent(
    key = "msg.event_id",
    version = "msg.version",
    entity = "msg.order_id",
    scope = "orders::on_status"
)]
async fn on_status(tx: &mut Tx<'_, Sqlite>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(msg.order_id)
    .bind(msg.status)
    .bind(msg.version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

const STATUSES: [&str; 4] = ["placed", "paid", "packed", "shipped"];
const CUSTOMERS: [&str; 5] = ["ada", "brian", "chen", "dagny", "emeka"];

/// A small deterministic generator (xorshift64*), so a seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What was sent and how: the events in producer order, and the deliveries as the broker
/// hands them out (with redeliveries and swapped neighbours).
struct Stream {
    events: Vec<Event>,
    deliveries: Vec<Event>,
    duplicates: usize,
    reordered: usize,
}

fn generate(seed: u64, orders: i64) -> Stream {
    let mut rng = Rng(seed.max(1));
    let mut events = Vec::new();
    for order_id in 1..=orders {
        events.push(Event::Placed(OrderPlaced {
            event_id: format!("placed-{order_id}"),
            customer: CUSTOMERS[rng.below(CUSTOMERS.len())].to_string(),
            amount: 10 + rng.below(90) as i64,
        }));
        let changes = 1 + rng.below(STATUSES.len());
        for (version, status) in STATUSES.iter().take(changes).enumerate() {
            events.push(Event::Status(StatusChanged {
                event_id: format!("status-{order_id}-{version}"),
                order_id,
                version: version as i64 + 1,
                status,
            }));
        }
    }
    // At-least-once delivery: over a quarter of the events are delivered again, a little later.
    let mut deliveries = Vec::new();
    let mut duplicates = 0;
    for event in &events {
        deliveries.push(event.clone());
        if rng.chance(28) {
            let at = deliveries.len() - rng.below(deliveries.len().min(6));
            deliveries.insert(at, event.clone());
            duplicates += 1;
        }
    }
    // Out of order: swap neighbours, so a later version can arrive first.
    let mut reordered = 0;
    let mut i = 1;
    while i < deliveries.len() {
        if rng.chance(12) {
            deliveries.swap(i - 1, i);
            reordered += 1;
            i += 1;
        }
        i += 1;
    }
    Stream {
        events,
        deliveries,
        duplicates,
        reordered,
    }
}

#[derive(Default, Debug)]
struct Counts {
    applied: usize,
    duplicate: usize,
    stale: usize,
}

/// The state an exactly-once consumer applying each event once, in version order, ends in.
struct Expected {
    customers: BTreeMap<String, (i64, i64)>,
    orders: BTreeMap<i64, (String, i64)>,
}

fn oracle(events: &[Event]) -> Expected {
    let mut expected = Expected {
        customers: BTreeMap::new(),
        orders: BTreeMap::new(),
    };
    for event in events {
        match event {
            Event::Placed(e) => {
                let entry = expected.customers.entry(e.customer.clone()).or_default();
                entry.0 += 1;
                entry.1 += e.amount;
            }
            Event::Status(e) => {
                let entry = expected
                    .orders
                    .entry(e.order_id)
                    .or_insert((String::new(), 0));
                if e.version > entry.1 {
                    *entry = (e.status.to_string(), e.version);
                }
            }
        }
    }
    expected
}

async fn open(path: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
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
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS customers (name TEXT PRIMARY KEY, orders INTEGER NOT NULL, total INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

async fn consume(
    pool: SqlitePool,
    queue: Arc<Mutex<VecDeque<Event>>>,
) -> Result<Counts, idem::Error<sqlx::Error>> {
    let mut counts = Counts::default();
    loop {
        let next = queue.lock().expect("queue lock").pop_front();
        let Some(event) = next else { return Ok(counts) };
        let outcome = match &event {
            Event::Placed(msg) => on_placed(&pool, msg).await?,
            Event::Status(msg) => on_status(&pool, msg).await?,
        };
        match outcome {
            Outcome::Applied(()) => counts.applied += 1,
            Outcome::Duplicate => counts.duplicate += 1,
            Outcome::Stale { .. } => counts.stale += 1,
            _ => {}
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (flags, args): (Vec<String>, Vec<String>) =
        std::env::args().skip(1).partition(|a| a == "--metrics");
    let recorder = if flags.is_empty() {
        None
    } else {
        Some(printer::install()?)
    };
    let mut args = args.into_iter();
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let orders: i64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(500);

    let stream = generate(seed, orders);
    let dir = std::env::temp_dir().join(format!("idem-orders-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let pool = open(&dir.join("orders.db")).await?;

    let total = stream.deliveries.len();
    println!(
        "{} events, {} deliveries: {} redelivered ({:.0}%), {} swapped ({:.0}%); 4 workers",
        stream.events.len(),
        total,
        stream.duplicates,
        100.0 * stream.duplicates as f64 / total as f64,
        stream.reordered,
        100.0 * 2.0 * stream.reordered as f64 / total as f64,
    );
    let queue = Arc::new(Mutex::new(VecDeque::from(stream.deliveries.clone())));
    let workers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(consume(pool.clone(), queue.clone())))
        .collect();
    let mut counts = Counts::default();
    for worker in workers {
        let c = worker.await??;
        counts.applied += c.applied;
        counts.duplicate += c.duplicate;
        counts.stale += c.stale;
    }
    println!(
        "applied {}, duplicate {}, stale {}",
        counts.applied, counts.duplicate, counts.stale
    );
    if counts.applied + counts.duplicate + counts.stale != total {
        return Err("some deliveries have no outcome".into());
    }

    let expected = oracle(&stream.events);
    let customers: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT name, orders, total FROM customers ORDER BY name")
            .fetch_all(&pool)
            .await?;
    let got_orders: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, status, version FROM orders ORDER BY id")
            .fetch_all(&pool)
            .await?;
    println!("\ncustomer  orders  total");
    for (name, n, total) in &customers {
        println!("{name:<9} {n:>6} {total:>6}");
    }
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, status, _) in &got_orders {
        *by_status.entry(status.as_str()).or_default() += 1;
    }
    println!("orders by final status: {by_status:?}");

    let mut mismatches = Vec::new();
    let want_customers: Vec<(String, i64, i64)> = expected
        .customers
        .iter()
        .map(|(k, (n, t))| (k.clone(), *n, *t))
        .collect();
    if customers != want_customers {
        mismatches.push(format!(
            "customers: got {customers:?}, want {want_customers:?}"
        ));
    }
    let want_orders: Vec<(i64, String, i64)> = expected
        .orders
        .iter()
        .map(|(k, (s, v))| (*k, s.clone(), *v))
        .collect();
    for (got, want) in got_orders.iter().zip(&want_orders) {
        if got != want {
            mismatches.push(format!("order {}: got {got:?}, want {want:?}", want.0));
        }
    }
    if got_orders.len() != want_orders.len() {
        mismatches.push(format!(
            "{} orders, want {}",
            got_orders.len(),
            want_orders.len()
        ));
    }
    pool.close().await;
    std::fs::remove_dir_all(&dir)?;
    if let Some(recorder) = recorder {
        let recorded = recorder.print();
        let returned = [
            ("applied", counts.applied),
            ("duplicate", counts.duplicate),
            ("stale", counts.stale),
        ];
        for (outcome, n) in returned {
            let got = recorded.get(outcome).copied().unwrap_or(0);
            if cfg!(feature = "metrics") && got != n as u64 {
                mismatches.push(format!(
                    "idem_messages_total{{outcome={outcome}}} is {got}, the handlers returned {n}"
                ));
            }
        }
    }

    if mismatches.is_empty() {
        println!("\nOK: the database matches the exactly-once oracle (each event once, in version order)");
        Ok(())
    } else {
        for m in &mismatches {
            eprintln!("MISMATCH {m}");
        }
        Err(format!(
            "{} mismatches against the exactly-once oracle",
            mismatches.len()
        )
        .into())
    }
}

/// `--metrics`: a recorder of the `metrics` facade that keeps counters and histogram samples in
/// memory, and prints them at the end (a service would install a Prometheus exporter instead).
mod printer {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    /// Per metric and labels: the counter's total, or the histogram's samples and their sum.
    type Values = Arc<Mutex<BTreeMap<String, (u64, f64)>>>;

    #[derive(Clone, Default)]
    pub struct Printer(Values);

    struct Slot(Values, String);

    impl metrics::CounterFn for Slot {
        fn increment(&self, n: u64) {
            self.0
                .lock()
                .expect("metrics lock")
                .entry(self.1.clone())
                .or_default()
                .0 += n;
        }
        fn absolute(&self, n: u64) {
            self.0
                .lock()
                .expect("metrics lock")
                .entry(self.1.clone())
                .or_default()
                .0 = n;
        }
    }

    impl metrics::HistogramFn for Slot {
        fn record(&self, value: f64) {
            let mut values = self.0.lock().expect("metrics lock");
            let entry = values.entry(self.1.clone()).or_default();
            entry.0 += 1;
            entry.1 += value;
        }
    }

    impl Printer {
        fn slot(&self, key: &Key) -> Arc<Slot> {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
                .collect();
            Arc::new(Slot(
                self.0.clone(),
                format!("{}{{{}}}", key.name(), labels.join(",")),
            ))
        }

        /// Prints every metric; returns `idem_messages_total` summed per outcome.
        pub fn print(&self) -> BTreeMap<String, u64> {
            let mut per_outcome = BTreeMap::new();
            println!("\nmetrics (counters: total; histograms: samples, mean)");
            if !cfg!(feature = "metrics") {
                println!("  none: idem was built without its `metrics` feature (add `--features metrics`)");
            }
            for (name, (n, sum)) in self.0.lock().expect("metrics lock").iter() {
                if name.contains("_seconds") {
                    let mean = if *n == 0 { 0.0 } else { sum / *n as f64 };
                    println!("  {name} {n} samples, mean {:.3} ms", mean * 1e3);
                } else {
                    println!("  {name} {n}");
                }
                if let Some(labels) = name.strip_prefix("idem_messages_total{") {
                    if let Some(outcome) =
                        labels.split(',').find_map(|l| l.strip_prefix("outcome="))
                    {
                        *per_outcome
                            .entry(outcome.trim_matches(|c| c == '"' || c == '}').to_string())
                            .or_default() += n;
                    }
                }
            }
            per_outcome
        }
    }

    impl Recorder for Printer {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.slot(key))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.slot(key))
        }
    }

    /// Installs the printer as the process's recorder.
    pub fn install() -> Result<Printer, Box<dyn std::error::Error>> {
        let printer = Printer::default();
        metrics::set_global_recorder(printer.clone()).map_err(|e| e.to_string())?;
        #[cfg(feature = "metrics")]
        idem::metrics::describe();
        Ok(printer)
    }
}

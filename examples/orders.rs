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
//!
//! The broker demos (`examples/demo/`) send these same events through a broker into these same
//! handlers and check them the same way: they take this file as a module (through
//! `demo/harness.rs`), and what is `pub` here is what they use.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::consume::Counts;
use idem::{idempotent, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

/// A new order: counted into its customer's total exactly once (key only).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub event_id: String,
    pub order_id: i64,
    pub customer: String,
    pub amount: i64,
}

/// A status change of an order, versioned per order (key + version + entity).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatusChanged {
    pub event_id: String,
    pub order_id: i64,
    pub version: i64,
    #[serde(deserialize_with = "known_status")]
    pub status: Status,
}

/// One of [`STATUSES`]. (A name for `&'static str`, so that serde reads the field through
/// `known_status` instead of borrowing it from the input.)
pub type Status = &'static str;

/// An order event; on a broker, JSON tagged with its `type`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    Placed(OrderPlaced),
    Status(StatusChanged),
}

impl Event {
    /// The event's own id (the handlers' key).
    pub fn id(&self) -> &str {
        match self {
            Event::Placed(e) => &e.event_id,
            Event::Status(e) => &e.event_id,
        }
    }

    /// The order it belongs to (a partition key that keeps an order's events in order).
    pub fn order_id(&self) -> i64 {
        match self {
            Event::Placed(e) => e.order_id,
            Event::Status(e) => e.order_id,
        }
    }
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

/// One event, to the handler its type needs, on a pool or in a batch (`idem::Transact`).
pub async fn handle<'s, 't: 's>(
    tx: impl idem::Transact<'s, 't, Sqlite>,
    event: &Event,
) -> idem::Handled<Result<(), sqlx::Error>> {
    match event {
        Event::Placed(msg) => on_placed(tx, msg).await,
        Event::Status(msg) => on_status(tx, msg).await,
    }
}

pub const STATUSES: [&str; 4] = ["placed", "paid", "packed", "shipped"];
pub const CUSTOMERS: [&str; 5] = ["ada", "brian", "chen", "dagny", "emeka"];

/// A status read from JSON, as one of [`STATUSES`].
fn known_status<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Status, D::Error> {
    let status = String::deserialize(de)?;
    STATUSES
        .into_iter()
        .find(|known| *known == status)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown status {status:?}")))
}

/// A small deterministic generator (xorshift64*), so a seed reproduces a run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What was sent and how: the events in producer order, and the deliveries as the broker
/// hands them out (with redeliveries and swapped neighbours).
pub struct Stream<T> {
    pub events: Vec<T>,
    pub deliveries: Vec<T>,
    pub duplicates: usize,
    pub reordered: usize,
}

impl<T: Clone> Stream<T> {
    /// At-least-once delivery of `events`: over a fifth of the deliveries are copies, a little
    /// later than their original, and about a fifth are swapped with a neighbour.
    pub fn deliver(events: Vec<T>, rng: &mut Rng) -> Self {
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

    /// "N events, M deliveries: X redelivered (P%), Y swapped (Q%)".
    pub fn summary(&self) -> String {
        let total = self.deliveries.len();
        format!(
            "{} events, {} deliveries: {} redelivered ({:.0}%), {} swapped ({:.0}%)",
            self.events.len(),
            total,
            self.duplicates,
            100.0 * self.duplicates as f64 / total as f64,
            self.reordered,
            100.0 * 2.0 * self.reordered as f64 / total as f64,
        )
    }
}

/// The events of `orders` orders (a placement, then one to four status changes each), delivered
/// with copies and swaps; the same for the same `seed`.
pub fn generate(seed: u64, orders: i64) -> Stream<Event> {
    let mut rng = Rng::new(seed);
    let mut events = Vec::new();
    for order_id in 1..=orders {
        events.push(Event::Placed(OrderPlaced {
            event_id: format!("placed-{order_id}"),
            order_id,
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
    Stream::deliver(events, &mut rng)
}

/// The handlers' tables: customers' (orders, total) and orders' latest (status, version).
#[derive(Debug, Default, PartialEq)]
pub struct State {
    pub customers: BTreeMap<String, (i64, i64)>,
    pub orders: BTreeMap<i64, (String, i64)>,
}

impl State {
    /// The oracle: the state an exactly-once consumer applying each event once, in version
    /// order, ends in.
    pub fn expected(events: &[Event]) -> State {
        let mut state = State::default();
        for event in events {
            match event {
                Event::Placed(e) => {
                    let entry = state.customers.entry(e.customer.clone()).or_default();
                    entry.0 += 1;
                    entry.1 += e.amount;
                }
                Event::Status(e) => {
                    let entry = state.orders.entry(e.order_id).or_default();
                    if e.version > entry.1 {
                        *entry = (e.status.to_string(), e.version);
                    }
                }
            }
        }
        state
    }

    /// What the handlers wrote.
    pub async fn read(pool: &SqlitePool) -> Result<State, sqlx::Error> {
        let customers: Vec<(String, i64, i64)> =
            sqlx::query_as("SELECT name, orders, total FROM customers")
                .fetch_all(pool)
                .await?;
        let orders: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT id, status, version FROM orders")
                .fetch_all(pool)
                .await?;
        Ok(State {
            customers: customers.into_iter().map(|(n, o, t)| (n, (o, t))).collect(),
            orders: orders.into_iter().map(|(i, s, v)| (i, (s, v))).collect(),
        })
    }
}

/// A SQLite file for a consumer (WAL, four connections), with idem's tables.
pub async fn open(path: &Path) -> Result<SqlitePool, sqlx::Error> {
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
    Ok(pool)
}

/// [`open`], with the handlers' tables.
pub async fn database(path: &Path) -> Result<SqlitePool, sqlx::Error> {
    let pool = open(path).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS customers (name TEXT PRIMARY KEY, orders INTEGER NOT NULL, total INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// What a demo found wrong: it prints each mismatch and exits 1 if there is any.
#[derive(Default)]
pub struct Check(Vec<String>);

impl Check {
    /// A mismatch, described by `what`, unless `ok`.
    pub fn that(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    /// Each of `delivered` deliveries decided once (applied, duplicate or stale), none
    /// dead-lettered.
    pub fn counts(&mut self, counts: &Counts, delivered: u64) {
        let decided = counts.applied + counts.duplicate + counts.stale;
        self.that(decided == delivered && counts.dead_lettered == 0, || {
            format!("{delivered} deliveries, but the counts are {counts:?}")
        });
    }

    /// The handlers' tables against the exactly-once oracle of `events`; returns the oracle.
    pub async fn database(
        &mut self,
        pool: &SqlitePool,
        events: &[Event],
    ) -> Result<State, sqlx::Error> {
        let (want, got) = (State::expected(events), State::read(pool).await?);
        let names: BTreeSet<&String> = want.customers.keys().chain(got.customers.keys()).collect();
        for name in names {
            let (want, got) = (want.customers.get(name), got.customers.get(name));
            self.that(want == got, || {
                format!("customer {name}: got {got:?}, want {want:?}")
            });
        }
        let ids: BTreeSet<&i64> = want.orders.keys().chain(got.orders.keys()).collect();
        for id in ids {
            let (want, got) = (want.orders.get(id), got.orders.get(id));
            self.that(want == got, || {
                format!("order {id}: got {got:?}, want {want:?}")
            });
        }
        Ok(want)
    }

    /// Prints `OK: <ok>`, or every mismatch; the exit code.
    pub fn finish(self, ok: &str) -> ExitCode {
        if self.0.is_empty() {
            println!("\nOK: {ok}");
            return ExitCode::SUCCESS;
        }
        for mismatch in &self.0 {
            eprintln!("MISMATCH {mismatch}");
        }
        eprintln!(
            "{} mismatches against the exactly-once oracle",
            self.0.len()
        );
        ExitCode::FAILURE
    }
}

/// A worker: takes deliveries off the shared queue and hands each to its handler on the pool.
async fn consume(
    pool: SqlitePool,
    queue: Arc<Mutex<VecDeque<Event>>>,
) -> Result<Counts, idem::Error<sqlx::Error>> {
    let mut counts = Counts::default();
    loop {
        let next = queue.lock().expect("queue lock").pop_front();
        let Some(event) = next else { return Ok(counts) };
        match handle(&pool, &event).await? {
            Outcome::Applied(()) => counts.applied += 1,
            Outcome::Duplicate => counts.duplicate += 1,
            Outcome::Stale { .. } => counts.stale += 1,
            _ => {}
        }
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
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
    let pool = database(&dir.join("orders.db")).await?;

    println!("{}; 4 workers", stream.summary());
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
    let mut check = Check::default();
    check.counts(&counts, stream.deliveries.len() as u64);
    check.database(&pool, &stream.events).await?;

    let state = State::read(&pool).await?;
    println!("\ncustomer  orders  total");
    for (name, (n, total)) in &state.customers {
        println!("{name:<9} {n:>6} {total:>6}");
    }
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    for (status, _) in state.orders.values() {
        *by_status.entry(status.as_str()).or_default() += 1;
    }
    println!("orders by final status: {by_status:?}");
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
            check.that(!cfg!(feature = "metrics") || got == n, || {
                format!(
                    "idem_messages_total{{outcome={outcome}}} is {got}, the handlers returned {n}"
                )
            });
        }
    }
    Ok(check
        .finish("the database matches the exactly-once oracle (each event once, in version order)"))
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

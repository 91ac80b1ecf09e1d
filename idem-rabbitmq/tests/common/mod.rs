//! What the RabbitMQ tests share: the local broker (queues and exchanges of their own, deleted
//! at the end), databases (a SQLite file, a PostgreSQL schema), a generated stream of order
//! events with duplicates and reordered versions, its exactly-once oracle, and a delivery
//! wrapper that counts settlements.
#![allow(dead_code)] // each test binary uses a part of this module

pub mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{Stream, StreamExt as _};
use idem::consume::{Delivery, Settle, SettleError};
use idem::rabbitmq::lapin::{
    self,
    options::{
        BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
        ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable, LongString},
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use tokio::sync::Notify;

/// A name no other test, run or process uses: `prefix_<pid>_<nanos>_<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// The broker: `IDEM_RABBITMQ_URL`, default the local server with guest/guest.
pub fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// The PostgreSQL server: `IDEM_POSTGRES_URL`, default the local server.
pub fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// Which kind of queue a test declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A durable classic queue: no delivery count.
    Classic,
    /// A quorum queue: `x-delivery-count` on redeliveries.
    Quorum,
}

/// A queue, its dead-letter exchange and the dead-letter queue bound to it, all of this test.
#[derive(Debug, Clone)]
pub struct Names {
    pub queue: String,
    pub dlx: String,
    pub dlq: String,
}

/// A connection for the test itself: declares, publishes with confirms, counts, cleans up.
pub struct Broker {
    pub url: String,
    connection: Connection,
    channel: Channel,
}

impl Broker {
    /// The local broker; `None` (after saying so) when none answers, unless `CI` is set:
    /// then that is a failure.
    pub async fn connect() -> Option<Broker> {
        let url = rabbit_url();
        let connection = match Connection::connect(&url, ConnectionProperties::default()).await {
            Ok(connection) => connection,
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!(
                    "skipped: no RabbitMQ at {url} ({err}); start one (rabbitmq-server -detached) \
                     or set IDEM_RABBITMQ_URL"
                );
                return None;
            }
            Err(err) => panic!("CI must run the RabbitMQ tests, but {url} did not answer: {err}"),
        };
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Some(Broker {
            url,
            connection,
            channel,
        })
    }

    /// Declares a queue, a dead-letter exchange and a dead-letter queue bound to it with the
    /// queue's name as routing key.
    pub async fn declare(&self, prefix: &str, kind: Kind) -> Names {
        let queue = unique_name(prefix);
        let names = Names {
            dlx: format!("{queue}.dlx"),
            dlq: format!("{queue}.dlq"),
            queue,
        };
        let mut arguments = FieldTable::default();
        if kind == Kind::Quorum {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(LongString::from("quorum")),
            );
            // RabbitMQ 4.x quorum queues drop a message after 20 deliveries by default: keep
            // the broker's own limit out of the consumer's way.
            arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(1000));
        }
        self.channel
            .queue_declare(
                names.queue.as_str().into(),
                QueueDeclareOptions::durable(),
                arguments,
            )
            .await
            .unwrap();
        self.channel
            .exchange_declare(
                names.dlx.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        self.channel
            .queue_declare(
                names.dlq.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        self.channel
            .queue_bind(
                names.dlq.as_str().into(),
                names.dlx.as_str().into(),
                names.queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        names
    }

    /// Deletes what [`declare`](Broker::declare) made.
    pub async fn delete(&self, names: &Names) {
        for queue in [&names.queue, &names.dlq] {
            self.channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
        }
        self.channel
            .exchange_delete(names.dlx.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Publishes `bodies` to `queue` (through the default exchange), persistent, each with its
    /// `message_id` and a header of the producer's, and waits for every confirm.
    pub async fn publish(&self, queue: &str, bodies: &[(String, Vec<u8>)]) {
        for (id, body) in bodies {
            let mut headers = FieldTable::default();
            headers.insert(
                "x-producer".into(),
                AMQPValue::LongString(LongString::from("idem-tests")),
            );
            self.channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default()
                        .with_message_id(id.as_str().into())
                        .with_delivery_mode(2)
                        .with_headers(headers),
                )
                .await
                .unwrap();
        }
        let returned = self.channel.wait_for_confirms().await.unwrap();
        assert!(returned.is_empty());
    }

    /// Ready messages and consumers of `queue` (a passive declare; unacked ones are not ready).
    pub async fn depth(&self, queue: &str) -> (u32, u32) {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// Waits (up to 10 s) until `queue` has `ready` ready messages and no consumer: after a
    /// consumer's connection closed, the broker needs a moment to return its unacked messages.
    pub async fn settles_at(&self, queue: &str, ready: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let depth = self.depth(queue).await;
            if depth == (ready, 0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{queue}: (ready, consumers) = {depth:?}, expected ({ready}, 0)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes every message of `queue` (acked), in order.
    pub async fn take_all(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut all = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            all.push(message.delivery);
        }
        all
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "OK".into()).await;
    }
}

/// A string header of a message.
pub fn header(message: &lapin::message::Delivery, name: &str) -> Option<String> {
    let headers = message.properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// A migrated SQLite database in the file at `path` (WAL, writers wait for the lock).
pub async fn sqlite_file(path: &std::path::Path) -> SqlitePool {
    let pool = sqlite_open(path).await;
    idem::migrate(&pool).await.unwrap();
    pool
}

/// The SQLite database in the file at `path`, as a consumer process opens it (not migrated).
pub async fn sqlite_open(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap()
}

/// A new SQLite file; returns its pool and path.
pub async fn sqlite() -> (SqlitePool, String) {
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("idem_rmq")));
    let pool = sqlite_file(&path).await;
    (pool, path.to_string_lossy().into_owned())
}

pub async fn drop_sqlite(pool: SqlitePool, path: &str) {
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// A pool on the PostgreSQL schema `schema` (not migrated).
pub async fn postgres_schema(schema: &str) -> PgPool {
    let options: PgConnectOptions = postgres_url().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(6)
        .connect_with(options.options([("search_path", schema)]))
        .await
        .unwrap()
}

/// A new PostgreSQL schema of its own, migrated; `None` (after saying so) when no server
/// answers, unless `CI` is set.
pub async fn postgres() -> Option<(PgPool, String)> {
    let url = postgres_url();
    let admin = match PgPool::connect(&url).await {
        Ok(admin) => admin,
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no PostgreSQL at {url} ({err}); set IDEM_POSTGRES_URL");
            return None;
        }
        Err(err) => panic!("CI must run the PostgreSQL tests, but {url} did not answer: {err}"),
    };
    let schema = unique_name("idem_rmq");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let pool = postgres_schema(&schema).await;
    idem::migrate(&pool).await.unwrap();
    Some((pool, schema))
}

pub async fn drop_postgres(pool: PgPool, schema: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// An order event: a credit (key only) or a status change (key + version + entity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    Credit(Credit),
    Status(Status),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credit {
    pub id: String,
    pub account: i64,
    pub amount: i64,
    /// The handler always fails on it.
    #[serde(default)]
    pub fail: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub id: String,
    pub order: i64,
    pub version: i64,
    #[serde(default)]
    pub fail: bool,
}

impl Event {
    pub fn id(&self) -> &str {
        match self {
            Event::Credit(c) => &c.id,
            Event::Status(s) => &s.id,
        }
    }

    /// The message as published: its id and JSON body.
    pub fn message(&self) -> (String, Vec<u8>) {
        (self.id().to_string(), serde_json::to_vec(self).unwrap())
    }
}

/// `unique` distinct events, then about 30% of them published again later (duplicates), and
/// neighbours swapped so that versions arrive out of order.
pub fn generate(seed: u64, unique: usize) -> Vec<Event> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_version: BTreeMap<i64, i64> = BTreeMap::new();
    let mut events: Vec<Event> = (0..unique)
        .map(|i| {
            if rng.random_bool(0.5) {
                Event::Credit(Credit {
                    id: format!("c{i}"),
                    account: rng.random_range(0..40),
                    amount: rng.random_range(1..1_000),
                    fail: false,
                })
            } else {
                let order = rng.random_range(0..60);
                let version = next_version.entry(order).or_default();
                *version += 1;
                Event::Status(Status {
                    id: format!("s{i}"),
                    order,
                    version: *version,
                    fail: false,
                })
            }
        })
        .collect();
    for _ in 0..unique / 5 {
        let i = rng.random_range(0..events.len() - 16);
        let j = i + rng.random_range(1..=16);
        events.swap(i, j);
    }
    let duplicates = unique * 3 / 7; // 30% of the published messages are copies
    for _ in 0..duplicates {
        let i = rng.random_range(0..events.len());
        let j = rng.random_range(i + 1..=(i + 300).min(events.len()));
        let copy = events[i].clone();
        events.insert(j, copy);
    }
    events
}

/// What applying every distinct event exactly once ends with, in any order: balances are sums;
/// an order ends at its highest version.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Oracle {
    pub balances: BTreeMap<i64, i64>,
    pub orders: BTreeMap<i64, i64>,
    pub credits: BTreeSet<String>,
    pub statuses: BTreeSet<String>,
    /// The id of each order's highest version: it is always applied.
    pub latest: BTreeSet<String>,
}

pub fn oracle(events: &[Event]) -> Oracle {
    let mut o = Oracle::default();
    let mut latest: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    for event in events {
        match event {
            Event::Credit(c) => {
                if o.credits.insert(c.id.clone()) {
                    *o.balances.entry(c.account).or_default() += c.amount;
                }
            }
            Event::Status(s) => {
                o.statuses.insert(s.id.clone());
                let best = latest.entry(s.order).or_insert((0, String::new()));
                if s.version > best.0 {
                    *best = (s.version, s.id.clone());
                }
            }
        }
    }
    for (order, (version, id)) in latest {
        o.orders.insert(order, version);
        o.latest.insert(id);
    }
    o
}

/// Settlements seen by [`Tracked`] deliveries.
#[derive(Debug, Default)]
pub struct Tally {
    pub acked: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub requeued: AtomicU64,
    changed: Notify,
    /// Set in a process that must stop dead after a commit, before the ack.
    pub block_before_ack: std::sync::atomic::AtomicBool,
}

impl Tally {
    pub fn new() -> Arc<Tally> {
        Arc::new(Tally::default())
    }

    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::SeqCst)
    }

    /// Completes once `done(acked, dead_lettered)` holds: a consumer's shutdown signal.
    pub async fn until(self: Arc<Self>, done: impl Fn(u64, u64) -> bool) {
        loop {
            let changed = self.changed.notified();
            if done(self.acked(), self.dead_lettered()) {
                return;
            }
            changed.await;
        }
    }
}

/// A delivery whose settlements are counted (once the broker took them).
pub struct Tracked<D> {
    inner: D,
    tally: Arc<Tally>,
}

impl<D: Delivery> Delivery for Tracked<D> {
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
        let counter = match &settle {
            Settle::Ack => &self.tally.acked,
            Settle::DeadLetter { .. } => &self.tally.dead_lettered,
            _ => &self.tally.requeued,
        };
        if matches!(settle, Settle::Ack) && self.tally.block_before_ack.load(Ordering::SeqCst) {
            // The transaction committed; the ack has not been sent. Say so, and stop here
            // (blocking the whole runtime, so nothing else goes out) until killed.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "committed {}", self.inner.describe()).unwrap();
            out.flush().unwrap();
            std::thread::sleep(Duration::from_secs(120));
            panic!("not killed while blocked between commit and ack");
        }
        let result = self.inner.settle(settle).await;
        if result.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
            self.tally.changed.notify_waiters();
        }
        result
    }

    /// The adapter's own batch ack (a `multiple` ack on RabbitMQ), counted.
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(tally) = deliveries.first().map(|d| d.tally.clone()) else {
            return Vec::new();
        };
        if tally.block_before_ack.load(Ordering::SeqCst) {
            // As in `settle`: committed, not acked; stop here until killed.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "committed {}", deliveries[0].inner.describe()).unwrap();
            out.flush().unwrap();
            std::thread::sleep(Duration::from_secs(120));
            panic!("not killed while blocked between commit and ack");
        }
        let results = D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await;
        let acked = results.iter().filter(|r| r.is_ok()).count() as u64;
        tally.acked.fetch_add(acked, Ordering::SeqCst);
        tally.changed.notify_waiters();
        results
    }
}

/// Wraps each delivery of `stream` so that `tally` counts its settlement.
pub fn track<D, E>(
    stream: impl Stream<Item = Result<D, E>>,
    tally: &Arc<Tally>,
) -> impl Stream<Item = Result<Tracked<D>, E>> {
    let tally = tally.clone();
    stream.map(move |item| {
        item.map(|inner| Tracked {
            inner,
            tally: tally.clone(),
        })
    })
}

/// The source of a test queue, with its dead-letter exchange.
pub fn source(url: &str, names: &Names, prefetch: usize) -> idem::rabbitmq::SourceBuilder {
    idem::rabbitmq::Source::builder(url, names.queue.as_str())
        .prefetch(prefetch)
        .dead_letters(names.dlx.as_str())
}

/// A time limit for a test's consumer run, so that a bug fails instead of hanging.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

//! The Kafka-protocol broker (`IDEM_KAFKA_BROKERS`, e.g. a `tansu` started by `.ci/run`) and a
//! real database for the Kafka tests (a SQLite file, or a PostgreSQL schema of its own at
//! `IDEM_POSTGRES_URL`): a topic and its dead-letter topic with names of their own per test,
//! deleted after; order events and their `#[idempotent]` handlers.
#![allow(dead_code)] // each test binary uses a part of this module

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem::kafka::rdkafka::{Offset, TopicPartitionList};
use idem::kafka::Source;
use idem::{idempotent, Tx};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, Postgres, Sqlite, SqlitePool};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A name no other test, run or process uses.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// The brokers the tests use: `IDEM_KAFKA_BROKERS`; `None`, saying why, when it is not set or
/// nothing answers there (a failure in CI).
pub fn brokers() -> Option<String> {
    let Ok(brokers) = std::env::var("IDEM_KAFKA_BROKERS") else {
        if std::env::var_os("CI").is_some() {
            panic!("CI must run the Kafka tests, but IDEM_KAFKA_BROKERS is not set");
        }
        eprintln!(
            "skipped: IDEM_KAFKA_BROKERS is not set; start a Kafka-protocol broker (e.g. `tansu broker \
             --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
             --storage-engine memory://tansu/`) and set IDEM_KAFKA_BROKERS=127.0.0.1:9092"
        );
        return None;
    };
    let first = brokers.split(',').next().unwrap_or_default().to_string();
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&first)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        });
    if !reachable {
        if std::env::var_os("CI").is_some() {
            panic!("CI must run the Kafka tests, but no broker answers at {brokers}");
        }
        eprintln!("skipped: no Kafka-protocol broker answers at {brokers} (IDEM_KAFKA_BROKERS)");
        return None;
    }
    Some(brokers)
}

/// A topic and its dead-letter topic, named for one test.
pub struct Fixture {
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub partitions: i32,
    producer: FutureProducer,
}

impl Fixture {
    /// Creates `<unique>` with `partitions` partitions and `<unique>.dead` with one.
    pub async fn new(partitions: i32) -> Option<Fixture> {
        let brokers = brokers()?;
        let topic = unique_name("idem_kafka");
        let group = format!("{topic}_group");
        let fx = Fixture::attach(&brokers, &topic, &group, partitions);
        let dead = format!("{topic}.dead");
        let admin = fx.admin();
        let created = admin
            .create_topics(
                &[
                    NewTopic::new(&topic, partitions, TopicReplication::Fixed(1)),
                    NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
                ],
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .unwrap();
        for result in created {
            result.unwrap();
        }
        Some(fx)
    }

    /// The fixture of a topic another process created.
    pub fn attach(brokers: &str, topic: &str, group: &str, partitions: i32) -> Fixture {
        // One record per produced batch: tansu 0.6.0 misreports high watermarks and loses or
        // redelivers records on resume when a batch holds several.
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("batch.num.messages", "1")
            .set("linger.ms", "0")
            .set("acks", "all")
            .create()
            .unwrap();
        Fixture {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            group: group.to_string(),
            partitions,
            producer,
        }
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .unwrap()
    }

    /// A source in the fixture's group, with short timers for tests.
    pub async fn source(&self) -> Source {
        self.source_builder().connect().await.unwrap()
    }

    /// The builder of [`source`](Fixture::source), to change a setting.
    pub fn source_builder(&self) -> idem::kafka::SourceBuilder {
        Source::builder(&self.brokers, &self.topic, &self.group)
            .consumer_config("session.timeout.ms", "6000")
            .consumer_config("heartbeat.interval.ms", "500")
            // A member whose metadata missed a topic or partition (a broker that answered before
            // it knew them) learns them within a second, not after librdkafka's 5 minutes.
            .consumer_config("topic.metadata.refresh.interval.ms", "1000")
            .producer_config("batch.num.messages", "1")
            .commit_interval(Duration::from_millis(200))
            .max_retry_delay(Duration::from_millis(500))
    }

    /// Produces one record (its own batch) and waits for the broker's ack.
    pub async fn produce(&self, key: &str, payload: &[u8]) {
        self.producer
            .send(
                FutureRecord::to(&self.topic).key(key).payload(payload),
                TIMEOUT,
            )
            .await
            .map_err(|(err, _)| err)
            .unwrap();
    }

    /// Produces one record to `partition` (its own batch) and waits for the broker's ack.
    pub async fn produce_to(&self, partition: i32, key: &str, payload: &[u8]) {
        self.producer
            .send(
                FutureRecord::to(&self.topic)
                    .partition(partition)
                    .key(key)
                    .payload(payload),
                TIMEOUT,
            )
            .await
            .map_err(|(err, _)| err)
            .unwrap();
    }

    /// Produces each event keyed by its order (an order's versions share a partition).
    pub async fn produce_all(&self, events: &[OrderEvent]) {
        for chunk in events.chunks(200) {
            let sends = chunk.iter().map(|e| {
                let payload = serde_json::to_vec(e).unwrap();
                let key = e.order.to_string();
                async move { self.produce(&key, &payload).await }
            });
            futures_util::future::join_all(sends).await;
        }
    }

    fn offsets_client(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .create()
            .unwrap()
    }

    /// The group's committed offset per partition (`None` where nothing was committed).
    pub async fn committed(&self) -> Vec<Option<i64>> {
        let client = self.offsets_client();
        let mut list = TopicPartitionList::new();
        for p in 0..self.partitions {
            list.add_partition(&self.topic, p);
        }
        tokio::task::spawn_blocking(move || {
            let committed = client.committed_offsets(list, TIMEOUT).unwrap();
            committed
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .collect()
        })
        .await
        .unwrap()
    }

    /// Each partition's high watermark (the offset the next record gets).
    pub async fn ends(&self) -> Vec<i64> {
        let client = self.offsets_client();
        let (topic, partitions) = (self.topic.clone(), self.partitions);
        tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| client.fetch_watermarks(&topic, p, TIMEOUT).unwrap().1)
                .collect()
        })
        .await
        .unwrap()
    }

    /// Whether the group has committed every record of the topic.
    pub async fn all_committed(&self) -> bool {
        let ends = self.ends().await;
        let committed = self.committed().await;
        ends.iter()
            .zip(&committed)
            .all(|(end, c)| *end == 0 || *c == Some(*end))
    }

    /// Completes once the group has committed every record: a consumer's shutdown signal.
    pub async fn settled(&self) {
        while !self.all_committed().await {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The dead letters, once `expected` have arrived (or 20 s passed): payload and headers.
    pub async fn dead_letters(&self, expected: usize) -> Vec<(Vec<u8>, BTreeMap<String, String>)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", unique_name("idem_kafka_dlq_reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let dead = format!("{}.dead", self.topic);
        tokio::task::spawn_blocking(move || {
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&dead, 0, Offset::Beginning)
                .unwrap();
            consumer.assign(&list).unwrap();
            let mut letters = Vec::new();
            let until = Instant::now() + Duration::from_secs(20);
            // Reads past `expected` for a while, so a letter too many is seen.
            let mut quiet_until = None;
            while Instant::now() < until && quiet_until.is_none_or(|q| Instant::now() < q) {
                if let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) {
                    let mut headers = BTreeMap::new();
                    if let Some(h) = message.headers() {
                        for header in h.iter() {
                            let value = header
                                .value
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_default();
                            headers.insert(header.key.to_string(), value);
                        }
                    }
                    letters.push((message.payload().unwrap_or_default().to_vec(), headers));
                }
                if letters.len() >= expected && quiet_until.is_none() {
                    quiet_until = Some(Instant::now() + Duration::from_secs(2));
                }
            }
            letters
        })
        .await
        .unwrap()
    }

    /// Deletes the topic and its dead-letter topic.
    pub async fn delete(self) {
        let dead = format!("{}.dead", self.topic);
        let _ = self
            .admin()
            .delete_topics(&[&self.topic, &dead], &AdminOptions::new())
            .await;
    }
}

/// Headers for a record, as a producer would set them.
pub fn headers(pairs: &[(&str, &str)]) -> OwnedHeaders {
    pairs.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(*value),
        })
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderEvent {
    pub id: String,
    pub order: i64,
    pub version: i64,
    pub status: String,
    /// The handler always fails on it (a poison message).
    #[serde(default)]
    pub fail: bool,
    /// The handler sleeps this long first.
    #[serde(default)]
    pub sleep_ms: u64,
}

impl OrderEvent {
    pub fn new(order: i64, version: i64) -> Self {
        OrderEvent {
            id: format!("evt-{order}-{version}"),
            order,
            version,
            status: format!("status-{version}"),
            fail: false,
            sleep_ms: 0,
        }
    }
}

macro_rules! handler {
    ($db:ty, $upsert:literal, $log:literal) => {
        /// Sets the order's status, and logs the event's application; fails on a poison event,
        /// which is `Poisoned` after 3 failed attempts.
        #[idempotent(
            key = "msg.id",
            version = "msg.version",
            entity = "msg.order",
            max_attempts = 3,
            scope = "kafka_tests::order_status"
        )]
        pub async fn order_status(tx: &mut Tx<'_, $db>, msg: &OrderEvent) -> Result<(), String> {
            if msg.sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(msg.sleep_ms)).await;
            }
            if msg.fail {
                return Err(format!("{} always fails", msg.id));
            }
            sqlx::query($upsert)
                .bind(msg.order)
                .bind(&msg.status)
                .bind(msg.version)
                .execute(&mut **tx)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::query($log)
                .bind(&msg.id)
                .execute(&mut **tx)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    };
}

handler!(
    Sqlite,
    "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
     ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    "INSERT INTO applied (id) VALUES (?1)"
);

/// The handler on PostgreSQL.
pub mod postgres {
    use super::*;

    handler!(
        Postgres,
        "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
        "INSERT INTO applied (id) VALUES ($1)"
    );
}

const TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS applied (id TEXT NOT NULL)",
];

/// A migrated SQLite database with the test tables, in the file at `path` (created if missing).
pub async fn sqlite_file(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    for table in TABLES {
        sqlx::query(table).execute(&pool).await.unwrap();
    }
    pool
}

/// A fresh SQLite database in a new file; the path, to delete it after.
pub async fn sqlite() -> (SqlitePool, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("idem_kafka")));
    (sqlite_file(&path).await, path)
}

/// Closes the pool and removes its file.
pub async fn drop_sqlite(pool: SqlitePool, path: &std::path::Path) {
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

pub fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A new PostgreSQL schema of its own, migrated, with the test tables; `None` (saying why)
/// when no server answers, a failure in CI. Returns the pool and the schema's name.
pub async fn postgres() -> Option<(PgPool, String)> {
    let url = postgres_url();
    let admin = match PgPool::connect(&url).await {
        Ok(admin) => admin,
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "skipped: no PostgreSQL at {url} ({err}); set IDEM_POSTGRES_URL to run this test"
            );
            return None;
        }
        Err(err) => panic!("CI must run the PostgreSQL tests, but {url} did not answer: {err}"),
    };
    let schema = unique_name("idem_kafka_t");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    Some((postgres_schema(&schema).await, schema))
}

/// A pool on the existing schema `schema`, migrated, with the test tables.
pub async fn postgres_schema(schema: &str) -> PgPool {
    let options: PgConnectOptions = postgres_url().parse().unwrap();
    let options = options.options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    for table in TABLES {
        sqlx::query(table).execute(&pool).await.unwrap();
    }
    pool
}

/// Drops the schema of a [`postgres`] pool.
pub async fn drop_postgres(pool: PgPool, schema: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// `(id, status, version)` of every order, by id.
pub async fn orders<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Vec<(i64, String, i64)>
where
    for<'r> (i64, String, i64): sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query_as("SELECT id, status, version FROM orders ORDER BY id")
        .fetch_all(&mut *pool.acquire().await.unwrap())
        .await
        .unwrap()
}

/// Event ids applied more than once (must be none).
pub async fn applied_twice<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Vec<String>
where
    for<'r> (String,): sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query_as::<_, (String,)>("SELECT id FROM applied GROUP BY id HAVING COUNT(*) > 1")
        .fetch_all(&mut *pool.acquire().await.unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|(id,)| id)
        .collect()
}

/// How many applications are logged.
pub async fn applied(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The final state the events must leave, had each been applied exactly once in its order:
/// each order at its highest version (poison events excluded).
pub fn oracle(events: &[OrderEvent]) -> Vec<(i64, String, i64)> {
    let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
    for e in events.iter().filter(|e| !e.fail) {
        let v = latest.entry(e.order).or_insert(0);
        *v = (*v).max(e.version);
    }
    latest
        .into_iter()
        .map(|(order, version)| (order, format!("status-{version}"), version))
        .collect()
}

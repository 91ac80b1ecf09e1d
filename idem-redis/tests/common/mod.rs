//! The local Redis and real databases for the Redis Streams tests: a stream (and its dead-letter
//! stream) named for one test and deleted after; a fresh SQLite file or PostgreSQL schema; order
//! events with duplicates and reordered versions, their `#[idempotent]` handlers and the
//! exactly-once oracle.
#![allow(dead_code)] // each test binary uses a part of this module

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::{idempotent, Tx};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamInfoGroupsReply, StreamPendingReply, StreamRangeReply};
use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, Postgres, Sqlite, SqlitePool};

/// The consumer group every test uses.
pub const GROUP: &str = "workers";

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

/// The server the tests use: `IDEM_REDIS_URL`, default the local server.
pub fn url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A stream of one test, and its dead-letter stream `<name>:dead`.
pub struct Streams {
    pub conn: MultiplexedConnection,
    pub name: String,
}

/// The group's state: `(pending, lag)`, lag being entries not yet read by the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    pub pending: usize,
    pub lag: usize,
}

impl Streams {
    /// A new stream name; `None` (saying why) without a Redis server, a failure in CI.
    pub async fn new(test: &str) -> Option<Streams> {
        let connected = async {
            let client = redis::Client::open(url())?;
            client.get_multiplexed_async_connection().await
        };
        let conn = match tokio::time::timeout(Duration::from_secs(3), connected).await {
            Ok(Ok(conn)) => conn,
            outcome => {
                let why = match outcome {
                    Ok(Err(err)) => err.to_string(),
                    _ => "no answer within 3 s".to_string(),
                };
                if std::env::var_os("CI").is_some() {
                    panic!(
                        "CI must run the Redis tests, but {} did not answer: {why}",
                        url()
                    );
                }
                eprintln!(
                    "skipped: no Redis at {} ({why}); set IDEM_REDIS_URL to run this test",
                    url()
                );
                return None;
            }
        };
        Some(Streams {
            conn,
            name: unique_name(&format!("idem_test:{test}")),
        })
    }

    /// The streams of an existing test (in a child process).
    pub async fn attach(name: &str) -> Streams {
        let client = redis::Client::open(url()).unwrap();
        Streams {
            conn: client.get_multiplexed_async_connection().await.unwrap(),
            name: name.to_string(),
        }
    }

    pub fn dead(&self) -> String {
        format!("{}:dead", self.name)
    }

    /// Adds one entry; its id.
    pub async fn publish(&self, payload: &[u8]) -> String {
        self.conn
            .clone()
            .xadd(&self.name, "*", &[("payload", payload)])
            .await
            .unwrap()
    }

    /// Adds the events as JSON entries, pipelined 500 at a time.
    pub async fn publish_all(&self, events: &[OrderEvent]) {
        let mut conn = self.conn.clone();
        for chunk in events.chunks(500) {
            let mut pipe = redis::pipe();
            for event in chunk {
                pipe.xadd(
                    &self.name,
                    "*",
                    &[("payload", serde_json::to_vec(event).unwrap())],
                )
                .ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
        }
    }

    /// Entries in the stream.
    pub async fn len(&self) -> usize {
        self.conn.clone().xlen(&self.name).await.unwrap()
    }

    /// Entries delivered to `group` and not yet acknowledged.
    pub async fn pending(&self, group: &str) -> usize {
        let reply: StreamPendingReply =
            self.conn.clone().xpending(&self.name, group).await.unwrap();
        reply.count()
    }

    /// Pending entries per consumer of `group`.
    pub async fn pending_by_consumer(&self, group: &str) -> BTreeMap<String, usize> {
        let reply: StreamPendingReply =
            self.conn.clone().xpending(&self.name, group).await.unwrap();
        match reply {
            StreamPendingReply::Data(data) => data
                .consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The group's pending count and lag (Redis 7: `XINFO GROUPS`).
    pub async fn group(&self, group: &str) -> GroupState {
        let reply: StreamInfoGroupsReply =
            self.conn.clone().xinfo_groups(&self.name).await.unwrap();
        let info = reply
            .groups
            .into_iter()
            .find(|g| g.name == group)
            .expect("the group exists");
        GroupState {
            pending: info.pending,
            lag: info.lag.expect("Redis 7 reports the group's lag"),
        }
    }

    /// Completes once the group has read every entry and has nothing pending.
    pub async fn settled(&self, group: &str) {
        loop {
            if self.group(group).await == (GroupState { pending: 0, lag: 0 }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The dead letters, in order: their fields as text.
    pub async fn dead_letters(&self) -> Vec<BTreeMap<String, String>> {
        let reply: StreamRangeReply = self.conn.clone().xrange_all(self.dead()).await.unwrap();
        reply
            .ids
            .iter()
            .map(|e| {
                e.map
                    .keys()
                    .map(|k| (k.clone(), e.get::<String>(k).unwrap_or_default()))
                    .collect()
            })
            .collect()
    }

    /// Deletes both streams (and with them the group).
    pub async fn delete(self) {
        let mut conn = self.conn.clone();
        let _: redis::RedisResult<i64> = conn.del(&[&self.name, &self.dead()]).await;
    }
}

/// An order event: version `version` of order `order` sets its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// `versions` of each of `orders`, copies of a fraction `duplicates` of them published again
/// later, and neighbours swapped `swaps` times so versions arrive out of order.
pub fn events(
    orders: i64,
    versions: i64,
    duplicates: f64,
    swaps: usize,
    rng: &mut StdRng,
) -> Vec<OrderEvent> {
    let mut events: Vec<OrderEvent> = (1..=versions)
        .flat_map(|v| (1..=orders).map(move |o| OrderEvent::new(o, v)))
        .collect();
    let copies = (events.len() as f64 * duplicates) as usize;
    for _ in 0..copies {
        let from = rng.random_range(0..events.len());
        let to = rng.random_range(from..=events.len());
        let copy = events[from].clone();
        events.insert(to, copy);
    }
    for _ in 0..swaps {
        let a = rng.random_range(0..events.len());
        let b = (a + rng.random_range(1..=16)).min(events.len() - 1);
        events.swap(a, b);
    }
    events
}

/// The state the events must leave had each been applied exactly once in its order: each
/// order at its highest version.
pub fn oracle(events: &[OrderEvent]) -> Vec<(i64, String, i64)> {
    let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
    for e in events {
        let v = latest.entry(e.order).or_insert(0);
        *v = (*v).max(e.version);
    }
    latest
        .into_iter()
        .map(|(order, version)| (order, format!("status-{version}"), version))
        .collect()
}

/// A random generator from `IDEM_REDIS_SEED` or a fresh seed, printed to replay the run.
pub fn seeded() -> StdRng {
    let seed = std::env::var("IDEM_REDIS_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("IDEM_REDIS_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

macro_rules! handlers {
    ($db:ty, $module:ident, $upsert:literal, $log:literal) => {
        pub mod $module {
            use super::*;

            /// Sets the order's status, and logs the event's application.
            #[idempotent(
                key = "msg.id",
                version = "msg.version",
                entity = "msg.order",
                scope = "redis_tests::order_status"
            )]
            pub async fn order_status(
                tx: &mut Tx<'_, $db>,
                msg: &OrderEvent,
            ) -> Result<(), String> {
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

            /// The same, poisoned after 3 failed attempts counted in idem's store.
            #[idempotent(
                key = "msg.id",
                version = "msg.version",
                entity = "msg.order",
                scope = "redis_tests::order_status_3",
                max_attempts = 3
            )]
            pub async fn order_status_3(
                tx: &mut Tx<'_, $db>,
                msg: &OrderEvent,
            ) -> Result<(), String> {
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
        }
    };
}

handlers!(
    Sqlite,
    sqlite,
    "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
     ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    "INSERT INTO applied (id) VALUES (?1)"
);
handlers!(
    Postgres,
    postgres,
    "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
     ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    "INSERT INTO applied (id) VALUES ($1)"
);

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

/// A fresh SQLite database in a new file, and the file (deleted when the process exits, if
/// [`drop_sqlite`] did not already: [`temp_db`]).
pub async fn sqlite() -> (SqlitePool, std::path::PathBuf) {
    let path = temp_db("idem_redis");
    (sqlite_file(&path).await, path)
}

/// A path in the temporary directory for a SQLite file of this test process, named
/// `prefix_<pid>_<nanos>_<n>.db`. The file, its `-wal` and its `-shm` are deleted when the
/// process exits, after every test of the binary ran, passed or failed, so that runs leave
/// nothing behind. A child process that opens the file does not delete it.
pub fn temp_db(prefix: &str) -> std::path::PathBuf {
    use std::sync::{Mutex, Once, PoisonError};
    static FILES: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
    static AT_EXIT: Once = Once::new();
    extern "C" fn remove_files() {
        let files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
        for path in files.iter() {
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                let _ = std::fs::remove_file(file);
            }
        }
    }
    // SAFETY: `remove_files` is an `extern "C" fn()` that neither panics nor unwinds.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(remove_files);
    });
    let path = std::env::temp_dir().join(format!("{}.db", unique_name(prefix)));
    FILES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(path.clone());
    path
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
    let schema = unique_name("idem_redis_t");
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

/// Applications logged: `(all, distinct)`.
pub async fn applied<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> (i64, i64)
where
    for<'r> (i64, i64): sqlx::FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM applied")
        .fetch_one(&mut *pool.acquire().await.unwrap())
        .await
        .unwrap()
}

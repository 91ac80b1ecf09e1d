//! The local NATS server and real databases for the JetStream tests: a stream, a durable pull
//! consumer and a dead-letter stream with names of their own per test, deleted after; a fresh
//! SQLite file or PostgreSQL schema; order events and their `#[idempotent]` handlers.
#![allow(dead_code)] // each test binary uses a part of this module

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::nats::async_nats::{self, jetstream, HeaderMap};
use idem::{idempotent, Tx};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, Postgres, Sqlite, SqlitePool};

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

/// The server the tests use: `IDEM_NATS_URL`, default the local server.
pub fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

/// A client of the local NATS server; `None`, saying why, when none answers (a failure in CI).
pub async fn connect() -> Option<async_nats::Client> {
    let url = nats_url();
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
    let connected = tokio::time::timeout(Duration::from_secs(3), options.connect(&url)).await;
    match connected {
        Ok(Ok(client)) => Some(client),
        outcome => {
            let why = match outcome {
                Ok(Err(err)) => err.to_string(),
                _ => "no answer within 3 s".to_string(),
            };
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the NATS tests, but {url} did not answer: {why}");
            }
            eprintln!(
                "skipped: no NATS server at {url} ({why}); set IDEM_NATS_URL to run this test"
            );
            None
        }
    }
}

/// A stream, its durable pull consumer, and a dead-letter stream, all named for one test.
pub struct Fixture {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub stream: String,
    pub consumer: String,
    /// The stream's subjects are `<prefix>.>`.
    pub prefix: String,
    pub dead_letter_stream: String,
    pub dead_letter_subject: String,
}

/// The JetStream consumer's settings a test picks.
#[derive(Clone, Copy)]
pub struct Settings {
    pub ack_wait: Duration,
    pub max_deliver: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ack_wait: Duration::from_secs(5),
            max_deliver: -1,
        }
    }
}

/// Creates a stream, trying again while the server answers "error creating store for stream"
/// (10049). nats-server 2.9 (Debian's) removes the account's store folder when its last stream is
/// deleted; a stream created by a parallel test at that moment fails to make its folder (the
/// server logs "mkdir …/jetstream/$G/streams: no such file or directory"). A later attempt
/// makes the folder again.
async fn create_stream(js: &jetstream::Context, config: jetstream::stream::Config) {
    let mut attempt = 1;
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return,
            Err(err) if attempt < 5 && store_not_created(&err) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("creating stream {}: {err}", config.name),
        }
    }
}

/// Whether a stream's creation failed on the server's store ("error creating store for
/// stream", JetStream error code 10049).
fn store_not_created(err: &jetstream::context::CreateStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::CreateStreamErrorKind::JetStream(js)
            if js.error_code() == jetstream::ErrorCode::STREAM_CREATE
    )
}

impl Fixture {
    pub async fn new(client: async_nats::Client, settings: Settings) -> Fixture {
        let js = jetstream::new(client.clone());
        delete_stale_streams(&js).await;
        let stream = unique_name("IDEM_T").to_uppercase();
        let prefix = stream.to_lowercase().replace('_', "-");
        let consumer = "workers".to_string();
        let dead_letter_stream = format!("{stream}_DLQ");
        let dead_letter_subject = format!("idem-dlq.{prefix}");
        create_stream(
            &js,
            jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                ..Default::default()
            },
        )
        .await;
        create_stream(
            &js,
            jetstream::stream::Config {
                name: dead_letter_stream.clone(),
                subjects: vec![dead_letter_subject.clone()],
                ..Default::default()
            },
        )
        .await;
        js.create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some(consumer.clone()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: settings.ack_wait,
                max_deliver: settings.max_deliver,
                max_ack_pending: 10_000,
                ..Default::default()
            },
            stream.as_str(),
        )
        .await
        .unwrap();
        Fixture {
            client,
            js,
            stream,
            consumer,
            prefix,
            dead_letter_stream,
            dead_letter_subject,
        }
    }

    /// The fixture a test created with the stream `stream` (for a child process).
    pub fn attach(client: async_nats::Client, stream: &str) -> Fixture {
        let prefix = stream.to_lowercase().replace('_', "-");
        Fixture {
            js: jetstream::new(client.clone()),
            client,
            stream: stream.to_string(),
            consumer: "workers".to_string(),
            dead_letter_stream: format!("{stream}_DLQ"),
            dead_letter_subject: format!("idem-dlq.{prefix}"),
            prefix,
        }
    }

    /// The source idem reads, with the test's dead-letter subject.
    pub fn source(&self) -> idem::nats::SourceBuilder {
        idem::nats::Source::builder(nats_url(), &self.stream, &self.consumer)
            .dead_letters(&self.dead_letter_subject)
    }

    /// Publishes `payload` on `<prefix>.<subject>` and waits for the stream's ack;
    /// `msg_id` sets `Nats-Msg-Id`.
    pub async fn publish(&self, subject: &str, payload: Vec<u8>, msg_id: Option<&str>) {
        let mut publish = jetstream::message::PublishMessage::build().payload(payload.into());
        if let Some(id) = msg_id {
            publish = publish.message_id(id);
        }
        self.js
            .send_publish(format!("{}.{subject}", self.prefix), publish)
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Publishes events as JSON without waiting for each ack in turn (then all acks).
    pub async fn publish_all(&self, events: &[OrderEvent]) {
        let mut acks = Vec::with_capacity(events.len());
        for event in events {
            let ack = self
                .js
                .publish(
                    format!("{}.order.{}", self.prefix, event.order),
                    serde_json::to_vec(event).unwrap().into(),
                )
                .await
                .unwrap();
            acks.push(ack);
            if acks.len() >= 256 {
                for ack in acks.drain(..) {
                    ack.await.unwrap();
                }
            }
        }
        for ack in acks {
            ack.await.unwrap();
        }
    }

    /// The consumer's `(num_pending, num_ack_pending, num_redelivered)`.
    pub async fn state(&self) -> (u64, usize, usize) {
        let mut consumer: jetstream::consumer::PullConsumer = self
            .js
            .get_consumer_from_stream(&self.consumer, &self.stream)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        (info.num_pending, info.num_ack_pending, info.num_redelivered)
    }

    /// Completes once the consumer has nothing pending and nothing unacked (a shutdown signal
    /// for "everything was settled").
    pub async fn settled(&self) {
        loop {
            let (pending, ack_pending, _) = self.state().await;
            if pending == 0 && ack_pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `limit` for the consumer to show nothing pending and nothing unacked.
    pub async fn assert_settled_within(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            let (pending, ack_pending, _) = self.state().await;
            if pending == 0 && ack_pending == 0 {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "after {limit:?}: num_pending {pending}, num_ack_pending {ack_pending}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The dead letters stored in the dead-letter stream: headers and payload.
    pub async fn dead_letters(&self) -> Vec<(HeaderMap, Vec<u8>)> {
        let mut stream = self.js.get_stream(&self.dead_letter_stream).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut letters = Vec::new();
        for seq in 1..=last {
            if let Ok(message) = stream.get_raw_message(seq).await {
                letters.push((message.headers, message.payload.to_vec()));
            }
        }
        letters
    }

    /// Deletes the streams (and with them the consumer).
    pub async fn delete(self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self.js.delete_stream(&self.dead_letter_stream).await;
    }
}

/// A header's value as text.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
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

macro_rules! handlers {
    ($db:ty, $module:ident, $upsert:literal, $log:literal) => {
        pub mod $module {
            use super::*;

            /// Sets the order's status, and logs the event's application.
            #[idempotent(
                key = "msg.id",
                version = "msg.version",
                entity = "msg.order",
                scope = "nats_tests::order_status"
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

            /// The same in lease mode (the body runs outside the claim's transaction).
            #[idempotent(
                key = "msg.id",
                scope = "nats_tests::leased",
                mode = "lease",
                lease = "30s"
            )]
            pub async fn leased(tx: &mut Tx<'_, $db>, msg: &OrderEvent) -> Result<(), String> {
                if msg.sleep_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(msg.sleep_ms)).await;
                }
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

/// A fresh SQLite database in a new file, deleted when the process exits ([`temp_db`]).
pub async fn sqlite() -> SqlitePool {
    sqlite_file(&temp_db("idem_nats")).await
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
    let schema = unique_name("idem_nats_t");
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
pub async fn orders_sqlite(pool: &SqlitePool) -> Vec<(i64, String, i64)> {
    sqlx::query_as("SELECT id, status, version FROM orders ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Event ids applied more than once (must be none).
pub async fn applied_twice_sqlite(pool: &SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM applied GROUP BY id HAVING COUNT(*) > 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// How many applications are logged.
pub async fn applied_sqlite(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A TCP proxy to the NATS server that a test can cut: every connection through it is closed
/// and no new one is accepted (a network cut, as the client sees it).
pub struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    pub async fn start() -> Proxy {
        let upstream = nats_url()
            .trim_start_matches("nats://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut stop = cut_rx.clone();
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stop.wait_for(|c| *c) => return,
                };
                let Ok((mut inbound, _)) = accepted else {
                    return;
                };
                let upstream = upstream.clone();
                let mut stop = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = stop.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { port, cut }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

/// Deletes test streams that runs which stopped early (a failed assertion, a killed process)
/// left behind, once per process: those older than an hour, by the time in their name.
async fn delete_stale_streams(js: &jetstream::Context) {
    use futures_util::TryStreamExt as _;
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let Ok(names) = js.stream_names().try_collect::<Vec<String>>().await else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for name in names {
        // IDEM_T_<pid>_<nanos>_<n>, and its _DLQ.
        let Some(rest) = name.strip_prefix("IDEM_T_") else {
            continue;
        };
        let nanos = rest.split('_').nth(1).and_then(|n| n.parse::<u128>().ok());
        if nanos.is_some_and(|t| now.saturating_sub(t) > 3_600 * 1_000_000_000) {
            let _ = js.delete_stream(&name).await;
        }
    }
}

//! What every case needs: a database of its own on each backend, the payments app behind an
//! `IdempotencyLayer`, a real server on a local port and a real client.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::http::{IdempotencyLayer, RequestTx};
use idem::store::{Leases, Stamps};
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tokio::sync::Notify;

/// A backend under test: a fresh database, its business table, and the insert of a payment.
pub trait TestDb: Stamps + Leases {
    /// A new database of this test's own, migrated, with the payments table; `None` (having
    /// said why) without a server.
    fn setup() -> impl Future<Output = Option<Pool<Self>>> + Send;
    /// Deletes it.
    fn teardown(pool: Pool<Self>) -> impl Future<Output = ()> + Send;
    /// `CREATE TABLE payments (id, client, amount)`.
    const CREATE: &'static str;
    /// Inserts one payment.
    fn insert<'c>(
        conn: &'c mut Self::Connection,
        id: &'c str,
        client: &'c str,
        amount: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;
    /// `SELECT COUNT(*) ...`, with one text parameter or none.
    fn count<'a>(
        pool: &'a Pool<Self>,
        sql: &'static str,
        bind: Option<&'a str>,
    ) -> impl Future<Output = i64> + Send + 'a;
}

/// What every backend's [`TestDb`] has alike: its table, the insert and the count.
macro_rules! shared {
    ($create:literal, $insert:literal) => {
        const CREATE: &'static str = $create;

        async fn insert(
            conn: &mut Self::Connection,
            id: &str,
            client: &str,
            amount: i64,
        ) -> Result<(), sqlx::Error> {
            sqlx::query($insert)
                .bind(id)
                .bind(client)
                .bind(amount)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn count(pool: &Pool<Self>, sql: &'static str, bind: Option<&str>) -> i64 {
            let query = sqlx::query_scalar::<_, i64>(sql);
            let query = match bind {
                Some(value) => query.bind(value),
                None => query,
            };
            query.fetch_one(pool).await.unwrap()
        }
    };
}

/// [`TestDb`] for a database the kit opens (`idem_testkit::backends`).
macro_rules! kit_db {
    ($db:ty, $kit:ty, $insert:literal) => {
        impl TestDb for $db {
            shared!(
                "CREATE TABLE payments (id TEXT PRIMARY KEY, client TEXT NOT NULL, amount BIGINT NOT NULL)",
                $insert
            );

            async fn setup() -> Option<Pool<Self>> {
                use idem_testkit::Backend as _;
                let pool = <$kit>::setup().await?;
                sqlx::query(Self::CREATE).execute(&pool).await.unwrap();
                Some(pool)
            }

            async fn teardown(pool: Pool<Self>) {
                use idem_testkit::Backend as _;
                <$kit>::teardown(pool).await
            }
        }
    };
}

kit_db!(
    sqlx::Sqlite,
    idem_testkit::backends::Sqlite,
    "INSERT INTO payments (id, client, amount) VALUES (?, ?, ?)"
);
kit_db!(
    sqlx::Postgres,
    idem_testkit::backends::Postgres,
    "INSERT INTO payments (id, client, amount) VALUES ($1, $2, $3)"
);

impl TestDb for sqlx::MySql {
    shared!(
        "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY, client VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
        "INSERT INTO payments (id, client, amount) VALUES (?, ?, ?)"
    );
    async fn setup() -> Option<Pool<Self>> {
        let url = std::env::var("IDEM_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string());
        let admin = match sqlx::MySqlPool::connect(&url).await {
            Ok(admin) => admin,
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: no MySQL/MariaDB at {url} ({err}); set IDEM_MYSQL_URL to run this test");
                return None;
            }
            Err(err) => panic!("CI must run the MySQL tests, but {url} did not answer: {err}"),
        };
        let database = idem_testkit::backends::unique_name("idem_http");
        // The name is a constant prefix and numbers.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(20)
            .connect_with(options.database(&database))
            .await
            .unwrap();
        idem::migrate(&pool).await.unwrap();
        sqlx::query(Self::CREATE).execute(&pool).await.unwrap();
        Some(pool)
    }
    async fn teardown(pool: Pool<Self>) {
        let database: String = sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
            .fetch_one(&pool)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
}

/// Runs `case` on a fresh database of `DB` with the payments table, then deletes it.
pub async fn with_db<DB: TestDb>(case: impl AsyncFnOnce(Pool<DB>)) {
    let Some(pool) = DB::setup().await else {
        return;
    };
    case(pool.clone()).await;
    DB::teardown(pool).await;
}

/// Generates one `#[tokio::test]` per backend for each generic case (a server's tests are
/// ignored, with the reason, where its variable is not set: see build.rs).
macro_rules! on_every_db {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    $crate::support::with_db::<sqlx::Sqlite>(super::$case).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                #[cfg_attr(idem_no_postgres, ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run")]
                async fn $case() {
                    $crate::support::with_db::<sqlx::Postgres>(super::$case).await
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                #[cfg_attr(idem_no_mysql, ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run")]
                async fn $case() {
                    $crate::support::with_db::<sqlx::MySql>(super::$case).await
                }
            )*
        }
    };
}
pub(crate) use on_every_db;

/// What a create-payment request carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Create {
    /// Cents.
    pub amount: i64,
}

/// What the endpoint answers: the payment's new id (different on every run of the handler).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payment {
    pub id: String,
    pub client: String,
    pub amount: i64,
}

/// Switches and gates the cases use to steer the handlers.
#[derive(Default)]
pub struct Steer {
    /// The next run of `/payments` answers 500 after writing.
    pub fail_next: AtomicBool,
    /// `/slow` waits for this before answering.
    pub release: Notify,
    /// `/slow` runs that have started.
    pub started: AtomicU64,
    /// Runs of any handler.
    pub runs: AtomicU64,
}

/// A payment id: unique per run of the handler.
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "pay-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The client a request names in `x-client` (the tests' stand-in for authentication).
pub fn client(parts: &axum::http::request::Parts) -> Option<String> {
    Some(parts.headers.get("x-client")?.to_str().ok()?.to_owned())
}

fn client_of(headers: &HeaderMap) -> String {
    headers["x-client"].to_str().unwrap().to_owned()
}

/// `POST /payments`: inserts a payment and answers 201 with it (or 500 when steered to fail).
pub async fn create_route<DB: TestDb>(
    State(steer): State<Arc<Steer>>,
    headers: HeaderMap,
    mut tx: RequestTx<DB>,
    Json(create): Json<Create>,
) -> Response {
    steer.runs.fetch_add(1, Ordering::SeqCst);
    let payment = Payment {
        id: new_id(),
        client: client_of(&headers),
        amount: create.amount,
    };
    if let Err(err) = DB::insert(&mut tx, &payment.id, &payment.client, payment.amount).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
    }
    if headers.contains_key("x-hang") {
        // A handler that never answers: the crash cases kill its server meanwhile.
        std::future::pending::<()>().await;
    }
    if steer.fail_next.swap(false, Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the ledger is down").into_response();
    }
    let location = format!("/payments/{}", payment.id);
    (StatusCode::CREATED, [("location", location)], Json(payment)).into_response()
}

/// Writes, then declines: a 4xx answer with an effect (an audit row).
async fn declined<DB: TestDb>(
    State(steer): State<Arc<Steer>>,
    headers: HeaderMap,
    mut tx: RequestTx<DB>,
    Json(create): Json<Create>,
) -> Response {
    steer.runs.fetch_add(1, Ordering::SeqCst);
    if let Err(err) = DB::insert(&mut tx, &new_id(), &client_of(&headers), -create.amount).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
    }
    (StatusCode::PAYMENT_REQUIRED, "card declined").into_response()
}

/// Writes, then answers `amount` bytes.
async fn big<DB: TestDb>(
    State(steer): State<Arc<Steer>>,
    headers: HeaderMap,
    mut tx: RequestTx<DB>,
    Json(create): Json<Create>,
) -> Response {
    steer.runs.fetch_add(1, Ordering::SeqCst);
    if let Err(err) = DB::insert(&mut tx, &new_id(), &client_of(&headers), create.amount).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
    }
    "x".repeat(create.amount as usize).into_response()
}

/// Waits for `steer.release`, then writes and answers.
async fn slow<DB: TestDb>(
    State(steer): State<Arc<Steer>>,
    headers: HeaderMap,
    mut tx: RequestTx<DB>,
    Json(create): Json<Create>,
) -> Response {
    steer.runs.fetch_add(1, Ordering::SeqCst);
    // The wait first, as a call to a payment provider would be: on SQLite a write would hold
    // the database's one write lock until the commit, and every other request would wait on it.
    let released = steer.release.notified();
    steer.started.fetch_add(1, Ordering::SeqCst);
    released.await;
    let id = new_id();
    if let Err(err) = DB::insert(&mut tx, &id, &client_of(&headers), create.amount).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
    }
    (StatusCode::CREATED, id).into_response()
}

/// The payments app: `/payments` (transactional; `x-hang` makes it never answer),
/// `/payments-leased` (the same in lease mode, 2 s), `/optional` (key optional), `/declined`,
/// `/big` (stores at most 1 KiB), `/slow` (waits for `Steer::release`) and `/leased` (the same
/// in lease mode).
pub fn app<DB: TestDb>(pool: Pool<DB>, steer: Arc<Steer>) -> Router {
    let layer = |scope| IdempotencyLayer::new(pool.clone(), scope, client);
    Router::new()
        .route(
            "/payments",
            post(create_route::<DB>).layer(layer("test::payments")),
        )
        .route(
            "/optional",
            post(create_route::<DB>).layer(layer("test::optional").optional_key()),
        )
        .route(
            "/declined",
            post(declined::<DB>).layer(layer("test::declined")),
        )
        .route(
            "/big",
            post(big::<DB>).layer(layer("test::big").max_response_bytes(1024)),
        )
        .route("/slow", post(slow::<DB>).layer(layer("test::slow")))
        .route(
            "/payments-leased",
            post(create_route::<DB>)
                .layer(layer("test::payments-leased").lease(Duration::from_secs(2))),
        )
        .route(
            "/leased",
            post(slow::<DB>).layer(layer("test::leased").lease(Duration::from_secs(2))),
        )
        .with_state(steer)
}

/// A server on a local port, stopped on drop.
pub struct Server {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(app: Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Server { url, task }
    }
}

impl Server {
    /// A client of this server that names itself `who` (`x-client`).
    pub fn client(&self, who: &'static str) -> Client {
        Client::new(&self.url, who)
    }
}

/// A client of a test server: who it says it is (`x-client`) and where it sends.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    who: &'static str,
}

impl Client {
    /// A client of the server at `url` that names itself `who`.
    pub fn new(url: &str, who: &'static str) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            who,
        }
    }

    /// `POST {path}` with `key` (already quoted, as on the wire) and `body`.
    pub async fn post(&self, path: &str, key: Option<&str>, body: &str) -> Seen {
        post_as(&self.http, &self.url, path, self.who, key, body).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a client saw: status, the headers a test reads, body bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub status: u16,
    pub replayed: bool,
    pub location: Option<String>,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `POST {url}{path}` as `client` with `key` (already quoted, as on the wire) and `body`.
pub async fn post_as(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    client: &str,
    key: Option<&str>,
    body: &str,
) -> Seen {
    let mut request = http
        .post(format!("{url}{path}"))
        .header("x-client", client)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (status, replayed) = (
        response.status().as_u16(),
        header("idempotent-replayed").is_some(),
    );
    let (location, retry_after, content_type) = (
        header("location"),
        header("retry-after"),
        header("content-type"),
    );
    Seen {
        status,
        replayed,
        location,
        retry_after,
        content_type,
        body: response.bytes().await.unwrap().to_vec(),
    }
}

/// The payments in the database.
pub async fn payments<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "SELECT COUNT(*) FROM payments", None).await
}

/// The records idem keeps under `scope`.
pub async fn records<DB: TestDb>(pool: &Pool<DB>, scope: &str) -> i64 {
    let sql = if DB::NAME == "PostgreSQL" {
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1"
    } else {
        "SELECT COUNT(*) FROM idem_records WHERE scope = ?"
    };
    DB::count(pool, sql, Some(scope)).await
}

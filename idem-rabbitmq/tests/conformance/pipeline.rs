//! The outbox's pipeline end to end, with both services SIGKILLed at random: orders go to
//! RabbitMQ with copies and neighbours swapped; service A (a child process: a consumer of
//! orders whose `#[idempotent]` handler publishes a payment through the outbox, and the
//! outbox's relay beside it) and service B (a child process: a consumer of payments keyed on
//! the AMQP `message_id` the relay set) each run on a PostgreSQL schema of their own. The test
//! SIGKILLs A and B at random points of the stream (spread by their progress in the database,
//! one in four right after a restart) and restarts them. At the end B's accounts equal the
//! exactly-once oracle, no order or payment was applied twice, every outbox row was sent, and
//! every queue is empty.
//!
//! The children pace themselves (a few ms per delivery and per relay batch) until the test has
//! made every planned kill and creates a release file; then they go at full speed. So the kills
//! land mid-stream on a fast machine as on a slow one (the test asserts that they did).
//!
//! About 400 orders and 10 kills; `IDEM_SOAK=1` runs 4,000 orders and 30 kills.
//! `IDEM_PIPELINE_SEED` replays a run (the seed is printed). Needs `IDEM_POSTGRES_URL` and
//! `IDEM_RABBITMQ_URL` (defaults: the local servers); without them the test says why it did not
//! run (in CI, `CI` set, that is a failure).
//!
//! RabbitMQ's reliability test: the kit's rules check each adapter's consumer and outbox
//! publisher alone; this one runs a whole pipeline of two services through one broker. Its
//! databases are schemas of the kit's PostgreSQL backend.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem::rabbitmq::lapin::types::FieldTable;
use idem::rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use idem::rabbitmq::{OutboxPublisher, Source};
use idem::{idempotent, Context, Tx};
use idem_testkit::backends::Postgres as PostgresBackend;
use idem_testkit::broker::harness::unique_name;
use idem_testkit::Kit;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

/// Set in a service process: `a` or `b`.
const CHILD: &str = "IDEM_PIPELINE_CHILD";
/// Set in a service process: its PostgreSQL schema.
const CHILD_SCHEMA: &str = "IDEM_PIPELINE_SCHEMA";
/// Set in a service process: the queues' and the dead-letter exchange's names, `,`-joined.
const CHILD_NAMES: &str = "IDEM_PIPELINE_NAMES";
/// Set in a service process: the file whose existence ends the pacing.
const CHILD_RELEASE: &str = "IDEM_PIPELINE_RELEASE";

/// The wait per delivery (and per relay batch) until the release file exists.
const PACE: Duration = Duration::from_millis(12);

fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v != "0")
}

fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// What service A consumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: String,
    amount: i64,
}

/// What service A publishes through the outbox, and service B consumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    order_id: String,
    customer: String,
    amount: i64,
}

/// A payment as B's handler sees it: with the AMQP `message_id` the relay set.
#[derive(Debug, Deserialize)]
struct Incoming {
    message_id: String,
    payment: Payment,
}

/// Service A: records the order and publishes its payment in one transaction; the payment's
/// id derives from the scope, the order id and the label, so every run publishes the same id.
#[idempotent(key = "order.order_id", scope = "outbox_pipeline::a::on_order")]
async fn on_order(
    tx: &mut Tx<'_, Postgres>,
    order: &Order,
    ctx: &Context,
    payments: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO a_orders (order_id, customer, amount) VALUES ($1, $2, $3)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(order.amount)
        .execute(&mut **tx)
        .await?;
    let payment = Payment {
        order_id: order.order_id.clone(),
        customer: order.customer.clone(),
        amount: order.amount,
    };
    ctx.outgoing(payments)
        .partition_key(order.customer.clone())
        .label("payment")
        .publish(tx, &payment)
        .await?;
    Ok(())
}

/// Service B: credits the customer once per payment, deduplicated on the message id; every
/// application also leaves a ledger row (no unique constraint: a second one would show).
#[idempotent(key = "msg.message_id", scope = "outbox_pipeline::b::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Postgres>, msg: &Incoming) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO b_applied (message_id, order_id) VALUES ($1, $2)")
        .bind(&msg.message_id)
        .bind(&msg.payment.order_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO b_accounts (customer, payments, paid) VALUES ($1, 1, $2) \
         ON CONFLICT (customer) DO UPDATE SET payments = b_accounts.payments + 1, \
         paid = b_accounts.paid + excluded.paid",
    )
    .bind(&msg.payment.customer)
    .bind(msg.payment.amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The queues and the dead-letter exchange of one run.
#[derive(Debug, Clone)]
struct Names {
    orders: String,
    payments: String,
    dlx: String,
}

impl Names {
    fn new() -> Self {
        let run = unique_name("idem_pipeline");
        Names {
            orders: format!("{run}_orders"),
            payments: format!("{run}_payments"),
            dlx: format!("{run}_dlx"),
        }
    }

    fn joined(&self) -> String {
        [&self.orders, &self.payments, &self.dlx]
            .map(String::as_str)
            .join(",")
    }

    fn split(joined: &str) -> Self {
        let mut parts = joined.split(',').map(str::to_string);
        let mut next = || parts.next().expect("three names");
        Names {
            orders: next(),
            payments: next(),
            dlx: next(),
        }
    }

    fn dead(queue: &str) -> String {
        format!("{queue}.dead")
    }

    fn queues(&self) -> [String; 4] {
        [
            self.orders.clone(),
            self.payments.clone(),
            Names::dead(&self.orders),
            Names::dead(&self.payments),
        ]
    }
}

/// Waits [`PACE`] unless the release file exists.
async fn pace(release: &Path) {
    if !release.exists() {
        tokio::time::sleep(PACE).await;
    }
}

/// A relay publisher that goes at the test's pace until the release.
struct Paced {
    inner: OutboxPublisher,
    release: PathBuf,
}

impl Publisher for Paced {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        pace(&self.release).await;
        self.inner.publish(batch).await
    }
}

/// A payment delivery whose payload, for B's handler, carries the AMQP `message_id` beside
/// the payment (idem's loop decodes the payload alone).
struct WithId {
    inner: idem::rabbitmq::Delivery,
    payload: Vec<u8>,
}

impl WithId {
    fn new(inner: idem::rabbitmq::Delivery) -> Self {
        let message = inner.message();
        let id = message
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let payment: serde_json::Value =
            serde_json::from_slice(&message.data).unwrap_or(serde_json::Value::Null);
        let payload =
            serde_json::to_vec(&serde_json::json!({ "message_id": id, "payment": payment }))
                .unwrap_or_default();
        WithId { inner, payload }
    }
}

impl Delivery for WithId {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn headers(&self) -> Vec<(String, String)> {
        self.inner.headers()
    }
    fn origin(&self) -> idem::recover::Origin {
        self.inner.origin()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.inner.settle(settle).await
    }
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        idem::rabbitmq::Delivery::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await
    }
}

/// A service process, run by the test (ignored otherwise). With `IDEM_PIPELINE_CHILD` set it
/// runs service A (consumer and relay) or B until its stdin closes (then shuts down
/// gracefully), or until it is killed.
#[test]
#[ignore = "a service process of the pipeline test, which runs it"]
fn service_child() {
    let Ok(service) = std::env::var(CHILD) else {
        eprintln!("not a test: a service process of the pipeline test");
        return;
    };
    let schema = std::env::var(CHILD_SCHEMA).unwrap();
    let names = Names::split(&std::env::var(CHILD_NAMES).unwrap());
    let release = PathBuf::from(std::env::var(CHILD_RELEASE).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::task::spawn_blocking(move || {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            let _ = stop.send(true);
        });
        let shutdown = || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let options: sqlx::postgres::PgConnectOptions = PostgresBackend::url().parse().unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.options([("search_path", schema.as_str())]))
            .await
            .unwrap();
        let url = rabbit_url();
        match service.as_str() {
            "a" => {
                let orders = Source::builder(&url, names.orders.as_str())
                    .prefetch(20)
                    .dead_letters(names.dlx.as_str())
                    .connect()
                    .await
                    .unwrap();
                let paced = orders.deliveries().then(|d| {
                    let release = release.clone();
                    async move {
                        pace(&release).await;
                        d
                    }
                });
                let payments = names.payments.as_str();
                let relay = Relay::new(
                    pool.clone(),
                    Paced {
                        inner: OutboxPublisher::builder(&url).connect().await.unwrap(),
                        release: release.clone(),
                    },
                )
                .batch(10)
                .idle(Duration::from_millis(5), Duration::from_millis(50))
                .retry(Duration::from_millis(50), Duration::from_secs(1));
                let (counts, stats) = tokio::join!(
                    consumer(pool.clone()).run(
                        Box::pin(paced),
                        json::<Order>,
                        async |batch, order| on_order(batch, order, payments).await,
                        shutdown(),
                    ),
                    relay.run(shutdown())
                );
                orders.close().await.unwrap();
                println!("A: {counts:?}; relay: {stats:?}");
            }
            "b" => {
                let payments = Source::builder(&url, names.payments.as_str())
                    .prefetch(20)
                    .dead_letters(names.dlx.as_str())
                    .connect()
                    .await
                    .unwrap();
                let paced = payments.deliveries().then(|d| {
                    let release = release.clone();
                    async move {
                        pace(&release).await;
                        d.map(WithId::new)
                    }
                });
                let counts = consumer(pool.clone())
                    .run(
                        Box::pin(paced),
                        json::<Incoming>,
                        async |batch, msg| on_payment(batch, msg).await,
                        shutdown(),
                    )
                    .await;
                payments.close().await.unwrap();
                println!("B: {counts:?}");
            }
            other => panic!("unknown service {other}"),
        }
        pool.close().await;
    });
}

fn consumer(pool: PgPool) -> Consumer<Postgres> {
    Consumer::new(pool)
        .batch(10)
        .concurrency(2)
        .retry_delay(Duration::from_millis(10), Duration::from_millis(100))
}

/// One service process of the run.
struct Service {
    name: &'static str,
    schema: String,
    child: Child,
}

impl Service {
    fn spawn(name: &'static str, schema: &str, names: &Names, release: &Path) -> Self {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "pipeline::service_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, name)
            .env(CHILD_SCHEMA, schema)
            .env(CHILD_NAMES, names.joined())
            .env(CHILD_RELEASE, release)
            .env("IDEM_POSTGRES_URL", PostgresBackend::url())
            .env("IDEM_RABBITMQ_URL", rabbit_url())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Service {
            name,
            schema: schema.to_string(),
            child,
        }
    }

    /// SIGKILLs the process (it must still be running) and starts it again.
    fn kill_and_restart(&mut self, names: &Names, release: &Path) {
        self.child.kill().unwrap(); // SIGKILL
        let status = self.child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "service {} died by itself: {status}",
            self.name
        );
        *self = Service::spawn(self.name, &self.schema, names, release);
    }

    /// Closes its stdin and waits for a clean exit.
    fn shut_down(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "service {} did not shut down cleanly: {status}",
            self.name
        );
    }
}

/// The customers' accounts, and what is published to A: about 30% copies and 15% of
/// neighbours swapped.
fn generate(seed: u64, n: usize) -> (Vec<Order>, Vec<Order>) {
    const CUSTOMERS: [&str; 7] = ["ada", "brian", "chen", "dagny", "emeka", "farah", "gus"];
    let mut rng = StdRng::seed_from_u64(seed);
    let orders: Vec<Order> = (0..n)
        .map(|i| Order {
            order_id: format!("order-{i}"),
            customer: CUSTOMERS[rng.random_range(0..CUSTOMERS.len())].to_string(),
            amount: rng.random_range(5..100),
        })
        .collect();
    let mut published = Vec::new();
    for order in &orders {
        published.push(order.clone());
        if rng.random_ratio(3, 10) {
            let back = rng.random_range(0..published.len().min(8));
            published.insert(published.len() - back, order.clone());
        }
    }
    for i in 1..published.len() {
        if rng.random_ratio(15, 100) {
            published.swap(i - 1, i);
        }
    }
    (orders, published)
}

async fn declare(channel: &Channel, names: &Names) {
    for queue in names.queues() {
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
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
        .await
        .unwrap();
    for queue in [&names.orders, &names.payments] {
        channel
            .queue_bind(
                Names::dead(queue).as_str().into(),
                names.dlx.as_str().into(),
                queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
}

async fn delete(channel: &Channel, names: &Names) {
    for queue in names.queues() {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    channel
        .exchange_delete(names.dlx.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
}

/// Messages ready in `queue` (unacked ones not counted).
async fn ready(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count()
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A's progress: orders applied. B's: payments applied.
async fn progress(service: &str, a: &PgPool, b: &PgPool) -> i64 {
    match service {
        "a" => count(a, "SELECT COUNT(*) FROM a_orders").await,
        _ => count(b, "SELECT COUNT(*) FROM b_applied").await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    any(idem_no_rabbitmq, idem_no_postgres),
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) and \
              IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn both_services_sigkilled_at_random_and_b_equals_the_oracle() {
    let url = rabbit_url();
    let admin = match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(admin) => admin,
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "skipped: no RabbitMQ at {url} ({err}); set IDEM_RABBITMQ_URL to run this test"
            );
            return;
        }
        Err(err) => panic!("CI must run the RabbitMQ tests, but {url} did not answer: {err}"),
    };
    let Some(kit_a) = Kit::<PostgresBackend>::open().await else {
        return;
    };
    let kit_b = Kit::<PostgresBackend>::open()
        .await
        .expect("PostgreSQL, as for A");
    let (a, b) = (kit_a.pool.clone(), kit_b.pool.clone());
    let schema = |pool: PgPool| async move {
        sqlx::query_scalar::<_, String>("SELECT current_schema()")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let (schema_a, schema_b) = (schema(a.clone()).await, schema(b.clone()).await);
    sqlx::query(
        "CREATE TABLE a_orders (order_id TEXT NOT NULL, customer TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .execute(&a)
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE b_applied (message_id TEXT NOT NULL, order_id TEXT NOT NULL); \
         CREATE TABLE b_accounts (customer TEXT PRIMARY KEY, payments BIGINT NOT NULL, paid BIGINT NOT NULL)",
    )
    .execute(&b)
    .await
    .unwrap();

    let channel = admin.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let names = Names::new();
    declare(&channel, &names).await;
    let release = std::env::temp_dir().join(format!("{}.release", names.orders));

    let (unique, kills) = if soak() { (4_000, 30) } else { (400, 10) };
    let seed = std::env::var("IDEM_PIPELINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("seed: IDEM_PIPELINE_SEED={seed}");
    let (orders, published) = generate(seed, unique);
    for order in &published {
        channel
            .basic_publish(
                "".into(),
                names.orders.as_str().into(),
                BasicPublishOptions::default(),
                &serde_json::to_vec(order).unwrap(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let started = Instant::now();

    // The kill plan: a victim each, at a point of its progress (sorted, under three quarters
    // of the stream, so the kills spread over it); one in four right after the last restart.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0b0c);
    let mut points: Vec<i64> = (0..kills)
        .map(|_| rng.random_range(0..unique as i64 * 3 / 4))
        .collect();
    points.sort_unstable();
    let mut services = [
        Service::spawn("a", &schema_a, &names, &release),
        Service::spawn("b", &schema_b, &names, &release),
    ];
    let deadline = Instant::now() + Duration::from_secs(if soak() { 1_200 } else { 300 });
    let mut killed = [0_u32; 2];
    for point in points {
        let victim = rng.random_range(0..2);
        let name = services[victim].name;
        if rng.random_ratio(1, 4) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
        } else {
            while progress(name, &a, &b).await < point {
                assert!(
                    Instant::now() < deadline,
                    "no progress of {name} before kill {}",
                    killed[0] + killed[1]
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_micros(rng.random_range(0..5_000))).await;
        }
        // Mid-stream: the paced services cannot have finished.
        let done = progress(name, &a, &b).await;
        assert!(
            done < unique as i64,
            "service {name} had finished before its kill"
        );
        services[victim].kill_and_restart(&names, &release);
        killed[victim] += 1;
    }
    let at_release = (progress("a", &a, &b).await, progress("b", &a, &b).await);
    std::fs::write(&release, b"").unwrap();
    eprintln!(
        "{} kills of A, {} of B, then released at A {} / B {} of {unique} orders",
        killed[0], killed[1], at_release.0, at_release.1
    );

    // Then let them finish: every payment applied at B, the outbox sent, both queues empty of
    // ready messages, for a moment.
    let mut quiet_since: Option<Instant> = None;
    loop {
        assert!(Instant::now() < deadline, "the services did not finish");
        let done = progress("b", &a, &b).await >= unique as i64
            && count(&a, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL").await == 0
            && ready(&channel, &names.orders).await == 0
            && ready(&channel, &names.payments).await == 0;
        match (done, quiet_since) {
            (true, Some(since)) if since.elapsed() > Duration::from_millis(1_500) => break,
            (true, None) => quiet_since = Some(Instant::now()),
            (false, _) => quiet_since = None,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for service in services {
        service.shut_down();
    }
    eprintln!(
        "{} orders ({} published), {} kills, in {:?}",
        unique,
        published.len(),
        killed[0] + killed[1],
        started.elapsed()
    );

    // B's state equals the oracle: each order's payment credited exactly once.
    let mut oracle: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for order in &orders {
        let account = oracle.entry(order.customer.clone()).or_default();
        account.0 += 1;
        account.1 += order.amount;
    }
    let accounts: BTreeMap<String, (i64, i64)> =
        sqlx::query_as::<_, (String, i64, i64)>("SELECT customer, payments, paid FROM b_accounts")
            .fetch_all(&b)
            .await
            .unwrap()
            .into_iter()
            .map(|(customer, n, paid)| (customer, (n, paid)))
            .collect();
    assert_eq!(accounts, oracle, "B's accounts differ from the oracle");
    // Nothing applied twice, at A or at B; every order's payment at B.
    let twice: Vec<String> =
        sqlx::query_scalar("SELECT order_id FROM b_applied GROUP BY order_id HAVING COUNT(*) > 1")
            .fetch_all(&b)
            .await
            .unwrap();
    assert!(twice.is_empty(), "B applied twice: {twice:?}");
    let applied: HashSet<String> = sqlx::query_scalar("SELECT order_id FROM b_applied")
        .fetch_all(&b)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(applied.len(), unique);
    assert!(orders.iter().all(|o| applied.contains(&o.order_id)));
    let twice: Vec<String> =
        sqlx::query_scalar("SELECT order_id FROM a_orders GROUP BY order_id HAVING COUNT(*) > 1")
            .fetch_all(&a)
            .await
            .unwrap();
    assert!(twice.is_empty(), "A applied twice: {twice:?}");
    assert_eq!(
        count(&a, "SELECT COUNT(*) FROM a_orders").await,
        unique as i64
    );
    // Every outbox row sent: one per order (a rerun of A's handler wrote the same id).
    assert_eq!(
        count(&a, "SELECT COUNT(*) FROM idem_outbox").await,
        unique as i64
    );
    assert_eq!(
        count(&a, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL").await,
        0
    );
    // B applied under the outbox's ids, one record per message id.
    assert_eq!(
        count(&b, "SELECT COUNT(*) FROM idem_records").await,
        unique as i64
    );
    let outbox_ids: HashSet<String> = sqlx::query_scalar("SELECT id FROM idem_outbox")
        .fetch_all(&a)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let applied_ids: HashSet<String> = sqlx::query_scalar("SELECT message_id FROM b_applied")
        .fetch_all(&b)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(
        applied_ids, outbox_ids,
        "B applied the outbox's ids, each once"
    );
    // Every queue empty once both shut down (nothing unacked left behind), nothing dead.
    for queue in names.queues() {
        assert_eq!(ready(&channel, &queue).await, 0, "{queue} is not empty");
    }

    delete(&channel, &names).await;
    let _ = std::fs::remove_file(&release);
    let _ = admin.close(200, "OK".into()).await;
    kit_a.close().await;
    kit_b.close().await;
}

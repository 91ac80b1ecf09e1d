//! The outbox end to end on PostgreSQL and RabbitMQ: what reaches the broker, and when.
//!
//! - A handler that publishes and then fails leaves nothing on the broker; one that commits
//!   is published once, with its derived id as AMQP `message_id`.
//! - A relay SIGKILLed between the commit and the publish (a child process): after a restart
//!   each committed message is published once.
//! - A relay SIGKILLed after the broker confirmed but before the rows were marked: the
//!   messages are published again with the same ids, and a downstream `#[idempotent]`
//!   consumer keyed on `message_id` applies each once.
//! - Two relays on one database, 2,000 rows over 100 keys (10,000 with `IDEM_SOAK=1`): every
//!   row published once, no key in two relays' publishes at the same time, and per-key order
//!   kept at the broker.
//!
//! Needs `IDEM_POSTGRES_URL` and `IDEM_RABBITMQ_URL` (defaults: the local servers); without
//! them each test says why it did not run (in CI, `CI` set, that is a failure).

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::rabbitmq::lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use idem::rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem::rabbitmq::lapin::{Channel, Connection, ConnectionProperties};
use idem::rabbitmq::{headers, OutboxPublisher};
use idem::{idempotent, Context, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

/// Set in a relay child process: when it SIGKILLs itself (`before-publish`, `after-confirm`).
const CHILD: &str = "IDEM_OUTBOX_CHILD";
/// Set in a relay child process: the PostgreSQL schema of the test's database.
const CHILD_SCHEMA: &str = "IDEM_OUTBOX_SCHEMA";

fn rabbit_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// A broker channel, or `None` with a line saying why (a failure in CI).
async fn rabbit() -> Option<(Connection, Channel)> {
    let url = rabbit_url();
    match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(connection) => {
            let channel = connection.create_channel().await.unwrap();
            Some((connection, channel))
        }
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "skipped: no RabbitMQ at {url} ({err}); set IDEM_RABBITMQ_URL to run this test"
            );
            None
        }
        Err(err) => panic!("CI must run the RabbitMQ tests, but {url} did not answer: {err}"),
    }
}

/// PostgreSQL and RabbitMQ, with a fresh schema and a fresh queue, or `None` (said why).
async fn servers() -> Option<(PgPool, Connection, Channel, String)> {
    let (connection, channel) = rabbit().await?;
    let pool = common::postgres().await?;
    let queue = common::unique_name("idem_outbox");
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    Some((pool, connection, channel, queue))
}

async fn cleanup(pool: PgPool, connection: Connection, channel: Channel, queue: &str) {
    channel
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = connection.close(200, "OK".into()).await;
    common::drop_postgres(pool).await;
}

/// A message as it arrived at the broker.
#[derive(Debug, Clone)]
struct Arrived {
    message_id: String,
    partition_key: Option<String>,
    payload: serde_json::Value,
}

/// Everything in `queue`, in arrival order (acked: the queue is empty afterwards).
async fn drain(channel: &Channel, queue: &str) -> Vec<Arrived> {
    let mut arrived = Vec::new();
    while let Some(got) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let properties = &got.delivery.properties;
        let header = |name: &str| {
            properties
                .headers()
                .as_ref()
                .and_then(|table| match table.inner().get(name) {
                    Some(AMQPValue::LongString(s)) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                })
        };
        let partition_key = header(headers::PARTITION_KEY);
        let message_id = properties.message_id().as_ref().unwrap().to_string();
        // The id is both the AMQP property and idem's header.
        assert_eq!(
            header(headers::MESSAGE_ID).as_deref(),
            Some(message_id.as_str())
        );
        arrived.push(Arrived {
            message_id,
            partition_key,
            payload: serde_json::from_slice(&got.delivery.data).unwrap(),
        });
    }
    arrived
}

/// Runs relay passes until one publishes nothing.
async fn relay_until_idle<P: Publisher>(relay: &mut Relay<Postgres, P>) -> usize {
    let mut total = 0;
    loop {
        let n = relay.step().await.unwrap();
        if n == 0 {
            return total;
        }
        total += n;
    }
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// What service A publishes for an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    order: String,
    n: i64,
}

/// An incoming order, for service A.
#[derive(Debug, Clone)]
struct Order {
    id: String,
    /// The partition key: a customer's payments stay in order.
    customer: String,
    queue: String,
    fail: bool,
}

#[idempotent(key = "msg.id", scope = "outbox_rabbitmq::on_order")]
async fn on_order(
    tx: &mut Tx<'_, Postgres>,
    msg: &Order,
    ctx: &Context,
) -> Result<String, sqlx::Error> {
    let payment = Payment {
        order: msg.id.clone(),
        n: 1,
    };
    let id = ctx
        .outgoing(&msg.queue)
        .partition_key(msg.customer.clone())
        .publish(tx, &payment)
        .await?;
    if msg.fail {
        return Err(sqlx::Error::Protocol(
            "the handler failed after publishing".into(),
        ));
    }
    Ok(id)
}

/// A payment as service B receives it: its message id is the idempotency key.
struct Received {
    message_id: String,
    payment: Payment,
}

#[idempotent(key = "msg.message_id", scope = "outbox_rabbitmq::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Postgres>, msg: &Received) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO applied (order_id, n) VALUES ($1, $2)")
        .bind(&msg.payment.order)
        .bind(msg.payment.n)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_rolled_back_handler_publishes_nothing_and_a_committed_one_once_with_its_id() {
    let Some((pool, connection, channel, queue)) = servers().await else {
        return;
    };
    let order = |fail| Order {
        id: "order-1".into(),
        customer: "ada".into(),
        queue: queue.clone(),
        fail,
    };
    assert!(on_order(&pool, &order(true)).await.is_err());
    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(rabbit_url())
            .connect()
            .await
            .unwrap(),
    );
    assert_eq!(relay_until_idle(&mut relay).await, 0);
    assert!(
        drain(&channel, &queue).await.is_empty(),
        "a rolled-back handler reached the broker"
    );

    let Outcome::Applied(id) = on_order(&pool, &order(false)).await.unwrap() else {
        panic!("applied")
    };
    assert_eq!(relay_until_idle(&mut relay).await, 1);
    let arrived = drain(&channel, &queue).await;
    assert_eq!(arrived.len(), 1);
    assert_eq!(arrived[0].message_id, id);
    assert_eq!(arrived[0].partition_key.as_deref(), Some("ada"));
    assert_eq!(
        arrived[0].payload,
        serde_json::json!({ "order": "order-1", "n": 1 })
    );
    let sent: Option<i64> = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idem_outbox WHERE id = $1 AND sent_at IS NOT NULL",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(sent, Some(1), "the row is marked sent after the confirm");

    // Retention: sent rows older than it are purged by the relay.
    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(rabbit_url())
            .connect()
            .await
            .unwrap(),
    )
    .retention(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(5)).await;
    relay.step().await.unwrap();
    assert_eq!(relay.stats().purged, 1);
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    cleanup(pool, connection, channel, &queue).await;
}

/// Writes `rows` outbox messages over `keys` keys (a key's `n` counts up), 200 per transaction.
async fn seed(pool: &PgPool, queue: &str, rows: usize, keys: usize) {
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("outbox_rabbitmq::seed", i.to_be_bytes().to_vec(), None);
        let payment = Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(queue)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .unwrap();
        if i % 200 == 199 {
            tx.commit().await.unwrap();
            tx = pool.begin().await.unwrap();
        }
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn two_relays_share_the_outbox_and_keep_per_key_order() {
    let Some((pool, connection, channel, queue)) = servers().await else {
        return;
    };
    let soak = std::env::var_os("IDEM_SOAK").is_some();
    let (rows, keys) = (if soak { 10_000 } else { 2_000 }, 100);
    seed(&pool, &queue, rows, keys).await;

    let publisher = common::Watched::new(
        OutboxPublisher::builder(rabbit_url())
            .connect()
            .await
            .unwrap(),
    );
    let relay = |pool: PgPool| {
        Relay::new(pool, publisher.clone())
            .batch(20)
            .batches_per_turn(2)
    };
    // Until the outbox is empty; bounded, so that a relay that stopped publishing ends the
    // test (in the assertions below) instead of hanging it.
    let done = |pool: PgPool| async move {
        let started = std::time::Instant::now();
        while pending(&pool).await > 0 && started.elapsed() < Duration::from_secs(300) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (a, b) = tokio::join!(
        relay(pool.clone()).run(done(pool.clone())),
        relay(pool.clone()).run(done(pool.clone()))
    );
    eprintln!("relay A published {}, relay B {}", a.published, b.published);
    assert_eq!(
        a.published + b.published,
        rows as u64,
        "every row published by exactly one relay"
    );
    assert!(
        !publisher.overlapped(),
        "two relays published one key at the same time"
    );

    let arrived = drain(&channel, &queue).await;
    assert_eq!(arrived.len(), rows, "every row reached the broker once");
    let ids: HashSet<&str> = arrived.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids.len(), rows);
    let mut last: HashMap<String, i64> = HashMap::new();
    for message in &arrived {
        let payment: Payment = serde_json::from_value(message.payload.clone()).unwrap();
        assert_eq!(
            message.partition_key.as_deref(),
            Some(payment.order.as_str())
        );
        let expected = last.get(&payment.order).map_or(0, |n| n + 1);
        assert_eq!(
            payment.n, expected,
            "key {} out of order at the broker",
            payment.order
        );
        last.insert(payment.order, payment.n);
    }
    assert_eq!(last.len(), keys);
    cleanup(pool, connection, channel, &queue).await;
}

/// The relay child process: nothing in a normal test run. With `IDEM_OUTBOX_CHILD` set, it
/// relays the test's outbox and SIGKILLs itself before its first publish or right after the
/// broker confirmed its first batch.
#[test]
fn relay_child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let schema = std::env::var(CHILD_SCHEMA).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let options: sqlx::postgres::PgConnectOptions = common::postgres_url().parse().unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.options([("search_path", schema.as_str())]))
            .await
            .unwrap();
        let publisher = KillAt {
            inner: OutboxPublisher::builder(rabbit_url())
                .connect()
                .await
                .unwrap(),
            after_confirm: mode == "after-confirm",
        };
        let mut relay = Relay::new(pool, publisher).batch(1_000);
        relay.step().await.unwrap();
        unreachable!("the relay child kills itself in its first publish");
    });
}

/// Kills its process with SIGKILL before publishing, or after the broker confirmed.
struct KillAt<P> {
    inner: P,
    after_confirm: bool,
}

impl<P: Publisher> Publisher for KillAt<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        if self.after_confirm {
            self.inner.publish(batch).await?;
        }
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_secs(60));
        Err("not killed".into())
    }
}

/// Runs a relay child in `mode` on the pool's schema and checks that SIGKILL ended it.
async fn run_child(pool: &PgPool, mode: &str) {
    use std::os::unix::process::ExitStatusExt as _;
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(pool)
        .await
        .unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "relay_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env(CHILD_SCHEMA, schema)
        .env("IDEM_POSTGRES_URL", common::postgres_url())
        .env("IDEM_RABBITMQ_URL", rabbit_url())
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the relay child ended otherwise: {status}"
    );
}

/// Orders of one customer handled by service A (committed): `n` outbox rows of one
/// partition, which a relay publishes in one batch, in order.
async fn commit_orders(pool: &PgPool, queue: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            id: format!("order-{i}"),
            customer: "ada".into(),
            queue: queue.to_string(),
            fail: false,
        };
        let Outcome::Applied(id) = on_order(pool, &order).await.unwrap() else {
            panic!("applied")
        };
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn a_relay_killed_between_commit_and_publish_publishes_after_restart_once() {
    let Some((pool, connection, channel, queue)) = servers().await else {
        return;
    };
    let ids = commit_orders(&pool, &queue, 5).await;
    run_child(&pool, "before-publish").await;
    assert!(
        drain(&channel, &queue).await.is_empty(),
        "the child published before it died"
    );
    assert_eq!(pending(&pool).await, 5);

    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(rabbit_url())
            .connect()
            .await
            .unwrap(),
    );
    assert_eq!(relay_until_idle(&mut relay).await, 5);
    let arrived: Vec<String> = drain(&channel, &queue)
        .await
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(arrived, ids, "each committed message once, in order");
    assert_eq!(pending(&pool).await, 0);
    cleanup(pool, connection, channel, &queue).await;
}

#[tokio::test]
async fn a_relay_killed_after_the_confirm_republishes_the_same_ids_and_downstream_applies_once() {
    let Some((pool, connection, channel, queue)) = servers().await else {
        return;
    };
    sqlx::query("CREATE TABLE applied (order_id TEXT NOT NULL, n BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let ids = commit_orders(&pool, &queue, 5).await;
    run_child(&pool, "after-confirm").await;
    assert_eq!(
        pending(&pool).await,
        5,
        "the child died before marking its rows"
    );

    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(rabbit_url())
            .connect()
            .await
            .unwrap(),
    );
    assert_eq!(relay_until_idle(&mut relay).await, 5);
    let arrived = drain(&channel, &queue).await;
    let arrived_ids: Vec<&str> = arrived.iter().map(|m| m.message_id.as_str()).collect();
    let twice: Vec<&str> = ids.iter().chain(&ids).map(String::as_str).collect();
    assert_eq!(
        arrived_ids, twice,
        "published again after the restart, with the same ids"
    );

    // Service B: every copy goes through the idempotent handler; each payment applies once.
    let mut outcomes = HashMap::new();
    for message in &arrived {
        let received = Received {
            message_id: message.message_id.clone(),
            payment: serde_json::from_value(message.payload.clone()).unwrap(),
        };
        let outcome = on_payment(&pool, &received).await.unwrap();
        *outcomes.entry(format!("{outcome:?}")).or_insert(0) += 1;
    }
    assert_eq!(outcomes.get("Applied(())"), Some(&5), "{outcomes:?}");
    assert_eq!(outcomes.get("Duplicate"), Some(&5), "{outcomes:?}");
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, n FROM applied ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, i64)> = (0..5).map(|i| (format!("order-{i}"), 1)).collect();
    assert_eq!(applied, expected);
    cleanup(pool, connection, channel, &queue).await;
}

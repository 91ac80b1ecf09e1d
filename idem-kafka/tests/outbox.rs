//! The outbox end to end on Kafka: handlers publish through `ctx.publish`, the real relay
//! publishes through [`idem::kafka::OutboxPublisher`] (an idempotent producer), and the topic
//! is read back.
//!
//! - A handler that publishes and then fails produces nothing; committed ones are produced once
//!   each, keyed by their partition key, with their derived ids in the `idem-message-id` header,
//!   in order per key, and their outbox rows are marked sent (SQLite, and PostgreSQL with
//!   several keys over several partitions).
//! - A relay batch published twice (the relay lost the result of the first publish): the topic
//!   holds both copies, and a consumer through idem's own [`idem::kafka::Source`] keyed on
//!   the id header applies each message once.
//!
//! The test broker, tansu 0.6.0, mishandles produced batches of several records, so these
//! publishers produce one record per batch (`batch.num.messages=1`, `linger.ms=0`, set with
//! `producer_config`); a real Kafka needs neither.
//!
//! Needs `IDEM_KAFKA_BROKERS` (skipped cleanly without it, outside CI) and `IDEM_POSTGRES_URL`
//! for one test.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::Fixture;
use futures_util::StreamExt as _;
use idem::consume::{Consumer, Counts, Delivery, Settle, SettleError};
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::rdkafka::message::{Headers as _, Message as _};
use idem::kafka::rdkafka::{Offset, TopicPartitionList};
use idem::kafka::{headers, OutboxPublisher};
use idem::outbox::{Message, OutboxStore, PublishError, Publisher, Relay};
use idem::{idempotent, Context, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Sqlite, SqlitePool};

/// What service A publishes for an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    topic: String,
    fail: bool,
}

#[idempotent(key = "msg.id", scope = "kafka_outbox::on_order")]
async fn on_order(
    tx: &mut Tx<'_, Sqlite>,
    msg: &Order,
    ctx: &Context,
) -> Result<String, sqlx::Error> {
    let payment = Payment {
        order: msg.id.clone(),
        n: 1,
    };
    let id = ctx
        .outgoing(&msg.topic)
        .partition_key(msg.customer.clone())
        .header("kind", "payment")
        .publish(tx, &payment)
        .await?;
    if msg.fail {
        return Err(sqlx::Error::Protocol(
            "the handler failed after publishing".into(),
        ));
    }
    Ok(id)
}

/// A payment as service B's handler sees it: with the id header the outbox set.
#[derive(Debug, Deserialize)]
struct Received {
    message_id: String,
    payment: Payment,
}

#[idempotent(key = "msg.message_id", scope = "kafka_outbox::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Received) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (order_id, n) VALUES (?1, ?2)")
        .bind(&msg.payment.order)
        .bind(msg.payment.n)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A delivery whose payload, for service B, is `{"message_id": <idem-message-id>, "payment":
/// ..}` (idem's consume loop decodes the payload alone).
struct WithId {
    inner: idem::kafka::Delivery,
    payload: Vec<u8>,
}

impl WithId {
    fn new(inner: idem::kafka::Delivery) -> Self {
        let id = String::from_utf8_lossy(inner.header(headers::MESSAGE_ID).unwrap_or_default())
            .into_owned();
        let payment: serde_json::Value =
            serde_json::from_slice(inner.payload()).unwrap_or(serde_json::Value::Null);
        let payload =
            serde_json::to_vec(&serde_json::json!({ "message_id": id, "payment": payment }))
                .unwrap();
        WithId { inner, payload }
    }
}

impl Delivery for WithId {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn revoked(&self) -> bool {
        self.inner.revoked()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.inner.settle(settle).await
    }
}

/// The publisher under test, one record per produced batch for tansu (see the module docs).
async fn publisher(fx: &Fixture) -> OutboxPublisher {
    OutboxPublisher::builder(&fx.brokers)
        .producer_config("batch.num.messages", "1")
        .producer_config("linger.ms", "0")
        .connect()
        .await
        .unwrap()
}

/// A record as the topic holds it.
#[derive(Debug)]
struct Record {
    partition: i32,
    key: Option<String>,
    id: String,
    kind: Option<String>,
    payment: Payment,
}

/// Every record of the fixture's topic, in offset order per partition (partitions one after
/// the other), once `expected` arrived and nothing more came for 2 s (or 30 s passed).
async fn records(fx: &Fixture, expected: usize) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &fx.brokers)
        .set("group.id", common::unique_name("idem_kafka_outbox_reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (topic, partitions) = (fx.topic.clone(), fx.partitions);
    let mut all = tokio::task::spawn_blocking(move || {
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&list).unwrap();
        let mut all = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        let mut quiet_until = None;
        while Instant::now() < until && quiet_until.is_none_or(|q| Instant::now() < q) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let mut id = String::new();
                let mut kind = None;
                for h in m.headers().iter().flat_map(|h| h.iter()) {
                    let value = String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned();
                    match h.key {
                        headers::MESSAGE_ID => id = value,
                        "kind" => kind = Some(value),
                        _ => {}
                    }
                }
                all.push((
                    m.offset(),
                    Record {
                        partition: m.partition(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        id,
                        kind,
                        payment: serde_json::from_slice(m.payload().unwrap_or_default()).unwrap(),
                    },
                ));
            }
            if all.len() >= expected && quiet_until.is_none() {
                quiet_until = Some(Instant::now() + Duration::from_secs(2));
            }
        }
        all
    })
    .await
    .unwrap();
    all.sort_by_key(|(offset, r)| (r.partition, *offset));
    all.into_iter().map(|(_, r)| r).collect()
}

/// Runs relay passes until one publishes nothing.
async fn relay_until_idle<DB: OutboxStore, P: Publisher>(relay: &mut Relay<DB, P>) -> usize {
    let mut total = 0;
    loop {
        let n = relay.step().await.unwrap();
        if n == 0 {
            return total;
        }
        total += n;
    }
}

/// Outbox rows not yet marked sent.
async fn pending(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A fresh SQLite database with service B's table, and its file.
async fn database() -> (SqlitePool, std::path::PathBuf) {
    let (pool, path) = common::sqlite().await;
    sqlx::query("CREATE TABLE payments (order_id TEXT NOT NULL, n INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    (pool, path)
}

async fn drop_sqlite(pool: SqlitePool, path: &std::path::Path) {
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Service A handles `n` orders of `customer`, committed; their message ids in order.
async fn commit_orders(pool: &SqlitePool, topic: &str, customer: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            id: format!("{customer}-order-{i}"),
            customer: customer.into(),
            topic: topic.into(),
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
async fn a_rolled_back_handler_produces_nothing_and_committed_ones_are_produced_once_keyed() {
    let Some(fx) = Fixture::new(3).await else {
        return;
    };
    let (pool, path) = database().await;
    let failing = Order {
        id: "order-x".into(),
        customer: "ada".into(),
        topic: fx.topic.clone(),
        fail: true,
    };
    assert!(on_order(&pool, &failing).await.is_err());
    let mut relay = Relay::new(pool.clone(), publisher(&fx).await);
    assert_eq!(relay_until_idle(&mut relay).await, 0);

    let ada = commit_orders(&pool, &fx.topic, "ada", 3).await;
    let bob = commit_orders(&pool, &fx.topic, "bob", 2).await;
    assert_eq!(relay_until_idle(&mut relay).await, 5);
    let records = records(&fx, 5).await;
    assert_eq!(
        records.len(),
        5,
        "the rolled-back one absent, the others once: {records:?}"
    );
    for (customer, ids) in [("ada", &ada), ("bob", &bob)] {
        let of: Vec<&Record> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(customer))
            .collect();
        let got: Vec<&str> = of.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(got, *ids, "{customer}'s messages once each, in order");
        assert!(
            of.iter().all(|r| r.partition == of[0].partition),
            "one key, one partition"
        );
        for (i, r) in of.iter().enumerate() {
            assert_eq!(r.kind.as_deref(), Some("payment"));
            assert_eq!(
                r.payment,
                Payment {
                    order: format!("{customer}-order-{i}"),
                    n: 1
                }
            );
        }
    }
    assert_eq!(pending(&pool).await, 0, "every row marked sent");
    drop_sqlite(pool, &path).await;
    fx.delete().await;
}

/// Publishes each batch, and reports the first one as failed: the relay lost the result of a
/// publish that reached Kafka (a time-out, a crash before the mark), so it goes again.
struct LoseFirstResult<P> {
    inner: P,
    lost: AtomicBool,
}

impl<P: Publisher> Publisher for LoseFirstResult<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        self.inner.publish(batch).await?;
        if !self.lost.swap(true, Ordering::SeqCst) {
            return Err("the first batch's result was lost".into());
        }
        Ok(())
    }
}

/// Service B: a consumer through idem's source until the group committed every record (at most
/// a minute).
async fn service_b(fx: &Fixture, pool: &SqlitePool) -> Counts {
    let source = fx.source().await;
    let counts = Consumer::new(pool.clone())
        .batch(4)
        .run(
            source.deliveries().map(|d| d.map(WithId::new)),
            idem::consume::json::<Received>,
            async |b, msg| on_payment(b, msg).await,
            // Bounded: a group that does not settle fails the test's assertions, not CI's clock.
            async {
                let _ = tokio::time::timeout(Duration::from_secs(60), fx.settled()).await;
            },
        )
        .await;
    source.close().await.unwrap();
    counts
}

#[tokio::test]
async fn a_batch_published_twice_is_applied_once_downstream() {
    let Some(fx) = Fixture::new(2).await else {
        return;
    };
    let (pool, path) = database().await;
    let ids = commit_orders(&pool, &fx.topic, "ada", 5).await;
    let lossy = LoseFirstResult {
        inner: publisher(&fx).await,
        lost: AtomicBool::new(false),
    };
    let mut relay = Relay::new(pool.clone(), lossy)
        .retry(Duration::from_millis(5), Duration::from_millis(5))
        .idle(Duration::from_millis(5), Duration::from_millis(5));
    // The failed batch waits out its backoff, then goes again; bounded so that a relay that
    // never publishes it again fails the assertions below instead of hanging.
    let started = Instant::now();
    while pending(&pool).await > 0 && started.elapsed() < Duration::from_secs(60) {
        relay.step().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(relay.stats().failed_batches, 1);
    assert_eq!(relay.stats().published, 5);
    assert_eq!(pending(&pool).await, 0);
    let produced: Vec<String> = records(&fx, 10).await.into_iter().map(|r| r.id).collect();
    let twice: Vec<String> = ids.iter().chain(&ids).cloned().collect();
    assert_eq!(
        produced, twice,
        "both copies, in order, on the key's partition"
    );

    let counts = service_b(&fx, &pool).await;
    assert_eq!((counts.applied, counts.duplicate), (5, 5), "{counts:?}");
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, n FROM payments ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, i64)> = (0..5).map(|i| (format!("ada-order-{i}"), 1)).collect();
    assert_eq!(applied, expected, "each payment applied once");
    drop_sqlite(pool, &path).await;
    fx.delete().await;
}

#[tokio::test]
async fn a_relay_on_postgres_keeps_per_key_order_in_the_topic() {
    let Some(fx) = Fixture::new(3).await else {
        return;
    };
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let admin = match sqlx::PgPool::connect(&url).await {
        Ok(admin) => admin,
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no PostgreSQL at {url} ({err})");
            fx.delete().await;
            return;
        }
        Err(err) => panic!("CI must run the PostgreSQL tests, but {url} did not answer: {err}"),
    };
    let schema = common::unique_name("idem_kafka_outbox");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("search_path", schema.as_str())]))
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();

    let (rows, keys) = (60usize, 6usize);
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("kafka_outbox::seed", i.to_be_bytes().to_vec(), None);
        let payment = Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(&fx.topic)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();

    let mut relay = Relay::new(pool.clone(), publisher(&fx).await).batch(20);
    assert_eq!(relay_until_idle(&mut relay).await, rows);
    let unsent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);

    let records = records(&fx, rows).await;
    assert_eq!(records.len(), rows, "every row produced once");
    let mut last: HashMap<String, (i64, i32)> = HashMap::new();
    for r in &records {
        assert_eq!(r.key.as_deref(), Some(r.payment.order.as_str()));
        let (expected, partition) = last
            .get(&r.payment.order)
            .map_or((0, r.partition), |(n, p)| (n + 1, *p));
        assert_eq!(
            r.payment.n, expected,
            "key {} out of order",
            r.payment.order
        );
        assert_eq!(r.partition, partition, "one key, one partition");
        last.insert(r.payment.order.clone(), (r.payment.n, r.partition));
    }
    assert_eq!(last.len(), keys);

    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    fx.delete().await;
}

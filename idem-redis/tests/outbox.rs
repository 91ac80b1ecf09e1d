//! The outbox end to end on Redis Streams: handlers publish through `ctx.publish`, the real
//! relay publishes through [`idem::redis::OutboxPublisher`], and the streams are read back.
//!
//! - A handler that publishes and then fails adds nothing; committed ones are added once each,
//!   with their derived ids in `idem-message-id`, in order per partition key, payload, partition key
//!   and headers in their fields, and their outbox rows are marked sent (SQLite, and PostgreSQL
//!   with several keys).
//! - A relay batch published twice (the relay lost the result of the first publish): Redis keeps
//!   both copies, and a consumer through idem's own [`idem::redis::Source`] keyed on
//!   `idem-message-id` applies each message once.
//! - A destination key that is not a stream fails the batch: nothing is marked sent.
//!
//! Needs `IDEM_REDIS_URL` (and `IDEM_POSTGRES_URL` for one test); without the servers each test
//! says why it did not run (in CI, `CI` set, that is a failure).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Streams, GROUP};
use futures_util::StreamExt as _;
use idem::consume::{Consumer, Counts, Delivery, Settle, SettleError};
use idem::outbox::{Message, OutboxStore, PublishError, Publisher, Relay};
use idem::redis::{headers, OutboxPublisher, Source};
use idem::{idempotent, Context, Outcome, Tx};
use redis::streams::StreamRangeReply;
use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
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
    stream: String,
    fail: bool,
}

#[idempotent(key = "msg.id", scope = "redis_outbox::on_order")]
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
        .outgoing(&msg.stream)
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

/// A payment as service B's handler sees it: with the `idem-message-id` the outbox set.
#[derive(Debug, Deserialize)]
struct Received {
    message_id: String,
    payment: Payment,
}

#[idempotent(key = "msg.message_id", scope = "redis_outbox::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Received) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (order_id, n) VALUES (?1, ?2)")
        .bind(&msg.payment.order)
        .bind(msg.payment.n)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A delivery whose payload, for service B, is `{"message_id": <idem-message-id>, "payment": ..}`
/// (idem's consume loop decodes the payload alone).
struct WithId {
    inner: idem::redis::Delivery,
    payload: Vec<u8>,
}

impl WithId {
    fn new(inner: idem::redis::Delivery) -> Self {
        let id = String::from_utf8_lossy(inner.field(headers::MESSAGE_ID).unwrap_or_default())
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
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.inner.settle(settle).await
    }
}

/// An entry as the stream holds it: its fields as text.
#[derive(Debug)]
struct Entry {
    fields: HashMap<String, String>,
}

impl Entry {
    fn get(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }
    fn payment(&self) -> Payment {
        serde_json::from_str(self.get("payload").expect("a payload field")).unwrap()
    }
}

/// Every entry of `stream`, in order.
async fn entries(streams: &Streams, stream: &str) -> Vec<Entry> {
    let reply: StreamRangeReply = streams.conn.clone().xrange_all(stream).await.unwrap();
    reply
        .ids
        .iter()
        .map(|e| Entry {
            fields: e
                .map
                .keys()
                .map(|k| (k.clone(), e.get::<String>(k).unwrap_or_default()))
                .collect(),
        })
        .collect()
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

/// Service A handles `n` orders of `customer`, committed; their message ids in order.
async fn commit_orders(pool: &SqlitePool, stream: &str, customer: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            id: format!("{customer}-order-{i}"),
            customer: customer.into(),
            stream: stream.into(),
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
async fn a_rolled_back_handler_adds_nothing_and_committed_ones_are_added_once_with_their_ids() {
    let Some(streams) = Streams::new("outbox_once").await else {
        return;
    };
    let (pool, path) = database().await;
    let stream = streams.name.clone();
    let failing = Order {
        id: "order-x".into(),
        customer: "ada".into(),
        stream: stream.clone(),
        fail: true,
    };
    assert!(on_order(&pool, &failing).await.is_err());
    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(common::url())
            .connect()
            .await
            .unwrap(),
    );
    assert_eq!(relay_until_idle(&mut relay).await, 0);
    assert_eq!(
        streams.len().await,
        0,
        "a rolled-back handler reached Redis"
    );

    let ada = commit_orders(&pool, &stream, "ada", 3).await;
    let bob = commit_orders(&pool, &stream, "bob", 2).await;
    assert_eq!(relay_until_idle(&mut relay).await, 5);
    let entries = entries(&streams, &stream).await;
    assert_eq!(entries.len(), 5, "{entries:?}");
    for (customer, ids) in [("ada", &ada), ("bob", &bob)] {
        let of: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.get("idem-partition-key") == Some(customer))
            .collect();
        let got: Vec<&str> = of
            .iter()
            .map(|e| e.get(headers::MESSAGE_ID).unwrap())
            .collect();
        assert_eq!(got, *ids, "{customer}'s messages once each, in order");
        for (i, e) in of.iter().enumerate() {
            assert_eq!(
                e.get(&format!("{}kind", headers::HEADER_PREFIX)),
                Some("payment")
            );
            assert_eq!(
                e.payment(),
                Payment {
                    order: format!("{customer}-order-{i}"),
                    n: 1
                }
            );
        }
    }
    assert_eq!(pending(&pool).await, 0, "every row marked sent");
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

/// Publishes each batch, and reports the first one as failed: the relay lost the result of a
/// publish that reached Redis (a time-out, a crash before the mark), so it goes again.
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

/// Service B: a consumer through idem's source until the group has read and settled everything.
async fn service_b(streams: &Streams, pool: &SqlitePool) -> Counts {
    let source = Source::builder(common::url(), &streams.name, GROUP, "b-1")
        .prefetch(4)
        .block(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let deliveries = source.deliveries().map(|d| d.map(WithId::new));
    Consumer::new(pool.clone())
        .batch(4)
        .run(
            deliveries,
            idem::consume::json::<Received>,
            async |b, msg| on_payment(b, msg).await,
            streams.settled(GROUP),
        )
        .await
}

#[tokio::test]
async fn a_batch_published_twice_is_applied_once_downstream() {
    let Some(streams) = Streams::new("outbox_twice").await else {
        return;
    };
    let (pool, path) = database().await;
    let ids = commit_orders(&pool, &streams.name, "ada", 5).await;
    let publisher = LoseFirstResult {
        inner: OutboxPublisher::builder(common::url())
            .connect()
            .await
            .unwrap(),
        lost: AtomicBool::new(false),
    };
    let mut relay = Relay::new(pool.clone(), publisher)
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
    let added: Vec<String> = entries(&streams, &streams.name)
        .await
        .iter()
        .map(|e| e.get(headers::MESSAGE_ID).unwrap().to_string())
        .collect();
    let twice: Vec<String> = ids.iter().chain(&ids).cloned().collect();
    assert_eq!(
        added, twice,
        "Redis keeps both copies, in order, with one id each"
    );

    let counts = service_b(&streams, &pool).await;
    assert_eq!((counts.applied, counts.duplicate), (5, 5), "{counts:?}");
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, n FROM payments ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, i64)> = (0..5).map(|i| (format!("ada-order-{i}"), 1)).collect();
    assert_eq!(applied, expected, "each payment applied once");
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

#[tokio::test]
async fn a_destination_that_is_not_a_stream_fails_the_batch_and_keeps_the_rows() {
    let Some(streams) = Streams::new("outbox_wrongtype").await else {
        return;
    };
    let (pool, path) = database().await;
    let () = streams
        .conn
        .clone()
        .set(&streams.name, "not a stream")
        .await
        .unwrap();
    commit_orders(&pool, &streams.name, "ada", 2).await;
    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(common::url())
            .connect()
            .await
            .unwrap(),
    );
    assert_eq!(relay.step().await.unwrap(), 0);
    assert_eq!(relay.stats().failed_batches, 1);
    assert_eq!(pending(&pool).await, 2, "nothing marked sent");
    let error: Option<String> = sqlx::query_scalar("SELECT MAX(last_error) FROM idem_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        error.as_deref().is_some_and(|e| e.contains("WRONGTYPE")),
        "{error:?}"
    );
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

#[tokio::test]
async fn a_relay_on_postgres_keeps_per_key_order_in_the_stream() {
    let Some(streams) = Streams::new("outbox_pg").await else {
        return;
    };
    let Some((pool, schema)) = common::postgres().await else {
        return;
    };
    let (rows, keys) = (200usize, 10usize);
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("redis_outbox::seed", i.to_be_bytes().to_vec(), None);
        let payment = Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(&streams.name)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();

    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(common::url())
            .connect()
            .await
            .unwrap(),
    )
    .batch(20);
    assert_eq!(relay_until_idle(&mut relay).await, rows);
    let unsent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);

    let entries = entries(&streams, &streams.name).await;
    assert_eq!(entries.len(), rows, "every row added once");
    let mut last: HashMap<String, i64> = HashMap::new();
    for e in &entries {
        let payment = e.payment();
        assert_eq!(e.get("idem-partition-key"), Some(payment.order.as_str()));
        let expected = last.get(&payment.order).map_or(0, |n| n + 1);
        assert_eq!(payment.n, expected, "key {} out of order", payment.order);
        last.insert(payment.order, payment.n);
    }
    assert_eq!(last.len(), keys);
    common::drop_postgres(pool, &schema).await;
    streams.delete().await;
}

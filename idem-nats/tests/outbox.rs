//! The outbox end to end on JetStream: handlers publish through `ctx.publish`, the real relay
//! publishes through [`idem::nats::OutboxPublisher`], and the stream's contents are checked.
//!
//! - A handler that publishes and then fails leaves nothing in the stream; committed ones are
//!   stored once each, with their derived ids as `Nats-Msg-Id`, in order per partition key,
//!   and their outbox rows are marked sent (SQLite, and PostgreSQL with several keys).
//! - A relay batch published twice (the relay lost the result of the first publish): JetStream's
//!   duplicate window drops the second copy of every message, and the rows are marked sent.
//! - Downstream, a consumer through idem's own [`idem::nats::Source`] keyed on `Nats-Msg-Id`
//!   applies each payment once, also when a second consumer replays the whole stream.
//!
//! Needs `IDEM_NATS_URL` (and `IDEM_POSTGRES_URL` for one test); without the servers each test
//! says why it did not run (in CI, `CI` set, that is a failure).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::Fixture;
use idem::consume::{Consumer, Counts, Delivery, Settle, SettleError};
use idem::nats::async_nats::jetstream;
use idem::nats::{headers, OutboxPublisher};
use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::{idempotent, Context, Outcome, Tx};
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
    subject: String,
    fail: bool,
}

#[idempotent(key = "msg.id", scope = "nats_outbox::on_order")]
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
        .outgoing(&msg.subject)
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

/// A payment as service B's handler sees it: with the `Nats-Msg-Id` the outbox set.
#[derive(Debug, Deserialize)]
struct Received {
    message_id: String,
    payment: Payment,
}

#[idempotent(key = "msg.message_id", scope = "nats_outbox::on_payment")]
async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Received) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (order_id, n) VALUES (?1, ?2)")
        .bind(&msg.payment.order)
        .bind(msg.payment.n)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A delivery whose payload, for service B, is `{"message_id": <Nats-Msg-Id>, "payment": ..}`
/// (idem's consume loop decodes the payload alone).
struct WithId {
    inner: idem::nats::Delivery,
    payload: Vec<u8>,
}

impl WithId {
    fn new(inner: idem::nats::Delivery) -> Self {
        let message = inner.message();
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let payment: serde_json::Value =
            serde_json::from_slice(&message.payload).unwrap_or(serde_json::Value::Null);
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

/// A message as the stream stored it.
#[derive(Debug)]
struct Stored {
    subject: String,
    msg_id: String,
    partition_key: Option<String>,
    kind: Option<String>,
    payment: Payment,
}

/// Everything the fixture's stream holds, in stream order.
async fn stored(fx: &Fixture) -> Vec<Stored> {
    let mut stream = fx.js.get_stream(&fx.stream).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        let message = stream.get_raw_message(seq).await.unwrap();
        let header = |name: &str| common::header(&message.headers, name).map(str::to_string);
        assert_eq!(header(headers::MESSAGE_ID), header("Nats-Msg-Id"));
        all.push(Stored {
            subject: message.subject.to_string(),
            msg_id: header("Nats-Msg-Id").expect("Nats-Msg-Id is set"),
            partition_key: header(headers::PARTITION_KEY),
            kind: header("kind"),
            payment: serde_json::from_slice(&message.payload).unwrap(),
        });
    }
    all
}

/// Runs relay passes until one publishes nothing.
async fn relay_until_idle<DB: idem::outbox::OutboxStore, P: Publisher>(
    relay: &mut Relay<DB, P>,
) -> usize {
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

/// A fresh SQLite database with service B's table.
async fn database() -> SqlitePool {
    let pool = common::sqlite().await;
    sqlx::query("CREATE TABLE payments (order_id TEXT NOT NULL, n INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// Service A handles `n` orders of `customer`, committed; their message ids in order.
async fn commit_orders(pool: &SqlitePool, subject: &str, customer: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            id: format!("{customer}-order-{i}"),
            customer: customer.into(),
            subject: subject.into(),
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
async fn a_rolled_back_handler_publishes_nothing_and_committed_ones_are_stored_once_with_their_ids()
{
    let Some(client) = common::connect().await else {
        return;
    };
    let fx = Fixture::new(client, Default::default()).await;
    let pool = database().await;
    let subject = format!("{}.payments", fx.prefix);
    let publisher = OutboxPublisher::builder(common::nats_url())
        .connect()
        .await
        .unwrap();

    let failing = Order {
        id: "order-x".into(),
        customer: "ada".into(),
        subject: subject.clone(),
        fail: true,
    };
    assert!(on_order(&pool, &failing).await.is_err());
    let mut relay = Relay::new(pool.clone(), publisher.clone());
    assert_eq!(relay_until_idle(&mut relay).await, 0);
    assert!(
        stored(&fx).await.is_empty(),
        "a rolled-back handler reached the stream"
    );

    let ada = commit_orders(&pool, &subject, "ada", 3).await;
    let bob = commit_orders(&pool, &subject, "bob", 2).await;
    assert_eq!(relay_until_idle(&mut relay).await, 5);
    let stored = stored(&fx).await;
    assert_eq!(stored.len(), 5, "{stored:?}");
    for (customer, ids) in [("ada", &ada), ("bob", &bob)] {
        let of: Vec<&Stored> = stored
            .iter()
            .filter(|m| m.partition_key.as_deref() == Some(customer))
            .collect();
        let got: Vec<&str> = of.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(got, *ids, "{customer}'s messages once each, in order");
        for (i, m) in of.iter().enumerate() {
            assert_eq!(m.subject, subject);
            assert_eq!(m.kind.as_deref(), Some("payment"));
            assert_eq!(
                m.payment,
                Payment {
                    order: format!("{customer}-order-{i}"),
                    n: 1
                }
            );
        }
    }
    assert_eq!(pending(&pool).await, 0, "every row marked sent");
    let sent: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(sent, 5);
    pool.close().await;
    fx.delete().await;
}

/// Publishes each batch, and reports the first one as failed: the relay lost the result of a
/// publish that reached the stream (a time-out, a crash before the mark), so it goes again.
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

/// A durable pull consumer `name` on the fixture's stream, from its start.
async fn durable(fx: &Fixture, name: &str) {
    fx.js
        .create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some(name.to_string()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(5),
                ..Default::default()
            },
            fx.stream.as_str(),
        )
        .await
        .unwrap();
}

/// Completes once consumer `name` has nothing pending and nothing unacked.
async fn drained(fx: &Fixture, name: &str) {
    loop {
        let mut consumer: jetstream::consumer::PullConsumer = fx
            .js
            .get_consumer_from_stream(name, &fx.stream)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Service B: consumer `name` through idem's source until it has taken and settled everything.
async fn service_b(fx: &Fixture, pool: &SqlitePool, name: &str) -> Counts {
    use futures_util::StreamExt as _;
    let deliveries = idem::nats::Source::builder(common::nats_url(), &fx.stream, name)
        .dead_letters(&fx.dead_letter_subject)
        .prefetch(10)
        .connect()
        .await
        .unwrap()
        .deliveries()
        .map(|d| d.map(WithId::new));
    Consumer::new(pool.clone())
        .batch(10)
        .run(
            deliveries,
            idem::consume::json::<Received>,
            async |b, msg| on_payment(b, msg).await,
            drained(fx, name),
        )
        .await
}

#[tokio::test]
async fn jetstream_drops_a_batch_published_twice_and_downstream_applies_each_once() {
    let Some(client) = common::connect().await else {
        return;
    };
    let fx = Fixture::new(client, Default::default()).await;
    let pool = database().await;
    let subject = format!("{}.payments", fx.prefix);
    let ids = commit_orders(&pool, &subject, "ada", 5).await;

    let publisher = LoseFirstResult {
        inner: OutboxPublisher::builder(common::nats_url())
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
    assert_eq!(
        relay.stats().published,
        5,
        "the second publish confirmed all five"
    );
    assert_eq!(pending(&pool).await, 0);
    let stored = stored(&fx).await;
    let stored_ids: Vec<&str> = stored.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(
        stored_ids, ids,
        "the stream kept one copy of each, in order"
    );

    // Service B keyed on Nats-Msg-Id applies each payment once; a replay of the whole stream
    // by a second consumer into the same database applies nothing again.
    let counts = service_b(&fx, &pool, &fx.consumer).await;
    assert_eq!((counts.applied, counts.duplicate), (5, 0), "{counts:?}");
    durable(&fx, "replay").await;
    let counts = service_b(&fx, &pool, "replay").await;
    assert_eq!((counts.applied, counts.duplicate), (0, 5), "{counts:?}");
    let applied: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, n FROM payments ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, i64)> = (0..5).map(|i| (format!("ada-order-{i}"), 1)).collect();
    assert_eq!(applied, expected);
    pool.close().await;
    fx.delete().await;
}

#[tokio::test]
async fn a_relay_on_postgres_keeps_per_key_order_in_the_stream() {
    let Some(client) = common::connect().await else {
        return;
    };
    let Some((pool, schema)) = common::postgres().await else {
        return;
    };
    let fx = Fixture::new(client, Default::default()).await;
    let subject = format!("{}.payments", fx.prefix);
    let (rows, keys) = (200usize, 10usize);
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("nats_outbox::seed", i.to_be_bytes().to_vec(), None);
        let payment = Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(&subject)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();

    let mut relay = Relay::new(
        pool.clone(),
        OutboxPublisher::builder(common::nats_url())
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

    let stored = stored(&fx).await;
    assert_eq!(stored.len(), rows, "every row stored once");
    let mut last: HashMap<String, i64> = HashMap::new();
    for m in &stored {
        assert_eq!(m.partition_key.as_deref(), Some(m.payment.order.as_str()));
        let expected = last.get(&m.payment.order).map_or(0, |n| n + 1);
        assert_eq!(
            m.payment.n, expected,
            "key {} out of order",
            m.payment.order
        );
        last.insert(m.payment.order.clone(), m.payment.n);
    }
    assert_eq!(last.len(), keys);
    common::drop_postgres(pool, &schema).await;
    fx.delete().await;
}

#[tokio::test]
async fn a_subject_no_stream_captures_fails_the_batch_and_keeps_the_rows() {
    if common::connect().await.is_none() {
        return;
    }
    let pool = database().await;
    let subject = common::unique_name("idem-no-stream").replace('_', "-");
    commit_orders(&pool, &subject, "ada", 2).await;
    let publisher = OutboxPublisher::builder(common::nats_url())
        .connect()
        .await
        .unwrap();
    let mut relay = Relay::new(pool.clone(), publisher);
    assert_eq!(relay.step().await.unwrap(), 0);
    assert_eq!(relay.stats().failed_batches, 1);
    assert_eq!(pending(&pool).await, 2, "nothing marked sent");
    let error: Option<String> = sqlx::query_scalar("SELECT MAX(last_error) FROM idem_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        error.as_deref().is_some_and(|e| e.contains(&subject)),
        "{error:?}"
    );
    pool.close().await;
}

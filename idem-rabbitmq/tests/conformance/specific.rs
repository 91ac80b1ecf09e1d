//! What is RabbitMQ's own, beside the kit's rules: what `connect` checks (a missing queue or
//! dead-letter exchange, a password kept out of errors), `close` cutting held requeues short,
//! an ack that cannot reach the broker, a dead letter the exchange routes nowhere, and a lease
//! held elsewhere requeued after the delay (RabbitMQ holds, then rejects), and what a delivery
//! tells of its origin and headers. Each test uses a
//! [`Rabbit`] input and a kit database of its own, and asserts the database and the queues.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery as _, Settle};
use idem::outbox::{Message, Publisher as _};
use idem::rabbitmq::lapin::options::BasicPublishOptions;
use idem::rabbitmq::lapin::types::{AMQPValue, FieldTable, LongString};
use idem::rabbitmq::lapin::BasicProperties;
use idem::rabbitmq::{Error, OutboxPublisher, Source};
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness::{self, track, within, Tally};
use idem_testkit::broker::model::{self, Credit, Event};
use idem_testkit::broker::{Broker, Raw, Spec};

use crate::Rabbit;

fn credit(id: &str) -> Raw {
    model::credit(id, 1, 1).raw()
}

#[tokio::test]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn a_missing_dead_letter_exchange_fails_at_start_with_a_clear_error() {
    let Some(b) = Rabbit::create(Spec::new("nodlx")).await else {
        return;
    };
    let err = b
        .builder()
        .dead_letters("idem-no-such-exchange")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::DeadLetterExchangeMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("idem-no-such-exchange"), "{err}");
    // Without one named, the default `<queue>.dead` must exist: gone here, the error names it.
    b.channel
        .exchange_delete(b.dlx().as_str().into(), Default::default())
        .await
        .unwrap();
    let err = b.builder().connect().await.unwrap_err();
    let default = b.dlx();
    assert!(
        matches!(&err, Error::DeadLetterExchangeMissing { exchange, .. } if *exchange == default),
        "{err}"
    );
    let err = Source::builder(crate::url(), "idem-no-such-queue")
        .dead_letters("amq.direct")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueueMissing { .. }), "{err}");
    // The URL in an error has no password.
    let err = Source::builder("amqp://guest:secret@127.0.0.1:1/%2f", "q")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    assert!(
        err.to_string().contains("guest:***@") && !err.to_string().contains("secret"),
        "{err}"
    );
    assert_eq!(b.depth(&b.queue).await, (0, 0));
    b.teardown().await;
}

/// `close` ends every stream of the source, rejects a held requeue at once (its 60 s hold cut
/// short), waits for what is out, and leaves: the message is ready again with no consumer, long
/// before its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn close_ends_every_stream_and_cuts_held_requeues_short() {
    let Some(b) = Rabbit::create(Spec::new("close")).await else {
        return;
    };
    b.publish(&[credit("h1")]).await;
    let source = b.builder().prefetch(10).connect().await.unwrap();
    let (mut first, mut second) = (source.deliveries(), source.deliveries());
    let delivery = first.next().await.unwrap().unwrap();
    delivery
        .settle(Settle::Requeue {
            delay: Duration::from_secs(60),
        })
        .await
        .unwrap();
    assert_eq!(b.depth(&b.queue).await, (0, 1), "held, unacked");
    let started = Instant::now();
    let closing = tokio::spawn(source.close());
    assert!(within(Duration::from_secs(5), "first", first.next())
        .await
        .is_none());
    assert!(within(Duration::from_secs(5), "second", second.next())
        .await
        .is_none());
    drop((first, second));
    within(Duration::from_secs(10), "close", closing)
        .await
        .unwrap()
        .unwrap();
    b.settles_at(&b.queue, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the hold was cut short"
    );
    b.teardown().await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn an_ack_that_cannot_reach_the_broker_is_an_error_and_the_message_comes_back() {
    let Some(b) = Rabbit::create(Spec::new("closed")).await else {
        return;
    };
    b.publish(&[credit("x1")]).await;
    let source = b.builder().prefetch(10).connect().await.unwrap();
    let mut deliveries = source.deliveries();
    let delivery = deliveries.next().await.unwrap().unwrap();
    assert_eq!(delivery.deliveries(), Some(1));
    assert!(delivery.describe().contains("message_id x1"));
    // Closing may race with lapin's own channel shutdown ("Closing"): either way the
    // connection is gone, which is all this test needs.
    let _ = source
        .connection()
        .close(200, "closed by the test".into())
        .await;
    // lapin answers Ok(false) for an acker whose channel closed: not settled, so an error.
    let err = delivery.settle(Settle::Ack).await.unwrap_err();
    assert!(
        err.to_string().contains("did not reach the broker"),
        "{err}"
    );
    drop(deliveries);
    // Closing a source whose connection is gone already leaves nothing to leave.
    source.close().await.unwrap();
    b.settles_at(&b.queue, 1).await;
    b.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn a_dead_letter_the_exchange_routes_nowhere_is_not_acked_and_not_lost() {
    harness::with::<Rabbit, Sqlite>(Spec::new("unrouted"), async |b, k| {
        model::schema(k).await;
        b.publish(&[Raw {
            id: "garbled".into(),
            payload: b"{not json".to_vec(),
        }])
        .await;
        // No queue is bound to the dead-letter exchange with this routing key: the broker
        // returns the dead letter (mandatory), so the original must stay.
        let deliveries = b
            .builder()
            .prefetch(10)
            .dead_letter_routing_key("bound-to-nothing")
            .connect()
            .await
            .unwrap()
            .deliveries();
        let d = k.dialect;
        let counts = Consumer::new(k.pool.clone())
            .run(
                deliveries,
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                tokio::time::sleep(Duration::from_millis(500)),
            )
            .await;
        eprintln!("{counts:?}");
        assert!(counts.dead_lettered >= 1 && counts.settle_failures == counts.dead_lettered);
        b.settles_at(&b.queue, 1).await;
        assert_eq!(b.depth(&b.dlq()).await, (0, 0));
    })
    .await;
}

#[idem::idempotent(key = "msg.id", scope = "rmq::leased", mode = "lease", lease = "10s")]
async fn leased(tx: &mut idem::Tx<'_, sqlx::Sqlite>, msg: &Credit) -> Result<(), String> {
    sqlx::query("INSERT INTO ledger (id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn in_progress_a_lease_held_elsewhere_is_requeued_after_the_delay_not_spun_on() {
    harness::with::<Rabbit, Sqlite>(Spec::new("lease"), async |b, k| {
        model::schema(k).await;
        // Another consumer holds the lease on "l1" for 600 ms (its claim committed, its body
        // runs).
        sqlx::query(
            "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) \
             VALUES ('rmq::leased', CAST('l1' AS BLOB), 9e15, \
                     CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 600, 1)",
        )
        .execute(&k.pool)
        .await
        .unwrap();
        b.publish(&[credit("l1")]).await;
        let tally = Tally::new();
        let deliveries = b
            .builder()
            .prefetch(10)
            .connect()
            .await
            .unwrap()
            .deliveries();
        let counts = within(
            Duration::from_secs(30),
            "the consumer",
            Consumer::new(k.pool.clone())
                .in_progress_delay(Duration::from_millis(150))
                .run_each(
                    track(deliveries, &tally),
                    |bytes: &[u8]| match json::<Event>(bytes)? {
                        Event::Credit(c) => Ok::<_, serde_json::Error>(c),
                        Event::Status(_) => Err(serde::de::Error::custom("a credit was expected")),
                    },
                    async |pool, msg: &Credit| leased(pool, msg).await,
                    tally.clone().until(|acked, _| acked >= 1),
                ),
        )
        .await;
        eprintln!("{counts:?}");
        // About 600 ms of lease at 150 ms a requeue (reject after the hold): a few tries, no
        // spin.
        assert!(
            (1..=8).contains(&counts.in_progress),
            "requeued {} times",
            counts.in_progress
        );
        assert_eq!(counts.applied, 1);
        b.settles_at(&b.queue, 0).await;
        assert_eq!(model::ledger(k).await.len(), 1);
    })
    .await;
}

/// A delivery tells its origin (the queue, its delivery tag and message id, and the queue as
/// where a replay publishes it) and its AMQP headers as text; published there through the
/// outbox, it comes back to the same source.
#[tokio::test]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn a_delivery_tells_its_origin_and_headers_and_a_replay_there_comes_back() {
    let Some(b) = Rabbit::create(Spec::new("origin")).await else {
        return;
    };
    let mut table = FieldTable::default();
    table.insert(
        "x-trace".into(),
        AMQPValue::LongString(LongString::from("t-1")),
    );
    table.insert("x-attempt".into(), AMQPValue::LongLongInt(3));
    b.channel
        .basic_publish(
            "".into(),
            b.queue.as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default()
                .with_message_id("o1".into())
                .with_headers(table),
        )
        .await
        .unwrap();
    assert!(b.channel.wait_for_confirms().await.unwrap().is_empty());
    let source = b.builder().prefetch(10).connect().await.unwrap();
    let mut deliveries = source.deliveries();
    let delivery = deliveries.next().await.unwrap().unwrap();
    let origin = delivery.origin();
    assert_eq!(origin.broker, "rabbitmq");
    assert_eq!(origin.broker, idem::rabbitmq::BROKER);
    assert_eq!(origin.source, b.queue);
    assert_eq!(origin.coordinates, "delivery tag 1, message id o1");
    assert_eq!(origin.destination, b.queue);
    let headers = delivery.headers();
    assert_eq!(
        headers,
        [
            ("x-attempt".to_string(), "3".to_string()),
            ("x-trace".to_string(), "t-1".to_string())
        ]
    );
    delivery.settle(Settle::Ack).await.unwrap();
    // A replay: the outbox (default exchange) publishes it to the destination.
    let publisher = OutboxPublisher::builder(crate::url())
        .connect()
        .await
        .unwrap();
    let replay = Message {
        id: "idem-origin-replay".into(),
        destination: origin.destination.clone(),
        partition_key: String::new(),
        payload: b"{}".to_vec(),
        headers,
        attempts: 0,
    };
    publisher.publish(&[replay]).await.unwrap();
    let again = within(Duration::from_secs(10), "the replay", deliveries.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.payload(), b"{}");
    assert_eq!(again.origin().source, b.queue);
    assert!(again
        .headers()
        .contains(&("x-trace".to_string(), "t-1".to_string())));
    again.settle(Settle::Ack).await.unwrap();
    drop(deliveries);
    source.close().await.unwrap();
    b.settles_at(&b.queue, 0).await;
    b.teardown().await;
}

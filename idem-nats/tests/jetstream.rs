//! idem's consumer loop on the local NATS server (JetStream) and SQLite: every test asserts the
//! database and the JetStream consumer (`num_pending`, `num_ack_pending`) after its run.
//! `IDEM_NATS_URL` names the server (default `nats://127.0.0.1:4222`); without one the tests
//! print "skipped: ..." (and fail in CI).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{header, sqlite::order_status, Fixture, OrderEvent, Settings};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::nats::Error;
use sqlx::SqlitePool;

fn consumer(pool: &SqlitePool) -> Consumer<sqlx::Sqlite> {
    Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(200))
}

async fn fixture(settings: Settings) -> Option<Fixture> {
    let client = common::connect().await?;
    Some(Fixture::new(client, settings).await)
}

fn poison(order: i64) -> OrderEvent {
    OrderEvent {
        fail: true,
        ..OrderEvent::new(order, 1)
    }
}

/// A poison message is tried until the JetStream consumer's `max_deliver`, and on that last
/// allowed delivery idem publishes it to the dead-letter subject (confirmed by the dead-letter
/// stream) with headers saying why, then terminates it: nothing is stranded unacked.
#[tokio::test]
async fn poison_is_dead_lettered_on_the_last_allowed_delivery_with_headers() {
    let Some(fx) = fixture(Settings {
        max_deliver: 3,
        ..Settings::default()
    })
    .await
    else {
        return;
    };
    let pool = common::sqlite().await;
    let mut events: Vec<OrderEvent> = (1..=10).map(|o| OrderEvent::new(o, 1)).collect();
    events.insert(3, poison(100));
    events.insert(7, poison(101));
    fx.publish_all(&events).await;

    let source = fx.source().prefetch(20).connect().await.unwrap();
    assert_eq!(source.max_deliver(), Some(3));
    assert_eq!(
        source.dead_letter_stream(),
        Some(fx.dead_letter_stream.as_str())
    );
    let counts = consumer(&pool)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    // Two failures each requeued twice, then dead-lettered on the third delivery.
    assert_eq!((counts.applied, counts.failed), (10, 6), "{counts:?}");
    assert_eq!(counts.settle_failures, 0);
    assert_eq!(common::orders_sqlite(&pool).await.len(), 10);
    assert_eq!(common::applied_sqlite(&pool).await, 10);

    let letters = fx.dead_letters().await;
    assert_eq!(letters.len(), 2, "{letters:?}");
    for (headers, payload) in &letters {
        let event: OrderEvent = serde_json::from_slice(payload).unwrap();
        assert!(event.fail);
        assert_eq!(
            header(headers, idem::nats::headers::REASON),
            Some("too_many_deliveries")
        );
        assert_eq!(header(headers, idem::nats::headers::DELIVERIES), Some("3"));
        assert_eq!(
            header(headers, idem::nats::headers::SOURCE),
            Some(fx.stream.as_str())
        );
        assert_eq!(
            header(headers, idem::nats::headers::SOURCE_CONSUMER),
            Some("workers")
        );
        assert_eq!(
            header(headers, idem::nats::headers::SOURCE_SUBJECT),
            Some(format!("{}.order.{}", fx.prefix, event.order).as_str())
        );
    }
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    fx.delete().await;
}

/// Without `max_deliver` on the server, the loop's own `max_deliveries` reads JetStream's
/// delivery count and dead-letters a message delivered more often, without running it.
#[tokio::test]
async fn over_max_deliveries_is_dead_lettered_without_running() {
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    let pool = common::sqlite().await;
    let mut events: Vec<OrderEvent> = (1..=5).map(|o| OrderEvent::new(o, 1)).collect();
    events.push(poison(100));
    fx.publish_all(&events).await;
    let source = fx.source().prefetch(20).connect().await.unwrap();
    assert_eq!(source.max_deliver(), None);
    let counts = consumer(&pool)
        .max_deliveries(2)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(
        (counts.applied, counts.failed, counts.dead_lettered),
        (5, 2, 1),
        "{counts:?}"
    );
    let letters = fx.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        header(&letters[0].0, idem::nats::headers::REASON),
        Some("too_many_deliveries")
    );
    assert_eq!(
        header(&letters[0].0, idem::nats::headers::DELIVERIES),
        Some("3")
    );
    assert_eq!(common::applied_sqlite(&pool).await, 5);
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    fx.delete().await;
}

/// An undecodable body is dead-lettered on its first delivery. Here no stream stores the
/// dead-letter subject, so the dead letter goes out on core NATS (confirmed by a flush) and a
/// subscriber receives it, with the decoder's error in its headers.
#[tokio::test]
async fn undecodable_bodies_are_dead_lettered_at_once_on_core_nats() {
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    let pool = common::sqlite().await;
    let subject = format!("idem-core-dlq.{}", fx.prefix);
    let mut letters = fx.client.subscribe(subject.clone()).await.unwrap();
    fx.client.flush().await.unwrap();
    fx.publish("order.1", b"{not json".to_vec(), None).await;
    fx.publish_all(&[OrderEvent::new(1, 1), OrderEvent::new(2, 1)])
        .await;
    fx.publish("order.2", b"[1, 2, 3]".to_vec(), None).await;

    let source = fx.source().dead_letters(&subject).connect().await.unwrap();
    assert_eq!(source.dead_letter_stream(), None);
    let counts = consumer(&pool)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(
        (counts.applied, counts.dead_lettered, counts.failed),
        (2, 2, 0),
        "{counts:?}"
    );
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let letter = tokio::time::timeout(Duration::from_secs(5), letters.next())
            .await
            .expect("a dead letter")
            .unwrap();
        let headers = letter.headers.unwrap();
        assert_eq!(
            header(&headers, idem::nats::headers::REASON),
            Some("undecodable")
        );
        assert_eq!(header(&headers, idem::nats::headers::DELIVERIES), Some("1"));
        assert!(header(&headers, idem::nats::headers::DETAIL)
            .unwrap()
            .contains("undecodable payload"));
        bodies.push(letter.payload.to_vec());
    }
    bodies.sort();
    assert_eq!(bodies, [b"[1, 2, 3]".to_vec(), b"{not json".to_vec()]);
    assert_eq!(common::applied_sqlite(&pool).await, 2);
    let (pending, ack_pending, redelivered) = fx.state().await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));
    // Nothing reached the stream's own dead-letter stream, and nothing looped back.
    assert!(fx.dead_letters().await.is_empty());
    fx.delete().await;
}

/// A dead-letter subject that the source stream captures would loop dead letters back into
/// the consumer: refused at start, clearly.
#[tokio::test]
async fn a_dead_letter_subject_inside_the_stream_is_refused() {
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    let err = fx
        .source()
        .dead_letters(format!("{}.dead", fx.prefix))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadLetterCaptured { .. }), "{err}");
    assert!(err.to_string().contains("loop back"), "{err}");
    let err = fx
        .source()
        .dead_letters("idem.*.x")
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("without wildcards"), "{err}");
    // The default lies outside the stream's subjects.
    let source = idem::nats::Source::builder(common::nats_url(), &fx.stream, &fx.consumer)
        .connect()
        .await
        .unwrap();
    assert_eq!(
        source.dead_letter_subject(),
        format!("idem.dead-letter.{}.workers", fx.stream)
    );
    source.close().await.unwrap();
    fx.delete().await;
}

/// What must exist is checked at connect, and the error names what is missing; a URL in an
/// error has no password or token.
#[tokio::test]
async fn a_missing_stream_or_consumer_fails_at_connect_naming_it() {
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    let err = idem::nats::Source::builder(common::nats_url(), "IDEM_NO_SUCH_STREAM", "workers")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StreamMissing { .. }), "{err}");
    assert!(err.to_string().contains("IDEM_NO_SUCH_STREAM"), "{err}");
    let err = idem::nats::Source::builder(common::nats_url(), &fx.stream, "no-such-consumer")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConsumerMissing { .. }), "{err}");
    assert!(err.to_string().contains("no-such-consumer"), "{err}");
    for url in ["nats://ada:secret@127.0.0.1:1", "nats://secret@127.0.0.1:1"] {
        let err = idem::nats::Source::builder(url, &fx.stream, &fx.consumer)
            .options(
                idem::nats::async_nats::ConnectOptions::new()
                    .connection_timeout(Duration::from_millis(200)),
            )
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(err.to_string().contains("***@127.0.0.1:1"), "{err}");
    }
    fx.delete().await;
}

/// On the shutdown signal mid-stream, the loop stops taking, finishes and acks what is in
/// flight, and gives back the rest: nothing is left unacked, and a second run applies exactly
/// what the first did not.
#[tokio::test]
async fn shutdown_mid_stream_loses_nothing() {
    let Some(fx) = fixture(Settings {
        ack_wait: Duration::from_secs(10),
        ..Settings::default()
    })
    .await
    else {
        return;
    };
    let pool = common::sqlite().await;
    let events: Vec<OrderEvent> = (1..=300)
        .map(|o| OrderEvent {
            sleep_ms: 3,
            ..OrderEvent::new(o, 1)
        })
        .collect();
    fx.publish_all(&events).await;
    let first = consumer(&pool)
        .batch(10)
        .run(
            fx.source()
                .prefetch(10)
                .expires(Duration::from_secs(1))
                .connect()
                .await
                .unwrap()
                .deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            tokio::time::sleep(Duration::from_millis(300)),
        )
        .await;
    let applied = common::applied_sqlite(&pool).await as u64;
    assert_eq!(first.applied, applied, "{first:?}");
    assert!(0 < applied && applied < 300, "applied {applied} of 300");
    assert_eq!(first.settle_failures, 0);
    // Everything taken was acked, or given back with a nak: JetStream counts those as
    // `num_ack_pending` until the next pull takes them, at once, not after `ack_wait`. So does
    // it the messages of a pull still open at the stop (at most one pull, `fetch(10)`), which
    // the source reads to its end and gives back in the background after `run` returned.
    let (pending, ack_pending, _) = fx.state().await;
    let ack_pending = ack_pending as u64;
    assert!(
        first.requeued <= ack_pending && ack_pending <= first.requeued + 10,
        "{ack_pending} ack pending: {first:?}"
    );
    assert_eq!(pending + ack_pending, 300 - applied, "nothing lost");
    let started = std::time::Instant::now();
    let second = consumer(&pool)
        .run(
            fx.source().connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(first.applied + second.applied, 300, "{second:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the given-back messages waited for ack_wait: {:?}",
        started.elapsed()
    );
    assert_eq!(second.duplicate, 0);
    assert_eq!(common::applied_sqlite(&pool).await, 300);
    assert!(common::applied_twice_sqlite(&pool).await.is_empty());
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    fx.delete().await;
}

/// Lease mode: while another worker holds the lease, the delivery is InProgress and goes back
/// as a nak with the loop's `in_progress_delay` (JetStream redelivers it after that delay, not
/// at once); once the lease holder finished, it is a Duplicate and acked.
#[tokio::test]
async fn in_progress_is_a_delayed_nak_not_a_spin() {
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    let pool = common::sqlite().await;
    let slow = OrderEvent {
        sleep_ms: 1500,
        ..OrderEvent::new(1, 1)
    };
    let holder = {
        let pool = pool.clone();
        let slow = slow.clone();
        tokio::spawn(async move { common::sqlite::leased(&pool, &slow).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    fx.publish_all(&[OrderEvent::new(1, 1)]).await;
    let counts = consumer(&pool)
        .in_progress_delay(Duration::from_millis(400))
        .run_each(
            fx.source().connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |pool, e| common::sqlite::leased(pool, e).await,
            fx.settled(),
        )
        .await;
    assert!(matches!(
        holder.await.unwrap(),
        Ok(idem::Outcome::Applied(()))
    ));
    // About 1.4 s of lease at 400 ms a nak: a few tries, not a spin.
    assert!(
        (1..=5).contains(&counts.in_progress),
        "naked {} times",
        counts.in_progress
    );
    assert_eq!((counts.duplicate, counts.applied), (1, 0), "{counts:?}");
    assert_eq!(common::applied_sqlite(&pool).await, 1);
    let (pending, ack_pending, redelivered) = fx.state().await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));
    fx.delete().await;
}

/// A batch that runs three times the consumer's `ack_wait` finishes without a redelivery:
/// its deliveries sent `Progress` heartbeats while it ran. The same for a lease-mode body.
#[tokio::test]
async fn a_handler_slower_than_ack_wait_finishes_without_a_redelivery() {
    let Some(fx) = fixture(Settings {
        ack_wait: Duration::from_secs(1),
        ..Settings::default()
    })
    .await
    else {
        return;
    };
    let pool = common::sqlite().await;
    let slow = |order| OrderEvent {
        sleep_ms: 1500,
        ..OrderEvent::new(order, 1)
    };
    fx.publish_all(&[slow(1), slow(2)]).await;
    let source = fx
        .source()
        .prefetch(2)
        .expires(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    assert_eq!(source.heartbeat(), Duration::from_secs(1) / 3);
    let counts = consumer(&pool)
        .batch(2)
        .linger(Duration::from_millis(200))
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(
        (counts.applied, counts.duplicate, counts.failed),
        (2, 0, 0),
        "{counts:?}"
    );
    assert_eq!(counts.settle_failures, 0);
    let (pending, ack_pending, redelivered) = fx.state().await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));

    // Lease mode: one body of 3 s.
    fx.publish_all(&[OrderEvent {
        sleep_ms: 3000,
        ..OrderEvent::new(3, 1)
    }])
    .await;
    let counts = consumer(&pool)
        .run_each(
            fx.source().connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |pool, e| common::sqlite::leased(pool, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!((counts.applied, counts.in_progress), (1, 0), "{counts:?}");
    let (pending, ack_pending, redelivered) = fx.state().await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));
    assert_eq!(common::applied_sqlite(&pool).await, 3);
    fx.delete().await;
}

/// A confirmed ack that the server never answers (the connection closed after the commit) is
/// counted as a settle failure, not taken for success; JetStream redelivers the message after
/// `ack_wait`, and that redelivery is a Duplicate, acked.
#[tokio::test]
async fn a_failed_confirmed_ack_is_counted_and_its_redelivery_is_a_duplicate() {
    let Some(fx) = fixture(Settings {
        ack_wait: Duration::from_secs(2),
        ..Settings::default()
    })
    .await
    else {
        return;
    };
    let pool = common::sqlite().await;
    fx.publish_all(&[OrderEvent::new(1, 1)]).await;
    // A connection of its own, through a proxy the handler cuts before its transaction
    // commits: the ack then goes nowhere, and its confirmation never comes.
    let proxy = common::Proxy::start().await;
    let source = idem::nats::Source::builder(proxy.url(), &fx.stream, &fx.consumer)
        .dead_letters(&fx.dead_letter_subject)
        .request_timeout(Duration::from_secs(1));
    let cut = Arc::new(tokio::sync::Notify::new());
    let first = consumer(&pool)
        .run(
            source.connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |b, e| {
                let result = order_status(b, e).await;
                proxy.cut();
                cut.notify_one();
                result
            },
            async {
                cut.notified().await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
            },
        )
        .await;
    assert_eq!((first.applied, first.settle_failures), (1, 1), "{first:?}");
    assert_eq!(common::applied_sqlite(&pool).await, 1);
    let (_, ack_pending, _) = fx.state().await;
    assert_eq!(ack_pending, 1, "the ack never reached the server");

    let second = consumer(&pool)
        .run(
            fx.source().connect().await.unwrap().deliveries(),
            json::<OrderEvent>,
            async |b, e| order_status(b, e).await,
            fx.settled(),
        )
        .await;
    assert_eq!(
        (second.applied, second.duplicate, second.settle_failures),
        (0, 1, 0),
        "{second:?}"
    );
    assert_eq!(common::applied_sqlite(&pool).await, 1);
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    fx.delete().await;
}

/// The server answers every kind of settlement idem sends with a reply subject (`+WPI`,
/// `-NAK`, `+TERM`, `+ACK`), so heartbeats and naks are confirmed, not fire-and-forget.
#[tokio::test]
async fn the_server_confirms_progress_nak_term_and_ack() {
    use idem::nats::async_nats::jetstream::{consumer::PullConsumer, AckKind};
    let Some(fx) = fixture(Settings::default()).await else {
        return;
    };
    fx.publish_all(&[OrderEvent::new(1, 1), OrderEvent::new(2, 1)])
        .await;
    let consumer: PullConsumer = fx
        .js
        .get_consumer_from_stream(&fx.consumer, &fx.stream)
        .await
        .unwrap();
    let confirmed = async |message: &idem::nats::async_nats::jetstream::Message, kind| {
        tokio::time::timeout(Duration::from_secs(2), message.double_ack_with(kind))
            .await
            .expect("the server answered")
            .expect("confirmed")
    };
    let mut batch = consumer.fetch().max_messages(2).messages().await.unwrap();
    let first = batch.next().await.unwrap().unwrap();
    let second = batch.next().await.unwrap().unwrap();
    confirmed(&first, AckKind::Progress).await;
    confirmed(&first, AckKind::Nak(Some(Duration::from_millis(100)))).await;
    confirmed(&second, AckKind::Term).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut batch = consumer.fetch().max_messages(2).messages().await.unwrap();
    let again = batch.next().await.unwrap().unwrap();
    assert_eq!(again.info().unwrap().delivered, 2);
    confirmed(&again, AckKind::Ack).await;
    let (pending, ack_pending, _) = fx.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    fx.delete().await;
}

//! What is NATS's own, beside the kit's rules: the server's `max_deliver` (idem dead-letters on
//! the last allowed delivery), dead letters on core NATS where no stream keeps them, a
//! dead-letter subject the stream would capture, what `connect` checks, a lease held elsewhere
//! as a delayed nak, `Progress` heartbeats for handlers slower than `ack_wait`, an ack whose
//! confirmation never comes, the server confirming every kind of settlement, and what a
//! delivery tells of its origin and headers. Each test
//! uses a [`Nats`] input and a kit database of its own, and asserts the database and the
//! JetStream consumer (`num_pending`, `num_ack_pending`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery as _, Settle};
use idem::nats::async_nats::HeaderMap;
use idem::nats::{headers, Error, OutboxPublisher, Source};
use idem::outbox::{Message, Publisher as _};
use idem::{idempotent, Outcome, Tx};
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness;
use idem_testkit::broker::model::{self, Event};
use idem_testkit::broker::{Broker, Raw, Spec};
use serde::{Deserialize, Serialize};

use crate::{header, url, Nats, CONSUMER};

fn consumer(pool: &sqlx::SqlitePool) -> Consumer<sqlx::Sqlite> {
    Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(200))
}

/// A spec whose consumer redelivers after `ack_wait`.
fn spec(rule: &'static str, ack_wait: Duration) -> Spec {
    Spec {
        redelivery: ack_wait,
        ..Spec::new(rule)
    }
}

/// A poison message is tried until the JetStream consumer's `max_deliver`, and on that last
/// allowed delivery idem publishes it to the dead-letter subject (confirmed by the dead-letter
/// stream) with headers saying why, then terminates it: nothing is stranded unacked.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn poison_is_dead_lettered_on_the_last_allowed_delivery_with_headers() {
    let Some(b) = Nats::create_with(Spec::new("maxdeliver"), 3).await else {
        return;
    };
    harness::on::<Nats, Sqlite>(b, async |b, k| {
        model::schema(k).await;
        let mut events: Vec<Event> = (0..10)
            .map(|i| model::credit(&format!("ok{i}"), i, 1))
            .collect();
        events.insert(3, model::poison("poison-a"));
        events.insert(7, model::poison("poison-b"));
        b.publish(&model::raws(&events)).await;

        let source = b.builder().prefetch(20).connect().await.unwrap();
        assert_eq!(source.max_deliver(), Some(3));
        assert_eq!(
            source.dead_letter_stream(),
            Some(b.dead_letter_stream().as_str())
        );
        let d = k.dialect;
        let counts = consumer(&k.pool)
            .run(
                source.deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled(),
            )
            .await;
        // Two failures each requeued twice, then dead-lettered on the third delivery.
        assert_eq!((counts.applied, counts.failed), (10, 6), "{counts:?}");
        assert_eq!(counts.settle_failures, 0);
        model::verify(k, &model::oracle(&events)).await;

        let letters = b.dead_letters().await;
        assert_eq!(letters.len(), 2, "{letters:?}");
        for letter in &letters {
            assert!(letter.id.as_deref().unwrap().starts_with("poison"));
            assert_eq!(letter.reason(), "too_many_deliveries");
            assert_eq!(letter.field(headers::DELIVERIES), Some("3"));
            assert_eq!(letter.field(headers::SOURCE), Some(b.stream.as_str()));
            assert_eq!(letter.field(headers::SOURCE_CONSUMER), Some(CONSUMER));
            assert_eq!(
                letter.field(headers::SOURCE_SUBJECT),
                Some(format!("{}.in", b.prefix).as_str())
            );
        }
        let (pending, ack_pending, _) = b.state().await;
        assert_eq!((pending, ack_pending), (0, 0));
    })
    .await;
}

/// An undecodable body is dead-lettered on its first delivery. Here no stream stores the
/// dead-letter subject, so the dead letter goes out on core NATS (confirmed by a flush) and a
/// subscriber receives it, with the decoder's error in its headers.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn undecodable_bodies_are_dead_lettered_at_once_on_core_nats() {
    harness::with::<Nats, Sqlite>(Spec::new("coredlq"), async |b, k| {
        model::schema(k).await;
        let subject = format!("idem-core-dlq.{}", b.prefix);
        let mut letters = b.client.subscribe(subject.clone()).await.unwrap();
        b.client.flush().await.unwrap();
        let good = [model::credit("c1", 1, 1), model::credit("c2", 2, 1)];
        b.publish(&[
            Raw {
                id: "garbled".into(),
                payload: b"{not json".to_vec(),
            },
            good[0].raw(),
            good[1].raw(),
            Raw {
                id: "array".into(),
                payload: b"[1, 2, 3]".to_vec(),
            },
        ])
        .await;

        let source = b.builder().dead_letters(&subject).connect().await.unwrap();
        assert_eq!(source.dead_letter_stream(), None);
        let d = k.dialect;
        let counts = consumer(&k.pool)
            .run(
                source.deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled(),
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
            let fields = letter.headers.unwrap();
            assert_eq!(header(&fields, headers::REASON), Some("undecodable"));
            assert_eq!(header(&fields, headers::DELIVERIES), Some("1"));
            assert!(header(&fields, headers::DETAIL)
                .unwrap()
                .contains("undecodable payload"));
            bodies.push(letter.payload.to_vec());
        }
        bodies.sort();
        assert_eq!(bodies, [b"[1, 2, 3]".to_vec(), b"{not json".to_vec()]);
        model::verify(k, &model::oracle(&good)).await;
        assert_eq!(b.state().await, (0, 0, 0));
        // Nothing reached the stream's own dead-letter stream, and nothing looped back.
        assert!(b.dead_letters().await.is_empty());
    })
    .await;
}

/// A dead-letter subject that the source stream captures would loop dead letters back into
/// the consumer: refused at start, clearly.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_dead_letter_subject_inside_the_stream_is_refused() {
    let Some(b) = Nats::create(Spec::new("captured")).await else {
        return;
    };
    let err = b
        .builder()
        .dead_letters(format!("{}.dead", b.prefix))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadLetterCaptured { .. }), "{err}");
    assert!(err.to_string().contains("loop back"), "{err}");
    let err = b
        .builder()
        .dead_letters("idem.*.x")
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("without wildcards"), "{err}");
    // The default lies outside the stream's subjects.
    let source = b.builder().connect().await.unwrap();
    assert_eq!(
        source.dead_letter_subject(),
        format!("idem.dead-letter.{}.workers", b.stream)
    );
    source.close().await.unwrap();
    b.teardown().await;
}

/// What must exist is checked at connect, and the error names what is missing; a URL in an
/// error has no password or token.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_missing_stream_or_consumer_fails_at_connect_naming_it() {
    let Some(b) = Nats::create(Spec::new("missing")).await else {
        return;
    };
    let err = Source::builder(url(), "IDEM_NO_SUCH_STREAM", CONSUMER)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StreamMissing { .. }), "{err}");
    assert!(err.to_string().contains("IDEM_NO_SUCH_STREAM"), "{err}");
    let err = Source::builder(url(), &b.stream, "no-such-consumer")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ConsumerMissing { .. }), "{err}");
    assert!(err.to_string().contains("no-such-consumer"), "{err}");
    for url in ["nats://ada:secret@127.0.0.1:1", "nats://secret@127.0.0.1:1"] {
        let err = Source::builder(url, &b.stream, CONSUMER)
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
    b.teardown().await;
}

/// A job that takes `sleep_ms`, applied once (a row in the kit's `ledger`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    id: String,
    sleep_ms: u64,
}

impl Job {
    fn raw(id: &str, sleep_ms: u64) -> Raw {
        let job = Job {
            id: id.into(),
            sleep_ms,
        };
        Raw {
            id: id.into(),
            payload: serde_json::to_vec(&job).unwrap(),
        }
    }
}

async fn work(tx: &mut Tx<'_, sqlx::Sqlite>, job: &Job) -> Result<(), String> {
    tokio::time::sleep(Duration::from_millis(job.sleep_ms)).await;
    sqlx::query("INSERT INTO ledger (id) VALUES (?1)")
        .bind(&job.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[idempotent(key = "job.id", scope = "nats_specific::job")]
async fn job(tx: &mut Tx<'_, sqlx::Sqlite>, job: &Job) -> Result<(), String> {
    work(tx, job).await
}

/// The same in lease mode (the body runs outside the claim's transaction).
#[idempotent(
    key = "job.id",
    scope = "nats_specific::leased",
    mode = "lease",
    lease = "30s"
)]
async fn leased(tx: &mut Tx<'_, sqlx::Sqlite>, job: &Job) -> Result<(), String> {
    work(tx, job).await
}

/// Lease mode: while another worker holds the lease, the delivery is InProgress and goes back
/// as a nak with the loop's `in_progress_delay` (JetStream redelivers it after that delay, not
/// at once); once the lease holder finished, it is a Duplicate and acked.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn in_progress_is_a_delayed_nak_not_a_spin() {
    harness::with::<Nats, Sqlite>(Spec::new("inprogress"), async |b, k| {
        model::schema(k).await;
        let holder = {
            let pool = k.pool.clone();
            let slow = Job {
                id: "j1".into(),
                sleep_ms: 1500,
            };
            tokio::spawn(async move { leased(&pool, &slow).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        b.publish(&[Job::raw("j1", 0)]).await;
        let counts = consumer(&k.pool)
            .in_progress_delay(Duration::from_millis(400))
            .run_each(
                b.builder().connect().await.unwrap().deliveries(),
                json::<Job>,
                async |pool, j| leased(pool, j).await,
                b.settled(),
            )
            .await;
        assert!(matches!(holder.await.unwrap(), Ok(Outcome::Applied(()))));
        // About 1.4 s of lease at 400 ms a nak: a few tries, not a spin.
        assert!(
            (1..=5).contains(&counts.in_progress),
            "naked {} times",
            counts.in_progress
        );
        assert_eq!((counts.duplicate, counts.applied), (1, 0), "{counts:?}");
        assert_eq!(model::applied(k).await, 1);
        assert_eq!(b.state().await, (0, 0, 0));
    })
    .await;
}

/// A batch that runs longer than the consumer's `ack_wait` finishes without a redelivery: its
/// deliveries sent `Progress` heartbeats while it ran. The same for a lease-mode body.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_handler_slower_than_ack_wait_finishes_without_a_redelivery() {
    let spec = spec("heartbeat", Duration::from_secs(1));
    harness::with::<Nats, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        b.publish(&[Job::raw("j1", 1500), Job::raw("j2", 1500)])
            .await;
        let source = b
            .builder()
            .prefetch(2)
            .expires(Duration::from_millis(500))
            .connect()
            .await
            .unwrap();
        assert_eq!(source.heartbeat(), Duration::from_secs(1) / 3);
        let counts = consumer(&k.pool)
            .batch(2)
            .linger(Duration::from_millis(200))
            .run(
                source.deliveries(),
                json::<Job>,
                async |batch, j| job(batch, j).await,
                b.settled(),
            )
            .await;
        assert_eq!(
            (counts.applied, counts.duplicate, counts.failed),
            (2, 0, 0),
            "{counts:?}"
        );
        assert_eq!(counts.settle_failures, 0);
        assert_eq!(b.state().await, (0, 0, 0));

        // Lease mode: one body of 3 s.
        b.publish(&[Job::raw("j3", 3000)]).await;
        let counts = consumer(&k.pool)
            .run_each(
                b.builder().connect().await.unwrap().deliveries(),
                json::<Job>,
                async |pool, j| leased(pool, j).await,
                b.settled(),
            )
            .await;
        assert_eq!((counts.applied, counts.in_progress), (1, 0), "{counts:?}");
        assert_eq!(b.state().await, (0, 0, 0));
        assert_eq!(model::applied(k).await, 3);
    })
    .await;
}

/// A TCP proxy to the NATS server that a test can cut: every connection through it is closed
/// and no new one is accepted (a network cut, as the client sees it).
struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn start() -> Proxy {
        let upstream = url()
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

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

/// A confirmed ack that the server never answers (the connection closed after the commit) is
/// counted as a settle failure, not taken for success; JetStream redelivers the message after
/// `ack_wait`, and that redelivery is a Duplicate, acked.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_failed_confirmed_ack_is_counted_and_its_redelivery_is_a_duplicate() {
    let spec = spec("confirm", Duration::from_secs(2));
    harness::with::<Nats, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        let events = [model::credit("c1", 1, 1)];
        b.publish(&model::raws(&events)).await;
        // A connection of its own, through a proxy the handler cuts before its transaction
        // commits: the ack then goes nowhere, and its confirmation never comes.
        let proxy = Proxy::start().await;
        let source = Source::builder(proxy.url(), &b.stream, CONSUMER)
            .request_timeout(Duration::from_secs(1));
        let cut = Arc::new(tokio::sync::Notify::new());
        let d = k.dialect;
        let first = consumer(&k.pool)
            .run(
                source.connect().await.unwrap().deliveries(),
                json::<Event>,
                async |batch, e| {
                    let result = model::handle(batch, e, &d).await;
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
        assert_eq!(model::applied(k).await, 1);
        let (_, ack_pending, _) = b.state().await;
        assert_eq!(ack_pending, 1, "the ack never reached the server");

        let second = consumer(&k.pool)
            .run(
                b.builder().connect().await.unwrap().deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled(),
            )
            .await;
        assert_eq!(
            (second.applied, second.duplicate, second.settle_failures),
            (0, 1, 0),
            "{second:?}"
        );
        model::verify(k, &model::oracle(&events)).await;
        let (pending, ack_pending, _) = b.state().await;
        assert_eq!((pending, ack_pending), (0, 0));
    })
    .await;
}

/// The server answers every kind of settlement idem sends with a reply subject (`+WPI`,
/// `-NAK`, `+TERM`, `+ACK`), so heartbeats and naks are confirmed, not fire-and-forget.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn the_server_confirms_progress_nak_term_and_ack() {
    use idem::nats::async_nats::jetstream::{consumer::PullConsumer, AckKind};
    let Some(b) = Nats::create(Spec::new("acks")).await else {
        return;
    };
    b.publish(&[
        model::credit("c1", 1, 1).raw(),
        model::credit("c2", 1, 1).raw(),
    ])
    .await;
    let consumer: PullConsumer =
        b.js.get_consumer_from_stream(CONSUMER, &b.stream)
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
    let (pending, ack_pending, _) = b.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    b.teardown().await;
}

/// A delivery tells its origin (the stream, its stream and consumer sequences, and the subject
/// it was published on as where a replay publishes it) and its headers, one pair per value;
/// published there through the outbox, it comes back to the same consumer.
#[tokio::test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_delivery_tells_its_origin_and_headers_and_a_replay_there_comes_back() {
    let Some(b) = Nats::create(Spec::new("origin")).await else {
        return;
    };
    let subject = format!("{}.in", b.prefix);
    let mut sent = HeaderMap::new();
    sent.insert("x-trace", "t-1");
    sent.append("x-tag", "a");
    sent.append("x-tag", "b");
    b.js.publish_with_headers(subject.clone(), sent, b"{}".to_vec().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let source = b
        .builder()
        .expires(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let mut deliveries = source.deliveries();
    let delivery = deliveries.next().await.unwrap().unwrap();
    let origin = delivery.origin();
    assert_eq!(origin.broker, "nats");
    assert_eq!(origin.broker, idem::nats::BROKER);
    assert_eq!(origin.source, b.stream);
    assert_eq!(origin.coordinates, "stream sequence 1, consumer sequence 1");
    assert_eq!(origin.destination, subject);
    let pair = |name: &str, value: &str| (name.to_string(), value.to_string());
    let headers = delivery.headers();
    assert_eq!(
        headers,
        [
            pair("x-tag", "a"),
            pair("x-tag", "b"),
            pair("x-trace", "t-1")
        ]
    );
    delivery.settle(Settle::Ack).await.unwrap();
    // A replay: the outbox publishes it to the destination, which the stream captures.
    let publisher = OutboxPublisher::builder(url()).connect().await.unwrap();
    let replay = Message {
        id: format!("idem-origin-replay-{}", b.stream),
        destination: origin.destination.clone(),
        partition_key: String::new(),
        payload: b"{}".to_vec(),
        headers,
        attempts: 0,
    };
    publisher.publish(&[replay]).await.unwrap();
    let again = harness::within(Duration::from_secs(10), "the replay", deliveries.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.payload(), b"{}");
    let replayed = again.origin();
    assert_eq!(
        (replayed.source, replayed.destination),
        (b.stream.clone(), subject)
    );
    assert_eq!(
        replayed.coordinates,
        "stream sequence 2, consumer sequence 2"
    );
    assert!(again.headers().contains(&pair("x-trace", "t-1")));
    again.settle(Settle::Ack).await.unwrap();
    drop(deliveries);
    source.close().await.unwrap();
    let (pending, ack_pending, _) = b.state().await;
    assert_eq!((pending, ack_pending), (0, 0));
    b.teardown().await;
}

//! What is Kafka's own, beside the kit's rules: what `connect` checks, the committed offset
//! held by a record not yet settled (the watermark), `max_held` pausing a partition while the
//! others flow, a second member joining mid-stream (a rebalance), and what a delivery tells of
//! its origin and headers. Each test uses a
//! [`Kafka`] topic and a kit database of its own, and asserts the database, the group's
//! committed offsets and the topic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Counts, Delivery, Settle, SettleError};
use idem::kafka::rdkafka::message::{Header, OwnedHeaders};
use idem::kafka::OutboxPublisher;
use idem::outbox::{Message, Publisher as _};
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness::{self, unique_name, within};
use idem_testkit::broker::model::{self, Event, Status};
use idem_testkit::broker::{Broker, Spec};
use idem_testkit::Kit;

use crate::Kafka;

/// How long a test waits for the group to settle before it takes the workaround it states.
const STALL: Duration = Duration::from_secs(60);

/// Runs a consumer until every partition is committed to its end, or `STALL` passed (then the
/// test's assertions say what is missing, instead of the test hanging).
async fn run_until_settled(b: &Kafka, k: &Kit<Sqlite>, sleep: Duration) -> Counts {
    let source = b.builder().connect().await.unwrap();
    let d = k.dialect;
    let counts = Consumer::new(k.pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(200))
        .run(
            source.deliveries(),
            json::<Event>,
            async |batch, e| {
                tokio::time::sleep(sleep).await;
                model::handle(batch, e, &d).await
            },
            async {
                let _ = tokio::time::timeout(STALL, b.settled()).await;
            },
        )
        .await;
    source.close().await.unwrap();
    counts
}

/// What must exist is checked at connect, and the error names what is missing.
#[tokio::test]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn a_missing_topic_or_dead_letter_topic_fails_at_connect_naming_it() {
    let Some(b) = Kafka::create_with(Spec::new("missing"), 1).await else {
        return;
    };
    let missing = unique_name("idem_kit_missing");
    let err = idem::kafka::Source::builder(&b.brokers, &missing, &b.group)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::kafka::Error::TopicMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&missing), "{err}");
    let err = b
        .builder()
        .dead_letters(&missing)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::kafka::Error::DeadLetterTopicMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&missing), "{err}");
    b.teardown().await;
}

/// A delivery that counts its settlements once they are done.
struct Counted {
    inner: idem::kafka::Delivery,
    settled: Arc<AtomicU64>,
}

impl Delivery for Counted {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }

    fn revoked(&self) -> bool {
        self.inner.revoked()
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
        let done = self.inner.settle(settle).await;
        self.settled.fetch_add(1, Ordering::SeqCst);
        done
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

/// The receiver as a stream.
fn stream_of<T: Send + 'static>(
    receiver: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::unfold(receiver, |mut r| async move {
        r.recv().await.map(|item| (item, r))
    })
}

/// Produces credits `<prefix>0..n` to `partition`.
async fn produce_credits(b: &Kafka, partition: i32, prefix: &str, n: i64) -> Vec<Event> {
    let events: Vec<Event> = (0..n)
        .map(|i| model::credit(&format!("{prefix}{i}"), i % 4, 1))
        .collect();
    for e in &events {
        b.produce_raw(Some(partition), &e.raw()).await;
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn a_record_held_back_holds_the_committed_offset_while_later_ones_settle() {
    let Some(b) = Kafka::create_with(Spec::new("held"), 1).await else {
        return;
    };
    harness::on::<Kafka, Sqlite>(b, async |b, k| {
        model::schema(k).await;
        let events = produce_credits(b, 0, "c", 10).await;

        // Offset 2 is taken from the broker and held back from the loop until released; the
        // others run and settle first, out of order.
        let source = b.builder().connect().await.unwrap();
        let settled = Arc::new(AtomicU64::new(0));
        let held: Arc<Mutex<Option<idem::kafka::Delivery>>> = Arc::default();
        let (release, released) = tokio::sync::mpsc::unbounded_channel();
        let taken = {
            let (settled, held) = (settled.clone(), held.clone());
            source.deliveries().filter_map(move |d| {
                let (settled, held) = (settled.clone(), held.clone());
                async move {
                    match d {
                        Ok(inner) if inner.offset() == 2 => {
                            *held.lock().unwrap() = Some(inner);
                            None
                        }
                        other => Some(other.map(|inner| Counted { inner, settled })),
                    }
                }
            })
        };
        let released = stream_of(released).map(|inner| {
            Ok(Counted {
                inner,
                settled: settled.clone(),
            })
        });
        let deliveries = futures_util::stream::select(taken, released);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let d = k.dialect;
        // The loop and the test's steps run side by side in this task.
        let run = Consumer::new(k.pool.clone()).batch(1).concurrency(2).run(
            deliveries,
            json::<Event>,
            async |batch, e| model::handle(batch, e, &d).await,
            async {
                let _ = stopped.await;
            },
        );
        let steps = async {
            let counter = settled.clone();
            wait_for("9 records settled", || counter.load(Ordering::SeqCst) == 9).await;
            source.commit().await.unwrap();
            assert_eq!(model::applied(k).await, 9);
            assert_eq!(b.committed().await, vec![Some(2)], "never past offset 2");

            let delivery = held.lock().unwrap().take().expect("offset 2 was held");
            release.send(delivery).unwrap();
            wait_for("10 records settled", || {
                counter.load(Ordering::SeqCst) == 10
            })
            .await;
            source.commit().await.unwrap();
            assert_eq!(b.committed().await, vec![Some(10)]);
            assert_eq!(model::applied(k).await, 10);
            stop.send(()).unwrap();
        };
        let (counts, ()) = tokio::join!(run, steps);
        assert_eq!(counts.applied, 10);
        source.close().await.unwrap();
        model::verify(k, &model::oracle(&events)).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn a_partition_holding_max_held_records_is_paused_while_others_flow_and_resumes_once_they_settle(
) {
    const MAX_HELD: usize = 5;
    let Some(b) = Kafka::create_with(Spec::new("maxheld"), 2).await else {
        return;
    };
    harness::on::<Kafka, Sqlite>(b, async |b, k| {
        model::schema(k).await;
        let mut events = produce_credits(b, 0, "p0-", 30).await;
        events.extend(produce_credits(b, 1, "p1-", 30).await);

        // Every record of partition 0 is taken from the broker and held back from the loop
        // (never settled) until the test lets go; partition 1's go through and settle.
        let source = b.builder().max_held(MAX_HELD).connect().await.unwrap();
        let settled = Arc::new(AtomicU64::new(0));
        // Offsets of partition 0 in the order the source delivered them, and how many of
        // partition 1 it delivered.
        let seen_0: Arc<Mutex<Vec<i64>>> = Arc::default();
        let seen_1 = Arc::new(AtomicU64::new(0));
        let held: Arc<Mutex<Option<Vec<idem::kafka::Delivery>>>> =
            Arc::new(Mutex::new(Some(Vec::new())));
        let (release, released) = tokio::sync::mpsc::unbounded_channel();
        let taken = {
            let (settled, held, seen_0, seen_1) = (
                settled.clone(),
                held.clone(),
                seen_0.clone(),
                seen_1.clone(),
            );
            source.deliveries().filter_map(move |d| {
                let (settled, held) = (settled.clone(), held.clone());
                match &d {
                    Ok(inner) if inner.partition() == 0 => {
                        seen_0.lock().unwrap().push(inner.offset());
                    }
                    Ok(_) => {
                        seen_1.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {}
                }
                async move {
                    match d {
                        Ok(inner) if inner.partition() == 0 => {
                            let mut held = held.lock().unwrap();
                            match held.as_mut() {
                                Some(held) => {
                                    held.push(inner);
                                    None
                                }
                                None => Some(Ok(Counted { inner, settled })),
                            }
                        }
                        other => Some(other.map(|inner| Counted { inner, settled })),
                    }
                }
            })
        };
        let released = stream_of(released).map(|inner| {
            Ok(Counted {
                inner,
                settled: settled.clone(),
            })
        });
        let deliveries = futures_util::stream::select(taken, released);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let d = k.dialect;
        let run = Consumer::new(k.pool.clone()).batch(5).concurrency(2).run(
            deliveries,
            json::<Event>,
            async |batch, e| model::handle(batch, e, &d).await,
            async {
                let _ = stopped.await;
            },
        );
        let steps = async {
            let counter = settled.clone();
            wait_for("partition 1's 30 records settled", || {
                counter.load(Ordering::SeqCst) == 30
            })
            .await;
            wait_for("partition 0 paused at max_held", || {
                seen_0.lock().unwrap().len() >= MAX_HELD
            })
            .await;
            // More records for partition 1, produced after partition 0 was paused: they flow,
            // in the same fetches that would bring partition 0's 25 others were it not paused.
            events.extend(produce_credits(b, 1, "p1b-", 20).await);
            wait_for("partition 1's 50 records settled", || {
                counter.load(Ordering::SeqCst) == 50
            })
            .await;
            assert_eq!(seen_1.load(Ordering::SeqCst), 50);
            // Exactly max_held: the source pauses the partition as it takes the max_held-th
            // record, and librdkafka's pause discards what it had already fetched of it (a
            // version barrier) and later fetches from after the last record handed out.
            let before_release = seen_0.lock().unwrap().clone();
            assert_eq!(
                before_release,
                (0..MAX_HELD as i64).collect::<Vec<_>>(),
                "partition 0 delivered its first max_held records, then nothing while paused"
            );
            source.commit().await.unwrap();
            assert_eq!(
                b.committed().await,
                vec![None, Some(50)],
                "nothing of partition 0 settled; partition 1 committed to its end"
            );
            assert_eq!(model::applied(k).await, 50);

            // Let go: the held records settle, the watermark moves, and the next commit tick
            // resumes partition 0 from where it stopped.
            let held = held.lock().unwrap().take().unwrap();
            assert_eq!(held.len(), MAX_HELD);
            for delivery in held {
                release.send(delivery).unwrap();
            }
            wait_for("all 80 records settled", || {
                counter.load(Ordering::SeqCst) == 80
            })
            .await;
            source.commit().await.unwrap();
            assert_eq!(b.committed().await, vec![Some(30), Some(50)]);
            assert_eq!(
                *seen_0.lock().unwrap(),
                (0..30).collect::<Vec<i64>>(),
                "resumed where it paused: each offset of partition 0 once, in order"
            );
            stop.send(()).unwrap();
        };
        let (counts, ()) = tokio::join!(run, steps);
        assert_eq!(counts.applied, 80, "{counts:?}");
        source.close().await.unwrap();
        model::verify(k, &model::oracle(&events)).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn a_second_consumer_joining_mid_stream_loses_nothing() {
    let Some(b) = Kafka::create_with(Spec::new("join"), 4).await else {
        return;
    };
    harness::on::<Kafka, Sqlite>(b, async |b, k| {
        model::schema(k).await;
        let events: Vec<Event> = (1..=100)
            .flat_map(|order| {
                (1..=6).map(move |version| {
                    Event::Status(Status {
                        id: format!("s{order}-{version}"),
                        order,
                        version,
                        fail: false,
                    })
                })
            })
            .collect();
        b.publish(&model::raws(&events)).await;
        let sleep = Duration::from_millis(2);

        // The first consumer runs from the start; the second joins once 60 records applied.
        // Both stop once every partition is committed to its end, or after `STALL` (see below).
        let first = run_until_settled(b, k, sleep);
        let second = async {
            let joined = tokio::time::timeout(Duration::from_secs(20), async {
                while model::applied(k).await < 60 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            if joined.await.is_err() {
                eprintln!(
                    "the first consumer applied {} records in 20 s; the second joins anyway",
                    model::applied(k).await
                );
            }
            run_until_settled(b, k, sleep).await
        };
        let (first, second) = tokio::join!(first, second);
        eprintln!("first: {first:?}\nsecond: {second:?}");
        assert!(
            second.applied + second.duplicate + second.stale > 0,
            "the second consumer got partitions: {second:?}"
        );
        // tansu 0.6.0 once left a partition to nobody after this rebalance (one hang in about
        // ten runs, not reproduced alone); a real Kafka hands it on. Then both members have
        // left: past the session timeout a fresh member drains what is left, and everything
        // below still holds. (A hang inside `source.close()`, seen once in CI with a stack
        // trace, was another matter: librdkafka#4041, which `Source::close` now steps around.)
        let mut drained = Counts::default();
        if !b.all_committed().await {
            eprintln!(
                "not settled within {STALL:?}: committed {:?}, ends {:?}; a fresh member drains the rest",
                b.committed().await,
                b.ends().await
            );
            tokio::time::sleep(Duration::from_secs(9)).await;
            drained = run_until_settled(b, k, sleep).await;
        }
        let handled = |c: &Counts| c.applied + c.duplicate + c.stale;
        assert!(
            handled(&first) + handled(&second) + handled(&drained) >= 600,
            "every record was handled"
        );
        assert_eq!(
            first.applied + second.applied + drained.applied,
            model::applied(k).await
        );
        model::verify(k, &model::oracle(&events)).await;
        let committed: Vec<i64> = b.committed().await.into_iter().flatten().collect();
        assert_eq!(committed, b.ends().await);
    })
    .await;
}

/// A delivery tells its origin (the topic, its partition and offset, and the topic as where a
/// replay publishes it) and its record headers as text, a value that is not UTF-8 with its
/// invalid bytes replaced; published there through the outbox, it comes back to the group.
#[tokio::test]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn a_delivery_tells_its_origin_and_headers_and_a_replay_there_comes_back() {
    let Some(b) = Kafka::create(Spec::new("origin")).await else {
        return;
    };
    let sent = OwnedHeaders::new()
        .insert(Header {
            key: "x-trace",
            value: Some("t-1"),
        })
        .insert(Header {
            key: "x-attempt",
            value: Some("3"),
        })
        .insert(Header {
            key: "x-bytes",
            value: Some(&b"a\xff"[..]),
        });
    b.produce(Some(2), "o1", b"{}", sent).await;
    let source = b.builder().connect().await.unwrap();
    let mut deliveries = source.deliveries();
    let delivery = within(STALL, "the record", deliveries.next())
        .await
        .unwrap()
        .unwrap();
    let origin = delivery.origin();
    assert_eq!(origin.broker, "kafka");
    assert_eq!(origin.broker, idem::kafka::BROKER);
    assert_eq!(origin.source, b.topic);
    assert_eq!(origin.coordinates, "partition 2 offset 0");
    assert_eq!(origin.destination, b.topic);
    let pair = |name: &str, value: &str| (name.to_string(), value.to_string());
    let headers = delivery.headers();
    assert_eq!(
        headers,
        [
            pair("x-trace", "t-1"),
            pair("x-attempt", "3"),
            pair("x-bytes", "a\u{fffd}")
        ]
    );
    delivery.settle(Settle::Ack).await.unwrap();
    // A replay: the outbox publishes it to the destination.
    let publisher = OutboxPublisher::builder(&b.brokers)
        .producer_config("batch.num.messages", "1")
        .producer_config("linger.ms", "0")
        .connect()
        .await
        .unwrap();
    let replay = Message {
        id: "idem-origin-replay".into(),
        destination: origin.destination.clone(),
        partition_key: "o1".into(),
        payload: b"{}".to_vec(),
        headers,
        attempts: 0,
    };
    publisher.publish(&[replay]).await.unwrap();
    let again = within(STALL, "the replay", deliveries.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.payload(), b"{}");
    let replayed = again.origin();
    assert_eq!(
        (replayed.source, replayed.destination),
        (b.topic.clone(), b.topic.clone())
    );
    assert!(again.headers().contains(&pair("x-trace", "t-1")));
    again.settle(Settle::Ack).await.unwrap();
    drop(deliveries);
    source.close().await.unwrap(); // commits the watermarks
    within(STALL, "the commits", b.settled()).await;
    assert_eq!(
        b.ends().await.iter().sum::<i64>(),
        2,
        "the record and its replay"
    );
    b.teardown().await;
}

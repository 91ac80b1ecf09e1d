//! The Kafka consumer on a real Kafka-protocol broker (`IDEM_KAFKA_BROKERS`) and SQLite: every
//! test asserts the database, the group's committed offsets and the dead-letter topic.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixture, OrderEvent};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Delivery, Settle, SettleError};
use idem::kafka::headers;
use sqlx::SqlitePool;

fn consumer(pool: &SqlitePool) -> Consumer<sqlx::Sqlite> {
    Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(200))
}

/// How long a test waits for the group to settle before it takes the workaround it states.
const STALL: Duration = Duration::from_secs(60);

/// Runs a consumer until every partition is committed to its end, or `STALL` passed (then the
/// test's assertions say what is missing, instead of the test hanging).
async fn run_until_settled(fx: &Fixture, pool: &SqlitePool) -> idem::consume::Counts {
    let source = fx.source().await;
    let counts = consumer(pool)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| common::order_status(b, e).await,
            async {
                let _ = tokio::time::timeout(STALL, fx.settled()).await;
            },
        )
        .await;
    source.close().await.unwrap();
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_and_undecodable_records_go_to_the_dead_letter_topic_exactly_once() {
    let Some(fx) = Fixture::new(2).await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let mut events: Vec<OrderEvent> = (1..=20).map(|o| OrderEvent::new(o, 1)).collect();
    for order in [100, 101] {
        events.push(OrderEvent {
            fail: true,
            ..OrderEvent::new(order, 1)
        });
    }
    fx.produce_all(&events).await;
    fx.produce("junk", b"{not json").await;
    let counts = run_until_settled(&fx, &pool).await;

    assert_eq!(counts.applied, 20, "{counts:?}");
    assert_eq!(counts.dead_lettered, 3, "{counts:?}");
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    assert!(common::applied_twice(&pool).await.is_empty());
    let ends = fx.ends().await;
    assert_eq!(ends.iter().sum::<i64>(), 23);
    let committed: Vec<i64> = fx.committed().await.into_iter().flatten().collect();
    assert_eq!(committed, ends, "every partition committed to its end");

    let mut letters = fx.dead_letters(3).await;
    assert_eq!(letters.len(), 3, "each exactly once: {letters:?}");
    // The undecodable one first.
    letters.sort_by_key(|(payload, _)| payload.as_slice() != b"{not json");
    let (junk, junk_headers) = &letters[0];
    assert_eq!(junk.as_slice(), b"{not json");
    assert_eq!(junk_headers[headers::REASON], "undecodable");
    // Attempts are written for a poisoned message only: an undecodable one never ran.
    assert!(!junk_headers.contains_key(headers::ATTEMPTS));
    for (payload, fields) in &letters[1..] {
        let event: OrderEvent = serde_json::from_slice(payload).unwrap();
        assert!(event.fail);
        assert_eq!(fields[headers::REASON], "poisoned");
        assert_eq!(fields[headers::ATTEMPTS], "3");
        assert_eq!(fields[headers::SOURCE], fx.topic);
        assert!(fields[headers::SOURCE_PARTITION].parse::<i32>().is_ok());
        assert!(fields[headers::SOURCE_OFFSET].parse::<i64>().is_ok());
    }
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

/// What must exist is checked at connect, and the error names what is missing.
#[tokio::test]
async fn a_missing_topic_or_dead_letter_topic_fails_at_connect_naming_it() {
    let Some(fx) = Fixture::new(1).await else {
        return;
    };
    let missing = common::unique_name("idem_kafka_missing");
    let err = idem::kafka::Source::builder(&fx.brokers, &missing, &fx.group)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::kafka::Error::TopicMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&missing), "{err}");
    let err = fx
        .source_builder()
        .dead_letters(&missing)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::kafka::Error::DeadLetterTopicMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&missing), "{err}");
    fx.delete().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_held_back_holds_the_committed_offset_while_later_ones_settle() {
    let Some(fx) = Fixture::new(1).await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let events: Vec<OrderEvent> = (1..=10).map(|o| OrderEvent::new(o, 1)).collect();
    fx.produce_all(&events).await;

    // Offset 2 is taken from the broker and held back from the loop until released; the
    // others run and settle first, out of order.
    let source = fx.source().await;
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
    let released = tokio_stream_of(released).map(|inner| {
        Ok(Counted {
            inner,
            settled: settled.clone(),
        })
    });
    let deliveries = futures_util::stream::select(taken, released);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The loop and the test's steps run side by side in this task.
    let run = Consumer::new(pool.clone()).batch(1).concurrency(2).run(
        deliveries,
        json::<OrderEvent>,
        async |b, e| common::order_status(b, e).await,
        async {
            let _ = stopped.await;
        },
    );
    let steps = async {
        let counter = settled.clone();
        wait_for("9 records settled", || counter.load(Ordering::SeqCst) == 9).await;
        source.commit().await.unwrap();
        assert_eq!(common::applied(&pool).await, 9);
        assert_eq!(fx.committed().await, vec![Some(2)], "never past offset 2");

        let delivery = held.lock().unwrap().take().expect("offset 2 was held");
        release.send(delivery).unwrap();
        wait_for("10 records settled", || {
            counter.load(Ordering::SeqCst) == 10
        })
        .await;
        source.commit().await.unwrap();
        assert_eq!(fx.committed().await, vec![Some(10)]);
        assert_eq!(common::applied(&pool).await, 10);
        stop.send(()).unwrap();
    };
    let (counts, ()) = tokio::join!(run, steps);
    assert_eq!(counts.applied, 10);
    source.close().await.unwrap();
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

/// Produces `n` events (orders `first..first + n`, version 1) to `partition`.
async fn produce_orders(fx: &Fixture, partition: i32, first: i64, n: i64) -> Vec<OrderEvent> {
    let events: Vec<OrderEvent> = (first..first + n).map(|o| OrderEvent::new(o, 1)).collect();
    for e in &events {
        let payload = serde_json::to_vec(e).unwrap();
        fx.produce_to(partition, &e.order.to_string(), &payload)
            .await;
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_holding_max_held_records_is_paused_while_others_flow_and_resumes_once_they_settle(
) {
    const MAX_HELD: usize = 5;
    let Some(fx) = Fixture::new(2).await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let mut events = produce_orders(&fx, 0, 1_000, 30).await;
    events.extend(produce_orders(&fx, 1, 2_000, 30).await);

    // Every record of partition 0 is taken from the broker and held back from the loop (never
    // settled) until the test lets go; partition 1's go through and settle.
    let source = fx
        .source_builder()
        .max_held(MAX_HELD)
        .connect()
        .await
        .unwrap();
    let settled = Arc::new(AtomicU64::new(0));
    // Offsets of partition 0 in the order the source delivered them, and how many of partition
    // 1 it delivered.
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
    let released = tokio_stream_of(released).map(|inner| {
        Ok(Counted {
            inner,
            settled: settled.clone(),
        })
    });
    let deliveries = futures_util::stream::select(taken, released);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = Consumer::new(pool.clone()).batch(5).concurrency(2).run(
        deliveries,
        json::<OrderEvent>,
        async |b, e| common::order_status(b, e).await,
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
        // More records for partition 1, produced after partition 0 was paused: they flow, in
        // the same fetches that would bring partition 0's 25 others were it not paused.
        events.extend(produce_orders(&fx, 1, 3_000, 20).await);
        wait_for("partition 1's 50 records settled", || {
            counter.load(Ordering::SeqCst) == 50
        })
        .await;
        assert_eq!(seen_1.load(Ordering::SeqCst), 50);
        // Exactly max_held: the source pauses the partition as it takes the max_held-th record,
        // and librdkafka's pause discards what it had already fetched of it (a version barrier)
        // and later fetches from after the last record handed out.
        let before_release = seen_0.lock().unwrap().clone();
        assert_eq!(
            before_release,
            (0..MAX_HELD as i64).collect::<Vec<_>>(),
            "partition 0 delivered its first max_held records, then nothing while paused"
        );
        source.commit().await.unwrap();
        assert_eq!(
            fx.committed().await,
            vec![None, Some(50)],
            "nothing of partition 0 settled; partition 1 committed to its end"
        );
        assert_eq!(common::applied(&pool).await, 50);

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
        assert_eq!(fx.committed().await, vec![Some(30), Some(50)]);
        assert_eq!(
            *seen_0.lock().unwrap(),
            (0..30).collect::<Vec<i64>>(),
            "resumed where it paused: each offset of partition 0 once, in order"
        );
        stop.send(()).unwrap();
    };
    let (counts, ()) = tokio::join!(run, steps);
    assert_eq!(counts.applied, 80, "{counts:?}");
    assert_eq!(common::applied(&pool).await, 80);
    assert!(common::applied_twice(&pool).await.is_empty());
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    source.close().await.unwrap();
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

/// The receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    receiver: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::unfold(receiver, |mut r| async move {
        r.recv().await.map(|item| (item, r))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_batches_and_commits_what_settled() {
    let Some(fx) = Fixture::new(2).await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let events: Vec<OrderEvent> = (1..=40)
        .map(|o| OrderEvent {
            sleep_ms: 40,
            ..OrderEvent::new(o, 1)
        })
        .collect();
    fx.produce_all(&events).await;

    // Shut down as soon as the first batch committed: the batches in flight then finish and
    // settle (drain), and close commits every settled offset.
    let source = fx.source().await;
    let first = {
        let pool = pool.clone();
        async move {
            while common::applied(&pool).await == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let counts = Consumer::new(pool.clone())
        .batch(5)
        .concurrency(2)
        .run(
            source.deliveries(),
            json::<OrderEvent>,
            async |b, e| common::order_status(b, e).await,
            first,
        )
        .await;
    source.close().await.unwrap();
    let applied = common::applied(&pool).await;
    assert!(applied < 40, "shut down mid-stream: {counts:?}");
    assert_eq!(counts.applied as i64, applied, "every batch taken finished");
    let committed: i64 = fx.committed().await.into_iter().flatten().sum();
    // Each applied record is settled; the committed offsets cover exactly the contiguous part.
    assert!(
        committed <= applied && committed > 0,
        "{committed} of {applied}"
    );

    // A second run finishes: what was applied and not committed comes back as duplicates.
    let again = run_until_settled(&fx, &pool).await;
    assert_eq!(again.duplicate as i64, applied - committed, "{again:?}");
    assert_eq!(common::applied(&pool).await, 40);
    assert!(common::applied_twice(&pool).await.is_empty());
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_consumer_joining_mid_stream_loses_nothing() {
    let Some(fx) = Fixture::new(4).await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let events: Vec<OrderEvent> = (1..=100)
        .flat_map(|o| (1..=6).map(move |v| OrderEvent::new(o, v)))
        .map(|e| OrderEvent { sleep_ms: 2, ..e })
        .collect();
    fx.produce_all(&events).await;

    // The first consumer runs from the start; the second joins once 60 records applied. Both
    // stop once every partition is committed to its end, or after `STALL` (see below).
    let first = run_until_settled(&fx, &pool);
    let second = async {
        let joined = tokio::time::timeout(Duration::from_secs(20), async {
            while common::applied(&pool).await < 60 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        if joined.await.is_err() {
            eprintln!(
                "the first consumer applied {} records in 20 s; the second joins anyway",
                common::applied(&pool).await
            );
        }
        run_until_settled(&fx, &pool).await
    };
    let (first, second) = tokio::join!(first, second);
    eprintln!("first: {first:?}\nsecond: {second:?}");
    assert!(
        second.applied + second.duplicate > 0,
        "the second consumer got partitions: {second:?}"
    );
    // tansu 0.6.0 once left a partition to nobody after this rebalance (one hang in about ten
    // runs, not reproduced alone); a real Kafka hands it on. Then both members have left: past
    // the session timeout a fresh member drains what is left, and everything below still holds.
    // (A hang inside `source.close()`, seen once in CI with a stack trace, was another matter:
    // librdkafka#4041, which `Source::close` now steps around.)
    let mut drained = idem::consume::Counts::default();
    if !fx.all_committed().await {
        eprintln!(
            "not settled within {STALL:?}: committed {:?}, ends {:?}; a fresh member drains the rest",
            fx.committed().await,
            fx.ends().await
        );
        tokio::time::sleep(Duration::from_secs(9)).await;
        drained = run_until_settled(&fx, &pool).await;
    }
    let handled = |c: &idem::consume::Counts| c.applied + c.duplicate + c.stale;
    assert!(
        handled(&first) + handled(&second) + handled(&drained) >= 600,
        "every record was handled"
    );
    assert_eq!(
        (first.applied + second.applied + drained.applied) as i64,
        common::applied(&pool).await
    );
    assert_eq!(common::orders(&pool).await, common::oracle(&events));
    assert!(common::applied_twice(&pool).await.is_empty());
    let committed: Vec<i64> = fx.committed().await.into_iter().flatten().collect();
    assert_eq!(committed, fx.ends().await);
    pool.close().await;
    let _ = std::fs::remove_file(&path);
    fx.delete().await;
}

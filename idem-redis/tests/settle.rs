//! How entries settle on the local Redis, through idem's consumer loop and SQLite: poison
//! dead-lettered exactly once, a shutdown that drains and a restart that resumes, and the
//! `max_deliveries` net fed by the delivery counts of `XAUTOCLAIM`/`XPENDING`. Every test
//! asserts the database and the stream (pending entries, lag, dead letters) at the end.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{GroupState, OrderEvent, Streams, GROUP};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, DeadLetterReason, Delivery, Settle};
use idem::redis::{Source, SourceBuilder};
use redis::AsyncCommands as _;
use sqlx::SqlitePool;

fn consumer(pool: &SqlitePool) -> Consumer<sqlx::Sqlite> {
    Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
}

fn source(streams: &Streams, name: &str) -> SourceBuilder {
    Source::builder(common::url(), &streams.name, GROUP, name).block(Duration::from_millis(50))
}

/// `streams.settled`, or after `limit` (so a broken run ends and its assertions say why).
async fn settled_within(streams: &Streams, limit: Duration) {
    let _ = tokio::time::timeout(limit, streams.settled(GROUP)).await;
}

/// Poison events among good ones, consumed by two consumers of the group at once: each poison
/// entry is tried `max_attempts` (3) times, then dead-lettered once, as `poisoned` with its
/// attempts; every good event applies once; nothing is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_is_dead_lettered_exactly_once_after_max_attempts() {
    let Some(streams) = Streams::new("poison_once").await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let mut events: Vec<OrderEvent> = (1..=200).map(|o| OrderEvent::new(o, 1)).collect();
    for o in [7, 50, 99, 150, 201] {
        events.insert(
            o as usize % events.len(),
            OrderEvent {
                fail: true,
                ..OrderEvent::new(1_000 + o, 1)
            },
        );
    }
    streams.publish_all(&events).await;
    let run = async |name: &str| {
        consumer(&pool)
            .run(
                source(&streams, name)
                    .claim_idle(Duration::from_secs(1))
                    .connect()
                    .await
                    .unwrap()
                    .deliveries(),
                json::<OrderEvent>,
                async |b, e| common::sqlite::order_status_3(b, e).await,
                settled_within(&streams, Duration::from_secs(60)),
            )
            .await
    };
    let (a, b) = tokio::join!(run("a"), run("b"));
    assert_eq!(a.applied + b.applied, 200, "{a:?} {b:?}");
    assert_eq!(a.dead_lettered + b.dead_lettered, 5, "{a:?} {b:?}");
    assert_eq!(
        a.failed + b.failed,
        15,
        "3 failed attempts each: {a:?} {b:?}"
    );
    let dead = streams.dead_letters().await;
    assert_eq!(dead.len(), 5, "{dead:?}");
    let mut poisoned = BTreeSet::new();
    for letter in &dead {
        assert_eq!(
            letter[idem::redis::headers::REASON],
            "poisoned",
            "{letter:?}"
        );
        assert!(
            letter[idem::redis::headers::DETAIL].contains("failed 3 times"),
            "{letter:?}"
        );
        let event: OrderEvent = serde_json::from_str(&letter["payload"]).unwrap();
        assert!(event.fail);
        poisoned.insert(event.id);
    }
    assert_eq!(poisoned.len(), 5, "each poison entry once");
    assert_eq!(common::applied(&pool).await, (200, 200));
    assert_eq!(
        streams.group(GROUP).await,
        GroupState { pending: 0, lag: 0 }
    );
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

/// One entry held by two consumers at once (the second took it over with `XAUTOCLAIM` while
/// the first still worked on it), both dead-letter it: one dead letter, and it is acked.
#[tokio::test]
async fn an_entry_two_consumers_hold_is_dead_lettered_once() {
    let Some(streams) = Streams::new("two_holders").await else {
        return;
    };
    streams.publish(b"{not json").await;
    let mut first = Box::pin(
        source(&streams, "first")
            .connect()
            .await
            .unwrap()
            .deliveries(),
    );
    let held = first.next().await.unwrap().unwrap();
    let mut second = Box::pin(
        source(&streams, "second")
            .claim_idle(Duration::ZERO)
            .connect()
            .await
            .unwrap()
            .deliveries(),
    );
    let taken = second.next().await.unwrap().unwrap();
    assert_eq!(taken.id(), held.id(), "taken over under its own id");
    assert_eq!((held.deliveries(), taken.deliveries()), (Some(1), Some(2)));
    let dead = |d: u32| Settle::DeadLetter {
        reason: DeadLetterReason::TooManyDeliveries { deliveries: d },
    };
    taken.settle(dead(2)).await.unwrap();
    held.settle(dead(1)).await.unwrap();
    let letters = streams.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0][idem::redis::headers::DELIVERIES], "2");
    assert_eq!(streams.pending(GROUP).await, 0);
    streams.delete().await;
}

/// A dead letter keeps what the entry carried besides its payload: the outbox's message id
/// (what a downstream consumer dedupes a replayed dead letter on) and partition key.
#[tokio::test]
async fn a_dead_letter_carries_the_entrys_message_id() {
    let Some(streams) = Streams::new("dead_letter_id").await else {
        return;
    };
    let fields: [(&str, &[u8]); 3] = [
        ("payload", b"{not json"),
        (idem::redis::headers::MESSAGE_ID, b"idem-0123"),
        (idem::redis::headers::PARTITION_KEY, b"order-7"),
    ];
    let _: String = streams
        .conn
        .clone()
        .xadd(&streams.name, "*", &fields)
        .await
        .unwrap();
    let mut deliveries = Box::pin(
        source(&streams, "only")
            .connect()
            .await
            .unwrap()
            .deliveries(),
    );
    let delivery = deliveries.next().await.unwrap().unwrap();
    let reason = DeadLetterReason::TooManyDeliveries { deliveries: 1 };
    delivery
        .settle(Settle::DeadLetter { reason })
        .await
        .unwrap();
    let letters = streams.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["payload"], "{not json");
    assert_eq!(letters[0][idem::redis::headers::MESSAGE_ID], "idem-0123");
    assert_eq!(letters[0][idem::redis::headers::PARTITION_KEY], "order-7");
    assert_eq!(letters[0][idem::redis::headers::DELIVERIES], "1");
    assert_eq!(streams.pending(GROUP).await, 0);
    streams.delete().await;
}

/// The shutdown signal mid-stream: the batches in flight finish and are acked; what was read
/// and not started stays pending (Redis has no way to un-read an entry), never applied and
/// unacked; a restart under the same consumer name reads those back at once (not after
/// `claim_idle`, here an hour) and every event applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_and_a_restart_resumes_what_was_left_pending() {
    let Some(streams) = Streams::new("shutdown").await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let events: Vec<OrderEvent> = (1..=600)
        .map(|o| OrderEvent {
            sleep_ms: 2,
            ..OrderEvent::new(o, 1)
        })
        .collect();
    streams.publish_all(&events).await;
    let hour = Duration::from_secs(3600);
    let stop = async {
        while common::applied(&pool).await.0 < 100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let first = consumer(&pool)
        .run(
            source(&streams, "w1")
                .prefetch(100)
                .claim_idle(hour)
                .connect()
                .await
                .unwrap()
                .deliveries(),
            json::<OrderEvent>,
            async |b, e| common::sqlite::order_status(b, e).await,
            stop,
        )
        .await;
    // Give the requeues of the deliveries taken and not started time to reach Redis.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let applied_ids: BTreeSet<String> = sqlx::query_scalar("SELECT id FROM applied")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(applied_ids.len() as u64, first.applied, "{first:?}");
    assert!(first.applied >= 100 && first.applied < 600, "{first:?}");
    // Every entry pending now was never applied: nothing that committed is left unacked.
    let event_of: BTreeMap<String, String> = {
        let all: redis::streams::StreamRangeReply = streams
            .conn
            .clone()
            .xrange_all(&streams.name)
            .await
            .unwrap();
        all.ids
            .iter()
            .map(|e| {
                let payload: String = e.get("payload").unwrap();
                let event: OrderEvent = serde_json::from_str(&payload).unwrap();
                (e.id.clone(), event.id)
            })
            .collect()
    };
    let pending: redis::streams::StreamPendingCountReply = streams
        .conn
        .clone()
        .xpending_count(&streams.name, GROUP, "-", "+", 1_000)
        .await
        .unwrap();
    for entry in &pending.ids {
        assert!(
            !applied_ids.contains(&event_of[&entry.id]),
            "{} was applied and left unacked",
            entry.id
        );
    }
    let state = streams.group(GROUP).await;
    assert_eq!(
        600 - state.lag - state.pending,
        first.applied as usize,
        "acked = applied: {state:?} {first:?}"
    );

    let second = consumer(&pool)
        .run(
            source(&streams, "w1")
                .claim_idle(hour)
                .connect()
                .await
                .unwrap()
                .deliveries(),
            json::<OrderEvent>,
            async |b, e| common::sqlite::order_status(b, e).await,
            settled_within(&streams, Duration::from_secs(60)),
        )
        .await;
    assert_eq!(first.applied + second.applied, 600, "{first:?} {second:?}");
    assert_eq!(common::applied(&pool).await, (600, 600));
    assert_eq!(
        streams.group(GROUP).await,
        GroupState { pending: 0, lag: 0 }
    );
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

/// An entry whose consumers crash with it three times (each takes it over with `XAUTOCLAIM`,
/// counting a delivery, and dies): the next consumer reads its count, 4, from `XPENDING` and
/// dead-letters it over `max_deliveries(3)` without running the handler; a fresh entry beside
/// it applies.
#[tokio::test]
async fn max_deliveries_counts_the_deliveries_of_crashed_consumers() {
    let Some(streams) = Streams::new("max_deliveries").await else {
        return;
    };
    let (pool, path) = common::sqlite().await;
    let doomed = OrderEvent::new(1, 1);
    streams.publish(&serde_json::to_vec(&doomed).unwrap()).await;
    for (n, crashed) in ["c1", "c2", "c3"].into_iter().enumerate() {
        let mut deliveries = Box::pin(
            source(&streams, crashed)
                .claim_idle(Duration::ZERO)
                .connect()
                .await
                .unwrap()
                .deliveries(),
        );
        let delivery = deliveries.next().await.unwrap().unwrap();
        assert_eq!(delivery.deliveries(), Some(n as u32 + 1));
        std::mem::forget(delivery); // the process died: never settled
    }
    streams
        .publish(&serde_json::to_vec(&OrderEvent::new(2, 1)).unwrap())
        .await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let counts = consumer(&pool)
        .max_deliveries(3)
        .run(
            source(&streams, "heir")
                .claim_idle(Duration::from_millis(200))
                .connect()
                .await
                .unwrap()
                .deliveries(),
            json::<OrderEvent>,
            async |b, e| common::sqlite::order_status(b, e).await,
            settled_within(&streams, Duration::from_secs(30)),
        )
        .await;
    assert_eq!((counts.applied, counts.dead_lettered), (1, 1), "{counts:?}");
    let letters = streams.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0][idem::redis::headers::REASON],
        "too_many_deliveries"
    );
    assert_eq!(letters[0][idem::redis::headers::DELIVERIES], "4");
    assert_eq!(
        serde_json::from_str::<OrderEvent>(&letters[0]["payload"]).unwrap(),
        doomed
    );
    assert_eq!(
        common::orders(&pool).await,
        vec![(2, "status-1".to_string(), 1)]
    );
    assert_eq!(
        streams.group(GROUP).await,
        GroupState { pending: 0, lag: 0 }
    );
    common::drop_sqlite(pool, &path).await;
    streams.delete().await;
}

/// What must be right is checked at connect, and the error names it: a dead-letter key or a
/// stream key that holds another type. A URL in an error has no password.
#[tokio::test]
async fn a_key_of_another_type_fails_at_connect_naming_it() {
    let Some(streams) = Streams::new("wrong_type").await else {
        return;
    };
    let key = format!("{}:not-a-stream", streams.name);
    let _: () = streams.conn.clone().set(&key, "x").await.unwrap();
    let err = source(&streams, "w1")
        .dead_letters(&key)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::redis::Error::DeadLetterNotAStream { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&key), "{err}");
    let err = Source::builder(common::url(), &key, GROUP, "w1")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, idem::redis::Error::Group { .. }), "{err}");
    assert!(err.to_string().contains(&key), "{err}");
    let err = Source::builder("redis://:secret@127.0.0.1:1", &streams.name, GROUP, "w1")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, idem::redis::Error::Connect { .. }), "{err}");
    assert!(
        err.to_string().contains(":***@127.0.0.1:1") && !err.to_string().contains("secret"),
        "{err}"
    );
    let _: i64 = streams.conn.clone().del(&key).await.unwrap();
    streams.delete().await;
}

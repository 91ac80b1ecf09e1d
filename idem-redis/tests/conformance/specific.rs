//! What is Redis's own, beside the kit's rules: entries a dead consumer left pending taken over
//! by `XAUTOCLAIM` under their own ids, poison dead-lettered once while two consumers take
//! each other's entries over, one entry held by two consumers, what a dead letter keeps of the
//! entry, the delivery counts of crashed consumers, what `connect` checks, and a consumer
//! process SIGSTOPped past `claim_idle`, and what a delivery tells of its origin and headers.
//! Each test uses a [`Redis`] input and a kit database of
//! its own, and asserts the database and the stream.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, DeadLetterReason, Delivery as _, Settle};
use idem::outbox::{Message, Publisher as _};
use idem::redis::{headers, Error, OutboxPublisher, Source};
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness;
use idem_testkit::broker::model::{self, Event};
use idem_testkit::broker::{Broker, Spec};
use redis::AsyncCommands as _;

use crate::{url, GroupState, Redis, GROUP};

fn consumer(pool: &sqlx::SqlitePool) -> Consumer<sqlx::Sqlite> {
    Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
}

/// A spec whose entries held by a dead consumer are taken over after `claim_idle`.
fn spec(rule: &'static str, claim_idle: Duration) -> Spec {
    Spec {
        redelivery: claim_idle,
        ..Spec::new(rule)
    }
}

/// A consumer reads every entry and dies before settling any; another consumer of the group
/// takes them over with `XAUTOCLAIM` under their own ids (nothing is added to the stream) and
/// applies each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn entries_a_dead_consumer_left_pending_are_taken_over_and_apply_once() {
    let spec = spec("takeover", Duration::from_millis(300));
    harness::with::<Redis, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        let events: Vec<Event> = (0..6)
            .map(|i| model::credit(&format!("t{i}"), 1, 1))
            .collect();
        b.publish(&model::raws(&events)).await;
        // Consumer "dead" reads every entry and dies before settling any of them.
        {
            let dead = b.builder("dead").connect().await.unwrap();
            let mut taken = Box::pin(dead.deliveries());
            for _ in 0..6 {
                let delivery = taken.next().await.unwrap().unwrap();
                std::mem::forget(delivery); // never settled
            }
        }
        assert_eq!(b.group().await, GroupState { pending: 6, lag: 0 });
        let d = k.dialect;
        let counts = Consumer::new(k.pool.clone())
            .batch(10)
            .max_deliveries(5)
            .run(
                b.builder("heir").connect().await.unwrap().deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled_within(Duration::from_secs(30)),
            )
            .await;
        assert_eq!(counts.applied, 6, "{counts:?}");
        model::verify(k, &model::oracle(&events)).await;
        assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
        // Taken over under their own ids: nothing was added to the stream.
        assert_eq!(b.stream_len().await, 6);
        assert!(b.dead_letters().await.is_empty());
    })
    .await;
}

/// Poison entries among good ones, consumed by two consumers of the group at once that take
/// each other's entries over (`claim_idle` 1 s) while they retry: each poison entry is tried
/// `max_attempts` (3) times, then dead-lettered once, as `poisoned` with its attempts; every
/// good one applies once; nothing is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn poison_is_dead_lettered_exactly_once_by_two_consumers_taking_entries_over() {
    let spec = spec("poison2", Duration::from_secs(1));
    harness::with::<Redis, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        let mut events: Vec<Event> = (0..200)
            .map(|i| model::credit(&format!("ok{i}"), i % 7, 1))
            .collect();
        for i in [7, 50, 99, 150, 199] {
            events.insert(i, model::poison(&format!("poison{i}")));
        }
        b.publish(&model::raws(&events)).await;
        let d = k.dialect;
        let run = async |name: &str| {
            consumer(&k.pool)
                .run(
                    b.builder(name).connect().await.unwrap().deliveries(),
                    json::<Event>,
                    async |batch, e| model::handle_counted(batch, e, &d).await,
                    b.settled_within(Duration::from_secs(60)),
                )
                .await
        };
        let (one, two) = tokio::join!(run("a"), run("b"));
        assert_eq!(one.applied + two.applied, 200, "{one:?} {two:?}");
        assert_eq!(one.dead_lettered + two.dead_lettered, 5, "{one:?} {two:?}");
        assert_eq!(
            one.failed + two.failed,
            15,
            "3 failed attempts each: {one:?} {two:?}"
        );
        let dead = b.dead_letters().await;
        assert_eq!(dead.len(), 5, "{dead:?}");
        let mut poisoned = BTreeSet::new();
        for letter in &dead {
            assert_eq!(letter.reason(), "poisoned", "{letter:?}");
            assert!(
                letter
                    .field(headers::DETAIL)
                    .is_some_and(|d| d.contains("failed 3 times")),
                "{letter:?}"
            );
            let event: Event = serde_json::from_slice(&letter.payload).unwrap();
            assert!(matches!(&event, Event::Credit(c) if c.fail));
            poisoned.insert(event.id().to_string());
        }
        assert_eq!(poisoned.len(), 5, "each poison entry once");
        model::verify(k, &model::oracle(&events)).await;
        assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
    })
    .await;
}

/// One entry held by two consumers at once (the second took it over with `XAUTOCLAIM` while
/// the first still worked on it), both dead-letter it: one dead letter, and it is acked.
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn an_entry_two_consumers_hold_is_dead_lettered_once() {
    let Some(b) = Redis::create(Spec::new("holders")).await else {
        return;
    };
    b.add(&[(headers::PAYLOAD, b"{not json")]).await;
    let mut first = Box::pin(b.builder("first").connect().await.unwrap().deliveries());
    let held = first.next().await.unwrap().unwrap();
    let mut second = Box::pin(
        b.builder("second")
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
    let letters = b.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].field(headers::DELIVERIES), Some("2"));
    assert_eq!(b.group().await.pending, 0);
    b.teardown().await;
}

/// A dead letter keeps what the entry carried besides its payload: the outbox's message id
/// (what a downstream consumer dedupes a replayed dead letter on) and partition key.
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn a_dead_letter_carries_the_entrys_message_id() {
    let Some(b) = Redis::create(Spec::new("deadid")).await else {
        return;
    };
    b.add(&[
        (headers::PAYLOAD, b"{not json"),
        (headers::MESSAGE_ID, b"idem-0123"),
        (headers::PARTITION_KEY, b"order-7"),
    ])
    .await;
    let mut deliveries = Box::pin(b.builder("only").connect().await.unwrap().deliveries());
    let delivery = deliveries.next().await.unwrap().unwrap();
    let reason = DeadLetterReason::TooManyDeliveries { deliveries: 1 };
    delivery
        .settle(Settle::DeadLetter { reason })
        .await
        .unwrap();
    let letters = b.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].payload, b"{not json");
    assert_eq!(letters[0].id.as_deref(), Some("idem-0123"));
    assert_eq!(letters[0].field(headers::PARTITION_KEY), Some("order-7"));
    assert_eq!(letters[0].field(headers::DELIVERIES), Some("1"));
    assert_eq!(b.group().await.pending, 0);
    b.teardown().await;
}

/// An entry whose consumers crash with it three times (each takes it over with `XAUTOCLAIM`,
/// counting a delivery, and dies): the next consumer reads its count, 4, from `XPENDING` and
/// dead-letters it over `max_deliveries(3)` without running the handler; a fresh entry beside
/// it applies.
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn max_deliveries_counts_the_deliveries_of_crashed_consumers() {
    let spec = spec("crashcount", Duration::from_millis(200));
    harness::with::<Redis, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        let doomed = model::credit("doomed", 1, 1);
        b.publish(&[doomed.raw()]).await;
        for (n, crashed) in ["c1", "c2", "c3"].into_iter().enumerate() {
            let mut deliveries = Box::pin(
                b.builder(crashed)
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
        let fresh = model::credit("fresh", 2, 1);
        b.publish(&[fresh.raw()]).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let d = k.dialect;
        let counts = consumer(&k.pool)
            .max_deliveries(3)
            .run(
                b.builder("heir").connect().await.unwrap().deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled_within(Duration::from_secs(30)),
            )
            .await;
        assert_eq!((counts.applied, counts.dead_lettered), (1, 1), "{counts:?}");
        let letters = b.dead_letters().await;
        assert_eq!(letters.len(), 1, "{letters:?}");
        assert_eq!(letters[0].reason(), "too_many_deliveries");
        assert_eq!(letters[0].field(headers::DELIVERIES), Some("4"));
        assert_eq!(letters[0].payload, doomed.raw().payload);
        model::verify(k, &model::oracle(&[fresh])).await;
        assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
    })
    .await;
}

/// What must be right is checked at connect, and the error names it: a dead-letter key or a
/// stream key that holds another type. A URL in an error has no password.
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn a_key_of_another_type_fails_at_connect_naming_it() {
    let Some(b) = Redis::create(Spec::new("wrongtype")).await else {
        return;
    };
    let (key, _) = b.refusing_destination().await;
    let err = b
        .builder("w1")
        .dead_letters(&key)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadLetterNotAStream { .. }), "{err}");
    assert!(err.to_string().contains(&key), "{err}");
    let err = Source::builder(url(), &key, GROUP, "w1")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Group { .. }), "{err}");
    assert!(err.to_string().contains(&key), "{err}");
    let err = Source::builder("redis://:secret@127.0.0.1:1", &b.stream, GROUP, "w1")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    assert!(
        err.to_string().contains(":***@127.0.0.1:1") && !err.to_string().contains("secret"),
        "{err}"
    );
    let exists: bool = b.conn.clone().exists(&key).await.unwrap();
    assert!(exists, "connect changed nothing");
    b.teardown().await;
}

/// An idle stream read with the default `block` yields no error: the reader waits for
/// `XREADGROUP`'s reply longer than the read blocks on the server (the client's own reply
/// time-out, 500 ms, equals the default `block`, and every idle read failed with it).
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn an_idle_stream_read_with_the_default_block_yields_no_error() {
    let Some(b) = Redis::create(Spec::new("idle")).await else {
        return;
    };
    let source = Source::builder(url(), &b.stream, GROUP, "idle")
        .connect()
        .await
        .unwrap();
    let mut deliveries = source.deliveries();
    // Three idle reads at the default 500 ms: nothing arrives, and nothing fails.
    let idle = tokio::time::timeout(Duration::from_millis(1_600), deliveries.next()).await;
    assert!(
        idle.is_err(),
        "an idle stream yielded {:?}",
        idle.map(|d| d.map(|d| d.map(|_| ())))
    );
    b.publish(&model::raws(&[model::credit("idle-1", 1, 1)]))
        .await;
    let delivery = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
        .await
        .expect("the entry arrives within a read")
        .expect("the stream goes on")
        .expect("no error");
    delivery.settle(Settle::Ack).await.unwrap();
    drop(deliveries);
    source.close().await.unwrap();
    assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
    b.teardown().await;
}

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// Whether a writer could start on the SQLite file at `path` now: a process stopped inside a
/// write transaction would hold its lock until it continues.
async fn writable(path: &str) -> bool {
    use sqlx::Connection as _;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::ZERO);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let free = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .is_ok();
    if free {
        sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    free
}

/// A consumer process SIGSTOPped while it holds entries (read, not yet settled), past
/// `claim_idle`: another consumer takes them over with `XAUTOCLAIM` and applies them. After
/// SIGCONT the first one runs what it held and applies none of it twice: every effect once,
/// nothing pending, nothing added to the stream, no dead letter, and the first exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn a_consumer_paused_past_claim_idle_cannot_apply_its_entries_twice() {
    use idem_testkit::broker::child::{self, Spawn};
    use idem_testkit::broker::harness::Reopen as _;
    let spec = spec("paused", Duration::from_millis(500));
    harness::with::<Redis, Sqlite>(spec, async |b, k| {
        model::schema(k).await;
        let events: Vec<Event> = (0..40)
            .map(|i| model::credit(&format!("p{i}"), i % 5, 1))
            .collect();
        b.publish(&model::raws(&events)).await;
        // Paced (a delivery each 15 ms) throughout: the release file is never made.
        let never = std::env::temp_dir().join(harness::unique_name("idem_paused_never"));
        let mut paused = Spawn::new::<Redis, Sqlite>("consumer", b, &k.pool)
            .await
            .env(child::CONSUMER, "paused")
            .env(child::RELEASE, never.display())
            .spawn();
        let holds = async || b.pending_by_consumer().await.get("paused").copied();
        // Once it has read every entry and settled a few of them.
        while !(1..36).contains(&holds().await.unwrap_or(0)) {
            assert!(paused.try_wait().is_none(), "{}", paused.log());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // SIGSTOP it outside a write transaction (one it were stopped in would lock the file
        // against the heir until SIGCONT).
        let path = Sqlite::location(&k.pool).await;
        loop {
            signal(paused.id(), "STOP");
            if writable(&path).await {
                break;
            }
            signal(paused.id(), "CONT");
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let held = holds().await.unwrap_or(0);
        assert!(held > 0, "the paused consumer holds entries");
        tokio::time::sleep(Duration::from_millis(700)).await; // past claim_idle (500 ms)
        let d = k.dialect;
        let heir = consumer(&k.pool)
            .run(
                b.builder("heir").connect().await.unwrap().deliveries(),
                json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                b.settled_within(Duration::from_secs(30)),
            )
            .await;
        assert_eq!(
            (heir.applied + heir.duplicate) as usize,
            held,
            "the heir took over what the paused one held: {heir:?}"
        );
        assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
        model::verify(k, &model::oracle(&events)).await;
        signal(paused.id(), "CONT");
        let status = paused.wait(Duration::from_secs(60)).await;
        paused.assert_success(status);
        model::verify(k, &model::oracle(&events)).await;
        assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
        assert_eq!(b.stream_len().await, 40, "nothing added to the stream");
        assert!(b.dead_letters().await.is_empty());
        // What it ran after SIGCONT were duplicates: its applied and the heir's make 40.
        let log = paused.log();
        let count = |name: &str| -> usize {
            log.split("consumer paused: ")
                .nth(1)
                .and_then(|counts| counts.split(&format!(" {name}: ")).nth(1))
                .and_then(|n| n.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("the paused consumer's {name}: {log}"))
        };
        assert_eq!(
            count("applied") + heir.applied as usize,
            40,
            "{heir:?}; {log}"
        );
        assert_eq!(count("duplicate"), held, "{log}");
    })
    .await;
}

/// A delivery tells its origin (the stream, its entry id, and the stream as where a replay
/// publishes it) and the entry's fields other than the payload as its headers, named as they
/// are; published there through the outbox, it comes back to the group.
#[tokio::test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn a_delivery_tells_its_origin_and_headers_and_a_replay_there_comes_back() {
    let Some(b) = Redis::create(Spec::new("origin")).await else {
        return;
    };
    let id = b
        .add(&[
            (headers::PAYLOAD, b"{}"),
            ("x-trace", b"t-1"),
            ("x-attempt", b"3"),
        ])
        .await;
    let source = b.builder("only").connect().await.unwrap();
    let mut deliveries = source.deliveries();
    let delivery = deliveries.next().await.unwrap().unwrap();
    let origin = delivery.origin();
    assert_eq!(origin.broker, "redis");
    assert_eq!(origin.broker, idem::redis::BROKER);
    assert_eq!(origin.source, b.stream);
    assert_eq!(origin.coordinates, format!("entry {id}"));
    assert_eq!(origin.destination, b.stream);
    let pair = |name: &str, value: &str| (name.to_string(), value.to_string());
    let fields = delivery.headers();
    assert_eq!(fields, [pair("x-attempt", "3"), pair("x-trace", "t-1")]);
    delivery.settle(Settle::Ack).await.unwrap();
    // A replay: the outbox adds it to the destination, its headers as `idem-header-<name>`.
    let publisher = OutboxPublisher::builder(url()).connect().await.unwrap();
    let replay = Message {
        id: "idem-origin-replay".into(),
        destination: origin.destination.clone(),
        partition_key: String::new(),
        payload: b"{}".to_vec(),
        headers: vec![pair("x-trace", "t-1")],
        attempts: 0,
    };
    publisher.publish(&[replay]).await.unwrap();
    let again = harness::within(Duration::from_secs(10), "the replay", deliveries.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.payload(), b"{}");
    let replayed = again.origin();
    assert_ne!(replayed.coordinates, origin.coordinates, "a new entry");
    assert_eq!(
        (replayed.source, replayed.destination),
        (b.stream.clone(), b.stream.clone())
    );
    // Its headers come back as they were: the prefix is the outbox's, the id its own.
    assert_eq!(again.headers(), [pair("x-trace", "t-1")]);
    again.settle(Settle::Ack).await.unwrap();
    drop(deliveries);
    source.close().await.unwrap();
    assert_eq!(b.group().await, GroupState { pending: 0, lag: 0 });
    assert_eq!(b.stream_len().await, 2);
    b.teardown().await;
}

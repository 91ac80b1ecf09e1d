//! idem's consumer on the real local RabbitMQ (`IDEM_RABBITMQ_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`): exactly once through the broker on SQLite and
//! PostgreSQL, ack after commit (a process killed between the two), poison messages and dead
//! letters, shutdown mid-stream. Each test declares queues and exchanges of its own and deletes
//! them; each asserts the database and the queue's depth at the end. Without a broker a test
//! says "skipped" and passes, unless `CI` is set.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    generate, header, model, oracle, source, track, within, Broker, Credit, Event, Kind, Tally,
};
use idem::consume::{json, Consumer};
use idem::rabbitmq::headers;

/// Set in a child process of `ack_after_commit`: the SQLite file, queue and exchange.
const CHILD: &str = "IDEM_RMQ_ACK_CHILD";
const CHILD_QUEUE: &str = "IDEM_RMQ_QUEUE";
const CHILD_DLX: &str = "IDEM_RMQ_DLX";

fn seed() -> u64 {
    let seed = std::env::var("IDEM_RMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed: IDEM_RMQ_SEED={seed}");
    seed
}

fn credit(id: &str, account: i64, amount: i64) -> Event {
    Event::Credit(Credit {
        id: id.into(),
        account,
        amount,
        fail: false,
    })
}

/// Distinct events of the exactly-once test; with 30% duplicates, about 3,300 messages.
const UNIQUE: usize = 2_300;

macro_rules! exactly_once {
    ($m:ident, $pool:expr) => {
        async {
            let pool = $pool;
            let Some(broker) = Broker::connect().await else {
                return;
            };
            let names = broker.declare("idem_once", Kind::Classic).await;
            let events = generate(seed(), UNIQUE);
            let oracle = oracle(&events);
            let copies = (events.len() - UNIQUE) as u64;
            model::$m::schema(&pool).await;
            let messages: Vec<_> = events.iter().map(Event::message).collect();
            broker.publish(&names.queue, &messages).await;
            assert_eq!(broker.depth(&names.queue).await, (events.len() as u32, 0));

            let started = Instant::now();
            let tally = Tally::new();
            let total = events.len() as u64;
            let source = source(&broker.url, &names, 200).connect().await.unwrap();
            let counts = within(
                Duration::from_secs(180),
                "the consumer",
                Consumer::new(pool.clone()).batch(50).concurrency(4).run(
                    track(source.deliveries(), &tally),
                    json::<Event>,
                    async |b, e| model::$m::handle(b, e).await,
                    tally.clone().until(move |acked, _| acked >= total),
                ),
            )
            .await;
            source.close().await.unwrap();
            eprintln!(
                "{} messages in {:?}: {counts:?}",
                events.len(),
                started.elapsed()
            );
            // A copy of a stale version is stale again (stale writes no record); every other
            // copy is a duplicate.
            assert_eq!(counts.applied + counts.duplicate + counts.stale, total);
            assert!(counts.duplicate <= copies && counts.applied <= UNIQUE as u64);
            let ledger = model::$m::ledger(&pool).await;
            assert_eq!(ledger.values().sum::<i64>() as u64, counts.applied);
            assert_eq!(
                (counts.dead_lettered, counts.failed, counts.settle_failures),
                (0, 0, 0)
            );
            assert_eq!(tally.acked(), total);
            broker.settles_at(&names.queue, 0).await;
            assert_eq!(broker.depth(&names.dlq).await, (0, 0));
            model::$m::verify(&pool, &oracle).await;
            broker.delete(&names).await;
            broker.close().await;
        }
        .await
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_the_broker_on_sqlite() {
    let (pool, path) = common::sqlite().await;
    exactly_once!(sqlite, pool.clone());
    common::drop_sqlite(pool, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_the_broker_on_postgres() {
    let Some((pool, schema)) = common::postgres().await else {
        return;
    };
    exactly_once!(postgres, pool.clone());
    common::drop_postgres(pool, &schema).await;
}

/// The consumer process of `ack_after_commit`: stops dead after its first commit, before the
/// ack, and waits to be killed. Does nothing in a normal test run.
#[test]
fn ack_after_commit_child() {
    let Ok(path) = std::env::var(CHILD) else {
        return;
    };
    let names = common::Names {
        queue: std::env::var(CHILD_QUEUE).unwrap(),
        dlx: std::env::var(CHILD_DLX).unwrap(),
        dlq: String::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = common::sqlite_open(std::path::Path::new(&path)).await;
        let tally = Tally::new();
        tally
            .block_before_ack
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deliveries = source(&common::rabbit_url(), &names, 10)
            .connect()
            .await
            .unwrap()
            .deliveries();
        Consumer::new(pool)
            .run(
                track(deliveries, &tally),
                json::<Event>,
                async |b, e| model::sqlite::handle(b, e).await,
                std::future::pending(),
            )
            .await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_after_commit_a_consumer_killed_between_commit_and_ack_sees_a_duplicate() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_ack", Kind::Classic).await;
    let (pool, path) = common::sqlite().await;
    model::sqlite::schema(&pool).await;
    let events = [credit("a1", 1, 10), credit("a2", 1, 20), credit("a3", 2, 5)];
    let messages: Vec<_> = events.iter().map(Event::message).collect();
    broker.publish(&names.queue, &messages).await;

    // The child applies one message (batch of 1), commits, and stops before the ack.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ack_after_commit_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &path)
        .env(CHILD_QUEUE, &names.queue)
        .env(CHILD_DLX, &names.dlx)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("committed "))
    });
    let line = within(Duration::from_secs(30), "the child's commit", line)
        .await
        .unwrap()
        .expect("the child exited before committing");
    eprintln!("child: {line}");
    // Committed, not acked: the row is there, and the broker still counts the message as the
    // child's (nothing ready, one consumer).
    let ledger = model::sqlite::ledger(&pool).await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let (committed, _) = ledger.into_iter().next().unwrap();
    assert!(line.contains(&committed), "{line} vs {committed}");
    assert_eq!(broker.depth(&names.queue).await, (0, 1));

    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    // Unacked messages come back: all three.
    broker.settles_at(&names.queue, 3).await;

    let tally = Tally::new();
    let deliveries = source(&broker.url, &names, 10)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let counts = within(
        Duration::from_secs(30),
        "the second consumer",
        Consumer::new(pool.clone()).run(
            track(deliveries, &tally),
            json::<Event>,
            async |b, e| model::sqlite::handle(b, e).await,
            tally.clone().until(|acked, _| acked >= 3),
        ),
    )
    .await;
    // The redelivery of the committed message is a Duplicate, and acked.
    assert_eq!((counts.duplicate, counts.applied), (1, 2), "{counts:?}");
    assert_eq!(tally.acked(), 3);
    broker.settles_at(&names.queue, 0).await;
    let ledger = model::sqlite::ledger(&pool).await;
    assert_eq!(ledger.values().copied().collect::<Vec<_>>(), [1, 1, 1]);
    let balances: Vec<(i64, i64)> =
        sqlx::query_as("SELECT account, balance FROM balances ORDER BY account")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(balances, [(1, 30), (2, 5)]);
    broker.delete(&names).await;
    broker.close().await;
    common::drop_sqlite(pool, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_with_their_headers_and_the_rest_apply() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    // A quorum queue: it counts deliveries (x-delivery-count), which max_deliveries reads.
    let names = broker.declare("idem_poison", Kind::Quorum).await;
    let (pool, path) = common::sqlite().await;
    model::sqlite::schema(&pool).await;

    let mut messages = Vec::new();
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..20 {
        let event = credit(&format!("ok{i}"), i % 3, i + 1);
        *expected.entry(i % 3).or_insert(0) += i + 1;
        messages.push(event.message());
        if i % 7 == 3 {
            // A handler that always fails on it.
            let poison = Event::Credit(Credit {
                id: format!("poison{i}"),
                account: 9,
                amount: 1000,
                fail: true,
            });
            messages.push(poison.message());
        }
    }
    messages.push(("garbled".into(), b"{not json".to_vec()));
    messages.push(credit("", 9, 1).message()); // an empty key: refused before any write
    let poisoned = 3;
    broker.publish(&names.queue, &messages).await;

    let max_deliveries = 3;
    let tally = Tally::new();
    let deliveries = source(&broker.url, &names, 20)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let counts = within(
        Duration::from_secs(60),
        "the consumer",
        Consumer::new(pool.clone())
            .batch(5)
            .concurrency(2)
            .max_deliveries(max_deliveries)
            .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
            .run(
                track(deliveries, &tally),
                json::<Event>,
                async |b, e| model::sqlite::handle(b, e).await,
                tally
                    .clone()
                    .until(move |acked, dead| acked >= 20 && dead >= poisoned + 2),
            ),
    )
    .await;
    eprintln!("{counts:?}");
    assert_eq!(counts.applied, 20);
    // Each poison message ran max_deliveries times, then was dead-lettered on the next.
    assert_eq!(counts.failed, poisoned * u64::from(max_deliveries));
    assert_eq!(counts.dead_lettered, poisoned + 2);
    assert_eq!(counts.settle_failures, 0);
    broker.settles_at(&names.queue, 0).await;

    let dead = broker.take_all(&names.dlq).await;
    assert_eq!(dead.len() as u64, poisoned + 2);
    let mut reasons = std::collections::BTreeMap::new();
    for letter in &dead {
        let id = letter
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_string())
            .unwrap_or_default();
        let reason = header(letter, headers::REASON).unwrap();
        // The original body, properties and headers, plus idem's.
        let original = messages.iter().find(|(m, _)| *m == id).unwrap();
        assert_eq!(letter.data, original.1, "{id}");
        assert_eq!(header(letter, "x-producer").as_deref(), Some("idem-tests"));
        assert_eq!(
            header(letter, headers::SOURCE).as_deref(),
            Some(names.queue.as_str())
        );
        assert!(header(letter, headers::DETAIL).is_some());
        if id.starts_with("poison") {
            assert_eq!(reason, "too_many_deliveries", "{id}");
            assert_eq!(
                header(letter, headers::DELIVERIES),
                Some((max_deliveries + 1).to_string()),
                "{id}"
            );
        } else {
            // Dead-lettered at its first delivery.
            assert_eq!(header(letter, headers::DELIVERIES).as_deref(), Some("1"));
        }
        reasons.insert(id, reason);
    }
    assert_eq!(
        reasons.get("garbled").map(String::as_str),
        Some("undecodable")
    );
    assert_eq!(reasons.get("").map(String::as_str), Some("bad_key"));
    assert_eq!(broker.depth(&names.dlq).await, (0, 0));

    // The others are unaffected: applied once each, nothing of the poison.
    let ledger = model::sqlite::ledger(&pool).await;
    assert_eq!(ledger.len(), 20);
    assert!(ledger.iter().all(|(id, n)| id.starts_with("ok") && *n == 1));
    let balances: std::collections::BTreeMap<i64, i64> =
        sqlx::query_as::<_, (i64, i64)>("SELECT account, balance FROM balances")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(balances, expected);
    broker.delete(&names).await;
    broker.close().await;
    common::drop_sqlite(pool, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_stream_loses_nothing_and_leaves_nothing_unacked() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_shutdown", Kind::Classic).await;
    let (pool, path) = common::sqlite().await;
    model::sqlite::schema(&pool).await;
    let total = 600_u64;
    let events: Vec<Event> = (0..total as i64)
        .map(|i| credit(&format!("m{i}"), i % 5, 1))
        .collect();
    let messages: Vec<_> = events.iter().map(Event::message).collect();
    broker.publish(&names.queue, &messages).await;

    // Slow handlers, a prefetch larger than what is in flight: at the signal there are
    // batches running and deliveries taken but not started.
    let tally = Tally::new();
    let deliveries = source(&broker.url, &names, 60)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let counts = within(
        Duration::from_secs(60),
        "the consumer",
        Consumer::new(pool.clone()).batch(10).concurrency(2).run(
            track(deliveries, &tally),
            json::<Event>,
            async |b, e| {
                tokio::time::sleep(Duration::from_millis(2)).await;
                model::sqlite::handle(b, e).await
            },
            tally.clone().until(|acked, _| acked >= 150),
        ),
    )
    .await;
    eprintln!("first run: {counts:?}");
    let acked = tally.acked();
    assert!(acked >= 150 && acked < total, "{acked}");
    assert_eq!(counts.applied, acked);
    assert_eq!(counts.settle_failures, 0);
    // Everything applied was acked; everything else is back in the queue (the consumer is
    // gone once its deliveries are settled), ready for the next consumer.
    broker
        .settles_at(&names.queue, (total - acked) as u32)
        .await;
    let ledger = model::sqlite::ledger(&pool).await;
    assert_eq!(ledger.len() as u64, acked);
    assert!(ledger.values().all(|n| *n == 1));

    // The rest: applied now, and none is a duplicate (nothing applied was left unacked).
    let rest = Tally::new();
    let deliveries = source(&broker.url, &names, 60)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let remaining = total - acked;
    let counts = within(
        Duration::from_secs(60),
        "the second consumer",
        Consumer::new(pool.clone()).batch(50).concurrency(2).run(
            track(deliveries, &rest),
            json::<Event>,
            async |b, e| model::sqlite::handle(b, e).await,
            rest.clone().until(move |acked, _| acked >= remaining),
        ),
    )
    .await;
    eprintln!("second run: {counts:?}");
    assert_eq!((counts.applied, counts.duplicate), (remaining, 0));
    broker.settles_at(&names.queue, 0).await;
    let ledger = model::sqlite::ledger(&pool).await;
    assert_eq!(ledger.len() as u64, total);
    assert!(ledger.values().all(|n| *n == 1));
    let sum: i64 = sqlx::query_scalar("SELECT SUM(balance) FROM balances")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sum, total as i64);
    broker.delete(&names).await;
    broker.close().await;
    common::drop_sqlite(pool, &path).await;
}

#[tokio::test]
async fn a_missing_dead_letter_exchange_fails_at_start_with_a_clear_error() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_nodlx", Kind::Classic).await;
    let err = idem::rabbitmq::Source::builder(broker.url.as_str(), names.queue.as_str())
        .dead_letters("idem-no-such-exchange")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::rabbitmq::Error::DeadLetterExchangeMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("idem-no-such-exchange"), "{err}");
    // Without one named, the default `<queue>.dead` must exist: it does not here.
    let err = idem::rabbitmq::Source::builder(broker.url.as_str(), names.queue.as_str())
        .connect()
        .await
        .unwrap_err();
    let default = format!("{}.dead", names.queue);
    assert!(
        matches!(&err, idem::rabbitmq::Error::DeadLetterExchangeMissing { exchange, .. } if *exchange == default),
        "{err}"
    );
    let err = idem::rabbitmq::Source::builder(broker.url.as_str(), "idem-no-such-queue")
        .dead_letters(names.dlx.as_str())
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::rabbitmq::Error::QueueMissing { .. }),
        "{err}"
    );
    // The URL in an error has no password.
    let err = idem::rabbitmq::Source::builder("amqp://guest:secret@127.0.0.1:1/%2f", "q")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::rabbitmq::Error::Connect { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("guest:***@") && !err.to_string().contains("secret"),
        "{err}"
    );
    assert_eq!(broker.depth(&names.queue).await, (0, 0));
    broker.delete(&names).await;
    broker.close().await;
}

/// `close` ends every stream of the source, rejects a held requeue at once (its 60 s hold cut
/// short), waits for what is out, and leaves: the message is ready again with no consumer, long
/// before its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_every_stream_and_cuts_held_requeues_short() {
    use futures_util::StreamExt as _;
    use idem::consume::{Delivery as _, Settle};
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_close", Kind::Classic).await;
    broker
        .publish(&names.queue, &[credit("h1", 1, 1).message()])
        .await;
    let source = source(&broker.url, &names, 10).connect().await.unwrap();
    let (mut first, mut second) = (source.deliveries(), source.deliveries());
    let delivery = first.next().await.unwrap().unwrap();
    delivery
        .settle(Settle::Requeue {
            delay: Duration::from_secs(60),
        })
        .await
        .unwrap();
    assert_eq!(broker.depth(&names.queue).await, (0, 1), "held, unacked");
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
    broker.settles_at(&names.queue, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the hold was cut short"
    );
    broker.delete(&names).await;
    broker.close().await;
}

#[tokio::test]
async fn an_ack_that_cannot_reach_the_broker_is_an_error_and_the_message_comes_back() {
    use futures_util::StreamExt as _;
    use idem::consume::{Delivery as _, Settle};
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_closed", Kind::Classic).await;
    broker
        .publish(&names.queue, &[credit("x1", 1, 1).message()])
        .await;
    let source = source(&broker.url, &names, 10).connect().await.unwrap();
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
    broker.settles_at(&names.queue, 1).await;
    broker.delete(&names).await;
    broker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_the_exchange_routes_nowhere_is_not_acked_and_not_lost() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_unrouted", Kind::Classic).await;
    let (pool, path) = common::sqlite().await;
    model::sqlite::schema(&pool).await;
    broker
        .publish(&names.queue, &[("garbled".into(), b"{not json".to_vec())])
        .await;
    // No queue is bound to the dead-letter exchange with this routing key: the broker returns
    // the dead letter (mandatory), so the original must stay.
    let deliveries = source(&broker.url, &names, 10)
        .dead_letter_routing_key("bound-to-nothing")
        .connect()
        .await
        .unwrap()
        .deliveries();
    let counts = Consumer::new(pool.clone())
        .run(
            deliveries,
            json::<Event>,
            async |b, e| model::sqlite::handle(b, e).await,
            tokio::time::sleep(Duration::from_millis(500)),
        )
        .await;
    eprintln!("{counts:?}");
    assert!(counts.dead_lettered >= 1 && counts.settle_failures == counts.dead_lettered);
    broker.settles_at(&names.queue, 1).await;
    assert_eq!(broker.depth(&names.dlq).await, (0, 0));
    broker.delete(&names).await;
    broker.close().await;
    common::drop_sqlite(pool, &path).await;
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
async fn in_progress_a_lease_held_elsewhere_is_requeued_after_the_delay_not_spun_on() {
    let Some(broker) = Broker::connect().await else {
        return;
    };
    let names = broker.declare("idem_lease", Kind::Classic).await;
    let (pool, path) = common::sqlite().await;
    model::sqlite::schema(&pool).await;
    // Another consumer holds the lease on "l1" for 600 ms (its claim committed, its body runs).
    sqlx::query(
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token) \
         VALUES ('rmq::leased', CAST('l1' AS BLOB), 9e15, \
                 CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 600, 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    broker
        .publish(&names.queue, &[credit("l1", 1, 3).message()])
        .await;
    let tally = Tally::new();
    let deliveries = source(&broker.url, &names, 10)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let counts = within(
        Duration::from_secs(30),
        "the consumer",
        Consumer::new(pool.clone())
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
    // About 600 ms of lease at 150 ms a requeue (reject after the hold): a few tries, no spin.
    assert!(
        (1..=8).contains(&counts.in_progress),
        "requeued {} times",
        counts.in_progress
    );
    assert_eq!(counts.applied, 1);
    broker.settles_at(&names.queue, 0).await;
    assert_eq!(model::sqlite::ledger(&pool).await.len(), 1);
    broker.delete(&names).await;
    broker.close().await;
    common::drop_sqlite(pool, &path).await;
}

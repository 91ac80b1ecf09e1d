//! A quorum queue on a cluster of three private RabbitMQ nodes (the test's own: their own
//! names, ports, data and Erlang cookie; the machine's shared node is never touched) loses the
//! node the consumer is connected to, mid-run.
//!
//! The queue (three replicas, its leader on the node it was declared on) and its dead-letter
//! queue (quorum too) are declared through node 0, the messages published through node 1. The
//! consumer connects to node 0; once a third of the messages are acked, node 0 is killed
//! (SIGKILL). The consumer's run ends: the source reports its connection closed, and acks
//! that were on the way fail. The test then does what a service does ([`connect_any`]): it
//! connects again, to the first node that takes its consumer (node 0 refuses; the others once
//! the queue has elected a new leader), and runs again. Meanwhile node 0 is started again and
//! rejoins. In the end nothing is lost and nothing applied twice (the database equals the
//! oracle): deliveries unacked at the kill come back redelivered and are applied or answered
//! `Duplicate`; the poison messages are dead-lettered (a dead letter the dead-letter queue
//! refuses while it elects its new leader is retried); the queue is empty, seen from every
//! node. Skipped, saying why, where RabbitMQ is not installed (CI must have it).
//!
//! One cluster, started once, for the one test: about 35 s in all on a two-core machine, of
//! which 15–25 s start the three nodes (in parallel, 130–160 MiB resident each) and join them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer};
use idem::rabbitmq::{Error, Source};
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness::{self, track, within, Tally};
use idem_testkit::broker::model::{self, Event};
use idem_testkit::broker::Broker;
use idem_testkit::servers::RabbitNode;

use crate::Rabbit;

/// Distinct events (with 30% copies about 1,430 messages), and 5 poison ones; 10,000 distinct
/// with `IDEM_SOAK=1`.
fn unique() -> usize {
    if harness::soak() {
        10_000
    } else {
        1_000
    }
}

/// The consumer: batches of 20, two at a time; a message failing 4 deliveries is dead-lettered.
fn consumer(pool: sqlx::SqlitePool) -> Consumer<sqlx::Sqlite> {
    harness::consumer(pool, 20).max_deliveries(4)
}

/// Counts the redeliveries (the broker's `redelivered` flag) of messages that are not poison.
fn count_redelivered(
    source: &idem::rabbitmq::Source,
    redelivered: &Arc<AtomicU64>,
) -> impl futures_util::Stream<Item = Result<idem::rabbitmq::Delivery, Error>> + use<> {
    let redelivered = redelivered.clone();
    source.deliveries().inspect(move |item| {
        if let Ok(delivery) = item {
            let message = delivery.message();
            let poison = serde_json::from_slice::<Event>(&message.data)
                .map(|event| matches!(event, Event::Credit(c) if c.fail))
                .unwrap_or(true);
            if message.redelivered && !poison {
                redelivered.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
}

// ANCHOR: reconnect
/// A source on `queue` from the first of the cluster's `urls` that takes its consumer, trying
/// them in turn every 200 ms for up to `limit`, each attempt for up to 5 s (a node that takes
/// the connection but does not answer is skipped): what a service does when `Consumer::run`
/// returned because its connection closed (the node died), before it runs again.
async fn connect_any(
    urls: &[String],
    queue: &str,
    prefetch: usize,
    limit: Duration,
) -> Result<Source, String> {
    let started = Instant::now();
    loop {
        for url in urls {
            let builder = Source::builder(url.as_str(), queue)
                .prefetch(prefetch)
                .connect_timeout(Duration::from_secs(5));
            let err = match builder.connect().await {
                Ok(source) => return Ok(source),
                // The error names the URL without its password.
                Err(err) => err.to_string(),
            };
            if started.elapsed() >= limit {
                return Err(err);
            }
            eprintln!("reconnecting: {err}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
// ANCHOR_END: reconnect

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_on_three_nodes_loses_nothing_when_the_consumers_node_dies() {
    let began = Instant::now();
    let test = "RabbitMQ cluster test";
    let Some(nodes) = tokio::task::block_in_place(|| RabbitNode::cluster("idem-rmq-q", test, 3))
    else {
        return;
    };
    let nodes = Arc::new(nodes);
    let formed = began.elapsed();
    for node in nodes.iter() {
        eprintln!(
            "{}: started in {:?}, RSS {:?} KiB",
            node.node(),
            node.started_in(),
            node.rss_kib()
        );
    }
    eprintln!("three nodes started and clustered in {formed:?}");
    let running = nodes[1].running_nodes();
    assert_eq!(running.len(), 3, "{running:?}");

    let declared = Rabbit::on(&nodes[0].url(), None, "cluster", true).await;
    let queue = declared.queue.clone();
    let b = Rabbit::at(&nodes[1].url(), &queue, true).await;
    let declared = &declared;
    // Bounded as a whole: a step that hangs fails the test (and the nodes are killed).
    let limit = Duration::from_secs(if harness::soak() { 900 } else { 300 });
    within(
        limit,
        "the cluster test",
        harness::on::<Rabbit, Sqlite>(b, async |b, k| {
            model::schema(k).await;
            let mut events = model::generate(harness::seed(), unique());
            let poison: Vec<String> = (0..5).map(|i| format!("poison-{i}")).collect();
            // Spread over the stream: some fail before the kill, some after it.
            let spacing = events.len() / poison.len();
            for (i, id) in poison.iter().enumerate() {
                events.insert(i * spacing + 11, model::poison(id));
            }
            let oracle = model::oracle(&events);
            let total = events.len() as u64;
            b.publish(&model::raws(&events)).await;
            assert_eq!(b.depth(&queue).await, (total as u32, 0));

            let d = k.dialect;
            let handler = async |batch: &mut idem::Batch<sqlx::Sqlite>, e: &Event| {
                model::handle(batch, e, &d).await
            };
            let tally = Tally::new();
            let redelivered = Arc::new(AtomicU64::new(0));

            // Run 1, on node 0, until node 0 dies.
            let source = declared.builder().prefetch(60).connect().await.unwrap();
            let deliveries = track(count_redelivered(&source, &redelivered), &tally);
            let run = consumer(k.pool.clone()).run(
                deliveries,
                json::<Event>,
                handler,
                std::future::pending::<()>(),
            );
            let kill = async {
                let third = total / 3;
                tally.clone().until(move |acked, _| acked >= third).await;
                let acked = tally.acked();
                tokio::task::block_in_place(|| nodes[0].kill());
                (Instant::now(), acked)
            };
            let (first, (killed, acked_at_kill)) =
                within(Duration::from_secs(120), "run 1 until node 0 dies", async {
                    tokio::join!(run, kill)
                })
                .await;
            let ended = killed.elapsed();
            eprintln!(
                "node 0 killed at {acked_at_kill} acked of {total}; run 1 ended {ended:?} later: \
             {first:?}"
            );
            // At once, or after the consumer's `settle_timeout` (5 s) where an ack was on its way.
            assert!(
                ended < Duration::from_secs(15),
                "the run ended soon after its node died"
            );
            let _ = within(Duration::from_secs(40), "close", source.close()).await;
            eprintln!(
                "run 1's source closed {:?} after the kill",
                killed.elapsed()
            );

            // Node 0 comes back meanwhile (and rejoins), as a restarted machine would.
            let restarted = tokio::task::spawn_blocking({
                let nodes = nodes.clone();
                move || {
                    nodes[0].restart();
                    nodes[0].started_in()
                }
            });

            // Run 2: the service connects again, to the first node that takes its consumer (node 0
            // is down; another answers once the queue has a leader again), and runs again.
            let urls: Vec<String> = nodes.iter().map(RabbitNode::url).collect();
            let source = connect_any(&urls, &queue, 60, Duration::from_secs(60))
                .await
                .unwrap_or_else(|err| panic!("no node took the consumer a minute after: {err}"));
            let connected = killed.elapsed();
            let acked_before = tally.acked();
            let deliveries = track(count_redelivered(&source, &redelivered), &tally);
            let poisoned = || async {
                // Taken from the dead-letter queue and kept (`dead_letters` accumulates).
                let letters = b.dead_letters().await;
                let ids: std::collections::BTreeSet<String> =
                    letters.iter().filter_map(|l| l.id.clone()).collect();
                poison.iter().all(|id| ids.contains(id))
            };
            let run = consumer(k.pool.clone()).run(deliveries, json::<Event>, handler, async {
                // Done: every poison message in the dead-letter queue (a dead letter refused
                // while that queue elects its new leader is held 5 s and tried again), nothing
                // ready, nothing held here, twice in a row.
                let mut quiet = 0;
                while quiet < 2 {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    let settled = tally.acked() + tally.dead_lettered() >= total;
                    let ready = b.depth(&queue).await.0;
                    quiet = if settled && ready == 0 && tally.idle() && poisoned().await {
                        quiet + 1
                    } else {
                        0
                    };
                }
            });
            let flowing = async {
                let tally = tally.clone();
                tally.until(move |acked, _| acked > acked_before).await;
                killed.elapsed()
            };
            let (second, flowed) = within(Duration::from_secs(120), "run 2 on node 1", async {
                tokio::join!(run, flowing)
            })
            .await;
            within(Duration::from_secs(40), "close", source.close())
                .await
                .expect("the source closes cleanly");
            let redelivered = redelivered.load(Ordering::SeqCst);
            eprintln!(
                "run 2 on node 1 (connected {connected:?} after the kill, first ack {flowed:?} \
             after it): {second:?}; {redelivered} redeliveries of good messages"
            );

            // Nothing lost, nothing applied twice.
            model::verify(k, &oracle).await;
            let settled = first.applied + first.duplicate + first.stale;
            let settled = settled + second.applied + second.duplicate + second.stale;
            assert!(settled >= total - 5, "{first:?} {second:?}");
            // The loop's count of applications is the database's: none was ambiguous (the
            // database stayed up), so every redelivery of a committed message was a `Duplicate`.
            assert_eq!(first.applied + second.applied, model::applied(k).await);
            let distinct: std::collections::BTreeSet<&str> = events.iter().map(Event::id).collect();
            let copies = total - distinct.len() as u64;
            let duplicates = first.duplicate + second.duplicate;
            let beyond = duplicates.saturating_sub(copies);
            eprintln!(
                "{beyond} duplicates beyond the stream's {copies} copies (ack lost at the kill)"
            );
            assert!(redelivered > 0, "deliveries unacked at the kill came back");
            // Dead letters are at least once: each poison id at least once.
            let waited = Instant::now();
            let letters = loop {
                let letters = b.dead_letters().await;
                let ids: std::collections::BTreeSet<String> =
                    letters.iter().filter_map(|l| l.id.clone()).collect();
                if ids.len() >= poison.len() {
                    break letters;
                }
                assert!(
                    waited.elapsed() < Duration::from_secs(60),
                    "dead letters {ids:?} after 60 s; {first:?} {second:?}; (ready, consumers) \
                     of the dead-letter queue: {:?}, of the queue: {:?}",
                    b.depth(&b.dlq()).await,
                    b.depth(&queue).await,
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            eprintln!(
                "dead letters all there {:?} after the run",
                waited.elapsed()
            );
            let mut dead: Vec<String> = letters.iter().filter_map(|l| l.id.clone()).collect();
            dead.sort();
            dead.dedup();
            assert_eq!(dead, poison, "each poison message dead-lettered");
            b.settles_at(&queue, 0).await;
            assert_eq!(b.depth(&b.dlq()).await, (0, 0));

            // Node 0 is back in the cluster and sees the queue empty too.
            let restarted = within(Duration::from_secs(150), "node 0 restarts", restarted)
                .await
                .unwrap();
            eprintln!("node 0 restarted in {restarted:?}");
            let running = nodes[1].running_nodes();
            assert_eq!(running.len(), 3, "node 0 rejoined: {running:?}");
            let back = Rabbit::at(&nodes[0].url(), &queue, true).await;
            b.settles_at(&queue, 0).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while back.depth(&queue).await != (0, 0) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert_eq!(back.depth(&queue).await, (0, 0), "empty, seen from node 0");
        }),
    )
    .await;
    eprintln!("the cluster test took {:?}", began.elapsed());
}

//! A JetStream cluster of three private `nats-server` nodes (never the shared server) and a
//! stream, its consumer, its dead-letter stream and the outbox's stream, each with three
//! replicas. The idem consumer and the outbox publisher are given every node's URL, the
//! consumer leader's first (`retain_servers_order`), so both are connected to the node that
//! leads the consumer; that node is SIGKILLed while messages flow (one ack of a committed
//! delivery is held back until the kill, so that an ack is under way during the failover), and
//! started again on its store once the consumer acks again. The input is published through
//! another node, three quarters before the restart and the rest after it; so are the orders
//! whose payments the outbox publishes.
//!
//! Asserted: every distinct message applies once (the oracle on the database), each poison
//! message is dead-lettered once on the cluster's dead-letter stream, each order's payment is
//! in the outbox's stream once, nothing is left unsettled on the consumer, and a delivery that
//! came again after idem committed it (the held ack, answered "503 no responders" while the
//! consumer has no leader) was a `Duplicate`. Printed: the time to a new consumer leader, to
//! the first confirmed ack and to the first published outbox batch after the kill, the failed
//! settlements and the redeliveries. 300 distinct events (434 messages with copies and 6
//! poison ones) and 100 orders; 5,000 and 1,000 with `IDEM_SOAK=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::consume::{json, Settle, SettleError};
use idem::nats::async_nats::{self, jetstream, HeaderMap};
use idem::nats::{headers, OutboxPublisher, Source};
use idem::outbox::{Message, PublishError, Publisher, Relay};
use idem::Outcome;
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness;
use idem_testkit::broker::model::{self, Event, Order};
use idem_testkit::servers::NatsCluster;
use idem_testkit::Kit;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "workers";
const DEAD: &str = "ORDERS_DLQ";
const PAYMENTS: &str = "PAYMENTS";
const ACK_WAIT: Duration = Duration::from_secs(3);

/// What the test saw: each delivery (its stream sequence, JetStream's delivery count, its
/// event id), each settlement (and whether the server confirmed it, and when), and the
/// handler's outcome for each event id.
#[derive(Default)]
struct Journal {
    deliveries: Vec<(u64, u32, String)>,
    settles: Vec<Settled>,
    outcomes: Vec<(String, &'static str)>,
    published: Vec<(Instant, Instant, Result<(), String>)>,
}

struct Settled {
    sequence: u64,
    delivered: u32,
    ack: bool,
    started: Instant,
    ended: Instant,
    result: Result<(), String>,
}

type Shared = Arc<Mutex<Journal>>;

/// A delivery that the journal records, with its settlement.
struct Watched {
    inner: idem::nats::Delivery,
    journal: Shared,
    hold: Arc<Hold>,
}

/// Holds back one ack (the first one after [`armed`](Hold::armed) is set) until the node is
/// killed: a delivery idem committed whose ack goes out during the failover.
#[derive(Default)]
struct Hold {
    armed: AtomicBool,
    /// The held delivery: its stream sequence and delivery count.
    held: tokio::sync::watch::Sender<Option<(u64, u32)>>,
    killed: tokio::sync::watch::Sender<bool>,
}

impl idem::consume::Delivery for Watched {
    fn payload(&self) -> &[u8] {
        idem::consume::Delivery::payload(&self.inner)
    }
    fn deliveries(&self) -> Option<u32> {
        idem::consume::Delivery::deliveries(&self.inner)
    }
    fn revoked(&self) -> bool {
        idem::consume::Delivery::revoked(&self.inner)
    }
    fn describe(&self) -> String {
        idem::consume::Delivery::describe(&self.inner)
    }
    fn headers(&self) -> Vec<(String, String)> {
        idem::consume::Delivery::headers(&self.inner)
    }
    fn message_id(&self) -> Option<String> {
        idem::consume::Delivery::message_id(&self.inner)
    }
    fn consumer_group(&self) -> Option<String> {
        idem::consume::Delivery::consumer_group(&self.inner)
    }
    fn origin(&self) -> idem::recover::Origin {
        idem::consume::Delivery::origin(&self.inner)
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let sequence = self.inner.stream_sequence();
        let delivered = idem::consume::Delivery::deliveries(&self.inner).unwrap_or(0);
        let ack = settle == Settle::Ack;
        if ack && self.hold.armed.swap(false, Ordering::SeqCst) {
            let mut killed = self.hold.killed.subscribe();
            self.hold.held.send_replace(Some((sequence, delivered)));
            let _ = killed.wait_for(|k| *k).await;
        }
        let started = Instant::now();
        let result = idem::consume::Delivery::settle(self.inner, settle).await;
        self.journal.lock().unwrap().settles.push(Settled {
            sequence,
            delivered,
            ack,
            started,
            ended: Instant::now(),
            result: result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        });
        result
    }
}

/// The outbox's publisher, each batch's start, end and result recorded.
struct Timed {
    inner: OutboxPublisher,
    journal: Shared,
}

impl Publisher for Timed {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        let started = Instant::now();
        let result = self.inner.publish(batch).await;
        let record = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
        let entry = (started, Instant::now(), record);
        self.journal.lock().unwrap().published.push(entry);
        result
    }

    fn broker(&self) -> &str {
        self.inner.broker()
    }
}

/// A client's options: its name, the servers tried in the order given, a quick reconnect.
fn options(name: &str) -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .name(name)
        .retain_servers_order()
        .connection_timeout(Duration::from_secs(1))
        .reconnect_delay_callback(|_| Duration::from_millis(100))
}

/// The URLs of a comma-separated list, for async-nats (which parses a `&str` as one URL).
fn servers(urls: &str) -> Vec<String> {
    urls.split(',').map(str::to_string).collect()
}

/// `f` again every 200 ms until it succeeds (the cluster electing its leaders), at most 30 s.
async fn retried<T, E: std::fmt::Display>(
    what: &str,
    mut f: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(value) => return value,
            Err(err) if Instant::now() < deadline => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("{what}: {err}"),
        }
    }
}

async fn create_stream(js: &jetstream::Context, name: &str, subjects: Vec<String>) {
    let config = jetstream::stream::Config {
        name: name.to_string(),
        subjects,
        num_replicas: 3,
        ..Default::default()
    };
    retried(&format!("creating the stream {name}"), async || {
        js.create_stream(config.clone()).await
    })
    .await;
}

/// The consumer's leader and the stream's, as server names.
async fn leaders(js: &jetstream::Context) -> (Option<String>, Option<String>) {
    let info = retried("reading the consumer's info", async || {
        let mut consumer: jetstream::consumer::PullConsumer =
            js.get_consumer_from_stream(CONSUMER, STREAM).await?;
        consumer
            .info()
            .await
            .cloned()
            .map_err(async_nats::Error::from)
    })
    .await;
    let stream = retried("reading the stream's info", async || {
        let mut stream = js.get_stream(STREAM).await?;
        stream
            .info()
            .await
            .cloned()
            .map_err(async_nats::Error::from)
    })
    .await;
    (
        info.cluster.and_then(|c| c.leader),
        stream.cluster.and_then(|c| c.leader),
    )
}

/// The consumer's messages not yet delivered plus those delivered and not acked; `None` while
/// the cluster cannot say.
async fn unsettled(js: &jetstream::Context) -> Option<u64> {
    let mut consumer: jetstream::consumer::PullConsumer =
        js.get_consumer_from_stream(CONSUMER, STREAM).await.ok()?;
    let info = consumer.info().await.ok()?;
    Some(info.num_pending + info.num_ack_pending as u64)
}

/// The messages of `stream`: headers and payload.
async fn messages(js: &jetstream::Context, stream: &str) -> Vec<(HeaderMap, Vec<u8>)> {
    let mut stream = js.get_stream(stream).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            all.push((message.headers, message.payload.to_vec()));
        }
    }
    all
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

/// Publishes `events[range]` on `orders.in`, each with `Nats-Msg-Id: in-<index>` (so that a
/// publish tried again after a lost ack is stored once) and idem's message id header, trying
/// each again every 100 ms until the stream acks it; paced by `pace`. Counts the retries.
async fn publish(
    js: &jetstream::Context,
    events: &[Event],
    range: std::ops::Range<usize>,
    pace: Duration,
    retries: &AtomicU64,
) {
    for i in range {
        let event = &events[i];
        loop {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("in-{i}").as_str());
            headers.insert(headers::MESSAGE_ID, event.id());
            let payload = event.raw().payload;
            let sent = js
                .publish_with_headers("orders.in", headers, payload.into())
                .await;
            let stored = match sent {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            };
            if stored {
                break;
            }
            retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
}

fn order(i: usize) -> Order {
    Order {
        id: format!("order-{i}"),
        customer: format!("customer-{}", i % 7),
        destination: "pay.orders".into(),
        fail: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_three_node_cluster_loses_the_consumers_node_and_nothing_is_lost_or_applied_twice() {
    let began = Instant::now();
    let Some(cluster) = NatsCluster::start("idem_nats_cluster", "NATS cluster test", 3) else {
        return;
    };
    let Some(kit) = Kit::<Sqlite>::open().await else {
        return;
    };
    eprintln!("cluster of 3 up in {:?}", began.elapsed());
    model::schema(&kit).await;
    let soak = harness::soak();
    let seed = harness::seed();
    let (unique, n_orders) = if soak { (5_000, 1_000) } else { (300, 100) };
    // How long the input may take to be consumed, before the kill and after the restart.
    let limit = Duration::from_secs(if soak { 600 } else { 60 });
    let mut events = model::generate(seed, unique);
    for k in 0..6 {
        let at = (k * 2 + 1) * events.len() / 13;
        events.insert(at, model::poison(&format!("poison{k}")));
    }
    let poisons: BTreeSet<String> = (0..6).map(|k| format!("poison{k}")).collect();
    let orders: Vec<Order> = (0..n_orders).map(order).collect();

    // Streams and the consumer, from any node.
    let admin = async_nats::connect(servers(&cluster.urls(0)))
        .await
        .unwrap();
    let js = jetstream::new(admin);
    create_stream(&js, STREAM, vec!["orders.>".into()]).await;
    let dead_subject = Source::default_dead_letter_subject(STREAM, CONSUMER);
    create_stream(&js, DEAD, vec![dead_subject]).await;
    create_stream(&js, PAYMENTS, vec!["pay.>".into()]).await;
    let config = jetstream::consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_ack_pending: 10_000,
        ..Default::default()
    };
    retried("creating the consumer", async || {
        js.create_consumer_on_stream(config.clone(), STREAM).await
    })
    .await;

    // The node that leads the consumer is the one both clients connect to, and the one killed.
    let (consumer_leader, stream_leader) = leaders(&js).await;
    let consumer_leader = consumer_leader.expect("the consumer has a leader");
    let victim = cluster.node_named(&consumer_leader).unwrap();
    eprintln!(
        "consumer leader {consumer_leader}, stream leader {stream_leader:?}: {} is killed",
        cluster.name(victim)
    );
    let urls = cluster.urls(victim);
    let source = Source::builder(&urls, STREAM, CONSUMER)
        .options(options("idem-consumer"))
        .prefetch(10)
        .expires(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    assert_eq!(source.client().server_info().server_name, consumer_leader);
    assert_eq!(source.dead_letter_stream(), Some(DEAD));
    let publisher = OutboxPublisher::builder(&urls)
        .options(options("idem-outbox"))
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let connz = cluster.monitor(victim, "/connz").unwrap_or_default();
    assert!(
        connz.contains("idem-outbox"),
        "the outbox publisher is connected to {}",
        cluster.name(victim)
    );

    let journal: Shared = Arc::default();
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = Relay::new(
        kit.pool.clone(),
        Timed {
            inner: publisher,
            journal: journal.clone(),
        },
    )
    .idle(Duration::from_millis(10), Duration::from_millis(100))
    .retry(Duration::from_millis(100), Duration::from_secs(1))
    .publish_timeout(Duration::from_secs(5));
    let relay = tokio::spawn(relay.run(async {
        let _ = relay_stopped.await;
    }));

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let d = kit.dialect;
    let hold = Arc::new(Hold::default());
    let deliveries = {
        let (journal, hold) = (journal.clone(), hold.clone());
        source.deliveries().map(move |item| {
            item.map(|inner| {
                let sequence = inner.stream_sequence();
                let delivered = idem::consume::Delivery::deliveries(&inner).unwrap_or(0);
                let id =
                    serde_json::from_slice::<serde_json::Value>(inner.message().payload.as_ref())
                        .ok()
                        .and_then(|v| v.get("id")?.as_str().map(str::to_string))
                        .unwrap_or_default();
                journal
                    .lock()
                    .unwrap()
                    .deliveries
                    .push((sequence, delivered, id));
                Watched {
                    inner,
                    journal: journal.clone(),
                    hold: hold.clone(),
                }
            })
        })
    };
    let handler_journal = journal.clone();
    let run = tokio::spawn(harness::consumer(kit.pool.clone(), 10).run(
        deliveries,
        json::<Event>,
        async move |b, e: &Event| {
            let result = model::handle_counted(b, e, &d).await;
            let kind = match &result {
                Ok(Outcome::Applied(_)) => "applied",
                Ok(Outcome::Duplicate) => "duplicate",
                Ok(Outcome::Stale { .. }) => "stale",
                Ok(Outcome::Poisoned { .. }) => "poisoned",
                Ok(_) => "other",
                Err(_) => "failed",
            };
            let id = e.id().to_string();
            handler_journal.lock().unwrap().outcomes.push((id, kind));
            result
        },
        async {
            let _ = stopped.await;
        },
    ));

    // The input comes through a node that is not killed, three quarters before the restart
    // and the rest after it; so do the orders of service A.
    let producer = async_nats::connect_with_options(
        servers(&cluster.urls((victim + 1) % 3)),
        options("producer"),
    )
    .await
    .unwrap();
    let producer = jetstream::new(producer);
    let producer_js = producer.clone();
    let retries = Arc::new(AtomicU64::new(0));
    let (restarted, on_restart) = tokio::sync::watch::channel(false);
    let before = events.len() * 3 / 4;
    let input = {
        let (events, retries, mut on_restart) =
            (events.clone(), retries.clone(), on_restart.clone());
        tokio::spawn(async move {
            let pace = Duration::from_millis(4);
            publish(&producer, &events, 0..before, pace, &retries).await;
            let _ = on_restart.wait_for(|r| *r).await;
            publish(
                &producer,
                &events,
                before..events.len(),
                Duration::ZERO,
                &retries,
            )
            .await;
        })
    };
    let service_a = {
        let (kit_pool, orders, mut on_restart) =
            (kit.pool.clone(), orders.clone(), on_restart.clone());
        let first = orders.len() * 3 / 4;
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for (i, order) in orders.iter().enumerate() {
                if i == first {
                    let _ = on_restart.wait_for(|r| *r).await;
                }
                match model::on_order(&kit_pool, order).await {
                    Ok(Outcome::Applied(id)) => ids.push(id),
                    other => panic!("{order:?}: {other:?}"),
                }
                if i < first {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }
            ids
        })
    };
    drop(on_restart);

    // Kill the node once a quarter of the input was acked, while messages flow.
    let acked = |journal: &Shared| {
        let j = journal.lock().unwrap();
        j.settles
            .iter()
            .filter(|s| s.ack && s.result.is_ok())
            .count()
    };
    harness::eventually("a quarter of the input acked", limit, async || {
        acked(&journal) >= events.len() / 4
    })
    .await;
    // The next ack is held until the kill, so that one is under way during the failover.
    hold.armed.store(true, Ordering::SeqCst);
    let mut held = hold.held.subscribe();
    harness::within(
        Duration::from_secs(30),
        "an ack held",
        held.wait_for(|h| h.is_some()),
    )
    .await
    .unwrap();
    let held = (*held.borrow()).unwrap();
    let killed_at = Instant::now();
    cluster.kill(victim);
    hold.killed.send_replace(true);
    eprintln!("killed {} at {:?}", cluster.name(victim), began.elapsed());
    // The time until another node leads the consumer, asked through a node that was not killed.
    let elected = {
        let (client, victim) = (producer_js.client(), cluster.name(victim).to_string());
        // Short requests, so that one unanswered request does not hide the election.
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_millis(250))
            .build(client);
        tokio::spawn(async move {
            loop {
                let leader = async {
                    let mut consumer: jetstream::consumer::PullConsumer =
                        js.get_consumer_from_stream(CONSUMER, STREAM).await.ok()?;
                    consumer.info().await.ok()?.cluster.clone()?.leader
                };
                if leader.await.is_some_and(|l| l != victim) {
                    return killed_at.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // Flowing again: an ack that started after the kill and that the server confirmed.
    let flowing = |journal: &Shared| {
        let j = journal.lock().unwrap();
        j.settles
            .iter()
            .filter(|s| s.ack && s.result.is_ok() && s.started > killed_at)
            .map(|s| s.ended)
            .min()
    };
    let mut consumer_back = None;
    harness::eventually(
        "the consumer acks again after the kill",
        Duration::from_secs(60),
        async || {
            consumer_back = flowing(&journal);
            consumer_back.is_some()
        },
    )
    .await;
    let consumer_back = consumer_back.unwrap() - killed_at;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restarted_at = Instant::now();
    cluster.restart(victim);
    let healthy = tokio::task::spawn_blocking({
        let started = Instant::now();
        move || {
            cluster.wait_healthy(victim, Duration::from_secs(60));
            (cluster, started.elapsed())
        }
    });
    let (cluster, caught_up) = healthy.await.unwrap();
    let _ = restarted.send(true);
    let (new_consumer_leader, new_stream_leader) = leaders(&js).await;
    eprintln!(
        "{} back after {:?} down, healthy (caught up) {caught_up:?} after its restart; leaders now: consumer {new_consumer_leader:?}, stream {new_stream_leader:?}",
        cluster.name(victim),
        restarted_at - killed_at
    );

    input.await.unwrap();
    let payment_ids = service_a.await.unwrap();
    harness::eventually(
        "every input message settled and every outbox row sent",
        limit,
        async || unsettled(&js).await == Some(0) && model::unsent(&kit).await == 0,
    )
    .await;
    let _ = stop.send(());
    let counts = harness::within(Duration::from_secs(30), "the consumer's stop", run)
        .await
        .unwrap();
    harness::within(Duration::from_secs(40), "close", source.close())
        .await
        .expect("the source closes cleanly");
    let _ = stop_relay.send(());
    let relay_stats = relay.await.unwrap();

    // The database: every distinct message once, nothing of the poison ones.
    model::verify(&kit, &model::oracle(&events)).await;
    // The dead letters: each poison message once, on the cluster's dead-letter stream.
    let letters = messages(&js, DEAD).await;
    let mut dead: BTreeMap<String, usize> = BTreeMap::new();
    for (headers, _) in &letters {
        assert_eq!(header(headers, headers::REASON), Some("poisoned"));
        let id = header(headers, headers::MESSAGE_ID).unwrap_or_default();
        *dead.entry(id.to_string()).or_default() += 1;
    }
    let once: BTreeMap<String, usize> = poisons.iter().map(|p| (p.clone(), 1)).collect();
    assert_eq!(dead, once, "each poison message dead-lettered once");
    // The outbox: each order's payment once in the payments stream.
    let mut arrived: BTreeMap<String, usize> = BTreeMap::new();
    for (headers, _) in messages(&js, PAYMENTS).await {
        let id = header(&headers, "Nats-Msg-Id").unwrap_or_default();
        *arrived.entry(id.to_string()).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = payment_ids.iter().map(|p| (p.clone(), 1)).collect();
    assert_eq!(arrived, expected, "each payment once");
    // Nothing left on the consumer.
    harness::eventually(
        "nothing unsettled on the consumer",
        Duration::from_secs(20),
        async || unsettled(&js).await == Some(0),
    )
    .await;

    // What the kill did to the settlements under way, and the redeliveries.
    let j = std::mem::take(&mut *journal.lock().unwrap());
    let across: Vec<&Settled> = j
        .settles
        .iter()
        .filter(|s| s.started <= killed_at && s.ended >= killed_at)
        .collect();
    let failed: Vec<&Settled> = j.settles.iter().filter(|s| s.result.is_err()).collect();
    let mut acked_at: BTreeMap<u64, u32> = BTreeMap::new();
    for s in j.settles.iter().filter(|s| s.ack) {
        acked_at.entry(s.sequence).or_insert(s.delivered);
    }
    // A delivery that came again after idem committed it (its ack was tried: the ack comes
    // only after the commit).
    let again: Vec<&(u64, u32, String)> = j
        .deliveries
        .iter()
        .filter(|(seq, delivered, _)| acked_at.get(seq).is_some_and(|first| delivered > first))
        .collect();
    let duplicates: BTreeSet<&str> = j
        .outcomes
        .iter()
        .filter(|(_, kind)| *kind == "duplicate")
        .map(|(id, _)| id.as_str())
        .collect();
    for (seq, delivered, id) in &again {
        assert!(
            duplicates.contains(id.as_str()),
            "message {seq} ({id}), delivered again ({delivered}) after its commit, was not a duplicate"
        );
        assert!(
            j.settles
                .iter()
                .any(|s| s.sequence == *seq && s.delivered == *delivered && s.ack),
            "its redelivery {delivered} of message {seq} was acked"
        );
    }
    // The held ack, sent during the failover, and what became of it.
    let held_ack = j
        .settles
        .iter()
        .find(|s| (s.sequence, s.delivered) == held && s.ack)
        .expect("the held ack was sent");
    if held_ack.result.is_err() {
        assert!(
            again.iter().any(|(seq, _, _)| *seq == held.0),
            "the held ack failed ({:?}) and message {} never came again",
            held_ack.result,
            held.0
        );
    }
    assert!(
        !again.is_empty(),
        "no delivery came again after its commit (the held ack: {:?})",
        held_ack.result
    );
    // Of the deliveries that came again, how many had their earlier ack confirmed.
    let confirmed_then_again = again
        .iter()
        .filter(|(seq, delivered, _)| {
            j.settles.iter().any(|s| {
                s.sequence == *seq && s.delivered < *delivered && s.ack && s.result.is_ok()
            })
        })
        .count();
    let elected = elected.await.unwrap();
    // When those confirmed acks ended, in ms from the kill (negative: before it).
    let confirmed_when: Vec<i128> = again
        .iter()
        .filter_map(|(seq, delivered, _)| {
            j.settles.iter().find(|s| {
                s.sequence == *seq && s.delivered < *delivered && s.ack && s.result.is_ok()
            })
        })
        .map(|s| {
            if s.ended >= killed_at {
                (s.ended - killed_at).as_millis() as i128
            } else {
                -((killed_at - s.ended).as_millis() as i128)
            }
        })
        .collect();
    let relay_back = j
        .published
        .iter()
        .filter(|(started, _, r)| *started > killed_at && r.is_ok())
        .map(|(_, ended, _)| *ended - killed_at)
        .min();
    let relay_failed = j.published.iter().filter(|(_, _, r)| r.is_err()).count();
    eprintln!(
        "NATS cluster: {} input messages ({} distinct, {} poison), {} orders; {} deliveries, {} redelivered after their commit (all duplicates; {confirmed_then_again} of them after a confirmed ack, which ended at {confirmed_when:?} ms from the kill); the ack held over the kill: {:?} after {:?}; settlements across the kill: {} ({} failed); failed settlements: {} {:?}; a new consumer leader {elected:?} after the kill, consumer acking again {consumer_back:?} after the kill, relay publishing again {relay_back:?} after it ({relay_failed} failed batches); producer retries {}; counts {counts:?}; relay {relay_stats:?}; whole test {:?}",
        events.len(),
        unique,
        poisons.len(),
        orders.len(),
        j.deliveries.len(),
        again.len(),
        held_ack.result,
        held_ack.ended - held_ack.started,
        across.len(),
        across.iter().filter(|s| s.result.is_err()).count(),
        failed.len(),
        failed.iter().take(3).map(|s| s.result.clone().unwrap_err()).collect::<Vec<_>>(),
        retries.load(Ordering::Relaxed),
        began.elapsed(),
    );
    kit.close().await;
    drop(cluster);
}

//! On a Redis Cluster of the test's own (3 masters, no replicas: `servers::RedisCluster`,
//! killed and removed at the end), through a `ClusterClient`: the consumer (poison
//! dead-lettered to the stream's default dead-letter stream `{<stream>}:dead`, in the stream's
//! slot; a consumer dropped holding entries, taken over with `XAUTOCLAIM` by another; its lag
//! and readiness; the master serving its stream killed and restarted under it, and, on a
//! cluster with a replica for each master, killed for good and failed over), the outbox
//! publisher writing to streams on every master, and a dead-letter stream in another slot
//! refused at `connect`. Each asserts the database (every message
//! applied once) and the cluster (dead letters, nothing pending).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, NotReady};
use idem::outbox::{Message, Publisher as _, Relay};
use idem::redis::{headers, Error, OutboxPublisher, Source};
use idem::Context;
use idem_testkit::backends::{unique_name, Sqlite};
use idem_testkit::broker::model::{self, Event};
use idem_testkit::servers::RedisCluster;
use idem_testkit::Kit;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::AsyncCommands as _;

use crate::GROUP;

/// What `servers::unavailable` names when this machine has no `redis-server`.
const TEST: &str = "Redis Cluster tests";

/// A private cluster, a client of it and a connection.
struct Cluster {
    servers: RedisCluster,
    client: ClusterClient,
    conn: ClusterConnection,
}

impl Cluster {
    async fn start(name: &str) -> Option<Cluster> {
        Cluster::with_replicas(name, 0).await
    }

    /// 3 masters with `replicas` replicas each.
    async fn with_replicas(name: &str, replicas: usize) -> Option<Cluster> {
        let started = Instant::now();
        let name = name.to_string();
        let servers = tokio::task::spawn_blocking(move || {
            RedisCluster::start_with_replicas(&name, TEST, 3, replicas)
        })
        .await;
        let servers = servers.unwrap()?;
        // ANCHOR: cluster_client
        // Seeds: any of the cluster's masters (`redis://127.0.0.1:<port>`, one a master).
        let client = ClusterClient::new(servers.urls()).unwrap();
        // ANCHOR_END: cluster_client
        let conn = client.get_async_connection().await.unwrap();
        eprintln!(
            "cluster of 3 masters ({replicas} replicas each) up in {:?}",
            started.elapsed()
        );
        Some(Cluster {
            servers,
            client,
            conn,
        })
    }

    /// Adds `events` to `stream` (one pipeline: one slot), with their ids.
    async fn add(&self, stream: &str, events: &[Event]) {
        let mut pipe = redis::pipe();
        for event in model::raws(events) {
            let fields: [(&str, &[u8]); 2] = [
                (headers::PAYLOAD, &event.payload),
                (headers::MESSAGE_ID, event.id.as_bytes()),
            ];
            pipe.xadd(stream, "*", &fields).ignore();
        }
        let () = pipe.query_async(&mut self.conn.clone()).await.unwrap();
    }

    /// A consumer of `stream`'s group [`GROUP`] on the cluster, reading with a short block.
    fn builder(&self, stream: &str, consumer: &str) -> idem::redis::SourceBuilder {
        // ANCHOR: cluster_source
        // The client instead of a URL; the dead letters go to `{<stream>}:dead` by default.
        Source::builder(self.client.clone(), stream, GROUP, consumer)
            // ANCHOR_END: cluster_source
            .block(Duration::from_millis(50))
            .prefetch(20)
    }

    async fn slot(&self, key: &str) -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await
            .unwrap()
    }

    /// The group's `(pending, lag)`: the lag counted after the group's last delivered entry
    /// when Redis cannot tell it (after a restart from the append-only file).
    async fn group(&self, stream: &str) -> (usize, usize) {
        let reply: StreamInfoGroupsReply = self.conn.clone().xinfo_groups(stream).await.unwrap();
        let info = reply.groups.into_iter().find(|g| g.name == GROUP).unwrap();
        let lag = match info.lag {
            Some(lag) => lag,
            None => {
                let after = format!("({}", info.last_delivered_id);
                let rest: StreamRangeReply =
                    self.conn.clone().xrange(stream, after, "+").await.unwrap();
                rest.ids.len()
            }
        };
        (info.pending, lag)
    }

    /// Pending entries per consumer.
    async fn pending_by_consumer(&self, stream: &str) -> BTreeMap<String, usize> {
        let reply: redis::streams::StreamPendingReply =
            self.conn.clone().xpending(stream, GROUP).await.unwrap();
        match reply {
            redis::streams::StreamPendingReply::Data(data) => data
                .consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// Until the group has read and settled every entry, or 60 s.
    async fn settled(&self, stream: &str) {
        let settled = async {
            while self.group(stream).await != (0, 0) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), settled).await;
    }

    /// The entries of `stream`: their fields as text.
    async fn entries(&self, stream: &str) -> Vec<BTreeMap<String, String>> {
        let reply: StreamRangeReply = self.conn.clone().xrange_all(stream).await.unwrap();
        crate::fields(&reply)
    }
}

/// 200 credits and 4 poison ones in a stream named without a hash tag. A first consumer reads
/// 20 entries and is dropped holding them; a second, ready by its probe while it runs, takes
/// them over with `XAUTOCLAIM` (`claim_idle` 300 ms) and consumes the rest: every credit
/// applied once, each poison entry dead-lettered once (after 3 attempts) to `{<stream>}:dead`
/// (the stream's slot), nothing pending for either consumer, the stream's entries neither
/// added nor lost, and the lag says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_consumer_applies_once_dead_letters_poison_and_takes_a_dropped_consumers_entries_over(
) {
    let Some(c) = Cluster::start("redis-cluster-consume").await else {
        return;
    };
    let Some(k) = Kit::<Sqlite>::open().await else {
        return;
    };
    model::schema(&k).await;
    let stream = unique_name("idem_cluster:orders");
    let mut events: Vec<Event> = (0..200)
        .map(|i| model::credit(&format!("ok{i}"), i % 7, 1))
        .collect();
    for i in [3, 60, 120, 201] {
        events.insert(i, model::poison(&format!("poison{i}")));
    }
    c.add(&stream, &events).await;

    let started = Instant::now();
    let dead_letters = {
        let dropped = c
            .builder(&stream, "dropped")
            .claim_idle(Duration::from_millis(300))
            .connect()
            .await
            .unwrap();
        let mut taken = Box::pin(dropped.deliveries());
        for _ in 0..20 {
            let delivery = taken.next().await.unwrap().unwrap();
            std::mem::forget(delivery); // never settled
        }
        dropped.dead_letter_stream().to_string()
    };
    assert_eq!(dead_letters, format!("{{{stream}}}:dead"));
    assert_eq!(c.slot(&dead_letters).await, c.slot(&stream).await);
    assert_eq!(
        c.pending_by_consumer(&stream).await,
        BTreeMap::from([("dropped".to_string(), 20)])
    );

    let heir = c
        .builder(&stream, "heir")
        .claim_idle(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let d = k.dialect;
    let consumer = Consumer::new(k.pool.clone())
        .batch(20)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
        .health_of(&heir)
        .health_every(Duration::from_millis(100));
    let health = consumer.health();
    let mut was_ready = false;
    let until = async {
        let settled = c.settled(&stream);
        tokio::pin!(settled);
        loop {
            tokio::select! {
                () = &mut settled => break,
                () = tokio::time::sleep(Duration::from_millis(20)) => {
                    was_ready |= health.ready().is_ok();
                }
            }
        }
    };
    let counts = consumer
        .run(
            heir.deliveries(),
            json::<Event>,
            async |batch, e| model::handle_counted(batch, e, &d).await,
            until,
        )
        .await;
    let took = started.elapsed();
    assert!(was_ready, "the probe (PING on every master) made it ready");
    assert_eq!(health.ready(), Err(NotReady::Stopped));
    assert_eq!(counts.applied, 200, "{counts:?}");
    assert_eq!(counts.dead_lettered, 4, "{counts:?}");
    assert_eq!(counts.failed, 12, "3 failed attempts each: {counts:?}");
    model::verify(&k, &model::oracle(&events)).await;

    let letters = c.entries(&dead_letters).await;
    assert_eq!(letters.len(), 4, "{letters:?}");
    let poisoned: BTreeSet<&str> = letters
        .iter()
        .map(|l| {
            assert_eq!(l.get(headers::REASON).map(String::as_str), Some("poisoned"));
            l.get(headers::MESSAGE_ID).unwrap().as_str()
        })
        .collect();
    assert_eq!(
        poisoned,
        BTreeSet::from(["poison120", "poison201", "poison3", "poison60"])
    );
    assert_eq!(c.group(&stream).await, (0, 0));
    assert!(
        c.pending_by_consumer(&stream).await.is_empty(),
        "the dropped consumer's entries were taken over and settled"
    );
    let len: usize = c.conn.clone().xlen(&stream).await.unwrap();
    assert_eq!(len, 204, "taken over under their own ids");
    let lag = heir.lag().await.unwrap();
    assert_eq!(
        (lag[0].undelivered, lag[0].unacked),
        (Some(0), Some(0)),
        "{lag:?}"
    );
    heir.close().await.unwrap();
    eprintln!("204 entries (20 taken over, 4 dead-lettered) consumed on the cluster in {took:?}");
    k.close().await;
}

/// The master serving a consumer's stream killed (SIGKILL) once a quarter of its 400 entries
/// are applied, and restarted a second later on its append-only file (no replicas, so no
/// failover: the stream is unavailable meanwhile). The consumer's commands wait (redis-rs
/// retries them) or fail while it is down, and go on after (an entry whose ack was lost is
/// claimed back after `claim_idle` and found applied): every credit applied once, the stream
/// whole, nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_and_restarted_under_a_consumer_loses_nothing_and_applies_once() {
    let Some(c) = Cluster::start("redis-cluster-kill").await else {
        return;
    };
    let run = across_a_fault(&c, "kill", |master, _| {
        c.servers.kill(master);
        std::thread::sleep(Duration::from_secs(1));
        c.servers.restart(master);
    })
    .await;
    eprintln!("master down: {run}");
}

/// 400 credits on a cluster whose masters have a replica each, replicated before the consumer
/// starts; once 100 are applied, the master serving the stream is killed and not restarted:
/// its replica takes the slots over (node time-out 1 s) while the consumer keeps going. The
/// group's state (acks, last delivered entry) is replicated asynchronously, so what the dead
/// master had not passed on is delivered again: answered from the records, never applied
/// twice. Every credit applied once, the stream whole on the new master, nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failing_over_to_its_replica_under_a_consumer_applies_once() {
    let Some(c) = Cluster::with_replicas("redis-cluster-failover", 1).await else {
        return;
    };
    let run = across_a_fault(&c, "failover", |master, stream| {
        c.servers.kill(master);
        c.servers.wait_failover(master, stream);
        assert_ne!(
            c.servers.master_of(stream),
            master,
            "a replica took the slots"
        );
    })
    .await;
    eprintln!("failed over: {run}");
}

/// 400 credits in a stream of the cluster, replicated (where there are replicas) before a
/// consumer starts; once 100 are applied, `fault` runs with the master serving the stream (and
/// the stream's name), and the consumer runs on until the group has settled everything. Asserts every credit applied
/// once (the oracle, and the loop's count), nothing pending or unread, and the stream whole;
/// returns what happened, to print.
async fn across_a_fault(c: &Cluster, name: &str, fault: impl FnOnce(usize, &str)) -> String {
    let Some(k) = Kit::<Sqlite>::open().await else {
        return "skipped".into();
    };
    model::schema(&k).await;
    let stream = unique_name(&format!("idem_cluster:{name}"));
    let events: Vec<Event> = (0..400)
        .map(|i| model::credit(&format!("{name}{i}"), i % 9, 1))
        .collect();
    c.add(&stream, &events).await;
    let master = c.servers.master_of(&stream);
    tokio::task::block_in_place(|| c.servers.wait_replicated(master));
    let source = c
        .builder(&stream, "w")
        .prefetch(10)
        .claim_idle(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let d = k.dialect;
    let started = Instant::now();
    let mut faulted = Duration::ZERO;
    let mut at_fault = 0;
    let until = async {
        while model::applied(&k).await < 100 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        at_fault = model::applied(&k).await;
        let at = Instant::now();
        tokio::task::block_in_place(|| fault(master, &stream));
        faulted = at.elapsed();
        c.settled(&stream).await;
    };
    let counts = Consumer::new(k.pool.clone())
        .batch(10)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
        .run(
            source.deliveries(),
            json::<Event>,
            async |batch, e| model::handle(batch, e, &d).await,
            until,
        )
        .await;
    let took = started.elapsed();
    assert!(at_fault < 400, "the fault came mid-run: {at_fault} applied");
    model::verify(&k, &model::oracle(&events)).await;
    assert_eq!(counts.applied, 400, "{counts:?}");
    assert_eq!(c.group(&stream).await, (0, 0), "nothing pending or unread");
    let len: usize = c.conn.clone().xlen(&stream).await.unwrap();
    assert_eq!(len, 400, "the stream whole");
    source.close().await.unwrap();
    k.close().await;
    format!(
        "400 entries in {took:?}, the fault at {at_fault} applied lasting {faulted:?}, {} \
         answered as duplicates: {counts:?}",
        counts.duplicate
    )
}

/// An outbox relay with a `ClusterClient` publisher: 3 destination streams, one in each
/// master's slots, 150 messages each over 5 partition keys, relayed in batches of 200 (so a
/// batch spans slots): every message arrives once, under its outbox id, in its key's order;
/// nothing is left unsent. Then one batch of 30 interleaved over the three streams: each
/// stream gets its 10, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_publisher_writes_to_streams_on_every_master_of_a_cluster() {
    let Some(c) = Cluster::start("redis-cluster-outbox").await else {
        return;
    };
    let Some(k) = Kit::<Sqlite>::open().await else {
        return;
    };
    model::schema(&k).await;
    // A destination in each third of the slots: on each master (the cluster deals the slots
    // out in three ranges).
    let base = unique_name("idem_cluster:out");
    let mut destinations: BTreeMap<i64, String> = BTreeMap::new();
    for i in 0..200 {
        let name = format!("{base}:{i}");
        destinations
            .entry(c.slot(&name).await * 3 / 16384)
            .or_insert(name);
        if destinations.len() == 3 {
            break;
        }
    }
    assert_eq!(destinations.len(), 3);
    for destination in destinations.values() {
        seed_outbox(&k, destination, 150, 5).await;
    }
    let started = Instant::now();
    // ANCHOR: cluster_publisher
    let publisher = OutboxPublisher::builder(c.client.clone())
        .connect()
        .await
        .unwrap();
    // ANCHOR_END: cluster_publisher
    let mut relay = Relay::new(k.pool.clone(), publisher).batch(200);
    let mut published = 0;
    loop {
        let n = relay.step().await.expect("a relay pass");
        if n == 0 {
            break;
        }
        published += n;
    }
    let took = started.elapsed();
    assert_eq!(published, 450);
    assert_eq!(model::unsent(&k).await, 0);
    let mut ids = BTreeSet::new();
    for destination in destinations.values() {
        let entries = c.entries(destination).await;
        assert_eq!(entries.len(), 150, "{destination}");
        let mut next: BTreeMap<String, i64> = BTreeMap::new();
        for entry in &entries {
            assert!(ids.insert(entry[headers::MESSAGE_ID].clone()), "once each");
            let payment: model::Payment = serde_json::from_str(&entry[headers::PAYLOAD]).unwrap();
            let key = entry[headers::PARTITION_KEY].clone();
            assert_eq!(payment.order, key);
            let expected = next.entry(key).or_insert(0);
            assert_eq!(payment.n, *expected, "a key's messages in order");
            *expected += 1;
        }
    }
    eprintln!("450 outbox messages relayed to 3 streams on 3 masters in {took:?}");

    // One batch over the three slots, interleaved: each stream gets its messages in order.
    let publisher = OutboxPublisher::builder(c.client.clone())
        .connect()
        .await
        .unwrap();
    let streams: Vec<String> = destinations
        .values()
        .map(|d| format!("{d}:mixed"))
        .collect();
    let batch: Vec<Message> = (0..30)
        .map(|i| Message {
            id: format!("mixed-{i}"),
            destination: streams[i % 3].clone(),
            partition_key: String::new(),
            payload: i.to_string().into_bytes(),
            headers: Vec::new(),
            attempts: 0,
        })
        .collect();
    publisher.publish(&batch).await.unwrap();
    for (s, stream) in streams.iter().enumerate() {
        let got: Vec<String> = c
            .entries(stream)
            .await
            .into_iter()
            .map(|mut e| e.remove(headers::MESSAGE_ID).unwrap())
            .collect();
        let expected: Vec<String> = (s..30).step_by(3).map(|i| format!("mixed-{i}")).collect();
        assert_eq!(got, expected);
    }
    k.close().await;
}

/// `model::seed_outbox`, under context keys of `destination`'s own (message ids come from the
/// context: the kit's keys, the same for every destination, would make the second
/// destination's rows copies of the first's).
async fn seed_outbox(k: &Kit<Sqlite>, destination: &str, rows: usize, keys: usize) {
    let mut tx = k.pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new(
            "cluster::seed",
            format!("{destination}:{i}").into_bytes(),
            None,
        );
        let payment = model::Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(destination)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// A dead-letter stream in another slot than the stream fails `connect` with
/// [`Error::CrossSlot`], which says what to do, before anything is created; the script it
/// would have run fails on the server, `CROSSSLOT`, rather than writing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stream_in_another_slot_fails_at_connect_saying_what_to_do() {
    let Some(c) = Cluster::start("redis-cluster-slots").await else {
        return;
    };
    let stream = format!("{{{}}}", unique_name("orders"));
    let mut elsewhere = String::new();
    for i in 0.. {
        elsewhere = format!("dead-letters-{i}");
        if c.slot(&elsewhere).await != c.slot(&stream).await {
            break;
        }
    }
    let refused = c
        .builder(&stream, "w")
        .dead_letters(&elsewhere)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::CrossSlot { .. }), "{refused:?}");
    let text = refused.to_string();
    for words in ["Redis Cluster", "hash slot", "{orders}:dead", &elsewhere] {
        assert!(text.contains(words), "{text}");
    }
    let exists: bool = c.conn.clone().exists(&stream).await.unwrap();
    assert!(!exists, "nothing created");

    let across: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg("redis.call('XADD', KEYS[2], '*', 'a', 'b') return 1")
        .arg(2)
        .arg(&stream)
        .arg(&elsewhere)
        .query_async(&mut c.conn.clone())
        .await;
    let err = across.unwrap_err();
    assert!(err.to_string().contains("same slot"), "{err}");
    let exists: bool = c.conn.clone().exists(&elsewhere).await.unwrap();
    assert!(!exists, "nothing written");

    // The same stream with its default dead-letter stream connects.
    let source = c.builder(&stream, "w").connect().await.unwrap();
    assert_eq!(source.dead_letter_stream(), format!("{stream}:dead"));
    source.close().await.unwrap();
}

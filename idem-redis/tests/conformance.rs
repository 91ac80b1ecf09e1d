//! idem's broker conformance kit on the local Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`), Redis Streams, on SQLite and PostgreSQL (`IDEM_POSTGRES_URL`):
//! [`Redis`] is one rule's stream, its consumer group `workers` and the default dead-letter
//! stream `<stream>:dead`; `broker_suite!` runs every rule on it. What is Redis's own
//! (`XAUTOCLAIM` takeovers, two holders of one entry, what a dead letter keeps, delivery counts
//! of crashed consumers, what `connect` checks) is in [`specific`]; on a private Redis Cluster
//! in [`cluster`], and over TLS (feature `tls`) on a private server in `tls`.
//! Built without `IDEM_REDIS_URL` (and without `CI`), the tests are ignored, saying so (the crate's
//! build script); a server that does not answer fails the test in CI and skips it, saying why,
//! elsewhere.

#[path = "conformance/auth.rs"]
mod auth;
#[path = "conformance/cluster.rs"]
mod cluster;
#[path = "conformance/specific.rs"]
mod specific;
#[cfg(feature = "tls")]
#[path = "conformance/tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::time::Duration;

use idem::redis::{headers, OutboxPublisher, Source};
use idem_testkit::broker::harness::{skip, unique_name};
use idem_testkit::broker::{Arrived, Broker, DeadLetter, Raw, Settings, Spec};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::AsyncCommands as _;

// ANCHOR: broker_suite
idem_testkit::broker_suite!(Redis; absent(
    idem_no_redis = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
));
// ANCHOR_END: broker_suite

/// The consumer group of every input.
pub const GROUP: &str = "workers";

/// The server the tests use: `IDEM_REDIS_URL`, default the local server.
pub fn url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// One rule's stream with its group `workers` (made from the stream's start), its default
/// dead-letter stream `<stream>:dead`, the outbox's stream `<stream>:out`, and how long an
/// entry a dead consumer holds waits before another takes it over (`claim_idle`).
pub struct Redis {
    pub conn: MultiplexedConnection,
    pub stream: String,
    pub claim_idle: Duration,
}

/// The group's state: `(pending, lag)`, lag being entries not yet read by the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    pub pending: usize,
    pub lag: usize,
}

impl Redis {
    async fn connect() -> Option<MultiplexedConnection> {
        let connected = async {
            let client = redis::Client::open(url())?;
            client.get_multiplexed_async_connection().await
        };
        match tokio::time::timeout(Duration::from_secs(3), connected).await {
            Ok(Ok(conn)) => Some(conn),
            Ok(Err(err)) => skip(&format!("no Redis at {}", url()), err),
            Err(_) => skip(&format!("no Redis at {}", url()), "no answer within 3 s"),
        }
    }

    /// The dead-letter stream.
    pub fn dead(&self) -> String {
        format!("{}:dead", self.stream)
    }

    fn out(&self) -> String {
        format!("{}:out", self.stream)
    }

    fn not_a_stream(&self) -> String {
        format!("{}:not-a-stream", self.stream)
    }

    /// The source of consumer `consumer` in the group, reading with a short block.
    pub fn builder(&self, consumer: &str) -> idem::redis::SourceBuilder {
        Source::builder(url(), &self.stream, GROUP, consumer)
            .block(Duration::from_millis(50))
            .claim_idle(self.claim_idle)
    }

    /// Adds one entry with the fields `fields`; its id.
    pub async fn add(&self, fields: &[(&str, &[u8])]) -> String {
        self.conn
            .clone()
            .xadd(&self.stream, "*", fields)
            .await
            .unwrap()
    }

    /// Entries in the stream.
    pub async fn stream_len(&self) -> usize {
        self.conn.clone().xlen(&self.stream).await.unwrap()
    }

    /// The group's pending count and lag (Redis 7: `XINFO GROUPS`).
    pub async fn group(&self) -> GroupState {
        let reply: StreamInfoGroupsReply =
            self.conn.clone().xinfo_groups(&self.stream).await.unwrap();
        let info = reply
            .groups
            .into_iter()
            .find(|g| g.name == GROUP)
            .expect("the group exists");
        GroupState {
            pending: info.pending,
            lag: info.lag.expect("Redis 7 reports the group's lag"),
        }
    }

    /// Pending entries per consumer of the group.
    pub async fn pending_by_consumer(&self) -> BTreeMap<String, usize> {
        let reply: redis::streams::StreamPendingReply = self
            .conn
            .clone()
            .xpending(&self.stream, GROUP)
            .await
            .unwrap();
        match reply {
            redis::streams::StreamPendingReply::Data(data) => data
                .consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// Completes once the group has read every entry and has nothing pending (or after
    /// `limit`, so a broken run ends and its assertions say why).
    pub async fn settled_within(&self, limit: Duration) {
        let settled = async {
            while self.group().await != (GroupState { pending: 0, lag: 0 }) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(limit, settled).await;
    }

    /// The entries of `stream`, in order: their fields as text.
    pub async fn entries(&self, stream: &str) -> Vec<BTreeMap<String, String>> {
        let reply: StreamRangeReply = self.conn.clone().xrange_all(stream).await.unwrap();
        crate::fields(&reply)
    }
}

impl Broker for Redis {
    type Source = Source;
    type Publisher = OutboxPublisher;

    const NAME: &'static str = "Redis Streams";
    const COUNTS_DELIVERIES: bool = true;
    const SETTLES_EACH: bool = true;
    const DROPS_REPUBLISHED: bool = false;

    async fn create(spec: Spec) -> Option<Redis> {
        let mut conn = Redis::connect().await?;
        let stream = unique_name(&format!("idem_kit:{}", spec.rule));
        let () = conn
            .xgroup_create_mkstream(&stream, GROUP, "0")
            .await
            .unwrap();
        Some(Redis {
            conn,
            stream,
            claim_idle: spec.redelivery,
        })
    }

    fn names(&self) -> String {
        format!("{} {}", self.stream, self.claim_idle.as_millis())
    }

    async fn attach(names: &str) -> Redis {
        let (stream, idle) = names.split_once(' ').expect("stream claim_idle");
        let client = redis::Client::open(url()).unwrap();
        Redis {
            conn: client.get_multiplexed_async_connection().await.unwrap(),
            stream: stream.to_string(),
            claim_idle: Duration::from_millis(idle.parse().unwrap()),
        }
    }

    async fn publish(&self, messages: &[Raw]) {
        let mut conn = self.conn.clone();
        for chunk in messages.chunks(500) {
            let mut pipe = redis::pipe();
            for message in chunk {
                let fields: [(&str, &[u8]); 2] = [
                    (headers::PAYLOAD, &message.payload),
                    (headers::MESSAGE_ID, message.id.as_bytes()),
                ];
                pipe.xadd(&self.stream, "*", &fields).ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
        }
    }

    async fn source(&self, settings: Settings) -> Source {
        self.builder(&settings.consumer)
            .prefetch(settings.prefetch)
            .connect()
            .await
            .unwrap()
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.entries(&self.dead())
            .await
            .into_iter()
            .map(|mut fields| DeadLetter {
                id: fields.get(headers::MESSAGE_ID).cloned(),
                payload: fields
                    .remove(headers::PAYLOAD)
                    .unwrap_or_default()
                    .into_bytes(),
                fields,
            })
            .collect()
    }

    async fn unsettled(&self) -> u64 {
        let state = self.group().await;
        (state.pending + state.lag) as u64
    }

    async fn publisher(&self) -> OutboxPublisher {
        OutboxPublisher::builder(url()).connect().await.unwrap()
    }

    fn input(&self) -> String {
        self.stream.clone()
    }

    fn destination(&self) -> String {
        self.out()
    }

    async fn refusing_destination(&self) -> (String, String) {
        let key = self.not_a_stream();
        let () = self.conn.clone().set(&key, "x").await.unwrap();
        (key, "WRONGTYPE".into())
    }

    async fn arrived(&self, expected: usize) -> Vec<Arrived> {
        let _ = expected; // XADD answered for every message before the relay returned
        self.entries(&self.out())
            .await
            .into_iter()
            .map(|mut fields| Arrived {
                id: fields
                    .remove(headers::MESSAGE_ID)
                    .expect("the outbox writes the id"),
                partition_key: fields.remove(headers::PARTITION_KEY),
                partition: None,
                payload: fields
                    .remove(headers::PAYLOAD)
                    .unwrap_or_default()
                    .into_bytes(),
                headers: fields
                    .into_iter()
                    .filter_map(|(name, value)| {
                        let name = name.strip_prefix(headers::HEADER_PREFIX)?;
                        Some((name.to_string(), value))
                    })
                    .collect(),
            })
            .collect()
    }

    async fn teardown(self) {
        let keys = [
            self.stream.clone(),
            self.dead(),
            self.out(),
            self.not_a_stream(),
        ];
        let _: redis::RedisResult<i64> = self.conn.clone().del(&keys).await;
    }
}

/// The entries of a range's reply, in order: their fields as text.
pub(crate) fn fields(reply: &StreamRangeReply) -> Vec<BTreeMap<String, String>> {
    reply
        .ids
        .iter()
        .map(|e| {
            e.map
                .keys()
                .map(|k| (k.clone(), e.get::<String>(k).unwrap_or_default()))
                .collect()
        })
        .collect()
}

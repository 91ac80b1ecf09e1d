//! idem's broker conformance kit on a Kafka-protocol broker (`IDEM_KAFKA_BROKERS`, e.g. a
//! `tansu` started by `.ci/run`), on SQLite and PostgreSQL (`IDEM_POSTGRES_URL`): [`Kafka`] is
//! one rule's topic, its consumer group and the default dead-letter topic `<topic>.dead`;
//! `broker_suite!` runs every rule on it but `max_deliveries` (Kafka keeps no delivery count).
//! What is Kafka's own (what `connect` checks, the committed offset held by an unsettled
//! record, `max_held` pausing a partition, a member joining mid-stream) is in [`specific`].
//! Built without `IDEM_KAFKA_BROKERS` (and without `CI`), the tests are ignored, saying so (the
//! crate's build script); a broker that does not answer there fails the test in CI and skips it,
//! saying why, elsewhere.
//!
//! The test broker, tansu 0.6.0, mishandles produced batches of several records, so the
//! producers here produce one record per batch (`batch.num.messages=1`, `linger.ms=0`); a real
//! Kafka needs neither.

#[path = "conformance/specific.rs"]
mod specific;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem::kafka::rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem::kafka::rdkafka::{Offset, TopicPartitionList};
use idem::kafka::{headers, OutboxPublisher, Source};
use idem_testkit::broker::harness::{skip, unique_name};
use idem_testkit::broker::{Arrived, Broker, DeadLetter, Raw, Settings, Spec};

// ANCHOR: broker_suite
idem_testkit::broker_suite!(Kafka;
without(max_deliveries = "Kafka keeps no delivery count");
absent(
    idem_no_kafka = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
));
// ANCHOR_END: broker_suite

const TIMEOUT: Duration = Duration::from_secs(10);

/// The partitions of a rule's topic.
pub const PARTITIONS: i32 = 3;

/// The brokers: `IDEM_KAFKA_BROKERS`; `None`, saying why, when it is not set or nothing answers
/// there (a failure in CI).
pub fn brokers() -> Option<String> {
    let Ok(brokers) = std::env::var("IDEM_KAFKA_BROKERS") else {
        return skip(
            "IDEM_KAFKA_BROKERS is not set",
            "start a Kafka-protocol broker (e.g. `tansu broker --listener-url \
             tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
             --storage-engine memory://tansu/`) and set IDEM_KAFKA_BROKERS=127.0.0.1:9092",
        );
    };
    let first = brokers.split(',').next().unwrap_or_default().to_string();
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&first)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
        });
    if !reachable {
        return skip(
            &format!("no Kafka-protocol broker answers at {brokers}"),
            "IDEM_KAFKA_BROKERS",
        );
    }
    Some(brokers)
}

/// One rule's topic (`partitions` partitions), its group `<topic>_group`, and its default
/// dead-letter topic `<topic>.dead` (one partition).
pub struct Kafka {
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub partitions: i32,
    producer: FutureProducer,
}

impl Kafka {
    /// A fresh topic of `partitions` partitions and its dead-letter topic.
    pub async fn create_with(spec: Spec, partitions: i32) -> Option<Kafka> {
        let brokers = brokers()?;
        let topic = unique_name(&format!("idem_kit_{}", spec.rule));
        let kafka = Kafka::attach_to(&brokers, &topic, partitions);
        let created = kafka
            .admin()
            .create_topics(
                &[
                    NewTopic::new(&topic, partitions, TopicReplication::Fixed(1)),
                    NewTopic::new(&kafka.dead(), 1, TopicReplication::Fixed(1)),
                ],
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .unwrap();
        for result in created {
            result.unwrap();
        }
        Some(kafka)
    }

    fn attach_to(brokers: &str, topic: &str, partitions: i32) -> Kafka {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("batch.num.messages", "1")
            .set("linger.ms", "0")
            .set("acks", "all")
            .create()
            .unwrap();
        Kafka {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            group: format!("{topic}_group"),
            partitions,
            producer,
        }
    }

    /// The dead-letter topic.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.topic)
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .unwrap()
    }

    /// The builder of the rule's source, with short timers for tests.
    pub fn builder(&self) -> idem::kafka::SourceBuilder {
        Source::builder(&self.brokers, &self.topic, &self.group)
            .consumer_config("session.timeout.ms", "6000")
            .consumer_config("heartbeat.interval.ms", "500")
            // A member whose metadata missed a topic or partition (a broker that answered before
            // it knew them) learns them within a second, not after librdkafka's 5 minutes.
            .consumer_config("topic.metadata.refresh.interval.ms", "1000")
            .producer_config("batch.num.messages", "1")
            .commit_interval(Duration::from_millis(200))
            .max_retry_delay(Duration::from_millis(500))
    }

    /// Produces one record (its own batch), to `partition` if given, and waits for the ack.
    pub async fn produce(
        &self,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        headers: OwnedHeaders,
    ) {
        let mut record = FutureRecord::to(&self.topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        self.producer
            .send(record, TIMEOUT)
            .await
            .map_err(|(err, _)| err)
            .unwrap();
    }

    /// Produces one message of the kit: keyed by its id, which is also its id header.
    pub async fn produce_raw(&self, partition: Option<i32>, message: &Raw) {
        let headers = OwnedHeaders::new().insert(Header {
            key: headers::MESSAGE_ID,
            value: Some(message.id.as_str()),
        });
        self.produce(partition, &message.id, &message.payload, headers)
            .await;
    }

    fn offsets_client(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .create()
            .unwrap()
    }

    /// The group's committed offset per partition (`None` where nothing was committed).
    pub async fn committed(&self) -> Vec<Option<i64>> {
        let client = self.offsets_client();
        let mut list = TopicPartitionList::new();
        for p in 0..self.partitions {
            list.add_partition(&self.topic, p);
        }
        tokio::task::spawn_blocking(move || {
            let committed = client.committed_offsets(list, TIMEOUT).unwrap();
            committed
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .collect()
        })
        .await
        .unwrap()
    }

    /// Each partition's high watermark (the offset the next record gets) of `topic`.
    async fn ends_of(&self, topic: &str, partitions: i32) -> Vec<i64> {
        let client = self.offsets_client();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| client.fetch_watermarks(&topic, p, TIMEOUT).unwrap().1)
                .collect()
        })
        .await
        .unwrap()
    }

    /// Each partition's high watermark.
    pub async fn ends(&self) -> Vec<i64> {
        self.ends_of(&self.topic, self.partitions).await
    }

    /// Whether the group has committed every record of the topic.
    pub async fn all_committed(&self) -> bool {
        self.unsettled().await == 0
    }

    /// Completes once the group has committed every record.
    pub async fn settled(&self) {
        while !self.all_committed().await {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every record of `topic`, partition after partition, each in offset order: partition,
    /// key, headers, payload.
    async fn records(&self, topic: &str, partitions: i32) -> Vec<Record> {
        let ends = self.ends_of(topic, partitions).await;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", unique_name("idem_kit_kafka_reader"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let topic = topic.to_string();
        let mut all = tokio::task::spawn_blocking(move || {
            let mut list = TopicPartitionList::new();
            for p in 0..partitions {
                list.add_partition_offset(&topic, p, Offset::Beginning)
                    .unwrap();
            }
            consumer.assign(&list).unwrap();
            let wanted: i64 = ends.iter().sum();
            let mut all = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while (all.len() as i64) < wanted && Instant::now() < deadline {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                    let headers = m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|header| {
                                    let value = header.value.unwrap_or_default();
                                    let value = String::from_utf8_lossy(value).into_owned();
                                    (header.key.to_string(), value)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    all.push(Record {
                        partition: m.partition(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        offset: m.offset(),
                        headers,
                        payload: m.payload().unwrap_or_default().to_vec(),
                    });
                }
            }
            all
        })
        .await
        .unwrap();
        all.sort_by_key(|r| (r.partition, r.offset));
        all
    }
}

/// A record as a topic holds it.
struct Record {
    partition: i32,
    key: Option<String>,
    offset: i64,
    headers: BTreeMap<String, String>,
    payload: Vec<u8>,
}

impl Broker for Kafka {
    type Source = Source;
    type Publisher = OutboxPublisher;

    const NAME: &'static str = "Kafka";
    const COUNTS_DELIVERIES: bool = false;
    /// The committed offset moves only over a contiguous run of settled records.
    const SETTLES_EACH: bool = false;
    const DROPS_REPUBLISHED: bool = false;
    /// Longer than the consumers' `session.timeout.ms` (6 s): after it, the broker has expired
    /// every SIGKILLed member. tansu 0.6.0 mishandles such an expiry while the group is stable:
    /// it re-forms the group under the same generation without telling the followers, so a
    /// partition stays assigned to the dead member and nothing consumes it. A real Kafka bumps
    /// the generation and the followers rejoin.
    const REJOIN: Duration = Duration::from_secs(9);

    async fn create(spec: Spec) -> Option<Kafka> {
        Kafka::create_with(spec, PARTITIONS).await
    }

    fn names(&self) -> String {
        format!("{} {}", self.topic, self.partitions)
    }

    async fn attach(names: &str) -> Kafka {
        let (topic, partitions) = names.split_once(' ').expect("topic partitions");
        let brokers = std::env::var("IDEM_KAFKA_BROKERS").expect("IDEM_KAFKA_BROKERS");
        Kafka::attach_to(&brokers, topic, partitions.parse().unwrap())
    }

    async fn publish(&self, messages: &[Raw]) {
        for chunk in messages.chunks(200) {
            let sends = chunk.iter().map(|m| self.produce_raw(None, m));
            futures_util::future::join_all(sends).await;
        }
    }

    async fn source(&self, settings: Settings) -> Source {
        self.builder()
            .prefetch(settings.prefetch)
            .connect()
            .await
            .unwrap()
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.records(&self.dead(), 1)
            .await
            .into_iter()
            .map(|r| {
                // Where the original was: its partition and offset.
                let number = |field| r.headers.get(field).and_then(|v| v.parse::<i64>().ok());
                assert!(
                    number(headers::SOURCE_PARTITION).is_some()
                        && number(headers::SOURCE_OFFSET).is_some(),
                    "a dead letter names its original's partition and offset: {:?}",
                    r.headers
                );
                DeadLetter {
                    id: r.headers.get(headers::MESSAGE_ID).cloned(),
                    payload: r.payload,
                    fields: r.headers,
                }
            })
            .collect()
    }

    async fn unsettled(&self) -> u64 {
        let (ends, committed) = (self.ends().await, self.committed().await);
        ends.iter()
            .zip(&committed)
            .map(|(end, c)| (end - c.unwrap_or(0)).max(0) as u64)
            .sum()
    }

    async fn publisher(&self) -> OutboxPublisher {
        OutboxPublisher::builder(&self.brokers)
            .producer_config("batch.num.messages", "1")
            .producer_config("linger.ms", "0")
            // A record Kafka does not take (`refusing_destination`) fails its batch after this,
            // not after the publisher's 20 s.
            .producer_config("message.timeout.ms", "5000")
            .connect()
            .await
            .unwrap()
    }

    fn input(&self) -> String {
        self.topic.clone()
    }

    fn destination(&self) -> String {
        self.topic.clone()
    }

    async fn refusing_destination(&self) -> (String, String) {
        // Not a valid topic name: Kafka never takes the record, which times out; the error
        // names the topic.
        let topic = "idem kit: not a topic!".to_string();
        (topic.clone(), topic)
    }

    async fn arrived(&self, expected: usize) -> Vec<Arrived> {
        let _ = expected; // the broker acked every record before the relay returned
        self.records(&self.topic, self.partitions)
            .await
            .into_iter()
            .map(|mut r| {
                let partition_key = r.headers.remove(headers::PARTITION_KEY);
                assert_eq!(r.key, partition_key, "the partition key is the record key");
                Arrived {
                    id: r
                        .headers
                        .remove(headers::MESSAGE_ID)
                        .expect("the outbox sets the id header"),
                    partition_key,
                    partition: Some(r.partition),
                    payload: r.payload,
                    headers: r.headers,
                }
            })
            .collect()
    }

    async fn teardown(self) {
        let _ = self
            .admin()
            .delete_topics(&[&self.topic, &self.dead()], &AdminOptions::new())
            .await;
    }
}

//! [`Source`]: a consumer in a group whose records become deliveries, with the offsets
//! committed per partition up to the watermark, on a timer and at [`close`](Source::close).

use std::collections::HashSet;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, Stream, StreamExt as _};
use idem_runtime::consume::adapter::{InFlight, Lifecycle, CLOSE_TIMEOUT};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message as _;
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::delivery::{Delivery, Link};
use crate::error::Error;
use crate::rebalance::{Rebalancing, Shared};

/// How long [`SourceBuilder::connect`] waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings of a [`Source`], from [`Source::builder`]; nothing connects until
/// [`connect`](SourceBuilder::connect).
#[derive(Debug, Clone)]
pub struct SourceBuilder {
    brokers: String,
    consumer: ClientConfig,
    producer: ClientConfig,
    topic: String,
    dead_letters: String,
    commit_interval: Duration,
    max_retry_delay: Duration,
    max_held: usize,
}

impl SourceBuilder {
    /// How many records librdkafka fetches ahead per partition (`queued.min.messages`;
    /// default librdkafka's, 100,000; at least 1).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.consumer
            .set("queued.min.messages", n.clamp(1, 10_000_000).to_string());
        self
    }

    /// Where dead letters go (default `<topic>.dead`). The topic must exist:
    /// [`connect`](SourceBuilder::connect) checks it.
    pub fn dead_letters(mut self, topic: impl Into<String>) -> Self {
        self.dead_letters = topic.into();
        self
    }

    /// Sets a librdkafka property of the consumer (`session.timeout.ms`, `security.protocol`,
    /// ...). idem sets `enable.auto.commit` and `enable.auto.offset.store` to `false` after
    /// these: it stores and commits offsets itself.
    pub fn consumer_config(mut self, key: &str, value: &str) -> Self {
        self.consumer.set(key, value);
        self
    }

    /// Sets a librdkafka property of the dead-letter producer (`linger.ms` is 0 by default:
    /// dead letters are few and each waits for its ack).
    pub fn producer_config(mut self, key: &str, value: &str) -> Self {
        self.producer.set(key, value);
        self
    }

    /// How often the watermarks are committed (default 1 s); also at revoke and at close.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The longest wait before a failed record runs again in place (default 30 s): the
    /// consumer's retry delay doubles per retry up to this.
    pub fn max_retry_delay(mut self, delay: Duration) -> Self {
        self.max_retry_delay = delay;
        self
    }

    /// How many records of one partition may be held above its watermark (taken while a lower
    /// offset is still unsettled) before the partition is paused until the watermark moves
    /// (default 10,000): the memory and redelivery bound of a stuck record.
    pub fn max_held(mut self, n: usize) -> Self {
        self.max_held = n.max(1);
        self
    }

    /// Creates the consumer and the dead-letter producer ([`Error::Config`] if librdkafka
    /// refuses the settings), asks the brokers for the topic and the dead-letter topic
    /// ([`Error::Connect`] if they do not answer within 10 s, [`Error::TopicMissing`],
    /// [`Error::DeadLetterTopicMissing`]), and subscribes to the topic. The group is joined on
    /// the first poll of [`deliveries`](Source::deliveries).
    pub async fn connect(self) -> Result<Source, Error> {
        let refused = |what: &str| {
            let what = what.to_string();
            move |source| Error::Config {
                what: format!("librdkafka refused the {what}'s settings"),
                source: Some(source),
            }
        };
        let watermarks = Shared::default();
        let context = Rebalancing {
            topic: self.topic.clone(),
            watermarks: watermarks.clone(),
        };
        let group: Arc<str> = self.consumer.get("group.id").unwrap_or_default().into();
        let mut consumer = self.consumer;
        consumer
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer<Rebalancing> = consumer
            .create_with_context(context)
            .map_err(refused("consumer"))?;
        let producer: FutureProducer = self.producer.create().map_err(refused("producer"))?;
        let consumer = Arc::new(consumer);

        // The metadata request waits for the brokers: not on a runtime thread.
        let asking = consumer.clone();
        let topics = [self.topic.clone(), self.dead_letters.clone()];
        let known = tokio::task::spawn_blocking(move || {
            topics
                .iter()
                .map(|topic| {
                    let metadata = asking.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
                    Ok(metadata
                        .topics()
                        .iter()
                        .any(|t| t.name() == topic && t.error().is_none()))
                })
                .collect::<KafkaResult<Vec<bool>>>()
        })
        .await
        .unwrap_or(Err(KafkaError::Canceled))
        .map_err(|source| Error::Connect {
            brokers: self.brokers.clone(),
            source,
        })?;
        if !known[0] {
            return Err(Error::TopicMissing { topic: self.topic });
        }
        if !known[1] {
            return Err(Error::DeadLetterTopicMissing {
                topic: self.dead_letters,
            });
        }
        consumer
            .subscribe(&[&self.topic])
            .map_err(refused("subscription"))?;
        let link = Link {
            watermarks,
            producer,
            topic: self.topic.as_str().into(),
            group,
            dead_letters: self.dead_letters.as_str().into(),
            max_retry_delay: self.max_retry_delay,
            // Under the loop's 5 s settle time-out, so a slow broker fails the publish (which is
            // then retried in place) before the loop gives up on the settlement.
            publish_timeout: Duration::from_secs(4),
            lifecycle: Lifecycle::new(),
        };
        Ok(Source {
            consumer,
            link: Arc::new(link),
            commit_interval: self.commit_interval,
            max_held: self.max_held,
        })
    }
}

/// A consumer of one topic in a consumer group: hand [`deliveries`](Source::deliveries) to
/// `idem::consume::Consumer::run`, then [`close`](Source::close) it.
pub struct Source {
    pub(crate) consumer: Arc<StreamConsumer<Rebalancing>>,
    pub(crate) link: Arc<Link>,
    commit_interval: Duration,
    max_held: usize,
}

impl Source {
    /// A consumer of `topic` in the group `group` on the brokers `brokers`
    /// (`host:port,...`), starting from the earliest offset where the group has none. Nothing
    /// connects until [`SourceBuilder::connect`].
    pub fn builder(brokers: &str, topic: &str, group: &str) -> SourceBuilder {
        let mut consumer = ClientConfig::new();
        consumer
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("auto.offset.reset", "earliest");
        let mut producer = ClientConfig::new();
        producer
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "0")
            .set("acks", "all");
        SourceBuilder {
            brokers: brokers.to_string(),
            consumer,
            producer,
            topic: topic.to_string(),
            dead_letters: format!("{topic}.dead"),
            commit_interval: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(30),
            max_held: 10_000,
        }
    }

    /// The deliveries, for `Consumer::run`. Commits the moved watermarks every
    /// `commit_interval` while it is polled. An error item (a broker error) is followed by a
    /// short pause; the stream goes on until [`close`](Source::close). May be called more than
    /// once: the streams read from the same consumer, each record going to one of them.
    pub fn deliveries(&self) -> Deliveries {
        let (again, retried) = mpsc::unbounded_channel();
        let mut ticker = tokio::time::interval(self.commit_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reading = Reading {
            consumer: self.consumer.clone(),
            link: self.link.clone(),
            again,
            retried,
            ticker,
            max_held: self.max_held,
            paused: HashSet::new(),
            failed: false,
            _alive: self.link.lifecycle.track(),
        };
        let inner = stream::unfold(reading, |mut reading| async move {
            let next = reading.next().await;
            Some((next, reading))
        });
        Deliveries {
            inner: inner.take_until(self.link.lifecycle.stopped()).boxed(),
            topic: self.link.topic.clone(),
        }
    }

    /// Commits the watermarks now and waits for the broker's answer.
    pub async fn commit(&self) -> Result<(), Error> {
        let positions = self.link.watermarks.lock().positions();
        commit(
            &self.consumer,
            &self.link.topic,
            &positions,
            CommitMode::Sync,
        )
        .await
        .map_err(|source| Error::Commit {
            topic: self.link.topic.to_string(),
            source,
        })
    }

    /// Leaves the group: stops taking (every stream of this source ends, retries waiting in
    /// place are cut short), waits up to [`CLOSE_TIMEOUT`] (30 s) for the streams and the
    /// deliveries still out to be settled or dropped, commits the watermarks (every settled
    /// offset), then leaves the group (its partitions go to the other members at once).
    ///
    /// Leaving starts a revoke, which is served here, before librdkafka closes the consumer.
    /// Served inside the close, its callback can wait forever on the group's queue once the
    /// group has terminated (librdkafka#4041); a rebalance test hung so in CI. The close
    /// itself is bounded (30 s): past it, the consumer is left to a thread of its own, and
    /// this returns.
    pub async fn close(self) -> Result<(), Error> {
        self.link.lifecycle.stop();
        if !self.link.lifecycle.drained(CLOSE_TIMEOUT).await {
            tracing::warn!(
                topic = %self.link.topic,
                out = self.link.lifecycle.in_flight(),
                "deliveries still out {CLOSE_TIMEOUT:?} after close began; committing what settled and leaving anyway"
            );
        }
        let committed = self.commit().await;
        let consumer = self.consumer;
        // Leaving the group waits for the broker: not on a runtime thread.
        let leaving = consumer.clone();
        let _ = tokio::task::spawn_blocking(move || leaving.unsubscribe()).await;
        serve_revoke(&consumer, &self.link.watermarks).await;
        if !drop_within(consumer, LEAVE_TIMEOUT).await {
            tracing::warn!(
                "librdkafka did not close the consumer within {LEAVE_TIMEOUT:?}; it is left to its thread"
            );
        }
        committed
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("topic", &self.link.topic)
            .field("dead_letters", &self.link.dead_letters)
            .finish_non_exhaustive()
    }
}

impl idem_runtime::consume::Source for Source {
    type Delivery = Delivery;
    type Error = Error;
    type Deliveries = Deliveries;

    fn deliveries(&self) -> Deliveries {
        Source::deliveries(self)
    }

    async fn lag(&self) -> Result<Vec<idem_runtime::consume::Lag>, Error> {
        Source::lag(self).await
    }

    async fn close(self) -> Result<(), Error> {
        Source::close(self).await
    }

    fn probe(&self) -> idem_runtime::consume::Probe {
        Source::probe(self)
    }
}

/// The deliveries of a [`Source`]: a `Stream<Item = Result<Delivery, Error>>` for
/// `Consumer::run`, until [`Source::close`].
pub struct Deliveries {
    inner: BoxStream<'static, Result<Delivery, Error>>,
    topic: Arc<str>,
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Result<Delivery, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// How long [`Source::close`] serves the revoke that leaving the group starts.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Source::close`] waits for librdkafka to close the consumer.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `consumer` until it holds no partition (its revoke was served: the revoke hook
/// committed and librdkafka unassigned) or [`REVOKE_TIMEOUT`] passed. A record it still
/// returns is dropped unsettled: its offset is not committed, and the next owner delivers it.
/// The partitions held are read from the watermarks, which the rebalance hooks keep, not from
/// librdkafka: its `assignment()` waits on the group's queue too.
async fn serve_revoke(consumer: &StreamConsumer<Rebalancing>, watermarks: &Shared) {
    let holds_partitions = || !watermarks.lock().is_empty();
    let deadline = tokio::time::Instant::now() + REVOKE_TIMEOUT;
    while holds_partitions() && tokio::time::Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
    if holds_partitions() {
        tracing::warn!(
            "the consumer still held partitions {REVOKE_TIMEOUT:?} after leaving its group; closing it anyway"
        );
    }
}

/// Drops `value` (for the consumer's last handle: librdkafka's close) on a thread of its own,
/// and waits at most `timeout` for it; `false` if it was not dropped by then. Not on tokio's
/// blocking pool: a runtime waits for its blocking tasks when it shuts down, and a close that
/// never ends would hold it forever.
async fn drop_within<T: Send + 'static>(value: T, timeout: Duration) -> bool {
    let (dropped, done) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("idem-kafka-close".into())
        .spawn(move || {
            drop(value);
            let _ = dropped.send(());
        });
    if let Err(err) = spawned {
        // The value went with the closure, dropped on this thread.
        tracing::warn!(error = %err, "no thread to close the Kafka consumer on");
        return true;
    }
    tokio::time::timeout(timeout, done).await.is_ok()
}

/// Commits `positions` of `topic` (a broker round trip for `Sync`, off the runtime's threads).
async fn commit(
    consumer: &Arc<StreamConsumer<Rebalancing>>,
    topic: &str,
    positions: &[(i32, i64)],
    mode: CommitMode,
) -> KafkaResult<()> {
    if positions.is_empty() {
        return Ok(());
    }
    let mut list = TopicPartitionList::new();
    for (partition, position) in positions {
        list.add_partition_offset(topic, *partition, Offset::Offset(*position))?;
    }
    match mode {
        CommitMode::Async => consumer.commit(&list, mode),
        CommitMode::Sync => {
            let consumer = consumer.clone();
            tokio::task::spawn_blocking(move || consumer.commit(&list, mode))
                .await
                .unwrap_or_else(|_| Err(KafkaError::Canceled))
        }
    }
}

/// The state of a stream of deliveries.
struct Reading {
    consumer: Arc<StreamConsumer<Rebalancing>>,
    link: Arc<Link>,
    again: mpsc::UnboundedSender<Delivery>,
    retried: mpsc::UnboundedReceiver<Delivery>,
    ticker: tokio::time::Interval,
    max_held: usize,
    paused: HashSet<i32>,
    failed: bool,
    /// The stream is out until dropped: the source's `close` waits for it (the consumer is
    /// closed once its last handle is gone).
    _alive: InFlight,
}

impl Reading {
    async fn next(&mut self) -> Result<Delivery, Error> {
        if std::mem::take(&mut self.failed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            // Its own handle, so a received message does not borrow `self`.
            let consumer = self.consumer.clone();
            tokio::select! {
                biased;
                _ = self.ticker.tick() => self.tick(),
                Some(mut delivery) = self.retried.recv() => {
                    let current = self
                        .link
                        .watermarks
                        .lock()
                        .is_current(delivery.partition, delivery.epoch);
                    if current {
                        return Ok(delivery);
                    }
                    delivery.finished = true;
                }
                received = consumer.recv() => match received {
                    Ok(message) => {
                        if let Some(delivery) = self.take(&message) {
                            return Ok(delivery);
                        }
                    }
                    Err(source) => {
                        self.failed = true;
                        return Err(Error::Consume {
                            topic: self.link.topic.to_string(),
                            source,
                        });
                    }
                },
            }
        }
    }

    /// A record becomes a delivery holding its partition's watermark; a partition holding too
    /// many is paused.
    fn take(&mut self, message: &rdkafka::message::BorrowedMessage<'_>) -> Option<Delivery> {
        let partition = message.partition();
        let offset = message.offset();
        let (epoch, held) = {
            let mut watermarks = self.link.watermarks.lock();
            let epoch = watermarks.take(partition, offset);
            (epoch, watermarks.held(partition))
        };
        let Some(epoch) = epoch else {
            tracing::debug!(
                partition,
                offset,
                "a record of a partition no longer ours; skipped"
            );
            return None;
        };
        if held >= self.max_held && self.paused.insert(partition) {
            tracing::warn!(topic = %self.link.topic, partition, held, "a record holds this partition's watermark; pausing it");
            self.pause(partition, true);
        }
        Some(Delivery {
            out: Some(self.link.lifecycle.track()),
            link: self.link.clone(),
            partition,
            offset,
            epoch,
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            headers: message
                .headers()
                .map(rdkafka::message::BorrowedHeaders::detach),
            retries: 0,
            again: self.again.clone(),
            finished: false,
        })
    }

    /// On the timer: commit what moved, resume paused partitions whose watermark caught up.
    fn tick(&mut self) {
        let moved = self.link.watermarks.lock().moved();
        if !moved.is_empty() {
            let mut list = TopicPartitionList::new();
            for (partition, position) in &moved {
                let _ = list.add_partition_offset(
                    &self.link.topic,
                    *partition,
                    Offset::Offset(*position),
                );
            }
            if let Err(err) = self.consumer.commit(&list, CommitMode::Async) {
                tracing::warn!(topic = %self.link.topic, error = %err, "committing offsets failed; the next commit retries");
            }
        }
        let resumable: Vec<i32> = {
            let watermarks = self.link.watermarks.lock();
            self.paused
                .iter()
                .copied()
                .filter(|p| watermarks.held(*p) < self.max_held / 2 + 1)
                .collect()
        };
        for partition in resumable {
            self.paused.remove(&partition);
            self.pause(partition, false);
        }
    }

    fn pause(&self, partition: i32, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.link.topic, partition);
        let done = if pause {
            self.consumer.pause(&list)
        } else {
            self.consumer.resume(&list)
        };
        if let Err(err) = done {
            tracing::warn!(topic = %self.link.topic, partition, pause, error = %err, "pausing or resuming failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::drop_within;

    /// Blocks in its `Drop` until released, as librdkafka's close did (librdkafka#4041).
    struct HangingClose(mpsc::Receiver<()>);

    impl Drop for HangingClose {
        fn drop(&mut self) {
            let _ = self.0.recv();
        }
    }

    #[tokio::test]
    async fn a_close_that_never_ends_is_left_to_its_thread() {
        let (release, hold) = mpsc::channel();
        let waited = drop_within(HangingClose(hold), Duration::from_millis(50));
        let dropped = tokio::time::timeout(Duration::from_secs(10), waited)
            .await
            .expect("drop_within gives up at its timeout");
        assert!(!dropped, "the close still runs, and the caller goes on");
        release.send(()).unwrap();
    }

    #[tokio::test]
    async fn a_close_that_ends_is_waited_for() {
        let (release, hold) = mpsc::channel();
        release.send(()).unwrap();
        assert!(drop_within(HangingClose(hold), Duration::from_secs(30)).await);
    }
}

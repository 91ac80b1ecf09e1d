//! [`Source::lag`]: per partition, the end offset minus the group's committed offset, as the
//! brokers tell them.

use std::time::Duration;

use idem_runtime::consume::Lag;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::Error;
use crate::rebalance::Rebalancing;
use crate::source::Source;
use crate::BROKER;

/// How long each of the brokers' answers may take.
const LAG_TIMEOUT: Duration = Duration::from_secs(10);

/// One partition's offsets: its number, the group's committed offset (if any), and its low
/// and high (end) watermarks.
type Offsets = (i32, Option<i64>, i64, i64);

impl Source {
    /// How far behind the group is on each partition of the topic: the partition's end offset
    /// (high watermark) minus the group's committed offset (`undelivered`; what was delivered
    /// and not committed yet counts as behind, and a partition the group never committed
    /// counts from its low watermark, as the source starts at the earliest offset). Kafka does
    /// not tell what was delivered and not settled (`unacked` is `None`). `group` is the
    /// consumer group, `partition` the partition. Three requests to the brokers (the topic's
    /// partitions, the group's committed offsets, each partition's watermarks), made on a
    /// blocking thread. For `idem::gauges::Gauges::lag_of`.
    pub async fn lag(&self) -> Result<Vec<Lag>, Error> {
        let consumer = self.consumer.clone();
        let topic = self.link.topic.clone();
        let asking = topic.clone();
        let offsets = tokio::task::spawn_blocking(move || offsets(&consumer, &asking))
            .await
            .unwrap_or(Err(KafkaError::Canceled))
            .map_err(|source| Error::Lag {
                topic: topic.to_string(),
                source,
            })?;
        Ok(offsets
            .into_iter()
            .map(|(partition, committed, low, high)| Lag {
                broker: BROKER,
                source: topic.to_string(),
                group: self.link.group.to_string(),
                partition: Some(partition),
                undelivered: Some(
                    u64::try_from(high - committed.unwrap_or(low).max(low)).unwrap_or(0),
                ),
                unacked: None,
            })
            .collect())
    }
}

/// The offsets of every partition of `topic`, in partition order.
fn offsets(consumer: &StreamConsumer<Rebalancing>, topic: &str) -> KafkaResult<Vec<Offsets>> {
    let metadata = consumer.fetch_metadata(Some(topic), LAG_TIMEOUT)?;
    let mut partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    partitions.sort_unstable();
    let mut asked = TopicPartitionList::new();
    for &partition in &partitions {
        asked.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(asked, LAG_TIMEOUT)?;
    partitions
        .into_iter()
        .map(|partition| {
            let (low, high) = consumer.fetch_watermarks(topic, partition, LAG_TIMEOUT)?;
            let committed =
                committed
                    .find_partition(topic, partition)
                    .and_then(|e| match e.offset() {
                        Offset::Offset(offset) => Some(offset),
                        _ => None,
                    });
            Ok((partition, committed, low, high))
        })
        .collect()
}

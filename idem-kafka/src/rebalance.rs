//! [`Rebalancing`]: the consumer's context. rdkafka calls its rebalance hooks synchronously,
//! inside the poll: they only touch the watermarks and commit what has settled; they never
//! wait for in-flight work.

use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::watermark::Watermarks;

/// The watermarks, shared by the context, the deliveries and the committer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shared(Arc<Mutex<Watermarks>>);

impl Shared {
    /// The watermarks. A panic while holding the lock leaves nothing half-written (each
    /// method of [`Watermarks`] completes or does nothing), so a poisoned lock is recovered.
    pub fn lock(&self) -> MutexGuard<'_, Watermarks> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Keeps the watermarks in step with the group's assignment.
pub(crate) struct Rebalancing {
    pub topic: String,
    pub watermarks: Shared,
}

impl ClientContext for Rebalancing {}

impl ConsumerContext for Rebalancing {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let mut watermarks = self.watermarks.lock();
                for elem in assigned.elements_for_topic(&self.topic) {
                    watermarks.assign(elem.partition());
                }
                tracing::info!(topic = %self.topic, partitions = assigned.count(), "partitions assigned");
            }
            Rebalance::Revoke(revoked) => {
                // Commit what settled; in-flight results of these partitions are dropped when
                // they come back (their epoch is gone), and the new owner delivers them again.
                let mut commit = TopicPartitionList::new();
                {
                    let mut watermarks = self.watermarks.lock();
                    for elem in revoked.elements_for_topic(&self.topic) {
                        if let Some(position) = watermarks.revoke(elem.partition()) {
                            let _ = commit.add_partition_offset(
                                &self.topic,
                                elem.partition(),
                                Offset::Offset(position),
                            );
                        }
                    }
                }
                if commit.count() > 0 {
                    // A librdkafka call (one broker round trip), not async work: the new owner
                    // must find these offsets committed.
                    if let Err(err) = consumer.commit(&commit, CommitMode::Sync) {
                        tracing::warn!(topic = %self.topic, error = %err, "committing on revoke failed; the new owner redelivers (duplicates)");
                    }
                }
                tracing::info!(topic = %self.topic, partitions = revoked.count(), "partitions revoked");
            }
            Rebalance::Error(err) => {
                tracing::warn!(topic = %self.topic, error = %err, "rebalance error");
            }
        }
    }
}

//! [`Delivery`]: one record, settled by moving its partition's watermark (after a dead
//! letter's publish was confirmed, where it is one), or retried in place.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::consume::adapter::{InFlight, Lifecycle};
use idem_runtime::consume::Delivery as _;
use idem_runtime::consume::{self, DeadLetterReason, Settle, SettleError};
use idem_runtime::recover::Origin;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::sync::mpsc;

use crate::headers;
use crate::rebalance::Shared;
use crate::watermark::Epoch;

/// What every delivery of a source shares: the watermarks and the dead-letter producer.
pub(crate) struct Link {
    pub watermarks: Shared,
    pub producer: FutureProducer,
    pub topic: Arc<str>,
    /// The consumer group (`group.id`).
    pub group: Arc<str>,
    pub dead_letters: Arc<str>,
    pub max_retry_delay: Duration,
    pub publish_timeout: Duration,
    pub lifecycle: Lifecycle,
}

/// One record of the topic, taken by this consumer and not yet settled. Settling it moves its
/// partition's watermark; the offsets are committed by the source.
pub struct Delivery {
    /// Out until settled or dropped: the source's `close` waits for it. Moves with the
    /// delivery when it goes back into its stream.
    pub(crate) out: Option<InFlight>,
    pub(crate) link: Arc<Link>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) epoch: Epoch,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Option<OwnedHeaders>,
    /// Times this process ran it and retried it in place.
    pub(crate) retries: u32,
    /// Where a retried delivery goes back into its stream.
    pub(crate) again: mpsc::UnboundedSender<Delivery>,
    /// Settled, or handed to a retry: dropping it then is the end of it.
    pub(crate) finished: bool,
}

impl Delivery {
    /// The record's partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The record's offset in its partition.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The record's key, if it has one.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The value of the record's first header named `name`, such as the message id the outbox
    /// publisher sets ([`headers::MESSAGE_ID`]).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        use rdkafka::message::Headers as _;
        self.headers.as_ref()?.iter().find(|h| h.key == name)?.value
    }

    /// Marks the offset settled; a delivery of a revoked partition is dropped.
    fn settled(&mut self) {
        self.finished = true;
        let moved = self
            .link
            .watermarks
            .lock()
            .settle(self.partition, self.offset, self.epoch);
        if !moved {
            tracing::debug!(delivery = %self.describe(), "settled after its partition was revoked; dropped");
        }
    }

    /// Comes back into the stream after `delay`, doubled per earlier retry, at most
    /// `max_retry_delay`; the partition's watermark stays held meanwhile.
    fn retry_in_place(mut self, delay: Duration) {
        let doubled = delay
            .saturating_mul(1 << self.retries.min(16))
            .min(self.link.max_retry_delay);
        self.retries = self.retries.saturating_add(1);
        let closing = self.link.lifecycle.stopped();
        tokio::spawn(async move {
            // Cut short when the source closes: it goes back unsettled, and its offset is
            // delivered again from the committed one.
            tokio::select! {
                () = tokio::time::sleep(doubled) => {}
                () = closing => {}
            }
            let again = self.again.clone();
            // The stream is gone (shutdown): the offset stays unsettled and is delivered again
            // from the committed offset.
            let _ = again.send(self);
        });
    }

    /// Produces the record to the dead-letter topic, with why, and waits for the broker's ack.
    async fn dead_letter(&self, reason: &DeadLetterReason) -> Result<(), SettleError> {
        let detail = reason.to_string();
        let attempts = match reason {
            DeadLetterReason::Poisoned { attempts } => Some(attempts.to_string()),
            _ => None,
        };
        let partition = self.partition.to_string();
        let offset = self.offset.to_string();
        let mut fields = self
            .headers
            .clone()
            .unwrap_or_default()
            .insert(Header {
                key: headers::REASON,
                value: Some(reason.as_str()),
            })
            .insert(Header {
                key: headers::DETAIL,
                value: Some(&detail),
            });
        if let Some(attempts) = &attempts {
            fields = fields.insert(Header {
                key: headers::ATTEMPTS,
                value: Some(attempts),
            });
        }
        let fields = fields
            .insert(Header {
                key: headers::SOURCE,
                value: Some(&*self.link.topic),
            })
            .insert(Header {
                key: headers::SOURCE_PARTITION,
                value: Some(&partition),
            })
            .insert(Header {
                key: headers::SOURCE_OFFSET,
                value: Some(&offset),
            });
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.link.dead_letters)
            .payload(&self.payload)
            .headers(fields);
        if let Some(key) = &self.key {
            record = record.key(key);
        }
        self.link
            .producer
            .send(record, Timeout::After(self.link.publish_timeout))
            .await
            .map_err(|(err, _)| Box::new(err) as SettleError)?;
        Ok(())
    }
}

impl consume::Delivery for Delivery {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn revoked(&self) -> bool {
        !self
            .link
            .watermarks
            .lock()
            .is_current(self.partition, self.epoch)
    }

    /// The record's headers, in order (a repeated name as often as it is there). A value that
    /// is not UTF-8 is kept with its invalid bytes replaced (U+FFFD); a null value is empty
    /// text. The record's key is not a header and is not among them.
    fn headers(&self) -> Vec<(String, String)> {
        use rdkafka::message::Headers as _;
        let Some(headers) = &self.headers else {
            return Vec::new();
        };
        headers
            .iter()
            .map(|header| {
                let value = header.value.unwrap_or_default();
                (
                    header.key.to_string(),
                    String::from_utf8_lossy(value).into_owned(),
                )
            })
            .collect()
    }

    /// Broker [`BROKER`](crate::BROKER); source and destination the topic; coordinates
    /// `partition P offset O`.
    fn origin(&self) -> Origin {
        Origin {
            broker: crate::BROKER.to_string(),
            source: self.link.topic.to_string(),
            coordinates: format!("partition {} offset {}", self.partition, self.offset),
            destination: self.link.topic.to_string(),
        }
    }

    /// The consumer group.
    fn consumer_group(&self) -> Option<String> {
        Some(self.link.group.to_string())
    }

    fn describe(&self) -> String {
        format!("{}/{}@{}", self.link.topic, self.partition, self.offset)
    }

    async fn settle(mut self, settle: Settle) -> Result<(), SettleError> {
        if self.revoked() {
            // Its new owner delivers it again; nothing here may move that partition.
            self.finished = true;
            return Ok(());
        }
        match settle {
            Settle::Ack => self.settled(),
            Settle::DeadLetter { reason } => match self.dead_letter(&reason).await {
                Ok(()) => self.settled(),
                Err(err) => {
                    // Not settled: the offset stays held and the delivery comes back here, to
                    // be dead-lettered again.
                    let delay = self.link.max_retry_delay.min(Duration::from_secs(1));
                    self.retry_in_place(delay);
                    return Err(err);
                }
            },
            Settle::Requeue { delay } => self.retry_in_place(delay),
            _ => {
                self.retry_in_place(Duration::from_secs(1));
                return Err("a settlement this adapter does not know; retried in place".into());
            }
        }
        Ok(())
    }
}

impl Drop for Delivery {
    /// A delivery dropped unsettled (a settlement cancelled by the loop's time-out) would hold
    /// its partition's watermark for good: it goes back into its stream instead, unless its
    /// partition was revoked or the stream is gone (its offset is then delivered again from
    /// the committed one).
    fn drop(&mut self) {
        if self.finished || self.again.is_closed() || self.revoked() {
            return;
        }
        let again = Delivery {
            out: self.out.take(),
            link: self.link.clone(),
            partition: self.partition,
            offset: self.offset,
            epoch: self.epoch,
            key: self.key.take(),
            payload: std::mem::take(&mut self.payload),
            headers: self.headers.take(),
            retries: self.retries,
            again: self.again.clone(),
            finished: false,
        };
        // If the stream is gone by now, `again` comes back in the error and is dropped: its
        // own drop sees the closed channel and stops there.
        let _ = self.again.send(again);
    }
}

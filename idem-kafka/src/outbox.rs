//! The outbox's Kafka side: [`OutboxPublisher`], an `idem::outbox::Publisher` on an
//! idempotent rdkafka producer, with the partition key as record key and the id in a header.

use std::time::Duration;

use idem_runtime::outbox::{Message, PublishError, Publisher};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer as _};

use crate::error::Error;
use crate::headers;

/// How long [`OutboxPublisherBuilder::connect`] waits for the brokers' metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings of an [`OutboxPublisher`], from [`OutboxPublisher::builder`]; nothing connects
/// until [`connect`](OutboxPublisherBuilder::connect).
#[derive(Debug, Clone)]
pub struct OutboxPublisherBuilder {
    brokers: String,
    producer: ClientConfig,
}

impl OutboxPublisherBuilder {
    /// Sets a librdkafka property of the producer (`security.protocol`, `linger.ms`,
    /// `compression.type`, ...). `enable.idempotence` must stay `true` and `acks` `all`:
    /// [`connect`](OutboxPublisherBuilder::connect) refuses anything else.
    ///
    /// A broker that mishandles produced batches of several records (the test broker tansu
    /// 0.6.0 does) needs one record per batch: `batch.num.messages` = `1`.
    pub fn producer_config(mut self, key: &str, value: &str) -> Self {
        self.producer.set(key, value);
        self
    }

    /// The producer, once the settings are checked (no I/O).
    fn producer(&self) -> Result<FutureProducer, Error> {
        let idempotent = self.producer.get("enable.idempotence");
        if idempotent != Some("true") {
            return Err(Error::Config {
                what: format!(
                    "the outbox publisher needs enable.idempotence=true (it has {idempotent:?}): \
                     without it a retried produce can duplicate or reorder a key's records"
                ),
                source: None,
            });
        }
        let acks = self.producer.get("acks");
        if !matches!(acks, Some("all" | "-1")) {
            return Err(Error::Config {
                what: format!(
                    "the outbox publisher needs acks=all (it has {acks:?}): a record is \
                     confirmed only once every in-sync replica has it"
                ),
                source: None,
            });
        }
        self.producer.create().map_err(|source| Error::Config {
            what: "librdkafka refused the outbox producer's settings".into(),
            source: Some(source),
        })
    }

    /// Creates the producer and asks the brokers for the cluster's metadata. Fails with
    /// [`Error::Config`] when the settings turned the idempotent producer or `acks=all` off, or
    /// librdkafka refuses them, and with [`Error::Connect`] when the brokers do not answer
    /// within 10 s.
    pub async fn connect(self) -> Result<OutboxPublisher, Error> {
        let producer = self.producer()?;
        // The metadata request waits for the brokers: not on a runtime thread.
        let asking = producer.clone();
        tokio::task::spawn_blocking(move || {
            asking
                .client()
                .fetch_metadata(None, METADATA_TIMEOUT)
                .map(drop)
        })
        .await
        .unwrap_or(Err(KafkaError::Canceled))
        .map_err(|source| Error::Connect {
            brokers: self.brokers,
            source,
        })?;
        Ok(OutboxPublisher { producer })
    }
}

/// Publishes outbox messages to Kafka for an `idem::outbox::Relay`,
/// through an idempotent producer (`enable.idempotence=true`, `acks=all`): each to the topic
/// named by its destination, with its partition key as record key (so a key's messages share a
/// partition) and as the [`headers::PARTITION_KEY`] header, its id in the
/// [`headers::MESSAGE_ID`] header, and its own headers. A batch is
/// enqueued in order, then every delivery report awaited; it succeeds once Kafka acknowledged
/// every record, and fails on the first that was not (the relay then publishes the batch again
/// later, with the same ids). The idempotent producer keeps the enqueue order within a
/// partition, also across its own retries, so a key's messages arrive in the outbox's order.
///
/// Messages without a partition key are produced without a record key: librdkafka's partitioner
/// spreads them, so Kafka keeps no order among them. Give messages whose order matters a key.
///
/// Deliveries time out after `message.timeout.ms` (20 s here, under the relay's 30 s publish
/// time-out, so a stuck batch fails rather than being abandoned while still queued).
///
/// Consumers downstream dedupe on the id header (read it with
/// [`Delivery::header`](crate::Delivery::header)).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::kafka::OutboxPublisher;
/// use idem::outbox::Relay;
///
/// let publisher = OutboxPublisher::builder("127.0.0.1:9092")
///     .producer_config("compression.type", "lz4") // any librdkafka property
///     .connect()
///     .await?;
/// let stats = Relay::new(pool, publisher)
///     .run(std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
///     .await;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
pub struct OutboxPublisher {
    producer: FutureProducer,
}

impl OutboxPublisher {
    /// The settings of a publisher to the brokers `brokers` (`host:port,...`): an idempotent
    /// producer with `acks=all`, `linger.ms=5` and `message.timeout.ms=20000`.
    pub fn builder(brokers: &str) -> OutboxPublisherBuilder {
        let mut producer = ClientConfig::new();
        producer
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "20000");
        OutboxPublisherBuilder {
            brokers: brokers.to_string(),
            producer,
        }
    }

    /// Enqueues one record; waits while librdkafka's queue is full (the relay's publish
    /// time-out bounds the wait).
    async fn enqueue(&self, message: &Message) -> Result<DeliveryFuture, PublishError> {
        let mut record = FutureRecord::<[u8], [u8]>::to(&message.destination)
            .payload(&message.payload)
            .headers(fields(message));
        if !message.partition_key.is_empty() {
            record = record.key(message.partition_key.as_bytes());
        }
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((err, _)) => {
                    return Err(format!(
                        "producing message {} to {:?}: {err}",
                        message.id, message.destination
                    )
                    .into())
                }
            }
        }
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        let mut deliveries = Vec::with_capacity(batch.len());
        for message in batch {
            deliveries.push(self.enqueue(message).await?);
        }
        for (delivery, message) in deliveries.into_iter().zip(batch) {
            let failed = match delivery.await {
                Ok(Ok(_)) => continue,
                Ok(Err((err, _))) => err.to_string(),
                Err(_) => "the producer dropped its delivery report".to_string(),
            };
            return Err(format!(
                "Kafka did not acknowledge message {} to {:?}: {failed}",
                message.id, message.destination
            )
            .into());
        }
        Ok(())
    }

    /// [`BROKER`](crate::BROKER).
    fn broker(&self) -> &str {
        crate::BROKER
    }
}

/// The record headers of an outbox message: its own, then its partition key (if it has one),
/// then the id.
fn fields(message: &Message) -> OwnedHeaders {
    let mut fields = OwnedHeaders::new_with_capacity(message.headers.len() + 2);
    for (key, value) in &message.headers {
        fields = fields.insert(Header {
            key,
            value: Some(value),
        });
    }
    if !message.partition_key.is_empty() {
        fields = fields.insert(Header {
            key: headers::PARTITION_KEY,
            value: Some(&message.partition_key),
        });
    }
    fields.insert(Header {
        key: headers::MESSAGE_ID,
        value: Some(&message.id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idempotent_producer_and_acks_all_cannot_be_turned_off() {
        let off = OutboxPublisher::builder("127.0.0.1:1")
            .producer_config("enable.idempotence", "false")
            .producer();
        let Err(err) = off else { panic!("built") };
        assert!(err.to_string().contains("enable.idempotence"), "{err}");
        let one = OutboxPublisher::builder("127.0.0.1:1")
            .producer_config("acks", "1")
            .producer();
        let Err(err) = one else { panic!("built") };
        assert!(err.to_string().contains("acks=all"), "{err}");
        assert!(OutboxPublisher::builder("127.0.0.1:1")
            .producer_config("acks", "-1")
            .producer()
            .is_ok());
    }

    #[test]
    fn headers_carry_the_message_headers_the_partition_key_then_the_id() {
        use rdkafka::message::Headers as _;
        let message = Message {
            id: "idem-0123".into(),
            destination: "payments".into(),
            partition_key: "ada".into(),
            payload: b"{}".to_vec(),
            headers: vec![("kind".into(), "payment".into())],
            attempts: 0,
        };
        let fields = fields(&message);
        let pairs: Vec<(&str, Option<&[u8]>)> = fields.iter().map(|h| (h.key, h.value)).collect();
        assert_eq!(
            pairs,
            [
                ("kind", Some(&b"payment"[..])),
                (headers::PARTITION_KEY, Some(&b"ada"[..])),
                (headers::MESSAGE_ID, Some(&b"idem-0123"[..]))
            ]
        );
        let unkeyed = Message {
            partition_key: String::new(),
            ..message
        };
        assert!(super::fields(&unkeyed)
            .iter()
            .all(|h| h.key != headers::PARTITION_KEY));
    }
}

//! [`Lag`]: how far a consumer is behind its broker input, as the broker tells it
//! ([`Source::lag`](super::Source::lag)).

/// How far a consumer is behind its input, as its broker tells it, for one partition (Kafka)
/// or for the whole input (the other brokers). Every adapter's `Source::lag` returns these;
/// `idem::gauges::Gauges` (feature `metrics`) publishes them as `idem_consumer_lag` and
/// `idem_consumer_unacked`.
///
/// | broker | `undelivered` | `unacked` |
/// |---|---|---|
/// | RabbitMQ | the queue's ready messages (passive `queue.declare`'s `message_count`) | not told (`None`) |
/// | NATS JetStream | the durable consumer's `num_pending` | its `num_ack_pending` |
/// | Kafka | per partition, the end offset minus the group's committed offset (what was delivered and not committed yet counts as behind) | not told (`None`) |
/// | Redis Streams | the group's `lag` (`XINFO GROUPS`; `None` when Redis cannot tell, after entries were deleted) | the group's `pending` |
///
/// ```
/// let lag = idem_runtime::consume::Lag {
///     broker: "memory",
///     source: "orders".into(),
///     group: String::new(),
///     partition: None,
///     undelivered: Some(3),
///     unacked: Some(1),
/// };
/// assert_eq!(lag.partition_label(), "");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lag {
    /// The broker: `rabbitmq`, `nats`, `kafka`, `redis`, `memory` (each adapter's `BROKER`).
    pub broker: &'static str,
    /// The queue, stream or topic consumed.
    pub source: String,
    /// The consumer group (Kafka, Redis) or durable consumer (NATS) whose position this is;
    /// empty where the queue is the position (RabbitMQ, memory).
    pub group: String,
    /// The partition (Kafka); `None` for the whole input.
    pub partition: Option<i32>,
    /// Messages in the input that the consumer has not been given yet; `None` when the broker
    /// cannot tell now.
    pub undelivered: Option<u64>,
    /// Messages given to the consumer and not settled yet; `None` where the broker does not
    /// tell.
    pub unacked: Option<u64>,
}

impl Lag {
    /// The partition as a label: its number, or empty for the whole input.
    pub fn partition_label(&self) -> String {
        self.partition.map(|p| p.to_string()).unwrap_or_default()
    }
}

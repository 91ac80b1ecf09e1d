//! [`Source::lag`]: the queue's ready messages, as RabbitMQ tells them.

use idem_runtime::consume::Lag;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::error::Error;
use crate::source::Source;
use crate::BROKER;

impl Source {
    /// How far behind the queue is: its ready messages (`undelivered`), from a passive
    /// `queue.declare` on a channel of its own (a failed declare closes only that channel).
    /// RabbitMQ does not tell the unacknowledged messages over AMQP (`unacked` is `None`);
    /// `group` is empty, the queue being the position. For `idem::gauges::Gauges::lag_of`.
    pub async fn lag(&self) -> Result<Vec<Lag>, Error> {
        let shared = &self.shared;
        let channel = shared
            .connection
            .create_channel()
            .await
            .map_err(|source| Error::Setup {
                what: "a channel to read the queue's lag".into(),
                source,
            })?;
        let declared = channel
            .queue_declare(
                shared.queue.as_str().into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await;
        let _ = channel.close(200, "OK".into()).await;
        let queue = declared.map_err(|source| Error::QueueMissing {
            queue: shared.queue.clone(),
            source,
        })?;
        Ok(vec![Lag {
            broker: BROKER,
            source: shared.queue.clone(),
            group: String::new(),
            partition: None,
            undelivered: Some(u64::from(queue.message_count())),
            unacked: None,
        }])
    }
}

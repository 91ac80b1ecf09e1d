//! [`Source::lag`]: the durable consumer's pending counts, as JetStream tells them.

use idem_runtime::consume::Lag;

use crate::error::Error;
use crate::source::Source;
use crate::BROKER;

impl Source {
    /// How far behind the durable consumer is, from its info on the server: `num_pending`
    /// (messages of the stream it has not been given yet: `undelivered`) and
    /// `num_ack_pending` (given and not acked: `unacked`). `group` is the consumer's name.
    /// For `idem::gauges::Gauges::lag_of`.
    pub async fn lag(&self) -> Result<Vec<Lag>, Error> {
        let shared = &self.shared;
        let info = self
            .consumer
            .get_info()
            .await
            .map_err(|err| Error::Request {
                what: format!(
                    "reading the consumer {:?} of the stream {:?}",
                    shared.consumer, shared.stream
                ),
                source: err.into(),
            })?;
        Ok(vec![Lag {
            broker: BROKER,
            source: shared.stream.clone(),
            group: shared.consumer.clone(),
            partition: None,
            undelivered: Some(info.num_pending),
            unacked: Some(info.num_ack_pending as u64),
        }])
    }
}

//! [`Pulls`]: the state of one stream of deliveries, a pull request at a time, and what is
//! done with the last pull when the stream is dropped.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures_util::stream::StreamExt as _;
use idem_runtime::consume::adapter::InFlight;

use crate::delivery::{Delivery, Shared};
use crate::error::Error;

/// The pull request in progress, if any.
pub(crate) struct Pulls {
    consumer: PullConsumer,
    fetch: usize,
    expires: Duration,
    batch: Option<jetstream::consumer::pull::Batch>,
    shared: Arc<Shared>,
    /// The stream is out until its last pull was given back: the source's `close` waits for
    /// that.
    alive: Option<InFlight>,
}

impl Pulls {
    pub fn new(
        consumer: PullConsumer,
        fetch: usize,
        expires: Duration,
        shared: Arc<Shared>,
    ) -> Self {
        let alive = Some(shared.lifecycle.track());
        Pulls {
            consumer,
            fetch,
            expires,
            batch: None,
            shared,
            alive,
        }
    }

    fn pull_failed(&self, source: async_nats::Error) -> Error {
        Error::Pull {
            stream: self.shared.stream.clone(),
            consumer: self.shared.consumer.clone(),
            source,
        }
    }

    pub async fn next(mut self) -> Option<(Result<Delivery, Error>, Self)> {
        loop {
            let batch = match self.batch.as_mut() {
                Some(batch) => batch,
                None => {
                    // Pulled only now that the loop took every message of the last pull.
                    let pulled = self
                        .consumer
                        .batch()
                        .max_messages(self.fetch)
                        .expires(self.expires)
                        .messages()
                        .await;
                    match pulled {
                        Ok(batch) => self.batch.insert(batch),
                        Err(err) => {
                            // Do not spin on a server that is away.
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            let err = self.pull_failed(err.into());
                            return Some((Err(err), self));
                        }
                    }
                }
            };
            match batch.next().await {
                Some(Ok(message)) => {
                    let delivery = Delivery::new(message, self.shared.clone());
                    return Some((Ok(delivery), self));
                }
                Some(Err(err)) => {
                    self.batch = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let err = self.pull_failed(err);
                    return Some((Err(err), self));
                }
                None => self.batch = None,
            }
        }
    }
}

impl Drop for Pulls {
    /// The last pull request may still be open on the server when the loop stops taking: the
    /// messages it brings (and those the loop gave back, which JetStream redelivers into it)
    /// would reach a connection that no longer reads them, and come back only after
    /// `ack_wait`. So a task reads that pull to its end and gives each message back with a
    /// delay of `expires`, so that it cannot land in the same pull again. The stream stays
    /// out (for the source's `close`) until that task is done.
    fn drop(&mut self) {
        let alive = self.alive.take();
        let (Some(mut batch), Ok(runtime)) =
            (self.batch.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let expires = self.expires;
        let timeout = self.shared.settle_timeout;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(expires + Duration::from_secs(1), async {
                while let Some(message) = batch.next().await {
                    let Ok(message) = message else { continue };
                    let kind = AckKind::Nak(Some(expires));
                    if let Err(err) = crate::delivery::confirmed(&message, kind, timeout).await {
                        tracing::debug!(error = %err, "could not give back an unused message; it comes back after ack_wait");
                    }
                }
            })
            .await;
            drop(alive);
        });
    }
}

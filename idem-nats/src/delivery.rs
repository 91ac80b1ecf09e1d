//! [`Delivery`]: one JetStream message, with its `Progress` heartbeats until it is settled
//! with a confirmed `+ACK`, `-NAK` (delayed), or a confirmed dead letter then `+TERM`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use idem_runtime::consume::adapter::{InFlight, Lifecycle};
use idem_runtime::consume::{self, DeadLetterReason, Settle, SettleError};
use idem_runtime::recover::Origin;
use tokio::task::AbortHandle;

use crate::headers;

/// What a source, its streams and every delivery taken from them share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    pub stream: String,
    pub consumer: String,
    pub dead_letter: DeadLetter,
    pub heartbeat: Duration,
    pub max_deliver: Option<u32>,
    pub lifecycle: Lifecycle,
    /// How long a settlement waits for the server's answer.
    pub settle_timeout: Duration,
}

#[derive(Debug)]
pub(crate) struct DeadLetter {
    pub subject: String,
    /// The stream that stores the subject (publish acked by JetStream), or none (core NATS).
    pub stream: Option<String>,
}

/// A JetStream message delivered and not yet settled. While it lives, it sends `Progress`
/// heartbeats; settling or dropping it stops them.
pub struct Delivery {
    message: jetstream::Message,
    shared: Arc<Shared>,
    delivered: u32,
    stream_sequence: u64,
    consumer_sequence: u64,
    ticker: AbortHandle,
    /// Out until settled or dropped: the source's `close` waits for it.
    _out: InFlight,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("stream", &self.shared.stream)
            .field("sequence", &self.stream_sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    pub(crate) fn new(message: jetstream::Message, shared: Arc<Shared>) -> Self {
        let (delivered, stream_sequence, consumer_sequence) = match message.info() {
            Ok(info) => (
                u32::try_from(info.delivered).unwrap_or(u32::MAX),
                info.stream_sequence,
                info.consumer_sequence,
            ),
            Err(_) => (1, 0, 0),
        };
        let ticker = tokio::spawn(heartbeats(
            message.clone(),
            shared.heartbeat,
            shared.settle_timeout,
        ))
        .abort_handle();
        let out = shared.lifecycle.track();
        Delivery {
            message,
            shared,
            delivered,
            stream_sequence,
            consumer_sequence,
            ticker,
            _out: out,
        }
    }

    /// The message as async-nats gives it (subject, headers, payload).
    pub fn message(&self) -> &jetstream::Message {
        &self.message
    }

    /// Its sequence in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }

    /// Whether JetStream will not deliver it again (the consumer's `max_deliver` reached).
    fn last_allowed(&self) -> bool {
        self.shared
            .max_deliver
            .is_some_and(|max| self.delivered >= max)
    }

    /// Publishes the dead letter and waits for its confirmation.
    async fn publish_dead_letter(&self, reason: &DeadLetterReason) -> Result<(), SettleError> {
        let shared = &self.shared;
        let mut headers = self.message.headers.clone().unwrap_or_default();
        headers.insert(headers::REASON, reason.as_str());
        headers.insert(headers::DETAIL, one_line(&reason.to_string()).as_str());
        headers.insert(headers::DELIVERIES, self.delivered.to_string().as_str());
        if let DeadLetterReason::Poisoned { attempts } = reason {
            headers.insert(headers::ATTEMPTS, attempts.to_string().as_str());
        }
        headers.insert(headers::SOURCE, shared.stream.as_str());
        headers.insert(headers::SOURCE_CONSUMER, shared.consumer.as_str());
        headers.insert(
            headers::SOURCE_SEQUENCE,
            self.stream_sequence.to_string().as_str(),
        );
        headers.insert(headers::SOURCE_SUBJECT, self.message.subject.as_str());
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("idem-dlq.{}.{}", shared.stream, self.stream_sequence).as_str(),
        );
        let subject = shared.dead_letter.subject.clone();
        let payload = self.message.payload.clone();
        match &shared.dead_letter.stream {
            Some(_) => {
                let ack = shared
                    .jetstream
                    .publish_with_headers(subject, headers, payload)
                    .await?;
                ack.await?;
            }
            None => {
                shared
                    .client
                    .publish_with_headers(subject, headers, payload)
                    .await?;
                shared.client.flush().await?;
            }
        }
        Ok(())
    }
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect()
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.ticker.abort();
    }
}

/// Sends `kind` for `message` with a reply subject and waits (up to `timeout`) for the
/// server's answer. An answer with a status is an error: "503 no responders" is what a cluster
/// sends when no server takes the consumer's acks (while it elects the consumer's leader), so
/// nothing received the settlement; async-nats' `double_ack_with` would take it for a
/// confirmation.
pub(crate) async fn confirmed(
    message: &jetstream::Message,
    kind: AckKind,
    timeout: Duration,
) -> Result<(), SettleError> {
    use futures_util::StreamExt as _;
    let Some(reply) = message.reply.clone() else {
        return Err("not a JetStream message: it has no reply subject to settle".into());
    };
    let client = message.context.client();
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await?;
    client.publish_with_reply(reply, inbox, kind.into()).await?;
    let answer = tokio::time::timeout(timeout, answers.next())
        .await
        .map_err(|_| format!("the server did not answer the settlement within {timeout:?}"))?
        .ok_or("the connection dropped the settlement's answer")?;
    match answer.status {
        None | Some(async_nats::StatusCode::OK) => Ok(()),
        Some(async_nats::StatusCode::NO_RESPONDERS) => Err(
            "no server took the settlement (503 no responders: the consumer has no leader, as \
             while a cluster elects one); the message comes back after ack_wait"
                .into(),
        ),
        Some(status) => Err(format!(
            "the server answered the settlement with status {status}: {}",
            answer.description.as_deref().unwrap_or("")
        )
        .into()),
    }
}

/// Sends `Progress` every `every` until aborted.
async fn heartbeats(message: jetstream::Message, every: Duration, timeout: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(err) = confirmed(&message, AckKind::Progress, timeout).await {
            tracing::warn!(subject = %message.subject, error = %err, "a Progress heartbeat failed; trying again at the next tick");
        }
    }
}

impl consume::Delivery for Delivery {
    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn deliveries(&self) -> Option<u32> {
        Some(self.delivered)
    }

    /// The message's headers, by name; a header with several values gives one pair per value,
    /// in order. JetStream's own (`Nats-Msg-Id`, ...) are among them.
    fn headers(&self) -> Vec<(String, String)> {
        let Some(headers) = &self.message.headers else {
            return Vec::new();
        };
        let mut pairs: Vec<(String, String)> = headers
            .iter()
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |value| (name.to_string(), value.as_str().to_string()))
            })
            .collect();
        // The client keeps headers in a hash map: by name, so the order is the same each time.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
    }

    /// Broker [`BROKER`](crate::BROKER); source the stream; coordinates `stream sequence N,
    /// consumer sequence M`; destination the subject it was published on, which the stream
    /// captures again when a replay publishes there.
    fn origin(&self) -> Origin {
        Origin {
            broker: crate::BROKER.to_string(),
            source: self.shared.stream.clone(),
            coordinates: format!(
                "stream sequence {}, consumer sequence {}",
                self.stream_sequence, self.consumer_sequence
            ),
            destination: self.message.subject.to_string(),
        }
    }

    /// The durable consumer.
    fn consumer_group(&self) -> Option<String> {
        Some(self.shared.consumer.clone())
    }

    fn describe(&self) -> String {
        format!(
            "nats {}/{} #{} (delivery {})",
            self.shared.stream, self.shared.consumer, self.stream_sequence, self.delivered
        )
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        self.ticker.abort();
        let settle = match settle {
            // JetStream will not deliver it again: dead-letter it rather than strand it.
            Settle::Requeue { .. } if self.last_allowed() => {
                tracing::warn!(delivery = %self.describe(), "the consumer's max_deliver is reached: dead-lettering instead of requeueing");
                Settle::DeadLetter {
                    reason: DeadLetterReason::TooManyDeliveries {
                        deliveries: self.delivered,
                    },
                }
            }
            other => other,
        };
        let timeout = self.shared.settle_timeout;
        match settle {
            Settle::Ack => confirmed(&self.message, AckKind::Ack, timeout).await?,
            Settle::Requeue { delay } => {
                let delay = (!delay.is_zero()).then_some(delay);
                confirmed(&self.message, AckKind::Nak(delay), timeout).await?
            }
            Settle::DeadLetter { reason } => {
                self.publish_dead_letter(&reason).await?;
                confirmed(&self.message, AckKind::Term, timeout).await?
            }
            other => return Err(format!("idem-nats does not know the settlement {other:?}").into()),
        }
        Ok(())
    }
}

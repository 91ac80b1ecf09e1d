//! [`Delivery`]: one message of the queue, settled with `basic.ack`, a held `basic.reject`,
//! or a confirmed publish to the dead-letter exchange then `basic.ack`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_runtime::consume::adapter::{InFlight, Lifecycle};
use idem_runtime::consume::Delivery as _;
use idem_runtime::consume::{self, DeadLetterReason, Settle, SettleError};
use idem_runtime::recover::Origin;
use lapin::options::{BasicAckOptions, BasicPublishOptions, BasicRejectOptions};
use lapin::protocol::BasicProperties;
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::{Channel, Connection};

use crate::headers;

/// How long a delivery whose dead letter could not be published is held before it is
/// requeued (and tried again).
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(5);

/// What a source, its streams and every delivery taken from them share: the connection, the
/// consuming channel (its ackers need it open) and the publisher-confirms channel for dead
/// letters. The connection closes at [`Source::close`], or once all of them are gone (lapin
/// closes on drop).
pub(crate) struct Shared {
    pub connection: Connection,
    pub channel: Channel,
    pub confirms: Channel,
    pub queue: String,
    pub dead_letter_exchange: String,
    pub dead_letter_routing_key: String,
    pub max_hold: Duration,
    /// Delivery tags taken from the consuming channel and not yet acked or rejected: a
    /// `multiple` ack may only cover a run of these that is all its own.
    pub unacked_tags: Mutex<BTreeSet<u64>>,
    pub lifecycle: Lifecycle,
}

impl Shared {
    pub fn unacked(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        // Nothing panics while holding it; recover the set if something did.
        self.unacked_tags.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called once the ack or reject of `tags` went out (or failed for good).
    pub fn settled(&self, tags: impl IntoIterator<Item = u64>) {
        let mut unacked = self.unacked();
        for tag in tags {
            unacked.remove(&tag);
        }
    }
}

/// One message taken from the queue and not yet settled.
pub struct Delivery {
    delivery: lapin::message::Delivery,
    shared: Arc<Shared>,
    /// Out until settled or dropped: the source's `close` waits for it.
    _out: InFlight,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.shared.queue)
            .field("delivery_tag", &self.delivery.delivery_tag)
            .field("redelivered", &self.delivery.redelivered)
            .field("message_id", self.delivery.properties.message_id())
            .finish()
    }
}

impl Delivery {
    pub(crate) fn new(delivery: lapin::message::Delivery, shared: Arc<Shared>) -> Self {
        let out = shared.lifecycle.track();
        Delivery {
            delivery,
            shared,
            _out: out,
        }
    }

    /// lapin's delivery: properties, headers, exchange, routing key, redelivered flag.
    pub fn message(&self) -> &lapin::message::Delivery {
        &self.delivery
    }

    /// The quorum queue's `x-delivery-count` header: earlier failed deliveries.
    fn delivery_count_header(&self) -> Option<u32> {
        let headers = self.delivery.properties.headers().as_ref()?;
        let value = headers.inner().get("x-delivery-count")?;
        let count: i128 = match value {
            AMQPValue::ShortShortInt(n) => (*n).into(),
            AMQPValue::ShortShortUInt(n) => (*n).into(),
            AMQPValue::ShortInt(n) => (*n).into(),
            AMQPValue::ShortUInt(n) => (*n).into(),
            AMQPValue::LongInt(n) => (*n).into(),
            AMQPValue::LongUInt(n) => (*n).into(),
            AMQPValue::LongLongInt(n) => (*n).into(),
            AMQPValue::Timestamp(n) => (*n).into(),
            _ => return None,
        };
        u32::try_from(count.max(0)).ok()
    }

    async fn ack(&self) -> Result<(), SettleError> {
        let sent = self.delivery.acker.ack(BasicAckOptions::default()).await;
        self.shared.settled([self.delivery.delivery_tag]);
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_settled("basic.ack", &self.describe())),
            Err(err) => Err(Box::new(err)),
        }
    }

    /// Acks with `multiple = true`: this delivery and every unacked one below it on the channel,
    /// which the caller checked are all its own (`tags`).
    async fn ack_up_to(&self, tags: &[u64]) -> Result<(), String> {
        let sent = self
            .delivery
            .acker
            .ack(BasicAckOptions { multiple: true })
            .await;
        self.shared.settled(tags.iter().copied());
        let describe = self.describe();
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_settled("basic.ack (multiple)", &describe).to_string()),
            Err(err) => Err(format!("basic.ack (multiple) of {describe}: {err}")),
        }
    }

    async fn reject(&self) -> Result<(), SettleError> {
        let sent = self
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: true })
            .await;
        self.shared.settled([self.delivery.delivery_tag]);
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_settled("basic.reject", &self.describe())),
            Err(err) => Err(Box::new(err)),
        }
    }

    /// Publishes the dead letter with confirms; `Ok` only once the broker confirmed it and
    /// routed it somewhere.
    async fn publish_dead_letter(&self, reason: &DeadLetterReason) -> Result<(), SettleError> {
        let shared = &self.shared;
        let mut headers = self
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
        headers.insert(headers::REASON.into(), text(reason.as_str()));
        headers.insert(headers::DETAIL.into(), text(&reason.to_string()));
        if let Some(n) = self.deliveries() {
            headers.insert(headers::DELIVERIES.into(), AMQPValue::LongLongInt(n.into()));
        }
        if let DeadLetterReason::Poisoned { attempts } = reason {
            headers.insert(
                headers::ATTEMPTS.into(),
                AMQPValue::LongLongInt((*attempts).into()),
            );
        }
        headers.insert(headers::SOURCE.into(), text(&shared.queue));
        headers.insert(
            headers::SOURCE_EXCHANGE.into(),
            text(self.delivery.exchange.as_str()),
        );
        headers.insert(
            headers::SOURCE_ROUTING_KEY.into(),
            text(self.delivery.routing_key.as_str()),
        );
        let properties: BasicProperties = self
            .delivery
            .properties
            .clone()
            .with_headers(headers)
            .with_delivery_mode(2); // persistent
        let confirm = shared
            .confirms
            .basic_publish(
                ShortString::from(shared.dead_letter_exchange.as_str()),
                ShortString::from(shared.dead_letter_routing_key.as_str()),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &self.delivery.data,
                properties,
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            return Err(format!(
                "the broker refused (nack) the dead letter of {} on exchange {:?}",
                self.describe(),
                shared.dead_letter_exchange
            )
            .into());
        }
        if let Some(returned) = confirm.take_message() {
            return Err(format!(
                "the dead-letter exchange {:?} routed the dead letter of {} to no queue \
                 (routing key {:?}, {}): bind a queue to it",
                shared.dead_letter_exchange,
                self.describe(),
                shared.dead_letter_routing_key,
                returned.reply_text
            )
            .into());
        }
        Ok(())
    }

    /// Holds the delivery for `delay` (at most `max_hold`) in a task of its own, then rejects
    /// it with requeue; at once if the source is closing. The caller does not wait for the
    /// hold.
    fn hold_then_reject(self, delay: Duration) {
        let delay = delay.min(self.shared.max_hold);
        let closing = self.shared.lifecycle.stopped();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = closing => {}
            }
            if let Err(err) = self.reject().await {
                tracing::warn!(
                    delivery = %self.describe(),
                    error = %err,
                    "requeue after a hold failed; the broker returns the delivery when its channel closes"
                );
            }
        });
    }
}

/// A header's value as text; see [`Delivery::headers`](consume::Delivery::headers).
fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        other => nested(other),
    }
}

/// A value as text, strings quoted (inside an array or a table, where that keeps them apart).
fn nested(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::Float(x) => x.to_string(),
        AMQPValue::Double(x) => x.to_string(),
        AMQPValue::DecimalValue(d) => decimal(d.value, d.scale),
        AMQPValue::LongString(s) => format!("{:?}", String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::ShortString(s) => format!("{:?}", s.as_str()),
        AMQPValue::ByteArray(bytes) => {
            let hex: String = bytes
                .as_slice()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("0x{hex}")
        }
        AMQPValue::FieldArray(items) => {
            let items: Vec<String> = items.as_slice().iter().map(nested).collect();
            format!("[{}]", items.join(", "))
        }
        AMQPValue::FieldTable(table) => {
            let fields: Vec<String> = table
                .inner()
                .iter()
                .map(|(name, value)| format!("{}: {}", name.as_str(), nested(value)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        AMQPValue::Void => String::new(),
    }
}

/// An AMQP decimal (`value` × 10^-`scale`) in decimal notation: `12345`, scale 2 is `123.45`.
fn decimal(value: u32, scale: u8) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = digits.split_at(digits.len() - scale);
    format!("{whole}.{fraction}")
}

fn not_settled(verb: &str, delivery: &str) -> SettleError {
    format!("{verb} of {delivery} did not reach the broker (channel closed or acker already used)")
        .into()
}

impl consume::Delivery for Delivery {
    fn payload(&self) -> &[u8] {
        &self.delivery.data
    }

    /// `x-delivery-count` + 1 where the queue counts (quorum queues); 1 for a delivery that
    /// the broker says is the first; `None` for a redelivery on a queue that keeps no count
    /// (classic queues).
    fn deliveries(&self) -> Option<u32> {
        match self.delivery_count_header() {
            Some(earlier) => Some(earlier.saturating_add(1)),
            None if !self.delivery.redelivered => Some(1),
            None => None,
        }
    }

    /// The AMQP header table, by name, each value as text: strings as they are (invalid UTF-8
    /// replaced), numbers in decimal, booleans `true`/`false`, a timestamp in seconds, bytes in
    /// hex, arrays and tables as `[..]` and `{..}`, no value as empty text. Properties such as
    /// `message_id` are not headers and are not among them.
    fn headers(&self) -> Vec<(String, String)> {
        let Some(table) = self.delivery.properties.headers().as_ref() else {
            return Vec::new();
        };
        table
            .inner()
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), text(value)))
            .collect()
    }

    /// Broker [`BROKER`](crate::BROKER); source and destination the queue (a replay publishes
    /// on the default exchange, as an `OutboxPublisher` without an exchange does, which routes
    /// to the queue); coordinates `delivery tag N`, and `message id X` where it has one.
    fn origin(&self) -> Origin {
        let tag = self.delivery.delivery_tag;
        let coordinates = match self.delivery.properties.message_id() {
            Some(id) => format!("delivery tag {tag}, message id {id}"),
            None => format!("delivery tag {tag}"),
        };
        Origin {
            broker: crate::BROKER.to_string(),
            source: self.shared.queue.clone(),
            coordinates,
            destination: self.shared.queue.clone(),
        }
    }

    fn describe(&self) -> String {
        match self.delivery.properties.message_id() {
            Some(id) => format!(
                "{} #{} (message_id {})",
                self.shared.queue, self.delivery.delivery_tag, id
            ),
            None => format!("{} #{}", self.shared.queue, self.delivery.delivery_tag),
        }
    }

    /// One `basic.ack(multiple = true)` for the longest run of `deliveries` (sorted by tag)
    /// that starts at the channel's lowest unacked tag; the others one by one.
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let one_channel = deliveries
            .windows(2)
            .all(|w| Arc::ptr_eq(&w[0].shared, &w[1].shared));
        let mut order: Vec<usize> = (0..deliveries.len()).collect();
        order.sort_by_key(|&i| deliveries[i].delivery.delivery_tag);
        let tags: Vec<u64> = order
            .iter()
            .map(|&i| deliveries[i].delivery.delivery_tag)
            .collect();
        let covered = match deliveries.first() {
            Some(first) if one_channel && deliveries.len() > 1 => first
                .shared
                .unacked()
                .iter()
                .zip(&tags)
                .take_while(|(unacked, ours)| unacked == ours)
                .count(),
            _ => 0,
        };
        let mut results: Vec<Option<Result<(), SettleError>>> =
            (0..deliveries.len()).map(|_| None).collect();
        if covered > 1 {
            let last = &deliveries[order[covered - 1]];
            let sent = last.ack_up_to(&tags[..covered]).await;
            for &i in &order[..covered] {
                results[i] = Some(sent.clone().map_err(SettleError::from));
            }
        }
        for (i, delivery) in deliveries.iter().enumerate() {
            if results[i].is_none() {
                results[i] = Some(delivery.ack().await);
            }
        }
        results.into_iter().flatten().collect()
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        match settle {
            Settle::Ack => self.ack().await,
            Settle::Requeue { delay } if delay.is_zero() => self.reject().await,
            Settle::Requeue { delay } => {
                self.hold_then_reject(delay);
                Ok(())
            }
            Settle::DeadLetter { reason } => {
                if let Err(err) = self.publish_dead_letter(&reason).await {
                    // Not dead-lettered, so not acked: it must come back rather than sit
                    // unacked in a prefetch slot. After a pause, so that a missing binding
                    // does not spin.
                    self.hold_then_reject(DEAD_LETTER_RETRY);
                    return Err(err);
                }
                tracing::warn!(
                    delivery = %self.describe(),
                    queue = %self.shared.queue,
                    exchange = %self.shared.dead_letter_exchange,
                    %reason,
                    "dead-lettered"
                );
                self.ack().await
            }
            other => Err(format!(
                "idem-rabbitmq does not know the settlement {other:?} of {}",
                self.describe()
            )
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{ByteArray, DecimalValue, FieldArray, FieldTable};

    use super::*;

    #[test]
    fn header_values_read_as_text() {
        let long = |s: &str| AMQPValue::LongString(LongString::from(s));
        assert_eq!(text(&long("t-1")), "t-1");
        assert_eq!(text(&AMQPValue::ShortString("s".into())), "s");
        assert_eq!(text(&AMQPValue::LongLongInt(-3)), "-3");
        assert_eq!(text(&AMQPValue::ShortShortUInt(7)), "7");
        assert_eq!(text(&AMQPValue::Boolean(true)), "true");
        assert_eq!(text(&AMQPValue::Double(1.5)), "1.5");
        assert_eq!(text(&AMQPValue::Timestamp(1_700_000_000)), "1700000000");
        let decimal = |value, scale| AMQPValue::DecimalValue(DecimalValue { scale, value });
        assert_eq!(text(&decimal(12345, 2)), "123.45");
        assert_eq!(text(&decimal(5, 3)), "0.005");
        assert_eq!(text(&decimal(42, 0)), "42");
        assert_eq!(
            text(&AMQPValue::ByteArray(ByteArray::from(vec![0x0a, 0xff]))),
            "0x0aff"
        );
        assert_eq!(text(&AMQPValue::Void), "");
        let array = FieldArray::from(vec![long("a"), AMQPValue::LongInt(2)]);
        assert_eq!(text(&AMQPValue::FieldArray(array.clone())), r#"["a", 2]"#);
        let mut table = FieldTable::default();
        table.insert("k".into(), AMQPValue::FieldArray(array));
        table.insert("b".into(), AMQPValue::Boolean(false));
        assert_eq!(
            text(&AMQPValue::FieldTable(table)),
            r#"{b: false, k: ["a", 2]}"#
        );
        assert_eq!(
            text(&AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
            "a\u{fffd}"
        );
    }
}

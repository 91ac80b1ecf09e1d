//! RabbitMQ for idem's consumer loop: a queue consumed with manual acks, whose deliveries are
//! settled only after their transaction committed. Re-exported as `idem::rabbitmq` (feature
//! `rabbitmq`).
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(serde::Deserialize)] struct OrderEvent { id: String }
//! # async fn on_event(_: &mut idem_runtime::Batch<sqlx::Sqlite>, _: &OrderEvent)
//! #     -> Result<idem_runtime::Outcome<()>, idem_runtime::Error<String>> { todo!() }
//! use idem_rabbitmq::Queue;
//! use idem_runtime::consume::{json, Consumer};
//!
//! let deliveries = Queue::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "order-events")
//!     .prefetch(200) // batch × concurrency
//!     .dead_letter_exchange("order-events.dlx")
//!     .deliveries()
//!     .await?;
//! let counts = Consumer::new(pool)
//!     .batch(50)
//!     .concurrency(4)
//!     .max_deliveries(10)
//!     .run(deliveries, json::<OrderEvent>, on_event, async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await;
//! println!("{counts:?}");
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! | [`Settle`] | on RabbitMQ |
//! |---|---|
//! | `Ack` (sent only after the transaction committed) | `basic.ack`; a batch's acks in one `basic.ack(multiple = true)` where that covers only them (below) |
//! | `Requeue { delay }` | hold the delivery for `delay` (a timer task), then `basic.reject(requeue = true)` |
//! | `DeadLetter { reason }` | publish body + properties + `x-idem-*` headers to the dead-letter exchange with publisher confirms, wait for the confirm, then `basic.ack` |
//!
//! **Ack after commit.** The loop settles a delivery only after its transaction committed. A
//! process that dies between the commit and the ack leaves the delivery unacked; RabbitMQ
//! delivers it again and idem answers `Duplicate`, which is acked.
//!
//! **One ack per batch.** When a batch commits, its acks go out as one `basic.ack` with
//! `multiple = true` on the highest delivery tag of the longest run of the batch's tags that
//! starts at the lowest tag still unacked on the channel; the rest of the batch is acked one by
//! one. So a `multiple` ack never covers a delivery of another batch still in flight, a held
//! requeue, or a dead letter waiting for its confirm: a tag leaves the channel's unacked set only
//! after its own ack or reject went out.
//!
//! **`Ok(false)` is not success.** lapin answers `Ok(false)` to an ack or reject whose channel
//! closed (or whose acker was used): the message was *not* settled. [`RabbitDelivery`] turns it
//! into an error, so the loop logs and counts it (`Counts::settle_failures`); the broker
//! redelivers the message, and idem sees a duplicate.
//!
//! **Requeue: reject, not nack, held for the delay.** RabbitMQ 4.3 and later count only
//! rejections (`basic.reject` with requeue, or the AMQP 1.0 `modified` outcome with
//! `delivery-failed`) in a quorum queue's `x-delivery-count`, which feeds the consumer's
//! `max_deliveries`; `basic.nack` with requeue is not counted there. 3.x counts both; reject is
//! right for both. AMQP 0-9-1 has no delayed requeue, so a delivery that should come back after
//! `delay` is kept unacked for that long by a timer task and then rejected. We chose this over a
//! retry queue with a message TTL that dead-letters back into the source queue because such a
//! round trip *republishes* the message: its `x-delivery-count` starts again from zero, so
//! `max_deliveries` would never trip, and it needs two extra queues per delay declared by the
//! user. The price of holding:
//! - a held delivery occupies a prefetch slot until it is rejected (size `prefetch` with room for
//!   the failures you expect);
//! - it is bounded by the broker's consumer timeout (`consumer_timeout`, 30 minutes by default):
//!   an unacked delivery held longer makes the broker close the channel, which returns every
//!   unacked delivery of it. Holds are therefore capped by [`Queue::max_hold`] (default 5
//!   minutes); keep the consumer's `retry_delay` maximum (30 s by default) well below it;
//! - if the connection closes during the hold (shutdown, crash), the broker requeues the
//!   delivery at once: the delay is cut short, nothing is lost.
//!
//! A failed reject after the hold (the channel closed meanwhile) is logged; the broker returns
//! the delivery anyway when the channel closes. Deliveries the loop hands back at shutdown
//! (taken, never run) are rejected too, without a hold, so on 4.3+ they count one delivery.
//!
//! **Dead letters are at least once.** A dead letter is *published* by idem to the dead-letter
//! exchange with publisher confirms and `mandatory = true`, and the original is acked only after
//! the broker confirmed it and did not return it as unroutable. A plain `basic.reject` to a
//! queue's own `x-dead-letter-exchange` would be at most once (and drops the message where no
//! DLX is declared). If the confirm fails or the exchange routes it nowhere, the original is not
//! acked: the settlement is an error (logged and counted), the delivery is held 5 seconds and
//! requeued, and it is dead-lettered again when it comes back. A dead letter whose ack was lost
//! after the confirm is published again on the redelivery: dead letters are at least once. The dead letter keeps the original body and
//! properties (`message_id`, `content_type`, the headers, ...), is made persistent, and gains:
//!
//! | header | value |
//! |---|---|
//! | `x-idem-reason` | `undecodable`, `bad_key`, `too_many_deliveries`, ... ([`DeadLetterReason::as_str`]) |
//! | `x-idem-detail` | the reason in words |
//! | `x-idem-deliveries` | the broker's delivery count (long), where it counts (see below) |
//! | `x-idem-queue` | the queue it was consumed from |
//! | `x-idem-exchange`, `x-idem-routing-key` | where it was originally published |
//!
//! The idem key is not among them: it is derived inside the handler from the *decoded* message,
//! and a dead letter is often one that cannot be decoded or keyed at all; [`Settle`] carries no
//! key. A producer that sets the AMQP `message_id` (recommended) finds it on the dead letter.
//!
//! The dead-letter exchange must exist (declaring exchanges and queues is the user's job): it
//! is checked with a passive declare when [`Queue::deliveries`] starts, which fails with
//! [`Error::DeadLetterExchangeMissing`] otherwise. Dead letters are published with the routing
//! key [`Queue::dead_letter_routing_key`] (default: the source queue's name); bind a queue to
//! the exchange with it (or use a fanout exchange).
//!
//! # Delivery count
//!
//! [`RabbitDelivery::deliveries`](idem_runtime::consume::Delivery::deliveries) is what the
//! consumer's `max_deliveries` reads. Quorum queues put `x-delivery-count` on a redelivered
//! message (the number of earlier failed deliveries), so the count is that plus one. Classic
//! queues keep no count: there a first delivery (`redelivered` = false) counts 1 and a
//! redelivery is `None` (unknown): a redelivered flag is not a count, so `max_deliveries` does
//! not apply on classic queues. Use a quorum queue where poison messages must be bounded.
//! RabbitMQ 4.x quorum queues also have a default `delivery-limit` of 20 after which the broker
//! itself drops (or dead-letters) the message: set the queue's limit above the consumer's
//! `max_deliveries`.
//!
//! # Prefetch, connection, TLS
//!
//! The queue is consumed with `basic_qos(prefetch)`; set it to `batch × concurrency` of the
//! [`Consumer`](idem_runtime::consume::Consumer) (plus room for held retries), so every batch
//! slot can fill. The stream ends when the channel or connection closes; `Consumer::run` then
//! drains and returns, and the caller reconnects (lapin's automatic recovery is not used: after
//! a recovery the old deliveries' tags are void).
//!
//! TLS is lapin's: an `amqps://` URL connects over TLS (rustls with the ring provider and the
//! platform's trust store), and [`Queue::tls`] takes lapin's `OwnedTLSConfig` for a custom CA
//! chain or a client certificate. Other connection settings go through
//! [`Queue::connection_properties`].

#![warn(missing_docs)]

mod outbox;
pub use outbox::{OutboxPublisher, PARTITION_KEY_HEADER};

use std::collections::BTreeSet;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use idem_runtime::consume::{DeadLetterReason, Delivery, Settle, SettleError};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::protocol::BasicProperties;
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

pub use lapin;

/// A RabbitMQ queue to consume, built up before [`deliveries`](Queue::deliveries) connects.
#[derive(Debug, Clone)]
pub struct Queue {
    url: String,
    queue: String,
    prefetch: u16,
    dead_letter_exchange: Option<String>,
    dead_letter_routing_key: Option<String>,
    max_hold: Duration,
    properties: Option<ConnectionProperties>,
    tls: Option<OwnedTLSConfig>,
}

impl Queue {
    /// The queue `queue` on the broker at `url` (`amqp://user:pass@host:5672/%2f`, or
    /// `amqps://...` for TLS). Nothing connects until [`deliveries`](Queue::deliveries).
    pub fn connect(url: impl Into<String>, queue: impl Into<String>) -> Self {
        Queue {
            url: url.into(),
            queue: queue.into(),
            prefetch: 100,
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            max_hold: Duration::from_secs(300),
            properties: None,
            tls: None,
        }
    }

    /// How many unacked deliveries the broker sends ahead (`basic_qos`, per consumer; default
    /// 100, at least 1). Set it to the consumer's `batch × concurrency`.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// The exchange dead letters are published to (required; it must already exist).
    pub fn dead_letter_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.dead_letter_exchange = Some(exchange.into());
        self
    }

    /// The routing key of dead letters (default: the source queue's name).
    pub fn dead_letter_routing_key(mut self, key: impl Into<String>) -> Self {
        self.dead_letter_routing_key = Some(key.into());
        self
    }

    /// The longest a delivery is held before its delayed requeue (default 5 minutes): a
    /// longer `Requeue { delay }` is shortened to it, since the broker closes a channel that
    /// holds a delivery past its `consumer_timeout` (30 minutes by default).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = max;
        self
    }

    /// lapin's connection properties (connection name, auth provider, ...). Leave automatic
    /// recovery off: a recovered channel's delivery tags are not the old ones.
    pub fn connection_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = Some(properties);
        self
    }

    /// TLS settings for an `amqps://` URL: a custom CA chain (PEM) or a client identity.
    pub fn tls(mut self, tls: OwnedTLSConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Connects, checks that the queue and the dead-letter exchange exist, sets the prefetch,
    /// and starts consuming with manual acks. Hand the stream to
    /// [`Consumer::run`](idem_runtime::consume::Consumer::run).
    pub async fn deliveries(self) -> Result<Deliveries, Error> {
        let exchange = self
            .dead_letter_exchange
            .clone()
            .ok_or(Error::NoDeadLetterExchange)?;
        let runtime = lapin::runtime::default_runtime().map_err(Error::Amqp)?;
        let connection = Connection::connect_with_config(
            &self.url,
            self.properties.clone().unwrap_or_default(),
            self.tls.clone().unwrap_or_default(),
            runtime,
        )
        .await
        .map_err(|source| Error::Connect {
            url: redact(&self.url),
            source,
        })?;

        // Passive declares close their channel when the name is missing: use throwaway ones.
        let check = connection.create_channel().await.map_err(Error::Amqp)?;
        if let Err(source) = check
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            return Err(Error::QueueMissing {
                queue: self.queue,
                source,
            });
        }
        let check = connection.create_channel().await.map_err(Error::Amqp)?;
        if let Err(source) = check
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
        {
            return Err(Error::DeadLetterExchangeMissing { exchange, source });
        }
        let _ = check.close(200, "OK".into()).await;

        let confirms = connection.create_channel().await.map_err(Error::Amqp)?;
        confirms
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(Error::Amqp)?;
        let channel = connection.create_channel().await.map_err(Error::Amqp)?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(Error::Amqp)?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(), // no_ack = false: manual acks
                FieldTable::default(),
            )
            .await
            .map_err(Error::Amqp)?;
        let routing_key = self
            .dead_letter_routing_key
            .unwrap_or_else(|| self.queue.clone());
        Ok(Deliveries {
            consumer,
            shared: Arc::new(Shared {
                connection,
                channel,
                confirms,
                queue: self.queue,
                dead_letter_exchange: exchange,
                dead_letter_routing_key: routing_key,
                max_hold: self.max_hold,
                unacked: Mutex::new(BTreeSet::new()),
            }),
        })
    }
}

/// The URL without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Why a queue could not be consumed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No dead-letter exchange was given: dead letters would have nowhere to go.
    NoDeadLetterExchange,
    /// The broker did not answer or refused the connection.
    Connect {
        /// The URL, without its password.
        url: String,
        /// lapin's error.
        source: lapin::Error,
    },
    /// The queue does not exist (declare it first).
    QueueMissing {
        /// Its name.
        queue: String,
        /// The broker's answer to the passive declare.
        source: lapin::Error,
    },
    /// The dead-letter exchange does not exist (declare it, and a queue bound to it, first).
    DeadLetterExchangeMissing {
        /// Its name.
        exchange: String,
        /// The broker's answer to the passive declare.
        source: lapin::Error,
    },
    /// Another AMQP error while setting up.
    Amqp(lapin::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDeadLetterExchange => write!(
                f,
                "no dead-letter exchange: call .dead_letter_exchange(name) with an existing exchange"
            ),
            Error::Connect { url, source } => {
                write!(f, "could not connect to RabbitMQ at {url}: {source}")
            }
            Error::QueueMissing { queue, source } => {
                write!(f, "the queue {queue:?} does not exist (declare it first): {source}")
            }
            Error::DeadLetterExchangeMissing { exchange, source } => write!(
                f,
                "the dead-letter exchange {exchange:?} does not exist (declare it, and bind a \
                 dead-letter queue to it, before consuming): {source}"
            ),
            Error::Amqp(source) => write!(f, "AMQP error: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NoDeadLetterExchange => None,
            Error::Connect { source, .. }
            | Error::QueueMissing { source, .. }
            | Error::DeadLetterExchangeMissing { source, .. }
            | Error::Amqp(source) => Some(source),
        }
    }
}

/// What every delivery of one [`Deliveries`] shares: the connection, the consuming channel
/// (its ackers need it open) and the publisher-confirms channel for dead letters. The
/// connection closes once the stream and every delivery are gone (lapin closes on drop).
struct Shared {
    connection: Connection,
    #[allow(dead_code)] // kept open for the deliveries' ackers
    channel: Channel,
    confirms: Channel,
    queue: String,
    dead_letter_exchange: String,
    dead_letter_routing_key: String,
    max_hold: Duration,
    /// Delivery tags taken from the consuming channel and not yet acked or rejected: a
    /// `multiple` ack may only cover a run of these that is all its own.
    unacked: Mutex<BTreeSet<u64>>,
}

impl Shared {
    fn unacked(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        // Nothing panics while holding it; recover the set if something did.
        self.unacked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called once the ack or reject of `tags` went out (or failed for good).
    fn settled(&self, tags: impl IntoIterator<Item = u64>) {
        let mut unacked = self.unacked();
        for tag in tags {
            unacked.remove(&tag);
        }
    }
}

/// The deliveries of a queue: a `Stream<Item = Result<RabbitDelivery, lapin::Error>>` for
/// [`Consumer::run`](idem_runtime::consume::Consumer::run). It ends when the consumer is
/// cancelled or its channel closes (an error item comes first in that case). Once it and every
/// delivery taken from it are dropped (the loop has settled them, held requeues have been
/// rejected), the channel and connection close, and deliveries the broker sent ahead that the
/// loop never took go back to the queue.
pub struct Deliveries {
    consumer: lapin::Consumer,
    shared: Arc<Shared>,
}

impl Deliveries {
    /// The connection, e.g. to close it explicitly after the run or to watch its status.
    pub fn connection(&self) -> &Connection {
        &self.shared.connection
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.shared.queue
    }
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("queue", &self.shared.queue)
            .field("consumer_tag", &self.consumer.tag())
            .finish()
    }
}

impl Stream for Deliveries {
    type Item = Result<RabbitDelivery, lapin::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let shared = self.shared.clone();
        Pin::new(&mut self.consumer).poll_next(cx).map(|next| {
            next.map(|result| {
                result.map(|delivery| {
                    shared.unacked().insert(delivery.delivery_tag);
                    RabbitDelivery {
                        delivery,
                        shared: shared.clone(),
                    }
                })
            })
        })
    }
}

/// One message taken from the queue and not yet settled.
pub struct RabbitDelivery {
    delivery: lapin::message::Delivery,
    shared: Arc<Shared>,
}

impl fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("queue", &self.shared.queue)
            .field("delivery_tag", &self.delivery.delivery_tag)
            .field("redelivered", &self.delivery.redelivered)
            .field("message_id", self.delivery.properties.message_id())
            .finish()
    }
}

impl RabbitDelivery {
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
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_settled("basic.ack (multiple)", &self.describe()).to_string()),
            Err(err) => Err(format!(
                "basic.ack (multiple) of {}: {err}",
                self.describe()
            )),
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
        headers.insert("x-idem-reason".into(), text(reason.as_str()));
        headers.insert("x-idem-detail".into(), text(&reason.to_string()));
        if let Some(n) = self.deliveries() {
            headers.insert("x-idem-deliveries".into(), AMQPValue::LongLongInt(n.into()));
        }
        headers.insert("x-idem-queue".into(), text(&shared.queue));
        headers.insert(
            "x-idem-exchange".into(),
            text(self.delivery.exchange.as_str()),
        );
        headers.insert(
            "x-idem-routing-key".into(),
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
}

/// How long a delivery whose dead letter could not be published is held before it is
/// requeued (and tried again).
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(5);

impl RabbitDelivery {
    /// Holds the delivery for `delay` (at most `max_hold`) in a task of its own, then rejects
    /// it with requeue. The caller does not wait for the hold.
    fn hold_then_reject(self, delay: Duration) {
        let delay = delay.min(self.shared.max_hold);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
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

fn not_settled(verb: &str, delivery: &str) -> SettleError {
    format!("{verb} of {delivery} did not reach the broker (channel closed or acker already used)")
        .into()
}

impl Delivery for RabbitDelivery {
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
    use super::redact;

    #[test]
    fn urls_lose_their_password_in_errors() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
        assert_eq!(redact("amqps://user@host/vh"), "amqps://user@host/vh");
    }
}

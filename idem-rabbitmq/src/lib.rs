//! RabbitMQ for idem's consumer loop: a queue consumed with manual acks, whose deliveries are
//! settled only after their transaction committed, and the outbox's publisher. Re-exported as
//! `idem::rabbitmq` (feature `rabbitmq`).
//!
//! This crate follows [the adapter convention](idem_runtime::consume#adapters) (builder,
//! `connect`, `deliveries`, `close`; [`Error`]; [`headers`]); what follows is only what is
//! RabbitMQ's own.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(serde::Deserialize)] struct OrderEvent { id: String }
//! # async fn on_event(_: &mut idem::Batch<sqlx::Sqlite>, _: &OrderEvent)
//! #     -> Result<idem::Outcome<()>, idem::Error<String>> { todo!() }
//! use idem::consume::{json, Consumer};
//! use idem::rabbitmq::Source;
//!
//! let source = Source::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "order-events")
//!     .prefetch(200) // batch × concurrency
//!     .connect() // checks the queue and its dead-letter exchange, `order-events.dead`
//!     .await?;
//! let counts = Consumer::new(pool)
//!     .batch(50)
//!     .concurrency(4)
//!     .max_deliveries(10)
//!     .run(source.deliveries(), json::<OrderEvent>, on_event, async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     })
//!     .await;
//! source.close().await?; // basic.cancel, wait for what is out, close (200 OK)
//! println!("{counts:?}");
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! | [`Settle`](idem_runtime::consume::Settle) | on RabbitMQ |
//! |---|---|
//! | `Ack` (sent only after the transaction committed) | `basic.ack`; a batch's acks in one `basic.ack(multiple = true)` where that covers only them (below) |
//! | `Requeue { delay }` | hold the delivery for `delay` (a timer task), then `basic.reject(requeue = true)` |
//! | `DeadLetter { reason }` | publish body + properties + idem's [`headers`] to the dead-letter exchange with publisher confirms, wait for the confirm, then `basic.ack` |
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
//! closed (or whose acker was used): the message was *not* settled. [`Delivery`] turns it
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
//!   unacked delivery of it. Holds are therefore capped by [`SourceBuilder::max_hold`] (default 5
//!   minutes); keep the consumer's `retry_delay` maximum (30 s by default) well below it;
//! - if the connection closes during the hold (shutdown, crash), the broker requeues the
//!   delivery at once: the delay is cut short, nothing is lost. [`Source::close`] cuts every
//!   hold short the same way, and rejects at once.
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
//! | header ([`headers`]) | value |
//! |---|---|
//! | `idem-reason` ([`REASON`](headers::REASON)) | `undecodable`, `bad_key`, `too_many_deliveries`, ... (`DeadLetterReason::as_str`) |
//! | `idem-detail` ([`DETAIL`](headers::DETAIL)) | the reason in words |
//! | `idem-deliveries` ([`DELIVERIES`](headers::DELIVERIES)) | the broker's delivery count (long), where it counts (see below) |
//! | `idem-attempts` ([`ATTEMPTS`](headers::ATTEMPTS)) | the handler's failed attempts (long), when `poisoned` |
//! | `idem-source` ([`SOURCE`](headers::SOURCE)) | the queue it was consumed from |
//! | `idem-source-exchange`, `idem-source-routing-key` | where it was originally published |
//!
//! The idem key is not among them: it is derived inside the handler from the *decoded* message,
//! and a dead letter is often one that cannot be decoded or keyed at all; `Settle` carries no
//! key. A producer that sets the AMQP `message_id` (recommended) finds it on the dead letter.
//!
//! The dead-letter exchange (default `<queue>.dead`, or [`SourceBuilder::dead_letters`]) must
//! exist (declaring exchanges and queues is the user's job): [`SourceBuilder::connect`] checks
//! it with a passive declare and fails with [`Error::DeadLetterExchangeMissing`] otherwise.
//! Dead letters are published with the routing key [`SourceBuilder::dead_letter_routing_key`]
//! (default: the source queue's name); bind a queue to the exchange with it (or use a fanout
//! exchange).
//!
//! # Delivery count
//!
//! [`Delivery::deliveries`](idem_runtime::consume::Delivery::deliveries) is what the
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
//! The queue is consumed with `basic_qos(prefetch)` ([`SourceBuilder::prefetch`]); set it to
//! `batch × concurrency` of the [`Consumer`](idem_runtime::consume::Consumer) (plus room for
//! held retries), so every batch slot can fill. The stream ends when the channel or connection
//! closes; `Consumer::run` then drains and returns, and the caller reconnects (lapin's
//! automatic recovery is not used: after a recovery the old deliveries' tags are void).
//!
//! TLS is lapin's: an `amqps://` URL connects over TLS (rustls with the ring provider and the
//! platform's trust store), and [`SourceBuilder::tls`] takes lapin's `OwnedTLSConfig` for a
//! custom CA chain or a client certificate. Other connection settings go through
//! [`SourceBuilder::connection_properties`]. A handshake that fails (a certificate not signed
//! by a trusted CA, or for another host) is [`Error::Tls`]. Errors name the URL without its
//! password.
//!
//! # Outbox
//!
//! [`OutboxPublisher`] publishes the outbox's messages with publisher confirms, the id as AMQP
//! `message_id` and as the [`headers::MESSAGE_ID`] header, and the partition key as
//! [`headers::PARTITION_KEY`].

#![warn(missing_docs)]

mod delivery;
mod error;
pub mod headers;
mod health;
mod lag;
mod outbox;
mod source;

/// The broker's name in the [`Origin`](idem_runtime::recover::Origin) of a delivery: `rabbitmq`.
pub const BROKER: &str = "rabbitmq";

pub use delivery::Delivery;
pub use error::Error;
pub use outbox::{OutboxPublisher, OutboxPublisherBuilder};
pub use source::{Deliveries, Source, SourceBuilder, CONNECT_TIMEOUT};

pub use lapin;

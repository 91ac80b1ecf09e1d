//! Consumers: deliveries from a broker, decoded, handled in batches by `#[idempotent]`
//! handlers, and settled only after their transaction committed.
//!
//! This module knows no broker. A broker adapter (`idem::rabbitmq`, ..., see
//! [Adapters](#adapters)) turns the broker's messages into a stream of [`Delivery`] values and
//! translates each [`Settle`] into the broker's own verbs; [`Consumer`] does the rest, the same
//! for every broker:
//!
//! | result of the delivery | settles as |
//! |---|---|
//! | Applied, Duplicate, Stale, Replayed | [`Settle::Ack`] |
//! | InProgress (lease held elsewhere) | [`Settle::Requeue`] after `in_progress_delay` |
//! | handler `Err`, panic, over `handler_timeout` | [`Settle::Requeue`] with backoff |
//! | Poisoned (the handler's `max_attempts`) | [`Settle::DeadLetter`] |
//! | undecodable payload, `Error::Key`, `Error::Conflict`, over `max_deliveries` | [`Settle::DeadLetter`] |
//! | store or connection error | waits with backoff and runs again in place; never an attempt |
//!
//! With [`Recovery`] ([`Consumer::recovery`]), a failure is parked in the database for a
//! durable retry (and the delivery acked once that committed) instead of requeued in place,
//! and a dead letter is written to the database before the broker is told (and by default
//! also sent to the broker's dead-letter place: [`DeadLetters`]). Due retries run through the
//! same handler path; a parked retry out of runs becomes a dead letter in the database.
//!
//! When some deliveries of a batch fail on the store and the others were decided (committed),
//! the decided ones settle at once and only the failed ones wait and run again. A batch's acks
//! go out together through [`Delivery::ack_all`] (one `multiple` ack on RabbitMQ).
//!
//! With the feature `metrics`, the loop records the `idem_consumer_*` metrics of
//! `idem::metrics` (settled per outcome, dead-lettered per reason, settle failures, store
//! pauses, deliveries in flight).
//!
//! [`Consumer::health`] is the consumer's [`Health`]: whether it is ready (running, taking
//! work, its last check reached the database and the broker) and live (no batch stuck past a
//! bound), each with the reason when not; checked on an interval while the run runs
//! ([`Consumer::health_every`], [`Consumer::stuck_after`]).
//!
//! [`memory::MemoryQueue`] is a broker in memory for tests.
//!
//! # Adapters
//!
//! The four broker crates (`idem::rabbitmq`, `idem::nats`, `idem::kafka`, `idem::redis`) have
//! one shape, written down here once; each crate's docs add only what is its broker's own.
//!
//! **Names and files.** Each crate's `src/` holds `lib.rs` (its docs, the re-exports, and
//! `pub use` of its client crate: `lapin`, `async_nats`, `rdkafka`, `redis`), `source.rs`
//! (`SourceBuilder`, `Source`, `Deliveries`), `delivery.rs` (`Delivery`, one message not yet
//! settled, implementing [`Delivery`]), `outbox.rs` (`OutboxPublisherBuilder`,
//! `OutboxPublisher`, implementing `idem::outbox::Publisher`), `headers.rs` (`pub mod
//! headers`) and `error.rs` (`Error`); internals of one broker get files named for them
//! (Kafka's `watermark.rs` and `rebalance.rs`, NATS's `pull.rs`). Nothing else is called
//! `Source` in a broker crate.
//!
//! **Builder, connect, deliveries, close.**
//!
//! ```text
//! let source = Source::builder(<url or brokers>, <names>)   // no I/O: required arguments only
//!     .prefetch(n)                                          // same name, same meaning everywhere
//!     .dead_letters(place)                                  // every broker has a default
//!     /* the broker's own settings */
//!     .connect().await?;                                    // the one async step
//! let counts = Consumer::new(pool).run(source.deliveries(), decode, handler, shutdown).await;
//! source.close().await?;
//! ```
//!
//! - `Source::builder` takes what is required, and does nothing else; every other setting is a
//!   chained method with a documented default. `prefetch(n)` is how many deliveries the broker
//!   hands out ahead; `dead_letters(place)` is where dead letters go (an exchange, a subject, a
//!   topic, a stream).
//! - `connect()` connects, checks that what must exist exists (the queue, stream and durable
//!   consumer, topic, or group, and the dead-letter place), and fails with an `Error` that names
//!   what is missing or wrong.
//! - `deliveries()` returns the crate's `Deliveries`, a
//!   `Stream<Item = Result<Delivery, Error>> + Send + Unpin + 'static` for [`Consumer::run`].
//!   It may be called more than once: the streams share the input, each delivery going to one
//!   of them.
//! - `close()` stops taking (every stream of the source ends, and delays a delivery is waiting
//!   out are cut short), waits for the streams and the deliveries still out to be settled or
//!   dropped (at most [`adapter::CLOSE_TIMEOUT`], 30 s), then leaves the broker cleanly. A
//!   source dropped without `close` leaves as it can (its connection closes once its streams
//!   and deliveries are gone).
//! - `lag()` asks the broker how far behind the input is ([`Lag`]: RabbitMQ the queue's ready
//!   messages, NATS the consumer's pending and ack-pending counts, Kafka the end offset minus
//!   the committed one per partition, Redis the group's lag and pending count), for gauges.
//! - Broker-specific accessors (the connection, the dead-letter place in use, ...) are on
//!   `Source`.
//!
//! | broker | `Source::builder(..)` | `prefetch` maps to (default) | dead letters (default) | `close` leaves by |
//! |---|---|---|---|---|
//! | RabbitMQ | `(url, queue)` | `basic_qos` (100; clamped to 65,535) | exchange `<queue>.dead`, must exist | `basic.cancel`, held requeues rejected at once, channels and connection closed (200 OK) |
//! | NATS JetStream | `(url, stream, consumer)` | pull `max_messages` (100) | subject `idem.dead-letter.<stream>.<consumer>`, outside the stream | stopping pulls, giving back what the last pull brings, flushing and draining the connection |
//! | Kafka | `(brokers, topic, group)` | librdkafka `queued.min.messages` (librdkafka's, 100,000) | topic `<topic>.dead`, must exist | committing the watermarks, leaving the group, a bounded librdkafka close |
//! | Redis Streams | `(url, stream, group, consumer)` | `XREADGROUP` `COUNT` (100) | stream `<stream>:dead` (created by the first dead letter; `{<stream>}:dead` on a Redis Cluster when the name has no hash tag) | stopping reads: what was read and not settled stays pending, resumed by the next run |
//!
//! **The trait.** Every `Source` implements [`Source`] (and so does
//! [`memory::MemoryQueue`]), forwarding to its inherent methods: using one adapter needs no
//! import; code written once for any broker takes `S: Source`.
//!
//! **Health.** Each crate's `src/health.rs` gives `Source` an inherent `probe()`, a [`Probe`]
//! of its broker for the consumer's readiness, forwarded by [`Source::probe`]; a user writes
//! `Consumer::new(pool).health_of(&source)` for any of them. A probe is cheap (it runs every
//! check interval), bounded, and does not hold up `close`:
//!
//! | broker | `probe()` reads |
//! |---|---|
//! | RabbitMQ | lapin's connection status (no request) |
//! | NATS JetStream | async-nats' connection state (no request) |
//! | Kafka | a metadata request for the topic (2 s), on tokio's blocking threads |
//! | Redis Streams | `PING` on the settling connection (2 s) |
//! | memory | always connected (the trait's default) |
//!
//! **Errors.** One `Error` per crate (`thiserror`, `#[non_exhaustive]`), each variant saying
//! what failed (connecting to a URL, a queue missing, the dead-letter place missing or wrong, a
//! pull or read failing, leaving) and wrapping the client's error as its source. The
//! `Deliveries` stream yields the same `Error`. No message holds a password:
//! [`adapter::redact`] takes it out of a URL first.
//!
//! **Headers.** Each crate has `pub mod headers` with every header (Redis: entry field) idem
//! writes or reads, under the same constant name for the same meaning and the same value,
//! lowercase `idem-<name>`:
//!
//! | constant | value | RabbitMQ | NATS | Kafka | Redis |
//! |---|---|---|---|---|---|
//! | `MESSAGE_ID` | `idem-message-id` | outbox; also the AMQP `message_id` | outbox; also `Nats-Msg-Id` | outbox | outbox |
//! | `PARTITION_KEY` | `idem-partition-key` | outbox | outbox | outbox; also the record key | outbox |
//! | `REASON` | `idem-reason` | dead letter | dead letter | dead letter | dead letter |
//! | `DETAIL` | `idem-detail` | dead letter | dead letter | dead letter | dead letter |
//! | `DELIVERIES` | `idem-deliveries` | dead letter, where the queue counts | dead letter | (no count) | dead letter |
//! | `ATTEMPTS` | `idem-attempts` | dead letter, when `poisoned` | same | same | same |
//! | `SOURCE` | `idem-source` | the queue | the stream | the topic | the stream |
//! | coordinates | `idem-source-…` | `SOURCE_EXCHANGE`, `SOURCE_ROUTING_KEY` | `SOURCE_CONSUMER`, `SOURCE_SEQUENCE`, `SOURCE_SUBJECT` | `SOURCE_PARTITION`, `SOURCE_OFFSET` | `SOURCE_ID` |
//! | `PAYLOAD`, `HEADER_PREFIX` | `payload`, `idem-header-` | | | | the message's field, the prefix of its headers' fields |
//!
//! A dead letter keeps the original's body and headers (Redis: its other fields) and adds
//! idem's. The idem key is not among them: it is derived from the decoded message, and a dead
//! letter is often one that cannot be decoded.
//!
//! **Origin.** Each crate has `pub const BROKER` (`rabbitmq`, `nats`, `kafka`, `redis`;
//! `memory` for [`memory::MemoryQueue`]), and its `Delivery` tells its headers as text
//! ([`Delivery::headers`]; Redis: the entry's other fields) and its [`Origin`](crate::recover::Origin)
//! ([`Delivery::origin`]), whose destination is where the crate's `OutboxPublisher` publishes a
//! replay so that it comes back to the same consumer:
//!
//! | broker | source | coordinates | destination |
//! |---|---|---|---|
//! | RabbitMQ | the queue | `delivery tag N, message id X` | the queue (on the default exchange) |
//! | NATS | the stream | `stream sequence N, consumer sequence M` | the subject it was published on |
//! | Kafka | the topic | `partition P offset O` | the topic |
//! | Redis Streams | the stream | `entry <id>` | the stream |
//!
//! [`adapter`] holds what adapters share for `close` and errors ([`adapter::Lifecycle`],
//! [`adapter::redact`]), for a new adapter to follow the same convention.
//! `idem_testkit::broker_suite!` (crate `idem-testkit`, feature `broker`) then checks a new
//! adapter against the rules every broker meets, on its real server.

pub mod adapter;
mod consumer;
mod counts;
mod delivery;
mod flight;
mod health;
mod lag;
pub mod memory;
mod probe;
mod recovering;
mod recovery;
mod runner;
mod settle;
mod source;
#[cfg(feature = "otel")]
mod trace;

pub use consumer::Consumer;
pub use counts::Counts;
pub use delivery::{Delivery, SettleError};
pub use health::{Health, NotLive, NotReady, DEFAULT_CHECK_INTERVAL};
pub use lag::Lag;
pub use probe::Probe;
pub use recovery::{DeadLetters, Recovery, MAX_NAME_LEN};
pub use settle::{DeadLetterReason, Settle};
pub use source::Source;

/// Decodes a JSON payload: the default decoder of a consumer's messages.
///
/// ```
/// assert_eq!(idem::consume::json::<Vec<u8>>(b"[1,2]").unwrap(), vec![1, 2]);
/// ```
pub fn json<M: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<M, serde_json::Error> {
    serde_json::from_slice(payload)
}

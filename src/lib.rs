//! Idempotent message handlers for Rust.
//!
//! Brokers deliver at least once, so a consumer sees the same message twice, late, or both.
//! [`#[idempotent]`](idempotent) turns an async handler into one that records each message in the
//! same database transaction as its effect: duplicates are skipped, stale versions rejected, and
//! a crash can never leave the effect without the record or the record without the effect.
//!
//! ```
//! use idem::{idempotent, Outcome, Tx};
//! use sqlx::{Sqlite, SqlitePool};
//!
//! struct Paid { id: String, order_id: i64 }
//!
//! #[idempotent(key = "msg.id", scope = "billing::on_paid")]
//! async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE orders SET paid = paid + 1 WHERE id = ?")
//!         .bind(msg.order_id)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok(())
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let pool = SqlitePool::connect("sqlite::memory:").await?;
//! idem::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER)").execute(&pool).await?;
//! sqlx::query("INSERT INTO orders VALUES (1, 0)").execute(&pool).await?;
//!
//! let msg = Paid { id: "evt-1".into(), order_id: 1 };
//! assert_eq!(on_paid(&pool, &msg).await?, Outcome::Applied(()));
//! assert_eq!(on_paid(&pool, &msg).await?, Outcome::Duplicate); // redelivery: skipped
//! let paid: i64 = sqlx::query_scalar("SELECT paid FROM orders").fetch_one(&pool).await?;
//! assert_eq!(paid, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! Beyond one message at a time:
//! - [`batch`] handles a slice of messages in one transaction, claiming them in one round trip;
//! - `retention = "30d"` on the attribute, with [`retention::purge_expired`] and
//!   [`retention::Purger`], bounds the
//!   tables; version rows outlive the records, so stale protection outlives the dedupe window;
//! - a [`Context`] parameter gives stable derived keys for calls outside the database, and
//!   `mode = "lease"` claims such handlers with a lease ([`Outcome::InProgress`]);
//! - [`retry`] tries a delivery again after a [`Transient`] failure.
//!
//! The modules are by audience: the root holds what a handler author needs; [`retention`] is
//! for operators; [`store`] for backend authors.
//!
//! Features: `sqlite` (default), `postgres`, `mysql`, `uuid`, `chrono`, `time`, `metrics`, and the
//! brokers for the consumer loop: `rabbitmq`, `nats`, `redis` and `kafka` (`idem::rabbitmq`,
//! `idem::nats`, `idem::redis`, `idem::kafka`); `http` for idempotent axum endpoints
//! (`idem::http`).
#![warn(missing_docs)]

#[doc = include_str!("idempotent.md")]
pub use idem_macros::idempotent;

pub use idem_runtime::{
    batch, migrate, retry, Batch, Context, Error, Handled, Key, LeaseTransact, Outcome,
    PooledTransact, Replayable, RetryPolicy, Transact, Transient, Tx, Version, MAX_REPLAY_LEN,
};

/// For backend authors: the storage contract that a database implements for idem (the core,
/// [`Store`](store::Store), and the capabilities the handler options need:
/// [`Leases`](store::Leases), [`Stamps`](store::Stamps), [`Attempts`](store::Attempts)), the
/// values its methods take, and which of its errors are transient.
pub use idem_runtime::store;

/// Keys: the [`Key`] trait, its encoding, and why a key is refused ([`KeyError`](key::KeyError)).
pub use idem_runtime::key;

/// Metrics through the `metrics` facade (feature `metrics`): names, labels, and [`describe`](metrics::describe).
#[cfg(feature = "metrics")]
pub use idem_runtime::metrics;

/// Gauges of what waits (the outbox's backlog, parked retries, dead letters, each watched
/// broker source's lag), read on an interval (feature `metrics`): [`Gauges`](gauges::Gauges).
#[cfg(feature = "metrics")]
pub use idem_runtime::gauges;
/// Trace context through the outbox and the consumers (feature `otel`): W3C `traceparent` in
/// the message's headers, `send` and `process` spans after the OpenTelemetry messaging
/// conventions.
#[cfg(feature = "otel")]
pub use idem_runtime::otel;

/// For operators: purging expired records ([`purge_expired`](retention::purge_expired),
/// [`Purger`](retention::Purger)) and old version rows.
pub use idem_runtime::retention;

/// Recoverability: failed deliveries parked for durable retries and dead letters kept in the
/// database ([`Origin`](recover::Origin), [`Parked`](recover::Parked), the storage contract
/// [`RecoveryStore`](recover::RecoveryStore)); the consumer turns them on with
/// [`Consumer::recovery`](consume::Consumer::recovery).
pub use idem_runtime::recover;

/// Consumers: a broker-neutral loop that batches deliveries, runs them through handlers and
/// settles each after its transaction committed, with an in-memory broker for tests; and the
/// convention every broker adapter below follows (its `Source`, `connect`, `deliveries`,
/// `close`, `Error`, `headers`).
pub use idem_runtime::consume;

/// Redis Streams (feature `redis`): [`redis::Source`], a consumer group's entries for the
/// [`consume`] loop, `XACK`ed after commit and taken over with `XAUTOCLAIM`; and the outbox's
/// `XADD` publisher.
#[cfg(feature = "redis")]
pub use idem_redis as redis;

/// Kafka (feature `kafka`, rdkafka): [`kafka::Source`], a consumer group's records for the
/// [`consume`] loop, offsets committed per partition up to what has settled; and the outbox's
/// idempotent-producer publisher.
#[cfg(feature = "kafka")]
pub use idem_kafka as kafka;
/// NATS JetStream (feature `nats`): [`nats::Source`], a durable pull consumer for the
/// [`consume`] loop, with confirmed acks, delayed naks and `Progress` heartbeats; and the
/// outbox's `Nats-Msg-Id` publisher.
#[cfg(feature = "nats")]
pub use idem_nats as nats;
/// RabbitMQ (feature `rabbitmq`, lapin): [`rabbitmq::Source`], a queue's deliveries for the
/// [`consume`] loop, acked only after commit, requeued with `basic.reject`, dead-lettered with
/// publisher confirms; and the outbox's publisher.
#[cfg(feature = "rabbitmq")]
pub use idem_rabbitmq as rabbitmq;

/// Idempotent HTTP endpoints (feature `http`, axum 0.8): [`http::IdempotencyLayer`] on a route
/// and [`http::RequestTx`] in its handler; the `Idempotency-Key` header's response is stored in
/// the handler's own transaction.
#[cfg(feature = "http")]
pub use idem_http as http;

/// The transactional outbox: `ctx.publish(..)` in a handler writes the message in the
/// handler's transaction; a [`Relay`](outbox::Relay) publishes it after the commit.
pub use idem_runtime::outbox;

/// Lease mode: its default lease.
pub use idem_runtime::lease;

/// For operators: the queries of the `idem` command line ([`Admin`](admin::Admin)): counts per
/// scope, one message's record, forgetting a message, ending a lease, purging by batch.
pub use idem_runtime::admin;

/// What the code generated by `#[idempotent]` calls. Not public API: it may change in any release.
#[doc(hidden)]
pub use idem_runtime::__private;

/// idem's SQL backends, for idem's own tests (`backend::mysql::use_returning`). Not public API: it
/// may change in any release.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[doc(hidden)]
pub use idem_runtime::backend;

/// The sqlx that idem is built on (0.9): use it when your crate must name exactly the same
/// `Sqlite`, `Postgres` or `Transaction` types as idem's.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// let _pool: Option<idem::sqlx::SqlitePool> = None;
/// ```
pub use sqlx;

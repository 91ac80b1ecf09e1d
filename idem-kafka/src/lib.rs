//! Kafka for [idem](https://docs.rs/idem)'s consumer loop (rdkafka): a consumer group's records
//! become deliveries, and offsets are committed only up to what has settled; and the outbox's
//! idempotent-producer publisher. Re-exported as `idem::kafka` (feature `kafka`).
//!
//! This crate follows [the adapter convention](idem_runtime::consume#adapters) (builder,
//! `connect`, `deliveries`, `close`; [`Error`]; [`headers`]); what follows is only what is
//! Kafka's own.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::consume::Consumer;
//! use idem::kafka::Source;
//!
//! let source = Source::builder("127.0.0.1:9092", "orders", "billing")
//!     .connect() // checks the topic and its dead-letter topic, `orders.dead`
//!     .await?;
//! # let handler = async |_b: &mut idem::Batch<sqlx::Sqlite>, _m: &u64| -> idem::Handled<Result<(), String>> { Ok(idem::Outcome::Duplicate) };
//! let counts = Consumer::new(pool)
//!     .batch(100)
//!     .run(source.deliveries(), idem::consume::json::<u64>, handler, shutdown) // e.g. ctrl_c
//!     .await;
//! source.close().await?; // commits what settled, leaves the group
//! println!("{counts:?}");
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! Kafka settles by offset, not by message. Each partition keeps the offsets taken and not yet
//! settled; its **watermark** is the offset below which every record has settled (its
//! transaction committed, or its dead letter was acknowledged). Only watermarks are committed:
//! on a timer ([`commit_interval`](SourceBuilder::commit_interval)), at revoke and at
//! [`close`](Source::close). With batches and concurrency in flight, records complete out
//! of order; a later one settling never commits past an earlier one still running.
//!
//! | idem settles | Kafka does |
//! |---|---|
//! | `Ack` | the offset settles; the watermark moves over it when everything below has |
//! | `Requeue { delay }` | retried in place after `delay` (doubled per retry, at most [`max_retry_delay`](SourceBuilder::max_retry_delay)); the watermark stays held |
//! | `DeadLetter { reason }` | produced to the dead-letter topic (default `<topic>.dead`) with idem's [`headers`] (`idem-reason`, `idem-detail`, `idem-attempts` when `poisoned`, `idem-source`, `idem-source-partition`, `idem-source-offset`), then, once acknowledged, the offset settles |
//!
//! # Delivery count
//!
//! Kafka has no delivery count: attempts come from idem's store (the handler's
//! `max_attempts`), and a record that keeps failing is dead-lettered once it is `Poisoned`.
//! Until then it holds its partition's watermark: the partition keeps flowing, but a restart
//! or rebalance redelivers everything above the stuck record (duplicates, which idem
//! recognises), and once [`max_held`](SourceBuilder::max_held) records are held above it
//! the partition is paused. A handler without `max_attempts` that always fails stops its
//! partition there.
//!
//! # Rebalances and close
//!
//! rdkafka calls the rebalance hook synchronously inside its poll. On revoke the hook commits
//! the watermarks as they stand and forgets the partitions; in-flight results of revoked
//! partitions are dropped when they come back (the new owner delivers them again and finds them
//! applied: duplicates), and the loop skips revoked deliveries it has not started.
//!
//! [`Source::close`] waits for what is out, commits the watermarks, leaves the group (serving
//! the revoke that starts, so that librdkafka's close cannot hang on it, librdkafka#4041) and
//! closes the consumer within a bound.
//!
//! # Outbox
//!
//! [`OutboxPublisher`] produces through an idempotent producer, with the partition key as the
//! record key and the [`headers::PARTITION_KEY`] header, and the id as [`headers::MESSAGE_ID`].
#![warn(missing_docs)]

mod delivery;
mod error;
pub mod headers;
mod health;
mod lag;
mod outbox;
mod rebalance;
mod source;
mod watermark;

/// The broker's name in the [`Origin`](idem_runtime::recover::Origin) of a delivery: `kafka`.
pub const BROKER: &str = "kafka";

pub use delivery::Delivery;
pub use error::Error;
pub use outbox::{OutboxPublisher, OutboxPublisherBuilder};
pub use rdkafka;
pub use source::{Deliveries, Source, SourceBuilder};

//! Redis Streams for [idem](https://docs.rs/idem)'s consumer loop: a consumer group's entries
//! become [`Delivery`](idem_runtime::consume::Delivery) values, settled after commit.
//!
//! | idem settles | Redis Streams does |
//! |---|---|
//! | `Ack` | `XACK` |
//! | `Requeue { delay }` | the entry stays pending; after `delay` it is `XCLAIM`ed back by this consumer (counting a delivery) and handled again |
//! | `DeadLetter { reason }` | `XADD <stream>:dead` with the payload, reason, deliveries, source id and the entry's other fields (its `idem-id`), and `XACK`, in one script: both or neither, and only while the entry is still pending (two consumers holding one entry write one dead letter) |
//!
//! Entries a consumer left pending when it died are taken over by `XAUTOCLAIM` once idle
//! longer than [`claim_idle`](StreamSource::claim_idle): they keep their entry ids (an entry is
//! never re-`XADD`ed, which would change its id). A consumer that starts under the name of one
//! that stopped (crashed, or shut down with entries read and not started) reads that one's
//! pending entries back at once. Delivery counts are not in `XREADGROUP`'s reply: a new entry
//! is on its first delivery, and a claimed or resumed one's count comes from `XPENDING`, one
//! pipelined round trip per claimed batch, never on the happy path. The dead-letter stream
//! must be on the same server as the stream (no Redis Cluster).
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::consume::Consumer;
//! use idem::redis::StreamSource;
//!
//! let source = StreamSource::connect("redis://127.0.0.1:6379", "orders", "billing", "worker-1")
//!     .await?
//!     .count(100);
//! # let handler = async |_b: &mut idem::Batch<sqlx::Sqlite>, _m: &u64| -> idem::Handled<Result<(), String>> { Ok(idem::Outcome::Duplicate) };
//! let counts = Consumer::new(pool)
//!     .batch(100)
//!     .run(source.deliveries(), idem::consume::json::<u64>, handler, shutdown) // e.g. ctrl_c
//!     .await;
//! println!("{counts:?}");
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod delivery;
mod outbox;
mod source;

pub use delivery::RedisDelivery;
pub use outbox::{OutboxPublisher, FIELD_HEADER_PREFIX, FIELD_ID, FIELD_PARTITION_KEY};
pub use source::StreamSource;

//! Redis Streams for [idem](https://docs.rs/idem)'s consumer loop: a consumer group's entries
//! become deliveries, settled after commit; and the outbox's `XADD` publisher. Re-exported as
//! `idem::redis` (feature `redis`).
//!
//! This crate follows [the adapter convention](idem_runtime::consume#adapters) (builder,
//! `connect`, `deliveries`, `close`; [`Error`]; [`headers`], here entry fields); what follows
//! is only what is Redis's own.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::consume::Consumer;
//! use idem::redis::Source;
//!
//! let source = Source::builder("redis://127.0.0.1:6379", "orders", "billing", "worker-1")
//!     .prefetch(100)
//!     .connect() // creates the group (and the stream) if need be
//!     .await?;
//! # let handler = async |_b: &mut idem::Batch<sqlx::Sqlite>, _m: &u64| -> idem::Handled<Result<(), String>> { Ok(idem::Outcome::Duplicate) };
//! let counts = Consumer::new(pool)
//!     .batch(100)
//!     .run(source.deliveries(), idem::consume::json::<u64>, handler, shutdown) // e.g. ctrl_c
//!     .await;
//! source.close().await?; // stop reading; what was read and not settled stays pending
//! println!("{counts:?}");
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! | idem settles | Redis Streams does |
//! |---|---|
//! | `Ack` | `XACK` (a batch's in one `XACK`) |
//! | `Requeue { delay }` | the entry stays pending; after `delay` it is `XCLAIM`ed back by this consumer (counting a delivery) and handled again |
//! | `DeadLetter { reason }` | `XADD <stream>:dead` (or [`SourceBuilder::dead_letters`]) with the payload, idem's [`headers`] (`idem-reason`, `idem-detail`, `idem-deliveries`, `idem-attempts` when `poisoned`, `idem-source`, `idem-source-id`) and the entry's other fields (its `idem-message-id`), and `XACK`, in one script: both or neither, and only while the entry is still pending (two consumers holding one entry write one dead letter) |
//!
//! The message is the entry's [`headers::PAYLOAD`] field; an entry without one is
//! dead-lettered as undecodable.
//!
//! # Delivery count and claims
//!
//! Entries a consumer left pending when it died are taken over by `XAUTOCLAIM` once idle
//! longer than [`claim_idle`](SourceBuilder::claim_idle): they keep their entry ids (an entry
//! is never re-`XADD`ed, which would change its id). A consumer that starts under the name of
//! one that stopped (crashed, closed, or shut down with entries read and not started) reads that
//! one's pending entries back at once. Delivery counts are not in `XREADGROUP`'s reply: a new
//! entry is on its first delivery, and a claimed or resumed one's count comes from `XPENDING`,
//! one pipelined round trip per claimed batch, never on the happy path.
//!
//! # Redis Cluster
//!
//! Give [`Source::builder`] and [`OutboxPublisher::builder`] a
//! [`ClusterClient`](redis::cluster::ClusterClient) instead of a URL (see [`Server`]); the
//! rest is the same. A consumer's keys meet in one script (the dead letter is written and its
//! entry acked atomically), so the dead-letter stream must be in the stream's hash slot:
//! by default it is (`{orders}:dead` for a stream `orders`, whose hash tag `orders` is the
//! stream's whole name; `<stream>:dead` for a stream with a hash tag of its own, such as
//! `{orders}` or `shop:{eu}:orders`), and a dead-letter stream named with
//! [`SourceBuilder::dead_letters`] in another slot makes `connect` fail with
//! [`Error::CrossSlot`]. The outbox publisher sends a batch as one pipeline per hash slot of
//! its destinations, so destination streams need no naming rule.
//!
//! # TLS
//!
//! A `rediss://` URL connects over TLS, with the feature `tls` (redis-rs on rustls), trusting
//! the system's roots; for a CA of your own, build the client with
//! `redis::Client::build_with_tls` (or `ClusterClientBuilder::certs`) and a
//! `redis::TlsCertificates`, and hand it over. With `tls`, connecting installs rustls' ring
//! provider as the process's default unless one is installed already (install yours first,
//! with `CryptoProvider::install_default`, to choose another).
//!
//! # Outbox
//!
//! [`OutboxPublisher`] `XADD`s each message with its payload in [`headers::PAYLOAD`], its id in
//! [`headers::MESSAGE_ID`], its partition key and its headers ([`headers::HEADER_PREFIX`]).
#![warn(missing_docs)]

mod delivery;
mod error;
pub mod headers;
mod health;
mod lag;
mod outbox;
mod server;
mod source;

/// The broker's name in the [`Origin`](idem_runtime::recover::Origin) of a delivery: `redis`.
pub const BROKER: &str = "redis";

pub use delivery::Delivery;
pub use error::Error;
pub use outbox::{OutboxPublisher, OutboxPublisherBuilder};
pub use redis;
pub use server::Server;
pub use source::{Deliveries, Source, SourceBuilder};

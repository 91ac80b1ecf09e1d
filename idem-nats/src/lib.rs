//! NATS JetStream for idem's consumer loop: a durable pull consumer on a stream, whose
//! deliveries [`idem::consume::Consumer`](idem_runtime::consume::Consumer) runs through
//! `#[idempotent]` handlers and settles only after their transaction committed, and the
//! outbox's publisher. Re-exported as `idem::nats` (feature `nats`).
//!
//! This crate follows [the adapter convention](idem_runtime::consume#adapters) (builder,
//! `connect`, `deliveries`, `close`; [`Error`]; [`headers`]); what follows is only what is
//! JetStream's own.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! # #[derive(serde::Deserialize)] struct Event;
//! # async fn on_event(_: &mut idem::Batch<sqlx::Sqlite>, _: &Event)
//! #     -> Result<idem::Outcome<()>, idem::Error<String>> { todo!() }
//! use idem::consume::{json, Consumer};
//! use idem::nats::Source;
//!
//! // An existing stream and durable pull consumer (explicit acks).
//! let source = Source::builder("nats://127.0.0.1:4222", "ORDERS", "billing")
//!     .prefetch(100)
//!     .connect()
//!     .await?;
//! let counts = Consumer::new(pool)
//!     .batch(100)
//!     .run(source.deliveries(), json::<Event>, async |b, e| on_event(b, e).await,
//!          std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
//!     .await;
//! source.close().await?; // stop pulling, give back the last pull, flush
//! # Ok(()) }
//! ```
//!
//! # Settlement
//!
//! Every settlement is sent with a reply subject and waits for the server's answer, so one the
//! server never received is an error the loop logs and counts (`Counts::settle_failures`); the
//! server then redelivers the message after `ack_wait`, and idem sees a `Duplicate`. An answer
//! "503 no responders" is such an error too: a cluster sends it while no node leads the
//! consumer (a leader was lost and the next is not elected yet), and nothing took the ack
//! (async-nats' `double_ack` would count it as confirmed).
//!
//! | [`Settle`](idem_runtime::consume::Settle) | JetStream |
//! |---|---|
//! | `Ack` | `+ACK`, confirmed |
//! | `Requeue { delay }` | `-NAK {"delay": ..}` (a delayed redelivery, not a spin), confirmed |
//! | `DeadLetter { reason }` | publish to the dead-letter subject, wait for its confirmation, then `+TERM`, confirmed |
//!
//! The price is a round trip per settlement (async-nats opens an inbox for each confirmed
//! ack); the loop settles the deliveries of a batch one after another, after its one commit.
//!
//! A confirmed ack does not prove the ack counted: an ack that reaches the server after the
//! message's `ack_wait` expired is answered like any other, and the message is redelivered all
//! the same ([nats-server issue 4786](https://github.com/nats-io/nats-server/issues/4786)). That
//! redelivery is a `Duplicate` for idem, acked again; nothing is applied twice. Heartbeats (below)
//! keep `ack_wait` from expiring while idem is still working on a delivery.
//!
//! # Dead letters
//!
//! A dead letter is the original payload and headers, published to the dead-letter subject with
//! these [`headers`]: `idem-reason` (`undecodable`, `bad_key`, `too_many_deliveries`, ...),
//! `idem-detail` (the error text), `idem-deliveries` (JetStream's delivery count),
//! `idem-attempts` (the handler's failed attempts, when `poisoned`), `idem-source` (the
//! stream), `idem-source-consumer`, `idem-source-sequence` and `idem-source-subject`, and
//! `Nats-Msg-Id: idem-dlq.<stream>.<sequence>`, so a dead letter published twice (its `+TERM`
//! lost) is stored once by a dead-letter stream's duplicate window.
//!
//! The subject must lie **outside the source stream's subjects**, else the dead letter is stored
//! in the same stream and loops back into the consumer: [`SourceBuilder::connect`] checks this
//! and fails with [`Error::DeadLetterCaptured`] if the stream would capture it. The default,
//! `idem.dead-letter.<stream>.<consumer>` (or [`SourceBuilder::dead_letters`]), is checked the
//! same way.
//!
//! How the publish is confirmed depends on who stores the subject, found once at start:
//! - **another stream captures it** (recommended: a stream on `idem.dead-letter.>`): a JetStream
//!   publish, and idem waits for the stream's publish ack, so the dead letter is stored before
//!   the original is terminated: at least once, never lost.
//! - **no stream captures it**: a core NATS publish followed by a flush (a PING/PONG round trip),
//!   which confirms that the server received the publish and handed it to the subject's current
//!   subscribers, but nothing stores it: with no subscriber listening it is gone. A warning says
//!   so at start; create a stream on the subject to keep dead letters.
//!
//! # `max_deliver`
//!
//! When the JetStream consumer has `max_deliver` set, the server stops redelivering a message at
//! that count and leaves it unacked for ever (only an advisory on
//! `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>` says so). So that nothing is
//! stranded silently, a delivery that idem would requeue (a failure, a lease held elsewhere, a
//! shutdown) on the **last allowed delivery** is dead-lettered instead, with the reason
//! `too_many_deliveries`. A process that crashes during the last allowed delivery still leaves
//! the message to that advisory. To close that gap too, set the loop's `max_deliveries` to
//! `max_deliver - 1`: the last allowed delivery then only dead-letters (without running the
//! handler), so a crash during any earlier one is followed by a delivery that does.
//!
//! # Heartbeats
//!
//! Each delivery, from the moment the stream yields it until it is settled (or dropped), has a
//! ticker that sends `+WPI` (`AckKind::Progress`) every `ack_wait / 3`, so the server does not
//! redeliver a message that a long batch or a slow lease-mode handler is still working on. Like
//! every settlement here, the progress is sent with a reply subject and its answer awaited; a
//! heartbeat that fails is logged, and the next tick tries again (two more before `ack_wait`
//! runs out). Messages are pulled with `max_messages = prefetch(n)` and the next pull is requested
//! only once the loop has taken every message of the previous one, so at most one pull's worth
//! of messages waits in the client before its ticker starts.
//!
//! # Close
//!
//! [`Source::close`] stops pulling; the last pull request may still be open on the server, so
//! its messages are read to its end and given back (a nak delayed by `expires`), and the
//! close waits for that and for the deliveries still out (at most 30 s), then flushes and
//! drains the connection. A process that stops without it leaves those messages to come back
//! after `ack_wait`.
//!
//! # Producers: `Nats-Msg-Id`
//!
//! [`OutboxPublisher`] sets it (and [`headers::MESSAGE_ID`]) to the outbox message's id.
//! Publish with a `Nats-Msg-Id` header (the message's own id): JetStream then drops a publish
//! whose id it stored within the stream's duplicate window (2 minutes by default), which is the
//! first line of defence against a producer's retries. idem is still needed behind it: the window
//! ends (a retry after it is stored again), redeliveries to the consumer (`ack_wait` expired, a
//! crash before the ack, a lost ack) are not publishes and are never deduplicated, and neither
//! are replays of a stream or a message published twice under two ids.

#![warn(missing_docs)]

mod connect;
mod delivery;
mod error;
pub mod headers;
mod health;
mod lag;
mod outbox;
mod pull;
mod source;

/// The broker's name in the [`Origin`](idem_runtime::recover::Origin) of a delivery: `nats`.
pub const BROKER: &str = "nats";

pub use delivery::Delivery;
pub use error::Error;
pub use outbox::{OutboxPublisher, OutboxPublisherBuilder};
pub use source::{subject_matches, Deliveries, Source, SourceBuilder};

pub use async_nats;

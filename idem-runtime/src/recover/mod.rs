//! Recoverability: failed deliveries parked in the database for a retry later (durable
//! retries), and deliveries that gave up kept in the database for an operator (dead letters).
//!
//! Both are written in a transaction of their own **before** the broker is told anything, so a
//! crash between the two leaves the message in the broker (delivered again, a duplicate at
//! worst), never in neither place. [`Consumer::recovery`](crate::consume::Consumer::recovery)
//! turns them on for a consumer; `idem dead-letters` (the operator's CLI) shows, groups,
//! replays and discards dead letters.
//!
//! This module is the storage contract ([`RecoveryStore`], implemented for SQLite, PostgreSQL
//! and MySQL/MariaDB in `backend/`), the values it takes and returns, and the pure rules both
//! sides share: how an error message is reduced to its shape ([`shape`]) and which group it
//! falls in ([`group_of`]).

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use crate::store::Store;

mod shape;
pub(crate) mod stored;

pub use shape::{group_of, shape};
pub use stored::InvalidFailure;

/// Where a delivery came from, as its broker adapter tells
/// ([`Delivery::origin`](crate::consume::Delivery::origin)): kept with a parked retry or a dead
/// letter, shown to operators, and used to send a replayed dead letter back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The broker: `rabbitmq`, `nats`, `kafka`, `redis` (`memory` for the in-memory queue).
    pub broker: String,
    /// The queue, stream or topic it was consumed from.
    pub source: String,
    /// The broker's coordinates of this delivery, for people: `partition 3 offset 1042`,
    /// `stream sequence 17`, `entry 1700000000000-0`, a message id.
    pub coordinates: String,
    /// Where a replay publishes it through the outbox, so that it comes back to this consumer:
    /// the queue (RabbitMQ, through the default exchange), the subject (NATS), the topic
    /// (Kafka), the stream (Redis).
    pub destination: String,
}

/// A delivery whose handler failed: what a parked retry or a dead letter keeps of it.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The consumer's name ([`Recovery::new`](crate::consume::Recovery::new)).
    pub consumer: &'a str,
    /// The delivery's bytes, as the broker gave them.
    pub payload: &'a [u8],
    /// The delivery's headers (Redis: its other fields), in order.
    pub headers: &'a [(String, String)],
    /// Where it came from.
    pub origin: &'a Origin,
    /// How many times it failed, this time included.
    pub attempts: u32,
    /// The last failure's error, as text.
    pub error: &'a str,
    /// When it failed first (epoch milliseconds of the database's clock); `None`: now.
    pub first_failed_ms: Option<i64>,
}

/// A dead letter to write: the failure, why it gave up, and which handler's message it was
/// where that is known.
#[derive(Debug, Clone, Copy)]
pub struct NewDeadLetter<'a> {
    /// The delivery and its last error.
    pub failure: Failure<'a>,
    /// Why it gave up: [`DeadLetterReason::as_str`](crate::consume::DeadLetterReason::as_str)
    /// (`poisoned`, `undecodable`, `bad_key`, `conflict`, `too_many_deliveries`, `replay`,
    /// `retries_exhausted`).
    pub reason: &'a str,
    /// The handler's scope, where known.
    pub scope: Option<&'a str>,
    /// The handler's encoded key, where known.
    pub key: Option<&'a [u8]>,
    /// [`shape`] of the error.
    pub shape: &'a str,
    /// [`group_of`] consumer, scope, reason and shape.
    pub group: &'a str,
}

/// A parked retry taken by a consumer ([`RecoveryStore::take_due`]), held under its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// The row's id.
    pub id: i64,
    /// The token it is held with: every later change of the row names it, so a consumer whose
    /// lease ran out (and another took the row) changes nothing.
    pub token: i64,
    /// The delivery's bytes.
    pub payload: Vec<u8>,
    /// The delivery's headers.
    pub headers: Vec<(String, String)>,
    /// Where it came from.
    pub origin: Origin,
    /// Failed runs so far.
    pub attempts: u32,
    /// The last failure's error.
    pub last_error: Option<String>,
    /// When it failed first (epoch milliseconds of the database's clock).
    pub first_failed_ms: i64,
}

/// What a database must do to park retries and keep dead letters: implemented for
/// `sqlx::Sqlite`, `sqlx::Postgres` and `sqlx::MySql` on the tables of migration 0004
/// (`idem_parked`, `idem_dead_letters`). Every method but [`unpark`](RecoveryStore::unpark)
/// commits on its own; every time is the database's clock. A value that some database could
/// not hold (a source over 255 bytes, a NUL in a name: see [`InvalidFailure`]) is refused on
/// every backend alike, as `sqlx::Error::Encode`, before anything is written; a NUL in an
/// error or its shape is written as `\0`.
pub trait RecoveryStore: Store {
    /// Parks a failed delivery, due `due_in` from now, unleased; returns the row's id.
    fn park<'a>(
        pool: &'a Pool<Self>,
        failure: &'a Failure<'a>,
        due_in: Duration,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// Takes up to `limit` of `consumer`'s rows that are due and not held (never leased, or
    /// whose lease ran out), oldest due first, and holds them for `lease` under `token`. Two
    /// consumers taking at once never take the same row.
    fn take_due<'a>(
        pool: &'a Pool<Self>,
        consumer: &'a str,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> impl Future<Output = Result<Vec<Parked>, sqlx::Error>> + Send + 'a;

    /// Deletes a held row in the caller's transaction (the run that decided the message):
    /// `false` when the row is no longer held under `token` (its lease ran out and another
    /// consumer took it), and nothing is deleted.
    fn unpark<'c>(
        conn: &'c mut Self::Connection,
        id: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'c;

    /// Puts a held row back after another failure: its attempts, last error and next due
    /// time set, its lease cleared. `false` when it is no longer held under `token`.
    fn repark<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        token: i64,
        attempts: u32,
        error: &'a str,
        due_in: Duration,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Gives a held row back untried (a consumer shutting down): lease cleared, due time
    /// kept. `false` when it is no longer held under `token`.
    fn release_parked<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a;

    /// Writes a dead letter (state `dead`, first failure as given or now, last failure now);
    /// with `parked = Some((id, token))`, deletes that held row in the same transaction, and
    /// writes nothing when it is no longer held. Returns the dead letter's id (`None` when the
    /// parked row was no longer held).
    fn bury<'a>(
        pool: &'a Pool<Self>,
        dead: &'a NewDeadLetter<'a>,
        parked: Option<(i64, i64)>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;

    /// The last error counted for the encoded `key` in `scope` (`max_attempts`), if any: what
    /// a poisoned message's dead letter says it failed with.
    fn last_error<'a>(
        pool: &'a Pool<Self>,
        scope: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send + 'a;
}

//! The operator's dead letters (`idem_dead_letters`, migration 4): see them grouped by the shape
//! of their error, list and read them, replay them through the outbox, discard them, and purge
//! them after a retention. For `idem dead-letters` and `idem purge`; like the rest of
//! [`admin`](super), for people, not the hot path.
//!
//! A dead letter is `dead` until an operator settles it: [`replay`](DeadLetterAdmin::replay)
//! makes it `replayed` (an outbox message to its `destination` carries it back to its
//! consumer), [`discard`](DeadLetterAdmin::discard) makes it `discarded`. Settled rows are kept
//! until [`purge_dead_letters`](DeadLetterAdmin::purge_dead_letters) removes them.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Pool;

use super::Admin;
use crate::outbox::OutboxStore;

/// The state of a dead letter.
///
/// ```
/// use idem_runtime::admin::DeadLetterState;
/// assert_eq!(DeadLetterState::parse("replayed"), Some(DeadLetterState::Replayed));
/// assert_eq!(DeadLetterState::Dead.as_str(), "dead");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterState {
    /// Open: waiting for an operator.
    Dead,
    /// Sent back through the outbox (`replayed_as` names the outbox message).
    Replayed,
    /// Given up on by an operator; kept until the retention purges it.
    Discarded,
}

impl DeadLetterState {
    /// Every state, in their order of life.
    pub const ALL: [DeadLetterState; 3] = [
        DeadLetterState::Dead,
        DeadLetterState::Replayed,
        DeadLetterState::Discarded,
    ];

    /// The state as stored: `dead`, `replayed` or `discarded`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterState::Dead => "dead",
            DeadLetterState::Replayed => "replayed",
            DeadLetterState::Discarded => "discarded",
        }
    }

    /// The state stored as `text`, if it is one.
    pub fn parse(text: &str) -> Option<DeadLetterState> {
        DeadLetterState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
    }
}

impl std::fmt::Display for DeadLetterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which dead letters a query looks at: every field that is set must match (`None`: any).
/// [`Default`] selects the open ones (state `dead`) and nothing else.
///
/// ```
/// use idem_runtime::admin::{DeadLetterFilter, DeadLetterState};
/// let filter = DeadLetterFilter { scope: Some("billing".into()), ..Default::default() };
/// assert_eq!(filter.state, Some(DeadLetterState::Dead));
/// assert!(!filter.is_everything());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only these ids (empty: any).
    pub ids: Vec<i64>,
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only this handler scope's.
    pub scope: Option<String>,
    /// Only this group's ([`group_of`](crate::recover::group_of)).
    pub group: Option<String>,
    /// Only this reason's (`poisoned`, `undecodable`, `abandoned`, ...).
    pub reason: Option<String>,
    /// Only those consumed from this queue, stream or topic.
    pub source: Option<String>,
    /// Only those in this state (`None`: every state).
    pub state: Option<DeadLetterState>,
    /// Only those whose last failure was at or after this time (epoch milliseconds).
    pub since_ms: Option<i64>,
    /// Only those whose last failure was before this time (epoch milliseconds).
    pub until_ms: Option<i64>,
}

impl Default for DeadLetterFilter {
    fn default() -> Self {
        DeadLetterFilter {
            ids: Vec::new(),
            consumer: None,
            scope: None,
            group: None,
            reason: None,
            source: None,
            state: Some(DeadLetterState::Dead),
            since_ms: None,
            until_ms: None,
        }
    }
}

impl DeadLetterFilter {
    /// Whether nothing but the state narrows it: every dead letter in that state matches.
    pub fn is_everything(&self) -> bool {
        self.ids.is_empty()
            && self.consumer.is_none()
            && self.scope.is_none()
            && self.group.is_none()
            && self.reason.is_none()
            && self.source.is_none()
            && self.since_ms.is_none()
            && self.until_ms.is_none()
    }
}

/// The open dead letters of one group: one consumer, scope and reason, and one error shape, as
/// [`DeadLetterAdmin::groups`] counts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterGroup {
    /// The group: 16 hex digits ([`group_of`](crate::recover::group_of)).
    pub group: String,
    /// The consumer that gave up on them.
    pub consumer: String,
    /// The handler's scope, where known.
    pub scope: Option<String>,
    /// Why they gave up.
    pub reason: String,
    /// Their error with numbers, ids and quoted values taken out
    /// ([`shape`](crate::recover::shape)).
    pub shape: String,
    /// How many.
    pub count: u64,
    /// The earliest first failure among them (epoch milliseconds of the database's clock).
    pub first_failed_ms: i64,
    /// The latest last failure among them.
    pub last_failed_ms: i64,
}

/// A dead letter without its payload and headers, as [`DeadLetterAdmin::list`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInfo {
    /// The row's id.
    pub id: i64,
    /// The consumer that gave up on it.
    pub consumer: String,
    /// The handler's scope, where known (not for an undecodable payload).
    pub scope: Option<String>,
    /// The handler's encoded key, where known.
    pub key: Option<Vec<u8>>,
    /// Why it gave up.
    pub reason: String,
    /// The last failure's error.
    pub error: String,
    /// Its group ([`group_of`](crate::recover::group_of)).
    pub group: String,
    /// The broker: `rabbitmq`, `nats`, `kafka`, `redis`, `memory`.
    pub broker: String,
    /// The queue, stream or topic it was consumed from.
    pub source: String,
    /// The broker's coordinates of the delivery, for people.
    pub coordinates: String,
    /// Where a replay publishes it.
    pub destination: String,
    /// How many times it failed.
    pub attempts: u32,
    /// When it failed first (epoch milliseconds of the database's clock).
    pub first_failed_ms: i64,
    /// When it failed last.
    pub last_failed_ms: i64,
    /// Dead, replayed or discarded.
    pub state: DeadLetterState,
    /// When it stopped being dead; `None` while dead.
    pub settled_ms: Option<i64>,
    /// The outbox message id of its last replay.
    pub replayed_as: Option<String>,
}

/// A dead letter with everything it keeps, as [`DeadLetterAdmin::dead_letter`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// What [`DeadLetterAdmin::list`] shows of it.
    pub info: DeadLetterInfo,
    /// Its error's shape ([`shape`](crate::recover::shape)).
    pub shape: String,
    /// The delivery's bytes, as the broker gave them.
    pub payload: Vec<u8>,
    /// The delivery's headers (Redis: its other fields), in order; empty when none were kept.
    pub headers: Vec<(String, String)>,
}

/// Which dead letters [`DeadLetterAdmin::list`] returns: those with an id above `after`, in
/// id order, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Only ids above this one (the last id of the page before).
    pub after: Option<i64>,
    /// At most this many.
    pub limit: u64,
}

/// What [`DeadLetterAdmin::replay`] did with one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// An outbox message with this id carries it to `destination`; the dead letter is
    /// `replayed`.
    Replayed {
        /// The outbox message's id ([`replay_id`]).
        outbox_id: String,
        /// Where the relay publishes it.
        destination: String,
    },
    /// A parked retry of `consumer`, due now, carries it ([`ReplayTo::Consumer`]); the dead
    /// letter is `replayed`.
    Parked {
        /// The consumer that runs it.
        consumer: String,
    },
    /// It was not dead (replayed or discarded before): nothing was done.
    NotDead(DeadLetterState),
    /// There is no dead letter with this id.
    Missing,
    /// It cannot go through the outbox (its destination or headers are not publishable):
    /// nothing was done, and it stays dead. Says why.
    Refused(String),
}

/// Where [`DeadLetterAdmin::replay_to`] sends a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplayTo {
    /// An outbox message to its origin's destination, which the relay publishes back to the
    /// broker (the default).
    #[default]
    Outbox,
    /// Back among its consumer's parked retries, due now: the consumer (with durable retries
    /// on) runs it in-process, through its handler, without the broker.
    Consumer,
}

/// One dead letter's [`ReplayOutcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The dead letter's id.
    pub id: i64,
    /// What happened to it.
    pub outcome: ReplayOutcome,
}

/// The parked retries of one consumer, as [`DeadLetterAdmin::recovery_counts`] counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkedCounts {
    /// The consumer's name.
    pub consumer: String,
    /// Rows parked for a retry.
    pub parked: u64,
    /// Of them, rows a consumer holds under a running lease (being retried now).
    pub held: u64,
    /// The earliest due time among them (epoch milliseconds of the database's clock).
    pub oldest_due_ms: Option<i64>,
}

/// The open dead letters of one consumer, scope and reason, as
/// [`DeadLetterAdmin::recovery_counts`] counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadCounts {
    /// The consumer that gave up on them.
    pub consumer: String,
    /// The handler's scope, where known.
    pub scope: Option<String>,
    /// Why they gave up.
    pub reason: String,
    /// How many are dead (not replayed or discarded).
    pub dead: u64,
}

/// What waits in the recovery tables, for gauges: parked retries per consumer, open dead
/// letters per consumer, scope and reason, each sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryCounts {
    /// Per consumer, sorted by consumer.
    pub parked: Vec<ParkedCounts>,
    /// Per consumer, scope and reason, sorted by consumer, then scope (unknown first), then
    /// reason.
    pub dead: Vec<DeadCounts>,
}

/// The reason of a dead letter made of a parked retry that was not run within the retention
/// ([`DeadLetterAdmin::bury_abandoned`]).
pub const ABANDONED: &str = "abandoned";

/// The id of the outbox message that replays dead letter `id`: `idem-` and 32 hex digits of
/// SHA-256 over `idem-replay`, the id, and the id of its previous replay (`None` for the first
/// one). The same replay always gets the same id, so a replay run again never inserts twice;
/// a dead letter replayed again (were it put back to dead) gets a new one.
///
/// ```
/// use idem_runtime::admin::replay_id;
/// let first = replay_id(17, None);
/// assert_eq!(first, replay_id(17, None));
/// assert_eq!(first.len(), "idem-".len() + 32);
/// assert_ne!(first, replay_id(18, None));
/// assert_ne!(first, replay_id(17, Some(&first)));
/// ```
pub fn replay_id(id: i64, previous: Option<&str>) -> String {
    let mut hash = Sha256::new();
    // Length-prefixed parts, as every id idem derives: no two inputs run into the same bytes.
    for part in [
        &b"idem-replay"[..],
        &id.to_be_bytes(),
        previous.unwrap_or("").as_bytes(),
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut out = String::with_capacity(5 + 32);
    out.push_str("idem-");
    for byte in &digest[..16] {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The dead letters' queries and changes for operators: implemented for `sqlx::Sqlite`,
/// `sqlx::Postgres` and `sqlx::MySql` on the tables of migration 4.
///
/// Times are the database's clock, in epoch milliseconds ([`Admin::now_ms`]). A replay or a
/// discard changes a dead letter only while it is `dead`, in a transaction of its own, so two
/// operators (or one who runs the same command twice, or again after it was killed) settle
/// each dead letter once.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem_runtime::admin::{DeadLetterAdmin, DeadLetterFilter, Page};
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// assert!(sqlx::Sqlite::dead_letters_present(&pool).await?);
/// let open = DeadLetterFilter::default();
/// assert!(sqlx::Sqlite::groups(&pool, &open).await?.is_empty());
/// let page = Page { after: None, limit: 100 };
/// assert!(sqlx::Sqlite::list(&pool, &open, page).await?.is_empty());
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub trait DeadLetterAdmin: Admin + OutboxStore {
    /// Whether the recovery tables (`idem_dead_letters`, `idem_parked`) exist (a database
    /// migrated before them has none).
    fn dead_letters_present(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_;

    /// The dead letters that `filter` selects, counted per group, the largest group first.
    fn groups<'a>(
        pool: &'a Pool<Self>,
        filter: &'a DeadLetterFilter,
    ) -> impl Future<Output = Result<Vec<DeadLetterGroup>, sqlx::Error>> + Send + 'a;

    /// The dead letters that `filter` selects, in id order, one `page` of them, without their
    /// payloads and headers.
    fn list<'a>(
        pool: &'a Pool<Self>,
        filter: &'a DeadLetterFilter,
        page: Page,
    ) -> impl Future<Output = Result<Vec<DeadLetterInfo>, sqlx::Error>> + Send + 'a;

    /// The dead letter with this id, with its payload and headers, if there is one.
    fn dead_letter(
        pool: &Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetter>, sqlx::Error>> + Send + '_;

    /// Replays each of `ids` that is still dead, each in a transaction of its own: inserts an
    /// outbox message (id [`replay_id`], partition key `""`) to its `destination` with its
    /// payload and headers, clears its message's counted attempts (`idem_attempts`, when its
    /// scope and key are known), and marks it `replayed` (`settled_at` now, `replayed_as` the
    /// message's id). A dead letter that is not dead is left as it is. The outcomes are in the
    /// order of `ids`; an error stops at the dead letter it names, after the ones before it
    /// committed.
    fn replay<'a>(
        pool: &'a Pool<Self>,
        ids: &'a [i64],
    ) -> impl Future<Output = Result<Vec<Replay>, sqlx::Error>> + Send + 'a {
        Self::replay_to(pool, ids, ReplayTo::Outbox)
    }

    /// [`replay`](DeadLetterAdmin::replay), to `to`: with [`ReplayTo::Consumer`], each dead
    /// letter becomes a parked retry of its consumer, due now (0 attempts, its error kept as
    /// the last), in the same transaction that clears its counted attempts and marks it
    /// `replayed`; its outcome is [`ReplayOutcome::Parked`].
    fn replay_to<'a>(
        pool: &'a Pool<Self>,
        ids: &'a [i64],
        to: ReplayTo,
    ) -> impl Future<Output = Result<Vec<Replay>, sqlx::Error>> + Send + 'a;

    /// Marks each of `ids` that is still dead `discarded` (`settled_at` now; kept until the
    /// retention purges it), and returns how many.
    fn discard<'a>(
        pool: &'a Pool<Self>,
        ids: &'a [i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Deletes at most `limit` dead letters past `retention`, in one statement: replayed or
    /// discarded ones settled more than `retention` ago, and dead ones whose last failure was
    /// more than `retention` ago. Returns how many.
    fn purge_dead_letters(
        pool: &Pool<Self>,
        retention: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;

    /// Moves at most `limit` parked retries that no consumer ran in time (due more than
    /// `retention` ago and not held under a running lease: their consumer is gone or renamed)
    /// to the dead letters, with reason [`ABANDONED`] and their last error, in one
    /// transaction: each is deleted from `idem_parked` and written as a dead letter together,
    /// so none is lost or doubled. Returns how many.
    fn bury_abandoned(
        pool: &Pool<Self>,
        retention: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + '_;

    /// Parked retries per consumer and open dead letters per consumer, scope and reason, for
    /// gauges.
    fn recovery_counts(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<RecoveryCounts, sqlx::Error>> + Send + '_;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for state in DeadLetterState::ALL {
            assert_eq!(DeadLetterState::parse(state.as_str()), Some(state));
            assert_eq!(state.to_string(), state.as_str());
        }
        assert_eq!(DeadLetterState::parse("Dead"), None);
    }

    #[test]
    fn replay_ids_are_pinned_and_chain() {
        // Part of what operators see in the outbox: a change is a new id for the same replay.
        let first = replay_id(1, None);
        assert_eq!(first, "idem-9938288d868977d67ddea2d0e86642dd");
        let second = replay_id(1, Some(&first));
        assert_ne!(first, second);
        assert_eq!(second, replay_id(1, Some(&first)));
        assert_ne!(replay_id(1, None), replay_id(2, None));
        assert_ne!(replay_id(-1, None), replay_id(1, None));
    }

    #[test]
    fn the_default_filter_is_the_open_dead_letters() {
        let filter = DeadLetterFilter::default();
        assert!(filter.is_everything());
        assert_eq!(filter.state, Some(DeadLetterState::Dead));
        let some = DeadLetterFilter {
            ids: vec![3],
            ..DeadLetterFilter::default()
        };
        assert!(!some.is_everything());
    }
}

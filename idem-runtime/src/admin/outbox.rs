//! The operator's view of the transactional outbox (`idem_outbox`, migration 3): per
//! destination, how many messages wait for the relay, since when, and whether publishing them
//! failed. For `idem outbox`; like the rest of [`admin`](super), for people, not the hot path.

use std::future::Future;

use sqlx::Pool;

use super::Admin;

/// The outbox rows of one destination, as [`OutboxAdmin::outbox_stats`] counts them.
///
/// ```
/// let d = idem_runtime::admin::DestinationStats { destination: "payments".into(), ..Default::default() };
/// assert_eq!(d.pending, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationStats {
    /// Where the messages go (a queue, subject, topic or stream).
    pub destination: String,
    /// Messages committed and not yet confirmed by the broker.
    pub pending: u64,
    /// When the oldest pending message was written (its handler's commit), in epoch
    /// milliseconds of the database's clock; `None` when nothing is pending.
    pub oldest_pending_ms: Option<i64>,
    /// Pending messages whose publish failed at least once (they wait out a backoff).
    pub failed: u64,
    /// The most failed publishes of one pending message.
    pub most_attempts: u64,
    /// What the last failure of that message said (the first in order when several tie).
    pub last_error: Option<String>,
    /// Messages sent (confirmed) and kept until the relay purges them after its retention.
    pub sent: u64,
}

/// The outbox's queries for operators: implemented for `sqlx::Sqlite`, `sqlx::Postgres` and
/// `sqlx::MySql`.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem_runtime::admin::OutboxAdmin;
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// assert!(sqlx::Sqlite::outbox_present(&pool).await?);
/// assert!(sqlx::Sqlite::outbox_stats(&pool, None).await?.is_empty());
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub trait OutboxAdmin: Admin {
    /// Whether the `idem_outbox` table exists (a database migrated before the outbox has none).
    fn outbox_present(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + '_;

    /// Counts per destination (only `destination`, when given) of every row in the outbox,
    /// pending or sent and not purged yet, sorted by destination.
    fn outbox_stats<'a>(
        pool: &'a Pool<Self>,
        destination: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<DestinationStats>, sqlx::Error>> + Send + 'a;

    /// The pending rows of each destination that has some, and when the oldest of them was
    /// written, sorted by destination: the outbox gauges' query. It reads the pending rows
    /// alone (an index of migration 5), so it stays cheap however many sent rows the relay
    /// keeps; [`outbox_stats`](OutboxAdmin::outbox_stats) reads every row.
    fn outbox_backlog(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<Backlog>, sqlx::Error>> + Send + '_;
}

/// The messages of one destination waiting for the relay, as [`OutboxAdmin::outbox_backlog`]
/// reads them.
///
/// ```
/// let b = idem_runtime::admin::Backlog { destination: "payments".into(), pending: 3, oldest_ms: 1_000 };
/// assert_eq!(b.age_ms(4_000), 3_000);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Where the messages go (a queue, subject, topic or stream).
    pub destination: String,
    /// Messages committed and not yet confirmed by the broker (at least one).
    pub pending: u64,
    /// When the oldest of them was written (its handler's commit), in epoch milliseconds of
    /// the database's clock.
    pub oldest_ms: i64,
}

impl Backlog {
    /// How long the oldest pending message has waited at `now_ms` (the database's clock,
    /// [`Admin::now_ms`]); never negative.
    pub fn age_ms(&self, now_ms: i64) -> u64 {
        u64::try_from(now_ms.saturating_sub(self.oldest_ms)).unwrap_or(0)
    }
}

/// A destination's counts as the backends select them: destination, pending, oldest pending
/// (epoch ms), failed, most attempts, sent.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) type CountRow = (String, i64, Option<i64>, i64, i64, i64);

/// Joins the counts with the last error of each destination's most-failed pending message.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn assemble(
    counts: Vec<CountRow>,
    errors: Vec<(String, Option<String>)>,
) -> Vec<DestinationStats> {
    let mut errors: std::collections::HashMap<String, Option<String>> =
        errors.into_iter().collect();
    counts
        .into_iter()
        .map(
            |(destination, pending, oldest, failed, most, sent)| DestinationStats {
                last_error: errors.remove(&destination).flatten(),
                destination,
                pending: super::count(pending),
                oldest_pending_ms: oldest,
                failed: super::count(failed),
                most_attempts: super::count(most),
                sent: super::count(sent),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_join_their_destination() {
        let stats = assemble(
            vec![
                ("a".into(), 2, Some(5), 1, 3, 0),
                ("b".into(), 0, None, 0, 0, 7),
            ],
            vec![("a".into(), Some("refused".into()))],
        );
        assert_eq!(stats[0].last_error.as_deref(), Some("refused"));
        assert_eq!((stats[0].pending, stats[0].most_attempts), (2, 3));
        assert_eq!((stats[1].last_error.as_deref(), stats[1].sent), (None, 7));
    }
}

//! Retention: how long records are kept ([`DEFAULT_RETENTION`], or `retention = "30d"` on the
//! attribute), and purging the expired ones in bounded batches, by hand or from a background task.

pub use crate::claim::DEFAULT_RETENTION;

use std::time::Duration;

use sqlx::Pool;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::Store;

/// Deletes every record whose retention has passed, `batch_size` rows per statement (each its
/// own short transaction, so handlers keep running and no lock is held long), and returns how
/// many it deleted. Version rows are kept: stale protection outlives the dedupe window.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// assert_eq!(idem::retention::purge_expired(&pool, 1_000).await?, 0);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub async fn purge_expired<DB: Store>(
    pool: &Pool<DB>,
    batch_size: u64,
) -> Result<u64, sqlx::Error> {
    in_batches(batch_size, |limit| async move {
        let mut conn = pool.acquire().await?;
        let deleted = DB::purge_expired(&mut conn, limit).await?;
        drop(conn);
        #[cfg(feature = "metrics")]
        crate::metrics::purged(deleted);
        Ok(deleted)
    })
    .await
}

/// Deletes version high-water marks not advanced for `older_than`, `batch_size` rows per
/// statement, and returns how many. Opt-in: after this, a replay of an entity's old message
/// older than `older_than` is no longer recognised as stale.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # idem::migrate(&pool).await?;
/// let year = std::time::Duration::from_secs(365 * 24 * 3600);
/// assert_eq!(idem::retention::purge_versions(&pool, year, 1_000).await?, 0);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub async fn purge_versions<DB: Store>(
    pool: &Pool<DB>,
    older_than: Duration,
    batch_size: u64,
) -> Result<u64, sqlx::Error> {
    in_batches(batch_size, |limit| async move {
        let mut conn = pool.acquire().await?;
        DB::purge_versions(&mut conn, older_than, limit).await
    })
    .await
}

/// Runs `batch` (a purge of at most `batch_size` rows, at least 1, on a connection of its own)
/// until one deletes fewer, and returns how many they deleted in all.
async fn in_batches<F, Batch>(batch_size: u64, mut batch: F) -> Result<u64, sqlx::Error>
where
    F: FnMut(u64) -> Batch,
    Batch: std::future::Future<Output = Result<u64, sqlx::Error>>,
{
    let batch_size = batch_size.max(1);
    let mut total = 0;
    loop {
        let deleted = batch(batch_size).await?;
        total += deleted;
        if deleted < batch_size {
            return Ok(total);
        }
        // Let handlers waiting for the connection or the write lock go first.
        tokio::task::yield_now().await;
    }
}

/// A background task that runs [`purge_expired`] every `every`, until [`stop`](Purger::stop).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # idem::migrate(&pool).await?;
/// use std::time::Duration;
/// let purger = idem::retention::Purger::spawn(pool.clone(), Duration::from_secs(60), 1_000);
/// // ... the consumer runs ...
/// let purged = purger.stop().await;
/// assert_eq!(purged, 0);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct Purger {
    stop: watch::Sender<bool>,
    task: JoinHandle<u64>,
}

impl Purger {
    /// Spawns the purger on the current tokio runtime. It purges at once, then every `every`;
    /// a failed purge is logged (`tracing::warn!`) and tried again at the next tick.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does. (An `every` of zero is taken as 1 ms.)
    pub fn spawn<DB: Store>(pool: Pool<DB>, every: Duration, batch_size: u64) -> Purger {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut total = 0;
            let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => return total,
                    _ = ticks.tick() => {}
                }
                // Stopping waits for the statement in flight and counts what it purged: a
                // statement cancelled after the database committed it (on MariaDB, rows vanish
                // before the commit's reply arrives) would purge rows that `stop` never counts.
                let batch_size = batch_size.max(1);
                loop {
                    let purged = async {
                        let mut conn = pool.acquire().await?;
                        DB::purge_expired(&mut conn, batch_size).await
                    };
                    match purged.await {
                        Ok(n) => {
                            total += n;
                            tracing::debug!(purged = n, "idem purger");
                            if n < batch_size {
                                break;
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "idem purger failed; retrying at the next tick");
                            break;
                        }
                    }
                    if *stopped.borrow() {
                        return total;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        Purger { stop, task }
    }

    /// Stops the purger, waits for it, and returns how many records it purged in all. A purge
    /// statement in flight finishes first (one bounded statement), so the count is exact.
    pub async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or(0)
    }
}

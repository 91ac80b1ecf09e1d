//! Gauges a dashboard needs (feature `metrics`): what waits in the database and at the
//! brokers, read on an interval and set through the [`metrics`](https://docs.rs/metrics)
//! facade (the series are listed in [`crate::metrics`]):
//!
//! | series | labels | read from |
//! |---|---|---|
//! | `idem_outbox_pending` | `destination` | [`OutboxAdmin::outbox_backlog`] |
//! | `idem_outbox_oldest_pending_age_seconds` | `destination` | the same, and the database's clock |
//! | `idem_parked_retries` | `consumer` | [`DeadLetterAdmin::recovery_counts`] |
//! | `idem_dead_letters` | `consumer`, `scope`, `reason` | the same (open dead letters) |
//! | `idem_consumer_lag` | `broker`, `source`, `group`, `partition` | each watched [`Source::lag`] |
//! | `idem_consumer_unacked` | `broker`, `source`, `group`, `partition` | the same, where the broker tells it |
//!
//! The labels are names an application chooses (destinations, consumers, scopes, queues) and
//! the reasons idem gives; never a key. The outbox's query reads its pending rows alone (an
//! index of migration 5), however many sent rows the relay keeps; the recovery tables hold
//! only what waits and the dead letters within their retention.

mod series;
mod watch;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use crate::admin::{DeadLetterAdmin, OutboxAdmin};
use crate::consume::Source;
use crate::metrics::{
    CONSUMER_LAG, CONSUMER_UNACKED, DEAD_LETTERS, OUTBOX_OLDEST_PENDING_AGE_SECONDS,
    OUTBOX_PENDING, PARKED_RETRIES,
};
use series::{Labels, Series};
use watch::Watch;

/// How often [`Gauges::run`] reads by default: 15 s, Prometheus' default scrape interval, so
/// each scrape sees values at most one interval old, while the queries run four times a
/// minute whatever the number of scrapers.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// Reads what waits (the outbox's backlog per destination, parked retries and open dead
/// letters per consumer, and the lag of each watched [`Source`]) and sets the gauges of
/// [`crate::metrics`] to it, every [`interval`](Gauges::interval) (default
/// [`DEFAULT_INTERVAL`], 15 s).
///
/// A watched source is borrowed, so run the gauges beside the consumer and close the source
/// after both ended. A read that fails (the database or a broker down) is logged and leaves its
/// gauges at their last values; the next round reads again.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem_runtime::consume::memory::MemoryQueue; // `idem::consume::memory::MemoryQueue`
/// use idem_runtime::gauges::Gauges; // `idem::gauges::Gauges`
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// let queue = MemoryQueue::named("orders");
/// let gauges = Gauges::new(pool.clone())
///     .interval(std::time::Duration::from_secs(30))
///     .lag_of(&queue);
/// // Beside the consumer: `tokio::join!(consumer.run(..., shutdown()), gauges.run(shutdown()))`.
/// gauges.run(std::future::ready(())).await; // one round, then the shutdown
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub struct Gauges<'s, DB: OutboxAdmin + DeadLetterAdmin> {
    pool: Pool<DB>,
    interval: Duration,
    sources: Vec<Watched<'s>>,
    outbox_pending: Series,
    outbox_age: Series,
    parked: Series,
    dead: Series,
}

/// A watched source and its two series.
struct Watched<'s> {
    source: Box<dyn Watch + 's>,
    lag: Series,
    unacked: Series,
}

impl<'s, DB: OutboxAdmin + DeadLetterAdmin> Gauges<'s, DB> {
    /// The gauges of the database in `pool`, watching no source yet.
    pub fn new(pool: Pool<DB>) -> Self {
        Gauges {
            pool,
            interval: DEFAULT_INTERVAL,
            sources: Vec::new(),
            outbox_pending: Series::new(OUTBOX_PENDING),
            outbox_age: Series::new(OUTBOX_OLDEST_PENDING_AGE_SECONDS),
            parked: Series::new(PARKED_RETRIES),
            dead: Series::new(DEAD_LETTERS),
        }
    }

    /// How often [`run`](Gauges::run) reads (default [`DEFAULT_INTERVAL`], 15 s; at least a
    /// millisecond).
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = every.max(Duration::from_millis(1));
        self
    }

    /// Also publishes `source`'s lag ([`Source::lag`]) as `idem_consumer_lag` and
    /// `idem_consumer_unacked`. Any adapter's `Source`, or a
    /// [`MemoryQueue`](crate::consume::memory::MemoryQueue); call once per source.
    pub fn lag_of<S: Source>(mut self, source: &'s S) -> Self {
        self.sources.push(Watched {
            source: Box::new(source),
            lag: Series::new(CONSUMER_LAG),
            unacked: Series::new(CONSUMER_UNACKED),
        });
        self
    }

    /// Reads everything once and sets the gauges. Each part (the outbox, the recovery tables,
    /// each source) is read on its own: one that fails keeps its gauges at their last values
    /// and is named in the error, and the others are set.
    pub async fn update(&mut self) -> Result<(), UpdateError> {
        let mut failed = Vec::new();
        if let Err(err) = self.update_outbox().await {
            failed.push(format!("the outbox: {err}"));
        }
        if let Err(err) = self.update_recovery().await {
            failed.push(format!("parked retries and dead letters: {err}"));
        }
        for watched in &mut self.sources {
            match watched.source.lag().await {
                Ok(lags) => {
                    let mut lag = Vec::new();
                    let mut unacked = Vec::new();
                    for one in lags {
                        let labels: Labels = vec![
                            ("broker", one.broker.to_string()),
                            ("source", one.source.clone()),
                            ("group", one.group.clone()),
                            ("partition", one.partition_label()),
                        ];
                        if let Some(n) = one.undelivered {
                            lag.push((labels.clone(), n as f64));
                        }
                        if let Some(n) = one.unacked {
                            unacked.push((labels, n as f64));
                        }
                    }
                    watched.lag.set(lag);
                    watched.unacked.set(unacked);
                }
                Err(err) => failed.push(format!("a source's lag: {err}")),
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(UpdateError { failed })
        }
    }

    async fn update_outbox(&mut self) -> Result<(), sqlx::Error> {
        let backlog = DB::outbox_backlog(&self.pool).await?;
        let now_ms = DB::now_ms(&self.pool).await?;
        let labels = |destination: &str| vec![("destination", destination.to_string())];
        self.outbox_pending.set(
            backlog
                .iter()
                .map(|b| (labels(&b.destination), b.pending as f64))
                .collect(),
        );
        self.outbox_age.set(
            backlog
                .iter()
                .map(|b| (labels(&b.destination), b.age_ms(now_ms) as f64 / 1000.0))
                .collect(),
        );
        Ok(())
    }

    async fn update_recovery(&mut self) -> Result<(), sqlx::Error> {
        let counts = DB::recovery_counts(&self.pool).await?;
        self.parked.set(
            counts
                .parked
                .into_iter()
                .map(|p| (vec![("consumer", p.consumer)], p.parked as f64))
                .collect(),
        );
        self.dead.set(
            counts
                .dead
                .into_iter()
                .map(|d| {
                    let labels = vec![
                        ("consumer", d.consumer),
                        ("scope", d.scope.unwrap_or_default()),
                        ("reason", d.reason),
                    ];
                    (labels, d.dead as f64)
                })
                .collect(),
        );
        Ok(())
    }

    /// Runs until `shutdown` completes: a round ([`update`](Gauges::update)) at once, then one
    /// every [`interval`](Gauges::interval) (a round that takes longer delays the next; rounds
    /// never overlap). A failed round is logged (a `tracing` warning) and the next one reads
    /// again. A round under way when `shutdown` completes is finished first.
    pub async fn run<F: Future<Output = ()>>(mut self, shutdown: F) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick completes at once.
        ticks.tick().await;
        loop {
            if let Err(err) = self.update().await {
                tracing::warn!(error = %err, "idem gauges: a read failed; its gauges keep their last values");
            }
            tokio::select! {
                biased;
                () = shutdown.as_mut() => break,
                _ = ticks.tick() => {}
            }
        }
    }
}

impl<DB: OutboxAdmin + DeadLetterAdmin> fmt::Debug for Gauges<'_, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gauges")
            .field("interval", &self.interval)
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

/// The parts a round of [`Gauges::update`] could not read (the others were set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateError {
    failed: Vec<String>,
}

impl UpdateError {
    /// What failed, one line each (`the outbox: …`, `a source's lag: …`).
    pub fn failed(&self) -> &[String] {
        &self.failed
    }
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idem gauges not read: {}", self.failed.join("; "))
    }
}

impl std::error::Error for UpdateError {}

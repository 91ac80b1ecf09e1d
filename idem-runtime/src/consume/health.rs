//! [`Health`]: whether a running consumer is ready (connected to its broker and its database,
//! taking work) and live (its loop making progress), each with the reason when not: what a
//! Kubernetes readiness and liveness probe, or an operator, asks.
//!
//! While [`Consumer::run`](super::Consumer::run) runs, a task of its own checks, every
//! [`health_every`](super::Consumer::health_every) interval (default 5 s), the database (a
//! ping on a pooled connection) and the broker (the source's [`Probe`]), both at once, each
//! bounded by the interval; [`Health::ready`] only reads the last result. [`Health::live`]
//! reads when the oldest batch in flight began its current attempt: a batch whose attempt runs
//! past [`stuck_after`](super::Consumer::stuck_after) (default twice the handler time-out)
//! makes the consumer not live. A batch waiting on the database (a store pause) starts a new
//! attempt after each pause: a database outage makes the consumer not ready, never not live, so
//! a liveness probe does not restart a process for what a restart cannot fix.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use sqlx::{Connection as _, Database, Pool};
use tokio::time::Instant;

use super::probe::{no_answer, Probe};

/// The default interval of the checks.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Why a consumer is not ready: the text of [`Display`](fmt::Display) is what a `/readyz`
/// endpoint answers with its 503.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotReady {
    /// [`Consumer::run`](super::Consumer::run) has not begun.
    NotStarted,
    /// The run has begun, and its first check has not finished.
    Starting,
    /// The last check could not reach the database, the broker, or both (each `Some` says
    /// what failed).
    Unreachable {
        /// Why the database check failed, if it did.
        database: Option<String>,
        /// Why the broker's probe failed, if it did.
        broker: Option<String>,
    },
    /// The run takes no more deliveries: its shutdown signal came (or its stream ended), and
    /// it is finishing what is in flight.
    Draining,
    /// The run has ended.
    Stopped,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NotStarted => f.write_str("not started: the consumer is not running yet"),
            NotReady::Starting => {
                f.write_str("starting: the consumer's first health check has not finished")
            }
            NotReady::Unreachable { database, broker } => {
                let mut parts = Vec::with_capacity(2);
                if let Some(why) = database {
                    parts.push(format!("database unreachable: {why}"));
                }
                if let Some(why) = broker {
                    parts.push(format!("broker unreachable: {why}"));
                }
                f.write_str(&parts.join("; "))
            }
            NotReady::Draining => {
                f.write_str("draining: the consumer takes no more deliveries (shutting down)")
            }
            NotReady::Stopped => f.write_str("stopped: the consumer's run has ended"),
        }
    }
}

impl std::error::Error for NotReady {}

/// Why a consumer is not live: the text of [`Display`](fmt::Display) is what a `/livez`
/// endpoint answers with its 503.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotLive {
    /// A batch's attempt has run for `running`, past the bound `bound`
    /// ([`stuck_after`](super::Consumer::stuck_after)): a handler that does not return, and
    /// that the handler time-out could not cancel (it blocks its thread).
    Stuck {
        /// How long the oldest batch in flight has been in its current attempt.
        running: Duration,
        /// The bound it is past.
        bound: Duration,
    },
    /// The run has ended: the consumer makes no more progress until it runs again.
    Stopped,
}

impl fmt::Display for NotLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotLive::Stuck { running, bound } => write!(
                f,
                "stuck: a batch has run for {:.1}s, past the bound of {:.1}s",
                running.as_secs_f64(),
                bound.as_secs_f64()
            ),
            NotLive::Stopped => f.write_str("stopped: the consumer's run has ended"),
        }
    }
}

impl std::error::Error for NotLive {}

/// A consumer's health: clone it freely (into an HTTP handler, say) before
/// [`run`](super::Consumer::run); reading it takes a lock for a moment and does no I/O.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use idem::consume::{memory::MemoryQueue, Consumer, NotReady};
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// let queue = MemoryQueue::new();
/// let consumer = Consumer::new(pool)
///     .health_of(&queue) // the broker's probe (a memory queue is always connected)
///     .health_every(Duration::from_secs(5))
///     .stuck_after(Duration::from_secs(60));
/// let health = consumer.health();
/// assert_eq!(health.ready(), Err(NotReady::NotStarted));
/// assert!(health.live().is_ok());
/// // `/readyz`: match health.ready() { Ok(()) => 200, Err(why) => (503, why.to_string()) }
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    status: RwLock<Status>,
    batches: Mutex<Batches>,
}

/// What the checks last found, and where the run is.
#[derive(Debug, Default)]
struct Status {
    phase: Phase,
    /// The last check's result (`None` until the run's first check finished).
    checked: Option<Checked>,
    /// Check rounds finished since the handle was made.
    rounds: u64,
    /// The bound of a batch's attempt, set when the run begins.
    bound: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    NotStarted,
    Running,
    Draining,
    Stopped,
}

/// One check round: what failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Checked {
    database: Option<String>,
    broker: Option<String>,
}

/// The batches in flight: when each began its current attempt.
#[derive(Debug, Default)]
struct Batches {
    next: u64,
    started: BTreeMap<u64, Instant>,
}

impl Health {
    /// `Ok` when the consumer is running and taking deliveries, and its last check reached
    /// both the database and the broker; else why not.
    pub fn ready(&self) -> Result<(), NotReady> {
        self.read(|status| readiness(status.phase, status.checked.as_ref()))
    }

    /// `Ok` unless a batch's attempt has run past the bound, or the run has ended; else why.
    /// Before the run begins the consumer counts as live (nothing is stuck).
    pub fn live(&self) -> Result<(), NotLive> {
        let (phase, bound) = self.read(|status| (status.phase, status.bound));
        let oldest = self.batches().oldest();
        let running = oldest.map(|began| Instant::now().saturating_duration_since(began));
        liveness(phase, running, bound)
    }

    /// How many check rounds have finished since this handle was made (the runs of a
    /// consumer and of its clones share one handle): each round checks the database and the
    /// broker once.
    pub fn checks(&self) -> u64 {
        self.read(|status| status.rounds)
    }

    /// Reads the status under its lock (no copy of it).
    fn read<T>(&self, f: impl FnOnce(&Status) -> T) -> T {
        // Nothing panics while holding the lock; a poisoned one still holds a whole value.
        match self.inner.status.read() {
            Ok(status) => f(&status),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    fn update(&self, change: impl FnOnce(&mut Status)) {
        let mut status = match self.inner.status.write() {
            Ok(status) => status,
            Err(poisoned) => poisoned.into_inner(),
        };
        change(&mut status);
    }

    fn batches(&self) -> MutexGuard<'_, Batches> {
        self.inner
            .batches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Batches {
    fn begin(&mut self, now: Instant) -> u64 {
        let id = self.next;
        self.next += 1;
        self.started.insert(id, now);
        id
    }

    fn oldest(&self) -> Option<Instant> {
        self.started.values().min().copied()
    }
}

/// Whether a consumer in `phase`, whose last check found `checked`, is ready.
fn readiness(phase: Phase, checked: Option<&Checked>) -> Result<(), NotReady> {
    match phase {
        Phase::NotStarted => Err(NotReady::NotStarted),
        Phase::Draining => Err(NotReady::Draining),
        Phase::Stopped => Err(NotReady::Stopped),
        Phase::Running => match checked {
            None => Err(NotReady::Starting),
            Some(Checked {
                database: None,
                broker: None,
            }) => Ok(()),
            Some(Checked { database, broker }) => Err(NotReady::Unreachable {
                database: database.clone(),
                broker: broker.clone(),
            }),
        },
    }
}

/// Whether a consumer in `phase`, whose oldest batch has been in its attempt for `running`
/// (`None`: no batch in flight), is live.
fn liveness(phase: Phase, running: Option<Duration>, bound: Duration) -> Result<(), NotLive> {
    if phase == Phase::Stopped {
        return Err(NotLive::Stopped);
    }
    match running {
        Some(running) if running > bound => Err(NotLive::Stuck { running, bound }),
        _ => Ok(()),
    }
}

/// The consumer's health settings and its handle.
#[derive(Debug, Clone)]
pub(crate) struct Monitor {
    pub(crate) health: Health,
    pub(crate) probe: Probe,
    pub(crate) every: Duration,
    pub(crate) stuck_after: Option<Duration>,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor {
            health: Health::default(),
            probe: Probe::connected(),
            every: DEFAULT_CHECK_INTERVAL,
            stuck_after: None,
        }
    }
}

impl Monitor {
    /// The run begins: the checks start on a task of their own until the returned guard is
    /// dropped (the run ended, or its future was dropped), which marks the run stopped.
    pub(crate) fn start<DB: Database>(&self, pool: &Pool<DB>, handler_timeout: Duration) -> Checks {
        let bound = self
            .stuck_after
            .unwrap_or_else(|| handler_timeout.saturating_mul(2));
        self.health.update(|status| {
            status.phase = Phase::Running;
            status.checked = None;
            status.bound = bound;
        });
        let task = tokio::spawn(check_loop(
            self.health.clone(),
            pool.clone(),
            self.probe.clone(),
            self.every,
        ));
        Checks {
            health: self.health.clone(),
            task: task.abort_handle(),
        }
    }

    /// The run takes no more deliveries.
    pub(crate) fn draining(&self) {
        self.health.update(|status| status.phase = Phase::Draining);
    }

    /// A batch begins its first attempt; it counts as in flight until the guard is dropped.
    pub(crate) fn batch(&self) -> Attempt {
        let id = self.health.batches().begin(Instant::now());
        Attempt {
            health: self.health.clone(),
            id,
        }
    }
}

/// The checks of a run, stopped when dropped.
pub(crate) struct Checks {
    health: Health,
    task: tokio::task::AbortHandle,
}

impl Drop for Checks {
    fn drop(&mut self) {
        self.task.abort();
        self.health.update(|status| status.phase = Phase::Stopped);
    }
}

/// A batch in flight (see [`Monitor::batch`]).
pub(crate) struct Attempt {
    health: Health,
    id: u64,
}

impl Attempt {
    /// The batch begins another attempt (after a store pause): its time starts again.
    pub(crate) fn again(&self) {
        if let Some(began) = self.health.batches().started.get_mut(&self.id) {
            *began = Instant::now();
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.health.batches().started.remove(&self.id);
    }
}

/// Every `every`: the database and the broker, at once, each bounded by `every`; the result
/// is recorded.
async fn check_loop<DB: Database>(health: Health, pool: Pool<DB>, probe: Probe, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let (database, broker) = tokio::join!(ping(&pool, every), probe.check(every));
        let checked = Checked {
            database: database.err(),
            broker: broker.err(),
        };
        if let Some(why) = &checked.database {
            tracing::warn!(reason = %why, "health: the database check failed");
        }
        if let Some(why) = &checked.broker {
            tracing::warn!(reason = %why, "health: the broker check failed");
        }
        health.update(|status| {
            status.checked = Some(checked);
            status.rounds += 1;
        });
    }
}

/// A ping on a connection of `pool` (a round trip to a database server), bounded by `timeout`.
async fn ping<DB: Database>(pool: &Pool<DB>, timeout: Duration) -> Result<(), String> {
    let ping = async {
        let mut conn = pool.acquire().await?;
        conn.ping().await
    };
    match tokio::time::timeout(timeout, ping).await {
        Ok(result) => result.map_err(|err| err.to_string()),
        Err(_) => Err(no_answer(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(database: Option<&str>, broker: Option<&str>) -> Checked {
        Checked {
            database: database.map(str::to_string),
            broker: broker.map(str::to_string),
        }
    }

    #[test]
    fn ready_only_while_running_with_both_checks_passed() {
        let ok = failed(None, None);
        assert_eq!(readiness(Phase::Running, Some(&ok)), Ok(()));
        assert_eq!(
            readiness(Phase::NotStarted, Some(&ok)),
            Err(NotReady::NotStarted)
        );
        assert_eq!(readiness(Phase::Running, None), Err(NotReady::Starting));
        assert_eq!(
            readiness(Phase::Draining, Some(&ok)),
            Err(NotReady::Draining)
        );
        assert_eq!(readiness(Phase::Stopped, Some(&ok)), Err(NotReady::Stopped));
        let both = failed(Some("refused"), Some("disconnected"));
        let why = readiness(Phase::Running, Some(&both)).unwrap_err();
        assert_eq!(
            why.to_string(),
            "database unreachable: refused; broker unreachable: disconnected"
        );
        let broker = failed(None, Some("disconnected"));
        assert_eq!(
            readiness(Phase::Running, Some(&broker)),
            Err(NotReady::Unreachable {
                database: None,
                broker: Some("disconnected".into())
            })
        );
    }

    #[test]
    fn live_unless_an_attempt_runs_past_the_bound_or_the_run_ended() {
        let bound = Duration::from_secs(10);
        assert_eq!(liveness(Phase::NotStarted, None, bound), Ok(()));
        assert_eq!(liveness(Phase::Running, None, bound), Ok(()));
        assert_eq!(liveness(Phase::Running, Some(bound), bound), Ok(()));
        let running = Duration::from_secs(11);
        let stuck = liveness(Phase::Draining, Some(running), bound).unwrap_err();
        assert_eq!(stuck, NotLive::Stuck { running, bound });
        assert_eq!(
            stuck.to_string(),
            "stuck: a batch has run for 11.0s, past the bound of 10.0s"
        );
        assert_eq!(liveness(Phase::Stopped, None, bound), Err(NotLive::Stopped));
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_attempt_decides_and_a_new_attempt_starts_its_time_again() {
        let monitor = Monitor {
            stuck_after: Some(Duration::from_secs(10)),
            ..Monitor::default()
        };
        let health = monitor.health.clone();
        health.update(|s| {
            s.phase = Phase::Running;
            s.bound = Duration::from_secs(10);
        });
        let first = monitor.batch();
        tokio::time::advance(Duration::from_secs(6)).await;
        let second = monitor.batch();
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            matches!(health.live(), Err(NotLive::Stuck { running, .. }) if running == Duration::from_secs(12))
        );
        first.again();
        assert_eq!(health.live(), Ok(()), "both attempts are 6 s old");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            matches!(health.live(), Err(NotLive::Stuck { running, .. }) if running == Duration::from_secs(11))
        );
        drop(second);
        assert_eq!(health.live(), Ok(()), "the one left is 5 s old");
        drop(first);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(health.live(), Ok(()), "nothing in flight");
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_does_not_answer_fails_within_its_timeout() {
        let silent = Probe::new(std::future::pending::<Result<(), String>>);
        let why = silent.check(Duration::from_millis(200)).await.unwrap_err();
        assert_eq!(why, "no answer within 200ms");
        let down = Probe::new(|| async { Err("connection closed") });
        let why = down.check(Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(why, "connection closed");
        assert_eq!(
            Probe::connected().check(Duration::from_secs(1)).await,
            Ok(())
        );
    }
}

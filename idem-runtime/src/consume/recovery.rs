//! [`Recovery`]: what a consumer does with a delivery that fails, beyond retrying it in place:
//! park it in the database for a durable retry later, and keep what gives up as a dead letter
//! in the database, for an operator to see and replay (`idem dead-letters`).

use std::time::Duration;

/// Where a consumer with [`Recovery`] keeps a delivery that gives up (poisoned, undecodable,
/// a bad key, a conflict, over `max_deliveries`, out of durable retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DeadLetters {
    /// In the database's `idem_dead_letters` **and** the broker's dead-letter place (the
    /// default: a consumer that had a dead-letter queue keeps it).
    #[default]
    Both,
    /// In the database only; the broker's delivery is acked once the row is committed.
    Database,
    /// In the broker's dead-letter place only, as without [`Recovery`].
    Broker,
}

impl DeadLetters {
    pub(crate) fn in_database(self) -> bool {
        matches!(self, DeadLetters::Both | DeadLetters::Database)
    }

    pub(crate) fn in_broker(self) -> bool {
        matches!(self, DeadLetters::Both | DeadLetters::Broker)
    }
}

/// Durable retries and dead letters in the database, for one consumer
/// ([`Consumer::recovery`](super::Consumer::recovery)).
///
/// With durable retries, a delivery whose handler fails is written to `idem_parked` with the
/// time it is due (exponential backoff with jitter), and only after that commit is the broker
/// delivery acked: the queue, stream or partition keeps flowing while it waits, and a restart
/// loses nothing. The consumer takes due rows (at most [`take`](Recovery::take) at once, each
/// held under a lease by one consumer) and runs them through the same handler; a row is deleted
/// once its run is decided (applied, duplicate, stale), and after
/// [`durable_retries`](Recovery::durable_retries)' `attempts` runs it becomes a dead letter.
///
/// ```
/// use std::time::Duration;
/// use idem::consume::{DeadLetters, Recovery};
///
/// let recovery = Recovery::new("billing")
///     .durable_retries(8, Duration::from_secs(1), Duration::from_secs(60))
///     .dead_letters(DeadLetters::Database);
/// assert_eq!(recovery.name(), "billing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub(crate) name: String,
    pub(crate) retries: Option<Backoff>,
    pub(crate) dead_letters: DeadLetters,
    pub(crate) take: u32,
    pub(crate) lease: Duration,
    pub(crate) poll: Duration,
}

/// The durable retries' schedule: how many runs in all, and the wait before each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) attempts: u32,
    pub(crate) first: Duration,
    pub(crate) max: Duration,
}

/// The longest consumer name, in bytes (it fits an index on every database).
pub const MAX_NAME_LEN: usize = 255;

impl Recovery {
    /// Recovery for the consumer called `name`: the consumers that share a name share their
    /// parked retries, and dead letters say which consumer kept them. Dead letters go to the
    /// database and the broker ([`DeadLetters::Both`]); failures are retried in place until
    /// [`durable_retries`](Recovery::durable_retries) is set.
    pub fn new(name: impl Into<String>) -> Self {
        Recovery {
            name: name.into(),
            retries: None,
            dead_letters: DeadLetters::Both,
            take: 100,
            lease: Duration::from_secs(120),
            poll: Duration::from_secs(1),
        }
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Durable retries: a failed delivery is parked in the database and run again after
    /// `first`, doubled per failure, at most `max` (each wait up to a fifth shorter, at random,
    /// so that many failures do not come back at once), `attempts` runs in all (the first, in
    /// place, included; at least 1); then it is a dead letter (reason `retries_exhausted`).
    /// A handler's own `max_attempts`, if lower, poisons it first.
    pub fn durable_retries(mut self, attempts: u32, first: Duration, max: Duration) -> Self {
        self.retries = Some(Backoff {
            attempts: attempts.max(1),
            first,
            max: max.max(first),
        });
        self
    }

    /// Where dead letters go (default [`DeadLetters::Both`]).
    pub fn dead_letters(mut self, place: DeadLetters) -> Self {
        self.dead_letters = place;
        self
    }

    /// At most `n` due retries are taken at once (at least 1; default 100, and never more than
    /// fit in the consumer's next batch).
    pub fn take(mut self, n: u32) -> Self {
        self.take = n.max(1);
        self
    }

    /// How long a taken retry is held by this consumer before another may take it (default
    /// 2 minutes): longer than the consumer's handler time-out, so that only a consumer that
    /// died gives a retry back this way.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the consumer looks for due retries when none was due (default 1 s); it looks
    /// again at once while it finds full takes.
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// Refuses an empty name or one over [`MAX_NAME_LEN`] bytes.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("the recovery's consumer name is empty".into());
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(format!(
                "the recovery's consumer name is {} bytes; at most {MAX_NAME_LEN} are allowed",
                self.name.len()
            ));
        }
        Ok(())
    }
}

impl Backoff {
    /// The wait before the run after `failures` failed runs: `first × 2^(failures − 1)`, at
    /// most `max`, less up to a fifth of it chosen by `jitter` (0.0 to 1.0).
    pub(crate) fn delay(&self, failures: u32, jitter: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        let full = self.first.saturating_mul(1 << doublings).min(self.max);
        full.mul_f64(1.0 - 0.2 * jitter.clamp(0.0, 1.0))
    }

    /// Whether a delivery that failed `failures` times has runs left.
    pub(crate) fn runs_left(&self, failures: u32) -> bool {
        failures < self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_wait_doubles_up_to_the_bound_and_jitter_only_shortens_it() {
        let backoff = Backoff {
            attempts: 5,
            first: S,
            max: 16 * S,
        };
        let waits: Vec<_> = (1..=7).map(|n| backoff.delay(n, 0.0)).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 16, 16].map(|s| s * S));
        assert_eq!(backoff.delay(3, 1.0), 4 * S * 4 / 5);
        assert!(backoff.delay(40, 0.5) <= 16 * S, "no overflow far out");
        assert!(backoff.runs_left(4) && !backoff.runs_left(5));
    }

    #[test]
    fn settings_and_their_checks() {
        let recovery = Recovery::new("billing").durable_retries(0, 2 * S, S);
        let backoff = recovery.retries.unwrap();
        assert_eq!((backoff.attempts, backoff.max), (1, 2 * S));
        assert!(recovery.check().is_ok());
        assert!(Recovery::new("").check().is_err());
        assert!(Recovery::new("x".repeat(256)).check().is_err());
        assert!(DeadLetters::Both.in_database() && DeadLetters::Both.in_broker());
        assert!(!DeadLetters::Database.in_broker() && !DeadLetters::Broker.in_database());
    }
}

//! [`Outcome`]: what happened to one delivery of a message.

/// What an idempotent handler did with one delivery.
///
/// ```
/// use idem::Outcome;
///
/// let outcome: Outcome<u32> = Outcome::Applied(3);
/// assert!(outcome.is_applied());
/// assert_eq!(outcome.applied(), Some(3));
/// assert_eq!(Outcome::<u32>::Stale { latest: 9 }.as_str(), "stale");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// The handler ran and its effect committed together with the record of this message.
    Applied(T),
    /// This message (same scope and key) was already applied, or carries the version already
    /// applied; the handler did not run and nothing was written.
    Duplicate,
    /// A newer version of the entity was already applied; the handler did not run.
    Stale {
        /// The version already applied to the entity.
        latest: i64,
    },
    /// Lease mode only: another delivery of this message holds an unexpired lease and may still
    /// be running. Nothing ran; deliver it again later (nack or requeue with a delay).
    InProgress,
    /// `replay = true`: this message was applied before; the handler did not run, and this is
    /// the value its first run returned (stored as JSON with the record).
    Replayed(T),
    /// `max_attempts = N`: the handler failed `attempts` (≥ N) times on this message; it did
    /// not run again. Dead-letter it; `idem clear-attempts` (or a success) clears the count.
    Poisoned {
        /// The failed attempts counted.
        attempts: u32,
    },
}

impl<T> Outcome<T> {
    /// Whether the handler ran and committed.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }

    /// The handler's value, if it ran.
    pub fn applied(self) -> Option<T> {
        match self {
            Outcome::Applied(value) => Some(value),
            _ => None,
        }
    }

    /// The handler's value: the one it returned now (`Applied`) or the first time
    /// (`Replayed`).
    pub fn value(self) -> Option<T> {
        match self {
            Outcome::Applied(value) | Outcome::Replayed(value) => Some(value),
            _ => None,
        }
    }

    /// A short lowercase name: `"applied"`, `"duplicate"`, `"stale"`, `"in_progress"`,
    /// `"replayed"` or `"poisoned"` (for logs and metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Applied(_) => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale { .. } => "stale",
            Outcome::InProgress => "in_progress",
            Outcome::Replayed(_) => "replayed",
            Outcome::Poisoned { .. } => "poisoned",
        }
    }
}

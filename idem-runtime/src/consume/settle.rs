//! How each delivery settles with its broker, decided once for every adapter from what the
//! handler returned (the table in the crate's docs). Adapters only translate a [`Settle`].

use std::time::Duration;

use crate::error::Error;
use crate::outcome::Outcome;

/// What to tell the broker about one delivery, after its transaction committed or rolled back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// Done: applied now, or before (duplicate, stale, replayed). Remove it from the broker.
    Ack,
    /// Deliver it again after `delay` (a handler failure with backoff, a lease held elsewhere,
    /// a store outage). Adapters that cannot delay hold the delivery for `delay` first.
    Requeue {
        /// How long to wait before the redelivery.
        delay: Duration,
    },
    /// Never deliver it again here: publish it to the dead-letter destination (with `reason`),
    /// and remove the original only once that publish is confirmed.
    DeadLetter {
        /// Why.
        reason: DeadLetterReason,
    },
}

/// Why a delivery was dead-lettered; adapters put it in the dead letter's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The payload could not be decoded into the handler's message type.
    Undecodable(String),
    /// The message's key, entity or version cannot be stored (`idem::Error::Key`).
    BadKey(String),
    /// The broker delivered it more times than the consumer's `max_deliveries`.
    TooManyDeliveries {
        /// The broker's delivery count.
        deliveries: u32,
    },
    /// The handler failed `max_attempts` times (`Outcome::Poisoned`).
    Poisoned {
        /// The failed attempts idem counted.
        attempts: u32,
    },
    /// Its key was applied before with another payload (`idem::Error::Conflict`).
    Conflict(String),
    /// `replay = true` cannot keep or read its value (`idem::Error::Replay`): it would fail
    /// the same way every time.
    Replay(String),
}

impl DeadLetterReason {
    /// A short stable name for headers and metrics: `undecodable`, `bad_key`,
    /// `too_many_deliveries`, `poisoned`, `conflict`, `replay`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DeadLetterReason::Undecodable(_) => "undecodable",
            DeadLetterReason::BadKey(_) => "bad_key",
            DeadLetterReason::TooManyDeliveries { .. } => "too_many_deliveries",
            DeadLetterReason::Poisoned { .. } => "poisoned",
            DeadLetterReason::Conflict(_) => "conflict",
            DeadLetterReason::Replay(_) => "replay",
        }
    }
}

impl DeadLetterReason {
    /// What went wrong, without the reason's name: the decoder's or the key's error, or the
    /// counts (a dead letter in the database keeps it as its error, beside the reason).
    ///
    /// ```
    /// use idem::consume::DeadLetterReason;
    /// let reason = DeadLetterReason::Undecodable("expected value at line 1 column 1".into());
    /// assert_eq!(reason.detail(), "expected value at line 1 column 1");
    /// ```
    pub fn detail(&self) -> String {
        match self {
            DeadLetterReason::Undecodable(why)
            | DeadLetterReason::BadKey(why)
            | DeadLetterReason::Conflict(why)
            | DeadLetterReason::Replay(why) => why.clone(),
            other => other.to_string(),
        }
    }
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetterReason::Undecodable(why) => write!(f, "undecodable payload: {why}"),
            DeadLetterReason::BadKey(why) => write!(f, "bad key: {why}"),
            DeadLetterReason::TooManyDeliveries { deliveries } => {
                write!(
                    f,
                    "delivered {deliveries} times, over the consumer's max_deliveries"
                )
            }
            DeadLetterReason::Poisoned { attempts } => {
                write!(f, "poisoned: the handler failed {attempts} times")
            }
            DeadLetterReason::Conflict(why) => write!(f, "conflict: {why}"),
            DeadLetterReason::Replay(why) => write!(f, "replay: {why}"),
        }
    }
}

/// What a handler's result means for the loop: settle it so, and how to count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Settle at once.
    Settle(Settle, Counted),
    /// The store failed: pause the loop, then requeue; never counts as an attempt.
    StoreDown,
}

/// Which counter a settled delivery adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Counted {
    Applied,
    Duplicate,
    Replayed,
    Stale,
    InProgress,
    Failed,
    DeadLettered,
    /// Put back at shutdown, untried.
    Requeued,
}

impl Counted {
    /// The `outcome` label of `idem_consumer_settled_total`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Counted::Applied => "applied",
            Counted::Duplicate => "duplicate",
            Counted::Replayed => "replayed",
            Counted::Stale => "stale",
            Counted::InProgress => "in_progress",
            Counted::Failed => "failed",
            Counted::DeadLettered => "dead_lettered",
            Counted::Requeued => "requeued",
        }
    }
}

/// The settlement of a handler's result. `retry_delay` is the backoff for a handler failure
/// and `in_progress_delay` the wait before a message whose lease is held elsewhere comes back.
pub(crate) fn verdict<T, E: std::fmt::Display>(
    result: &Result<Outcome<T>, Error<E>>,
    retry_delay: Duration,
    in_progress_delay: Duration,
) -> Verdict {
    use Counted as C;
    let requeue = |delay, counted| Verdict::Settle(Settle::Requeue { delay }, counted);
    let dead = |reason| Verdict::Settle(Settle::DeadLetter { reason }, C::DeadLettered);
    match result {
        Ok(Outcome::Applied(_)) => Verdict::Settle(Settle::Ack, C::Applied),
        Ok(Outcome::Duplicate) => Verdict::Settle(Settle::Ack, C::Duplicate),
        Ok(Outcome::Stale { .. }) => Verdict::Settle(Settle::Ack, C::Stale),
        Ok(Outcome::Replayed(_)) => Verdict::Settle(Settle::Ack, C::Replayed),
        Ok(Outcome::InProgress) => requeue(in_progress_delay, C::InProgress),
        Ok(Outcome::Poisoned { attempts }) => dead(DeadLetterReason::Poisoned {
            attempts: *attempts,
        }),
        Err(Error::Handler(_)) | Err(Error::LeaseLost) => requeue(retry_delay, C::Failed),
        // Internal to a batch's first pass or to replay; never a delivery's final result.
        Err(Error::Deferred) | Err(Error::Stored { .. }) => requeue(retry_delay, C::Failed),
        Err(Error::Key(problem)) => dead(DeadLetterReason::BadKey(problem.to_string())),
        Err(err @ Error::Conflict { .. }) => dead(DeadLetterReason::Conflict(err.to_string())),
        Err(err @ Error::Replay { .. }) => dead(DeadLetterReason::Replay(err.to_string())),
        Err(Error::Store(_)) => Verdict::StoreDown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{KeyError, KeyPart, KeyProblem};

    const RETRY: Duration = Duration::from_millis(10);
    const LEASE: Duration = Duration::from_millis(20);

    fn of(result: Result<Outcome<()>, Error<String>>) -> Verdict {
        verdict(&result, RETRY, LEASE)
    }

    #[test]
    fn poison_and_conflicts_are_dead_lettered() {
        assert!(matches!(
            of(Ok(Outcome::Poisoned { attempts: 5 })),
            Verdict::Settle(
                Settle::DeadLetter {
                    reason: DeadLetterReason::Poisoned { attempts: 5 }
                },
                Counted::DeadLettered
            )
        ));
        let conflict = Error::Conflict {
            scope: "s",
            stored: "aa".into(),
            given: "bb".into(),
        };
        assert!(matches!(
            of(Err(conflict)),
            Verdict::Settle(
                Settle::DeadLetter {
                    reason: DeadLetterReason::Conflict(_)
                },
                _
            )
        ));
    }

    #[test]
    fn done_messages_are_acked() {
        for done in [
            Outcome::Applied(()),
            Outcome::Duplicate,
            Outcome::Stale { latest: 3 },
            Outcome::Replayed(()),
        ] {
            assert!(matches!(of(Ok(done)), Verdict::Settle(Settle::Ack, _)));
        }
    }

    #[test]
    fn failures_and_leases_held_elsewhere_come_back_later() {
        assert_eq!(
            of(Err(Error::Handler("boom".into()))),
            Verdict::Settle(Settle::Requeue { delay: RETRY }, Counted::Failed)
        );
        assert_eq!(
            of(Ok(Outcome::InProgress)),
            Verdict::Settle(Settle::Requeue { delay: LEASE }, Counted::InProgress)
        );
    }

    #[test]
    fn a_bad_key_is_dead_lettered_and_a_store_error_pauses() {
        let key = KeyError::new("s", KeyPart::Key, KeyProblem::Empty);
        assert!(matches!(
            of(Err(Error::Key(key))),
            Verdict::Settle(
                Settle::DeadLetter {
                    reason: DeadLetterReason::BadKey(_)
                },
                Counted::DeadLettered
            )
        ));
        assert_eq!(
            of(Err(Error::Store(sqlx::Error::PoolTimedOut))),
            Verdict::StoreDown
        );
    }
}

//! Retrying a delivery whose failure was transient: a serialization failure, a deadlock, a
//! dropped connection, a busy database.

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::outcome::Outcome;

/// An error that may be worth another attempt. Implemented for `sqlx::Error` and
/// [`idem::Error`](Error); implement it for a handler's own error type to let [`retry`] look
/// inside it.
///
/// ```
/// use idem::Transient;
/// assert!(sqlx::Error::PoolTimedOut.is_transient());
/// assert!(!sqlx::Error::RowNotFound.is_transient());
/// ```
pub trait Transient {
    /// Whether the same call may succeed if made again.
    fn is_transient(&self) -> bool;
}

impl Transient for sqlx::Error {
    /// Asks the backend the error came from: see [`store::is_transient`](crate::store::is_transient).
    fn is_transient(&self) -> bool {
        crate::store::is_transient(self)
    }
}

impl<E: Transient> Transient for Error<E> {
    fn is_transient(&self) -> bool {
        match self {
            Error::Handler(e) => e.is_transient(),
            Error::Store(e) => e.is_transient(),
            Error::Key(_)
            | Error::LeaseLost
            | Error::Conflict { .. }
            | Error::Replay { .. }
            | Error::Stored { .. }
            | Error::Deferred => false,
        }
    }
}

/// How often and how patiently [`retry`] tries: exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The wait after the first failure; it doubles after each one.
    pub first_delay: Duration,
    /// The longest wait.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `n + 1` (after `n` failures), with up to 50% jitter so that
    /// workers that failed together do not retry together.
    fn delay(&self, failures: u32) -> Duration {
        let base = self
            .first_delay
            .saturating_mul(1 << failures.saturating_sub(1).min(20))
            .min(self.max_delay);
        let jitter = crate::claim::random_u64() % 1_000;
        base.mul_f64(0.5 + jitter as f64 / 2_000.0)
    }
}

/// Calls `call` (a handler given a pool, so each attempt has a transaction of its own) until
/// it succeeds, fails for a reason that is not [`Transient`], or `policy.attempts` run out.
/// Safe because a handler is idempotent: an attempt whose commit went through before its
/// error reached us returns `Duplicate` the next time.
///
/// Do not retry a handler given the caller's transaction this way: after such an error the
/// caller's transaction is itself aborted, and the whole of it must be retried.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem::{retry, Error, Outcome, RetryPolicy};
/// let mut calls = 0;
/// let result: Result<Outcome<()>, Error<sqlx::Error>> = retry(RetryPolicy::default(), || {
///     calls += 1;
///     let attempt = calls;
///     async move {
///         if attempt < 3 { Err(Error::Store(sqlx::Error::PoolTimedOut)) } else { Ok(Outcome::Applied(())) }
///     }
/// })
/// .await;
/// assert_eq!(result.unwrap(), Outcome::Applied(()));
/// assert_eq!(calls, 3);
/// # });
/// ```
pub async fn retry<T, E, F, Fut>(policy: RetryPolicy, mut call: F) -> Result<Outcome<T>, Error<E>>
where
    E: Transient,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let mut failures = 0;
    loop {
        // With metrics, the attempt also tells the scope of the handler it ran, for the label.
        #[cfg(feature = "metrics")]
        let (result, scope) = crate::metrics::attempt(call()).await;
        #[cfg(not(feature = "metrics"))]
        let result = call().await;
        match result {
            Err(err) if err.is_transient() && failures + 1 < policy.attempts.max(1) => {
                failures += 1;
                #[cfg(feature = "metrics")]
                crate::metrics::retried(
                    scope,
                    if matches!(err, Error::Handler(_)) {
                        "handler"
                    } else {
                        "store"
                    },
                );
                tracing::debug!(
                    attempt = failures,
                    "transient failure; retrying the delivery"
                );
                tokio::time::sleep(policy.delay(failures)).await;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_max_with_jitter() {
        let policy = RetryPolicy {
            attempts: 10,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
        };
        let first = policy.delay(1);
        assert!(
            first >= Duration::from_millis(50) && first <= Duration::from_millis(100),
            "{first:?}"
        );
        let second = policy.delay(2);
        assert!(
            second >= Duration::from_millis(100) && second <= Duration::from_millis(200),
            "{second:?}"
        );
        assert!(policy.delay(9) <= Duration::from_millis(350));
    }

    #[tokio::test]
    async fn gives_up_on_errors_that_are_not_transient_or_after_the_last_attempt() {
        let mut calls = 0;
        let policy = RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
        };
        let result: Result<Outcome<()>, Error<sqlx::Error>> = retry(policy, || {
            calls += 1;
            async { Err(Error::Handler(sqlx::Error::RowNotFound)) }
        })
        .await;
        assert!(matches!(
            result,
            Err(Error::Handler(sqlx::Error::RowNotFound))
        ));
        assert_eq!(calls, 1);
        let mut calls = 0;
        let result: Result<Outcome<()>, Error<sqlx::Error>> = retry(policy, || {
            calls += 1;
            async { Err(Error::Handler(sqlx::Error::PoolTimedOut)) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 3);
    }
}

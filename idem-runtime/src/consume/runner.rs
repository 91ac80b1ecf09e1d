//! How the consumer runs a group of messages: as one [`batch`](crate::batch), or one at a time
//! on a pool.
//!
//! These are types with an `async fn`, not async closures: the future of an async closure that
//! borrows the consumer holds that borrow under a lifetime the compiler cannot prove `Send`
//! for every instance of, so a loop built on one could not be `tokio::spawn`ed.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use sqlx::Pool;

use crate::batch::{batch_with, Batch, Handler, Results};
use crate::claim::{watching, Seen};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::Store;

use super::recovering::Recovering;

/// A decoded message, and what its claim noted if it failed while the consumer was watching
/// (recovery on): which handler and key, and the error.
pub(crate) struct Tracked<M> {
    pub(crate) message: M,
    seen: Mutex<Option<Seen>>,
    /// A parked retry's row and the token it is held with.
    parked: Option<(i64, i64)>,
    /// Set when the batch that decided it deleted its parked row in its own transaction, just
    /// before committing (read only once that commit succeeded: the delivery is then acked).
    unparked: AtomicBool,
}

impl<M> Tracked<M> {
    pub(crate) fn new(message: M, parked: Option<(i64, i64)>) -> Self {
        Tracked {
            message,
            seen: Mutex::new(None),
            parked,
            unparked: AtomicBool::new(false),
        }
    }

    /// Whether its parked row was deleted in the transaction that decided it.
    pub(crate) fn unparked(&self) -> bool {
        self.unparked.load(Ordering::Relaxed)
    }

    /// What the last run noted, taken out.
    pub(crate) fn seen(&self) -> Option<Seen> {
        self.seen.lock().map_or(None, |mut seen| seen.take())
    }

    /// Runs `work` on this message; when `watch`, keeps what a failure inside noted.
    async fn run<F: Future>(&self, watch: bool, work: F) -> F::Output {
        if !watch {
            return work.await;
        }
        let (output, seen) = watching(work).await;
        if seen.is_some() {
            if let Ok(mut slot) = self.seen.lock() {
                *slot = seen;
            }
        }
        output
    }
}

/// Runs one group of decoded messages.
pub(crate) trait Runner<M, T, E> {
    /// Each message's result, in order; `Err` when the group's transaction could not be made.
    async fn run(&self, messages: &[Tracked<M>]) -> Results<T, E>;
}

/// The group in one transaction, through [`batch`](crate::batch) (`Consumer::run`).
pub(crate) struct InBatch<'a, DB: Store, H> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) handler: H,
    /// The consumer's recovery, when on: failures are watched, and the parked retries a batch
    /// decides are deleted in its transaction.
    pub(crate) recovery: Option<&'a Recovering<DB>>,
}

/// The consumer's closure, called on each tracked message's own message.
struct OnTracked<'a, DB: Store, H> {
    handler: &'a H,
    recovery: Option<&'a Recovering<DB>>,
}

impl<DB, M, T, E, H> Handler<DB, Tracked<M>, T, E> for OnTracked<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    fn call<'a>(
        &'a mut self,
        batch: &'a mut Batch<DB>,
        tracked: &'a Tracked<M>,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + 'a {
        let watch = self.recovery.is_some();
        tracked.run(watch, (self.handler)(batch, &tracked.message))
    }

    /// Deletes the parked row of each retry the batch decided (applied, duplicate, stale,
    /// replayed), in the batch's transaction: the retry's effect and the end of its row commit
    /// together.
    async fn before_commit(
        &mut self,
        conn: &mut DB::Connection,
        messages: &[Tracked<M>],
        results: &[Result<Outcome<T>, Error<E>>],
    ) -> Result<(), sqlx::Error> {
        let Some(recovery) = self.recovery else {
            return Ok(());
        };
        for (tracked, result) in messages.iter().zip(results) {
            let Some((id, token)) = tracked.parked else {
                continue;
            };
            if decided(result) {
                recovery.ops.unpark_in(conn, id, token).await?;
                tracked.unparked.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Whether a result ends a parked retry: its message was applied now or before.
fn decided<T, E>(result: &Result<Outcome<T>, Error<E>>) -> bool {
    matches!(
        result,
        Ok(Outcome::Applied(_) | Outcome::Duplicate | Outcome::Stale { .. } | Outcome::Replayed(_))
    )
}

impl<DB, H, M, T, E> Runner<M, T, E> for InBatch<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    async fn run(&self, messages: &[Tracked<M>]) -> Results<T, E> {
        // A run before this one (rolled back by a store error) may have marked some.
        for tracked in messages {
            tracked.unparked.store(false, Ordering::Relaxed);
        }
        let handler = OnTracked {
            handler: &self.handler,
            recovery: self.recovery,
        };
        batch_with(self.pool, messages, handler).await
    }
}

/// Each message alone, its handler given the pool (`Consumer::run_each`, lease mode).
pub(crate) struct EachAlone<'a, DB: Store, H> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) handler: H,
    pub(crate) watch: bool,
}

impl<DB, H, M, T, E> Runner<M, T, E> for EachAlone<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&Pool<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    async fn run(&self, messages: &[Tracked<M>]) -> Results<T, E> {
        let mut results = Vec::with_capacity(messages.len());
        for tracked in messages {
            let work = (self.handler)(self.pool, &tracked.message);
            results.push(tracked.run(self.watch, work).await);
        }
        Ok(results)
    }
}

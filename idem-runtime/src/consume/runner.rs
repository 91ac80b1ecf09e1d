//! How the consumer runs a group of messages: as one [`batch`](crate::batch), or one at a time
//! on a pool.
//!
//! These are types with an `async fn`, not async closures: the future of an async closure that
//! borrows the consumer holds that borrow under a lifetime the compiler cannot prove `Send`
//! for every instance of, so a loop built on one could not be `tokio::spawn`ed.

use std::future::Future;
use std::sync::Mutex;

use sqlx::Pool;

use crate::batch::{batch_with, Batch, Handler, Results};
use crate::claim::{watching, Seen};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::Store;

/// A decoded message, and what its claim noted if it failed while the consumer was watching
/// (recovery on): which handler and key, and the error.
pub(crate) struct Tracked<M> {
    pub(crate) message: M,
    seen: Mutex<Option<Seen>>,
}

impl<M> Tracked<M> {
    pub(crate) fn new(message: M) -> Self {
        Tracked {
            message,
            seen: Mutex::new(None),
        }
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
    pub(crate) watch: bool,
}

/// The consumer's closure, called on each tracked message's own message.
struct OnTracked<'a, H> {
    handler: &'a H,
    watch: bool,
}

impl<DB, M, T, E, H> Handler<DB, Tracked<M>, T, E> for OnTracked<'_, H>
where
    DB: Store,
    H: AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    fn call<'a>(
        &'a mut self,
        batch: &'a mut Batch<DB>,
        tracked: &'a Tracked<M>,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + 'a {
        tracked.run(self.watch, (self.handler)(batch, &tracked.message))
    }
}

impl<DB, H, M, T, E> Runner<M, T, E> for InBatch<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    async fn run(&self, messages: &[Tracked<M>]) -> Results<T, E> {
        let handler = OnTracked {
            handler: &self.handler,
            watch: self.watch,
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

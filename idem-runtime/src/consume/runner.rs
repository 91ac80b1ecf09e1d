//! How the consumer runs a group of messages: as one [`batch`](crate::batch), or one at a time
//! on a pool.
//!
//! These are types with an `async fn`, not async closures: the future of an async closure that
//! borrows the consumer holds that borrow under a lifetime the compiler cannot prove `Send`
//! for every instance of, so a loop built on one could not be `tokio::spawn`ed.

use sqlx::Pool;

use crate::batch::{batch_with, Batch, Results, Shared};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::Store;

/// Runs one group of decoded messages.
pub(crate) trait Runner<M, T, E> {
    /// Each message's result, in order; `Err` when the group's transaction could not be made.
    async fn run(&self, messages: &[M]) -> Results<T, E>;
}

/// The group in one transaction, through [`batch`](crate::batch) (`Consumer::run`).
pub(crate) struct InBatch<'a, DB: Store, H> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) handler: H,
}

impl<DB, H, M, T, E> Runner<M, T, E> for InBatch<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    async fn run(&self, messages: &[M]) -> Results<T, E> {
        batch_with(self.pool, messages, Shared(&self.handler)).await
    }
}

/// Each message alone, its handler given the pool (`Consumer::run_each`, lease mode).
pub(crate) struct EachAlone<'a, DB: Store, H> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) handler: H,
}

impl<DB, H, M, T, E> Runner<M, T, E> for EachAlone<'_, DB, H>
where
    DB: Store,
    H: AsyncFn(&Pool<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    async fn run(&self, messages: &[M]) -> Results<T, E> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push((self.handler)(self.pool, message).await);
        }
        Ok(results)
    }
}

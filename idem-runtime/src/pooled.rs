//! Connections and transactions taken from a pool on a delivery's path, behind a box.
//!
//! sqlx's `acquire` may open a connection, and that future's type is about 80 layout levels
//! deep (MySQL's handshake on a socket, under the pool's timeouts). Awaited inline, those levels
//! add to every future that contains it: the handler's, the batch's and the caller's own. A
//! MySQL batch in a release build reached 114 of the compiler's default `recursion_limit` (128)
//! that way, through a failure path it never took (a lease given back). Behind a box the depth
//! stops at the pointer, for one allocation beside a pool acquire.
//!
//! The size stops there too. `pool.begin()`'s future is 8.7 KB on PostgreSQL, and a future that
//! holds it inline is copied whole wherever it is moved or boxed: the batch's claim, boxed once
//! a message, was (BENCHMARKS.md, "The copies").

use futures_core::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool, Transaction};

/// `pool.acquire()`, boxed (see the module's documentation).
pub(crate) fn acquire<DB: Database>(
    pool: &Pool<DB>,
) -> BoxFuture<'static, Result<PoolConnection<DB>, sqlx::Error>> {
    Box::pin(pool.acquire())
}

/// `pool.begin()`, boxed (see the module's documentation).
pub(crate) fn begin<DB: Database>(
    pool: &Pool<DB>,
) -> BoxFuture<'_, Result<Transaction<'static, DB>, sqlx::Error>> {
    Box::pin(pool.begin())
}

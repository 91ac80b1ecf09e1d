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
//! a message, was (docs/design/performance.md#futures-moved-whole). The boxes here are
//! allocated before their
//! futures are made ([`in_place`]), so that sqlx's futures are written into them, not copied.

use futures_core::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool, Transaction};

/// `pool.acquire()`, boxed (see the module's documentation).
pub(crate) fn acquire<DB: Database>(
    pool: &Pool<DB>,
) -> BoxFuture<'static, Result<PoolConnection<DB>, sqlx::Error>> {
    in_place(|| pool.acquire())
}

/// `pool.begin()`, boxed (see the module's documentation).
pub(crate) fn begin<DB: Database>(
    pool: &Pool<DB>,
) -> BoxFuture<'_, Result<Transaction<'static, DB>, sqlx::Error>> {
    in_place(|| pool.begin())
}

/// `make`'s future in a box allocated before the future is made, so that the optimizer writes
/// it there instead of copying it from the stack (a future is as large as its largest state,
/// however little of it is set when it is made). `Box::pin(make())` allocates after.
pub(crate) fn in_place<'a, F>(make: impl FnOnce() -> F) -> BoxFuture<'a, F::Output>
where
    F: std::future::Future + Send + 'a,
{
    let boxed: Box<F> = Box::write(Box::new_uninit(), make());
    Box::into_pin(boxed)
}

//! Where a handler's transaction comes from ([`Transact`]), how it claims the delivery there, and
//! the transaction the body then writes through ([`Held`]).

use std::ops::{Deref, DerefMut};

use futures_core::future::BoxFuture;
use sqlx::{Pool, Transaction};
use sqlx_core::transaction::TransactionManager as _;

use crate::store::Store;

use super::builder::Claim;
use super::decide::{decide, Decision, Prefetched, Skip};
use super::kept::Kept;

/// Whatever can open the transaction of a handler and claim a delivery in it: a pool (`&pool`:
/// a new transaction that the handler commits), an open transaction (`&mut tx`: a savepoint
/// inside it, which the caller commits), a connection (`&mut conn`, `&mut *conn`), or a
/// [`Batch`](crate::Batch) (`idem::batch` passes it).
///
/// `'c` is how long the source is borrowed; `'t` the lifetime of the transaction the body
/// writes through.
///
/// ```
/// fn accepts<'c, 't>(_: impl idem::Transact<'c, 't, idem::sqlx::Sqlite>) {}
/// # #[cfg(feature = "sqlite")]
/// async fn demo(pool: &sqlx::SqlitePool) -> Result<(), sqlx::Error> {
///     accepts(pool);
///     let mut tx = pool.begin().await?;
///     accepts(&mut tx);
///     accepts(&mut *tx);
///     let mut conn = pool.acquire().await?;
///     accepts(&mut conn);
///     accepts(&mut *conn);
///     Ok(())
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a transaction for an idempotent handler",
    label = "expected a pool or an open transaction",
    note = "pass `&pool` (idem commits a new transaction) or `&mut tx` (idem adds a savepoint; you commit)"
)]
pub trait Transact<'c, 't, DB: Store>: Send {
    /// Opens the delivery's transaction and claims `claim` in it. Implemented by idem only.
    ///
    /// A boxed future, not `impl Future`: an opaque type here would have to prove the
    /// well-formedness of [`Claimed`] (which needs `'t: 'c`) and, with that bound, the futures
    /// of generated handlers fail their `Send` check (rust-lang/rust#100013).
    #[doc(hidden)]
    fn claim<'a>(
        self,
        claim: &'a Claim<DB>,
    ) -> BoxFuture<'a, Result<Claimed<'c, 't, DB>, sqlx::Error>>
    where
        Self: 'a,
        'c: 'a,
        't: 'a;

    /// A batch's first pass: keeps `claim` and returns `None`, and the handler returns at once
    /// (generated handlers ask through [`Claim::gather_in`], before the delivery's future is
    /// made). Every other source gives the claim back. Implemented by idem only.
    #[doc(hidden)]
    fn gather(&mut self, claim: Claim<DB>) -> Option<Claim<DB>> {
        Some(claim)
    }

    /// A batch's second pass: the claim its statements already decided, with no statement
    /// left to send, so no future and no box. Every other source, and a claim that still
    /// needs a statement, gives the source back for [`claim`](Transact::claim). Implemented by
    /// idem only.
    #[doc(hidden)]
    fn settle(self, _claim: &Claim<DB>) -> Result<Claimed<'c, 't, DB>, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

/// A [`Transact`] that can also open transactions of its own, as a handler with
/// `max_attempts = N` needs: it counts each failure in a short transaction after the body's
/// rolled back, which a caller's open transaction cannot give (the count would roll back with
/// it, or on SQLite wait for it). A pool (`&pool`) or a [`Batch`](crate::Batch).
#[diagnostic::on_unimplemented(
    message = "a handler with `max_attempts` needs a pool, not `{Self}`",
    label = "expected `&pool` or a batch",
    note = "`max_attempts` counts each failure in a transaction of its own, after the body's rolled back: pass `&pool`, or drop `max_attempts` to run inside your transaction"
)]
pub trait PooledTransact<'c, 't, DB: Store>: Transact<'c, 't, DB> {
    /// The pool failures are counted on.
    #[doc(hidden)]
    fn pool(&self) -> Pool<DB>;
}

impl<'c, DB: Store> PooledTransact<'c, 'c, DB> for &'c Pool<DB> {
    fn pool(&self) -> Pool<DB> {
        Pool::clone(self)
    }
}

/// What a `mode = "lease"` handler takes: a pool (`&pool`), and nothing else.
///
/// A lease is worth having only if it commits before the body runs, on a connection of its own,
/// so that other consumers see the message in progress at once instead of waiting on a row
/// lock. Inside a caller's open transaction it could not: committed there, it would be seen only
/// when the caller commits (after the body's external effect), and a caller's rollback would
/// take it back with the effect already made. So lease mode inside a caller's transaction is a
/// compile error; run such a handler on the pool, or drop `mode = "lease"` to compose with the
/// caller's transaction (the claim then waits on the first delivery's row lock).
#[diagnostic::on_unimplemented(
    message = "a `mode = \"lease\"` handler needs a pool, not `{Self}`",
    label = "expected `&pool`",
    note = "the lease commits on a connection of its own before the body runs, so that other consumers see the message in progress; inside your transaction it could not commit on its own: pass `&pool`, or drop `mode = \"lease\"` to run inside your transaction"
)]
pub trait LeaseTransact<'c, DB: Store>: Send {
    /// The pool the lease and the body's transaction are taken from.
    #[doc(hidden)]
    fn lease_pool(self) -> &'c Pool<DB>;
}

impl<'c, DB: Store> LeaseTransact<'c, DB> for &'c Pool<DB> {
    fn lease_pool(self) -> &'c Pool<DB> {
        self
    }
}

/// What a [`Transact`] made of a claim; [`Claim::begin`] turns it into a [`Held`].
#[doc(hidden)]
pub enum Claimed<'c, 't, DB: Store> {
    /// Claimed in this transaction of its own: run the body.
    Own(Transaction<'t, DB>),
    /// Claimed in a batch's transaction: run the body there.
    Batch {
        /// The batch's transaction.
        tx: &'c mut Transaction<'static, DB>,
        /// Set when the body fails.
        failed: &'c mut bool,
        /// Where an applied delivery leaves its stamp for the batch to write.
        kept: &'c mut Kept<DB>,
        /// Gives the transaction the handler's lifetime (the identity: see [`TxCast`]).
        cast: TxCast<'c, 't, DB>,
    },
    /// Not to run; nothing of it was kept.
    Skip(Skip),
}

/// A pool: a transaction of its own, begun with `Pool::begin` inside the claim's own box.
///
/// Not through `sqlx::Acquire`, whose `begin` for a pool moves `Pool::acquire`'s future into a
/// box: that future holds the path that opens a new connection (14 KB on MySQL, 17 KB on
/// PostgreSQL), and a move copies a future whole, so every delivery copied it. Here the
/// claim's box is allocated first and its future written into it (`pooled::in_place`), and the
/// pool's futures are laid out inside it where they run
/// (docs/design/performance.md#the-pools-begin).
impl<'c, DB: Store> Transact<'c, 'c, DB> for &'c Pool<DB> {
    fn claim<'a>(
        self,
        claim: &'a Claim<DB>,
    ) -> BoxFuture<'a, Result<Claimed<'c, 'c, DB>, sqlx::Error>>
    where
        Self: 'a,
        'c: 'a,
    {
        crate::pooled::in_place(move || async move {
            let tx = self.begin().await?;
            claim_alone(claim, tx).await
        })
    }
}

/// An owned pool (`pool.clone()`): as `&pool`, for a caller whose body's transaction must not
/// borrow the pool (idem-http hands it to an axum handler through the request's extensions,
/// which hold only `'static` values).
impl<DB: Store> Transact<'static, 'static, DB> for Pool<DB> {
    fn claim<'a>(
        self,
        claim: &'a Claim<DB>,
    ) -> BoxFuture<'a, Result<Claimed<'static, 'static, DB>, sqlx::Error>>
    where
        Self: 'a,
    {
        crate::pooled::in_place(move || async move {
            let tx = self.begin().await?;
            claim_alone(claim, tx).await
        })
    }
}

/// A caller's open transaction (a savepoint in it), a pool's connection, a bare connection or
/// a PostgreSQL listener's connection: sqlx's `Acquire::begin`, whose futures for these are small.
fn claim_acquired<'a, 'c: 'a, DB: Store, A>(
    source: A,
    claim: &'a Claim<DB>,
) -> BoxFuture<'a, Result<Claimed<'c, 'c, DB>, sqlx::Error>>
where
    A: sqlx::Acquire<'c, Database = DB> + Send + 'a,
{
    Box::pin(async move {
        let tx = source.begin().await?;
        claim_alone(claim, tx).await
    })
}

/// Implements [`Transact`] for sources that begin through `sqlx::Acquire` ([`claim_acquired`]).
macro_rules! acquired_source {
    ($(#[$meta:meta])* impl<$($generic:ident),*> for $source:ty, $db:ty) => {
        $(#[$meta])*
        impl<'c, $($generic: Store),*> Transact<'c, 'c, $db> for $source {
            fn claim<'a>(
                self,
                claim: &'a Claim<$db>,
            ) -> BoxFuture<'a, Result<Claimed<'c, 'c, $db>, sqlx::Error>>
            where
                Self: 'a,
                'c: 'a,
            {
                claim_acquired(self, claim)
            }
        }
    };
}

acquired_source!(impl<DB> for &'c mut Transaction<'_, DB>, DB);
acquired_source!(impl<DB> for &'c mut sqlx::pool::PoolConnection<DB>, DB);
acquired_source!(
    #[cfg(feature = "postgres")]
    impl<> for &'c mut sqlx::PgConnection, sqlx::Postgres
);
acquired_source!(
    #[cfg(feature = "postgres")]
    impl<> for &'c mut sqlx::postgres::PgListener, sqlx::Postgres
);
acquired_source!(
    #[cfg(feature = "mysql")]
    impl<> for &'c mut sqlx::MySqlConnection, sqlx::MySql
);
acquired_source!(
    #[cfg(feature = "sqlite")]
    impl<> for &'c mut sqlx::SqliteConnection, sqlx::Sqlite
);

/// Claims `claim` in `tx`, a transaction of its own, and gives the transaction to the body,
/// or drops it (rolling back) if the body must not run.
///
/// When `tx` is a top-level transaction (idem opened it on a pool or a bare connection, not as
/// a savepoint inside a caller's), a claim that fails with an error the backend says may be
/// retried at once ([`Store::retry_claim`]: MySQL's deadlock, which InnoDB gives duplicates
/// waiting behind a delivery that rolled back) begins again on the same connection, up to
/// [`CLAIM_ATTEMPTS`] times. Nothing is lost: the body has not run, and the error already
/// rolled the whole transaction back. In a caller's transaction the error is returned, since
/// the caller's own work was rolled back with it.
pub(crate) async fn claim_alone<'c, 't: 'c, DB: Store>(
    claim: &Claim<DB>,
    mut tx: Transaction<'t, DB>,
) -> Result<Claimed<'c, 't, DB>, sqlx::Error> {
    let mut attempt = 1;
    loop {
        match decide::<DB>(claim, &mut tx, Prefetched::default()).await {
            Ok(Decision::Apply) => return Ok(Claimed::Own(tx)),
            Ok(Decision::Skip { skip, .. }) => {
                // Nothing of a skipped delivery may stay, but the caller need not wait for it:
                // dropping the transaction queues its ROLLBACK, which sqlx sends before
                // anything else on the connection — at once in the background when a pool
                // connection is released (its release ping flushes it), or before the caller's
                // next statement for a savepoint. This saves the duplicate path a round trip.
                drop(tx);
                return Ok(Claimed::Skip(skip));
            }
            Err(err)
                if attempt < CLAIM_ATTEMPTS
                    && DB::retry_claim(&err)
                    && DB::TransactionManager::get_transaction_depth(&tx) == 1 =>
            {
                tracing::debug!(attempt, error = %err, "claim rolled back by the database; claiming again");
                attempt += 1;
                // ROLLBACK (the server did already; this resets sqlx's depth), then BEGIN, on
                // the same connection: `tx` stays the handler's transaction.
                DB::TransactionManager::rollback(&mut tx).await?;
                DB::TransactionManager::begin(&mut tx, None).await?;
            }
            Err(err) => return Err(err),
        }
    }
}

/// How many times [`claim_alone`] claims in a transaction of its own before it returns a
/// retryable error to the caller (whose [`retry`](crate::retry) may then try later).
pub(crate) const CLAIM_ATTEMPTS: u32 = 10;

/// Turns a batch's `'static` transaction into the handler's `'t` one. Only the batch's `Transact`
/// impl, where `'t` is `'static`, makes one: it is the identity, and it lets `Batch` carry no
/// lifetime, which keeps a batch's future `Send` for `tokio::spawn`. A fn pointer's types need
/// not be well-formed, so [`Claimed`] can carry it without `'t: 'c`.
#[doc(hidden)]
pub type TxCast<'c, 't, DB> = fn(&'c mut Transaction<'static, DB>) -> &'c mut Transaction<'t, DB>;

/// The transaction a claimed delivery's body writes through: its own (committed by
/// [`Run::finish`](super::Run::finish)) or a batch's (committed by the batch).
/// Derefs to the `sqlx::Transaction`.
#[doc(hidden)]
pub enum Held<'c, 't, DB: sqlx::Database> {
    /// A transaction or savepoint of this delivery alone.
    Own(Transaction<'t, DB>),
    /// The transaction of the batch this delivery belongs to; `failed` tells the batch that
    /// this delivery's body failed, so the batch must roll back and retry without it.
    Batch {
        /// The batch's transaction.
        tx: &'c mut Transaction<'t, DB>,
        /// Set when the body returns `Err`.
        failed: &'c mut bool,
        /// Where an applied delivery leaves its stamp for the batch to write.
        kept: &'c mut Kept<DB>,
    },
}

impl<'t, DB: sqlx::Database> Deref for Held<'_, 't, DB> {
    type Target = Transaction<'t, DB>;

    fn deref(&self) -> &Self::Target {
        match self {
            Held::Own(tx) => tx,
            Held::Batch { tx, .. } => tx,
        }
    }
}

impl<DB: sqlx::Database> DerefMut for Held<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Held::Own(tx) => tx,
            Held::Batch { tx, .. } => tx,
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::Transact;
    use sqlx::Postgres;

    fn is_source<S: Transact<'static, 'static, Postgres>>() {}

    /// Every `sqlx::Acquire` of a backend is a source, as under the blanket impl over `Acquire`
    /// that the pool's own impl replaced (PostgreSQL has the most of them).
    #[test]
    fn every_acquire_of_postgres_is_a_source() {
        is_source::<&'static sqlx::PgPool>();
        is_source::<&'static mut sqlx::Transaction<'static, Postgres>>();
        is_source::<&'static mut sqlx::pool::PoolConnection<Postgres>>();
        is_source::<&'static mut sqlx::PgConnection>();
        is_source::<&'static mut sqlx::postgres::PgListener>();
    }
}

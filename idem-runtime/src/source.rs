//! Where a handler's transaction comes from: [`Source`], and the transaction it holds, [`Held`].

use std::ops::{Deref, DerefMut};

use futures_core::future::BoxFuture;
use sqlx::{Database, Transaction};

use crate::batch::{Batch, TxCast};

/// Whatever can open the transaction of a handler: a pool (`&pool`: a new transaction that the
/// handler commits), an open transaction (`&mut tx`: a savepoint inside it, which the caller
/// commits), a connection (`&mut conn`), or a [`Batch`] (`idem::batch` passes it).
///
/// `'c` is how long the source is borrowed; `'t` the lifetime of the transaction the body
/// writes through.
///
/// ```
/// fn accepts<'c, 't>(_: impl idem_runtime::Source<'c, 't, sqlx::Sqlite>) {}
/// # #[cfg(feature = "sqlite")]
/// async fn demo(pool: &sqlx::SqlitePool) -> Result<(), sqlx::Error> {
///     accepts(pool);
///     let mut tx = pool.begin().await?;
///     accepts(&mut tx);
///     Ok(())
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a transaction for an idempotent handler",
    label = "expected a pool or an open transaction",
    note = "pass `&pool` (idem commits a new transaction) or `&mut tx` (idem adds a savepoint; you commit)"
)]
pub trait Source<'c, 't, DB: Database>: Send {
    /// How the handler gets its transaction. Implemented by idem only.
    #[doc(hidden)]
    fn open(self) -> Opening<'c, 't, DB>;
}

/// How a [`Source`] provides the transaction of one delivery.
#[doc(hidden)]
pub enum Opening<'c, 't, DB: Database> {
    /// A transaction of its own (from a pool), or a savepoint (inside a transaction).
    Begin(BoxFuture<'c, Result<Transaction<'t, DB>, sqlx::Error>>),
    /// The shared transaction of a batch.
    Batch(&'c mut Batch<DB>, TxCast<'c, 't, DB>),
}

impl<'c, DB: Database, A> Source<'c, 'c, DB> for A
where
    A: sqlx::Acquire<'c, Database = DB> + Send,
{
    fn open(self) -> Opening<'c, 'c, DB> {
        Opening::Begin(sqlx::Acquire::begin(self))
    }
}

/// The transaction a claimed delivery's body writes through: its own (committed by
/// [`Run::finish`](crate::__private::Run::finish)) or a batch's (committed by the batch).
/// Derefs to the `sqlx::Transaction`.
#[doc(hidden)]
pub enum Held<'c, 't, DB: Database> {
    /// A transaction or savepoint of this delivery alone.
    Own(Transaction<'t, DB>),
    /// The transaction of the batch this delivery belongs to; `failed` tells the batch that
    /// this delivery's body failed, so the batch must roll back and retry without it.
    Batch {
        /// The batch's transaction.
        tx: &'c mut Transaction<'t, DB>,
        /// Set when the body returns `Err`.
        failed: &'c mut bool,
    },
}

impl<'t, DB: Database> Deref for Held<'_, 't, DB> {
    type Target = Transaction<'t, DB>;

    fn deref(&self) -> &Self::Target {
        match self {
            Held::Own(tx) => tx,
            Held::Batch { tx, .. } => tx,
        }
    }
}

impl<DB: Database> DerefMut for Held<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Held::Own(tx) => tx,
            Held::Batch { tx, .. } => tx,
        }
    }
}

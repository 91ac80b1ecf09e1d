//! The start of a delivery: [`Claim::begin`] (on any [`Transact`]) and [`Claim::begin_lease`]
//! (lease mode, on a pool) refuse a bad key before anything is written, open the span, claim,
//! and hand back either the body's transaction or the handler's final result.

use std::future::Future;

use sqlx::Pool;

use crate::error::{Error, KeyError};
use crate::outcome::Outcome;
use crate::store::Store;

use super::builder::Claim;
use super::decide::Skip;
use super::lease;
use super::ops::missing;
use super::run::Run;
use super::span::{self, Watch};
use super::transact::{Claimed, Held, LeaseTransact, PooledTransact, Transact};

/// What [`Claim::begin`] decided: run the body on this transaction, or return at once.
// `Run` is the common variant, moved once into the handler's frame: boxing it would cost an
// allocation per delivery to save a few bytes on the duplicate path.
#[allow(clippy::large_enum_variant)]
pub enum Begun<'c, 't, DB: Store, T, E> {
    /// The message is claimed inside the held transaction; run the body, then [`Run::finish`].
    Run(Held<'c, 't, DB>, Run<DB>),
    /// Duplicate, stale, or an error: the handler's return value, nothing written.
    Done(Result<Outcome<T>, Error<E>>),
}

impl<DB: Store> Claim<DB> {
    /// A batch's first pass: the batch keeps the claim (`None`), and the handler returns at
    /// once, before any future of the delivery is made. Every other source, and a claim that
    /// will be refused, gives it back for [`begin`](Claim::begin), which would gather it too.
    #[inline]
    pub fn gather_in<'c, 't: 'c, S: Transact<'c, 't, DB>>(self, source: &mut S) -> Option<Self> {
        if self.problem().is_some() {
            return Some(self);
        }
        source.gather(self)
    }

    /// Opens the delivery's transaction on `source` and claims the message in it.
    ///
    /// Returns [`Begun::Run`] when the body should run, else the handler's final result:
    /// `Duplicate`, `Stale`, a store error, or a key error (before touching the database).
    // `start`'s future itself, not an `async fn` around it: a future awaited inside another is
    // moved into it whole, and this one is nearly a kilobyte
    // (docs/design/performance.md#futures-moved-whole).
    pub fn begin<'c, 't: 'c, T, E, S: Transact<'c, 't, DB>>(
        self,
        source: S,
    ) -> impl Future<Output = Begun<'c, 't, DB, T, E>> + use<'c, 't, DB, T, E, S> {
        self.start(source, None)
    }

    /// `max_attempts = N`: [`begin`](Claim::begin) on a source that can also count failures
    /// in transactions of their own (a pool, a batch).
    pub fn begin_counted<'c, 't: 'c, T, E, S: PooledTransact<'c, 't, DB>>(
        self,
        source: S,
    ) -> impl Future<Output = Begun<'c, 't, DB, T, E>> + use<'c, 't, DB, T, E, S> {
        let pool = source.pool();
        self.start(source, Some(pool))
    }

    async fn start<'c, 't: 'c, T, E>(
        self,
        mut source: impl Transact<'c, 't, DB>,
        pool: Option<Pool<DB>>,
    ) -> Begun<'c, 't, DB, T, E> {
        if let Some(refused) = self.refusal() {
            return refused;
        }
        let Some(claim) = source.gather(self) else {
            // A batch's first pass: this result is never seen by the batch's caller.
            return Begun::Done(Err(Error::Deferred));
        };
        let span = span::delivery(claim.scope(), claim.key_bytes());
        let watch = Watch::start();
        let claimed = match span::run_in(&span, || source.settle(&claim)) {
            Ok(settled) => Ok(settled),
            Err(source) => span::within(&span, source.claim(&claim)).await,
        };
        watch.claimed(claim.scope());
        match claimed {
            Ok(Claimed::Own(mut tx)) => {
                let seen = match claim.attempts(&mut tx) {
                    None => Ok(Ok(0)),
                    Some(counted) => span::within(&span, counted).await,
                };
                match seen {
                    Ok(Ok(seen)) => {
                        let attempts = pool.map(|pool| (pool, seen));
                        Begun::Run(Held::Own(tx), Run::new(span, watch, claim, None, attempts))
                    }
                    // Dropping the transaction rolls the claim back (see `claim_alone`).
                    Ok(Err(poisoned)) => skipped(&span, watch, poisoned, claim.scope()),
                    Err(err) => failed(&span, watch, err, claim.scope()),
                }
            }
            Ok(Claimed::Batch {
                tx,
                failed,
                kept,
                cast,
            }) => {
                let seen = match claim.attempts(tx) {
                    None => Ok(Ok(0)),
                    Some(counted) => span::within(&span, counted).await,
                };
                match seen {
                    Ok(Ok(seen)) => {
                        let attempts = pool.map(|pool| (pool, seen));
                        Begun::Run(
                            Held::Batch {
                                tx: cast(tx),
                                failed,
                                kept,
                            },
                            Run::new(span, watch, claim, None, attempts),
                        )
                    }
                    // The batch already claimed it: it rolls back and runs this message alone,
                    // where it is poisoned with nothing written.
                    Ok(Err(_)) => {
                        *failed = true;
                        Begun::Done(Err(Error::Deferred))
                    }
                    Err(err) => {
                        *failed = true;
                        self::failed(&span, watch, err, claim.scope())
                    }
                }
            }
            Ok(Claimed::Skip(skip)) => skipped(&span, watch, skip, claim.scope()),
            Err(err) => failed(&span, watch, err, claim.scope()),
        }
    }

    /// Lease mode: takes the message's lease in a statement of its own, committed at once so
    /// other consumers see it, then opens the body's transaction on `pool`.
    ///
    /// A delivery of a message in progress elsewhere returns `InProgress`; of a done one,
    /// `Duplicate`. [`Run::finish`] marks it done in the body's transaction, or releases it.
    ///
    /// With `version`, the version is decided in the body's transaction as in the
    /// transactional mode: `Stale` and `Duplicate` give the lease back and run nothing.
    ///
    /// The claim must come from [`lease_mode`](Claim::lease_mode), which keeps `DB`'s
    /// [`Leases`](crate::store::Leases) methods (generated code always calls it); without, this is
    /// an [`Error::Store`] that says so.
    pub async fn begin_lease<'c, 't: 'c, T, E>(
        self,
        source: impl LeaseTransact<'c, DB>,
    ) -> Begun<'c, 't, DB, T, E> {
        let pool = source.lease_pool();
        if let Some(refused) = self.refusal() {
            return refused;
        }
        let Some(leases) = self.lease_ops() else {
            return Begun::Done(Err(Error::Store(missing("begin_lease", "lease_mode"))));
        };
        let span = span::delivery(self.scope(), self.key_bytes());
        let watch = Watch::start();
        let taken = span::within(&span, lease::take(&self, leases, pool)).await;
        watch.claimed(self.scope());
        match taken {
            Ok(Ok((mut tx, lease))) => {
                let seen = match self.attempts(&mut tx) {
                    None => Ok(Ok(0)),
                    Some(counted) => span::within(&span, counted).await,
                };
                match seen {
                    Ok(Ok(seen)) => {
                        let attempts = self.attempt_limit().map(|_| (pool.clone(), seen));
                        Begun::Run(
                            Held::Own(tx),
                            Run::new(span, watch, self, Some(lease), attempts),
                        )
                    }
                    Ok(Err(poisoned)) => {
                        drop(tx);
                        span::within(&span, lease.release(self.record().id())).await;
                        skipped(&span, watch, poisoned, self.scope())
                    }
                    Err(err) => {
                        drop(tx);
                        span::within(&span, lease.release(self.record().id())).await;
                        failed(&span, watch, err, self.scope())
                    }
                }
            }
            Ok(Err(skip)) => skipped(&span, watch, skip, self.scope()),
            Err(err) => failed(&span, watch, err, self.scope()),
        }
    }

    /// `max_attempts`: the failures counted so far, read in the delivery's transaction, or
    /// [`Skip::Poisoned`] at the bound. `None` without `max_attempts`: no round trip, and no
    /// future to await (a delivery's caller then takes 0).
    fn attempts<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
    ) -> Option<impl Future<Output = Result<Result<u32, Skip>, sqlx::Error>> + 'a> {
        let (limit, ops) = self.attempt_limit()?;
        Some(async move {
            // Boxed (by the table): inline, the query's future (~400 bytes) would be part of
            // every delivery's future, `max_attempts` or not
            // (docs/design/performance.md#futures-moved-whole).
            let attempts = (ops.load_attempts)(conn, self.record_key()).await?;
            Ok(if attempts >= limit {
                super::seen::note(self.scope(), self.record_key().key, None);
                Err(Skip::Poisoned { attempts })
            } else {
                Ok(attempts)
            })
        })
    }

    /// The handler's result for a key, entity or version that cannot be stored. Inline, with
    /// the refusal itself out of line: as a call, this check cost 44 instructions a batched
    /// message (docs/design/performance.md#the-first-pass).
    #[inline]
    fn refusal<'c, 't, T, E>(&self) -> Option<Begun<'c, 't, DB, T, E>> {
        let problem = self.problem()?;
        Some(Begun::Done(Err(refused(self.scope(), problem))))
    }
}

/// Logs a refused key and returns its error.
#[cold]
fn refused<E>(scope: &'static str, problem: &KeyError) -> Error<E> {
    tracing::warn!(scope, error = %problem, "idempotent handler refused its key");
    Error::Key(problem.clone())
}

/// The handler's result for a delivery that does not run.
fn skipped<'c, 't, DB: Store, T, E>(
    span: &tracing::Span,
    watch: Watch,
    skip: Skip,
    scope: &'static str,
) -> Begun<'c, 't, DB, T, E> {
    let done = skip.result(scope);
    span::record_outcome(span, watch, scope, &done);
    Begun::Done(done)
}

/// The handler's result when the store failed before the body ran.
fn failed<'c, 't, DB: Store, T, E>(
    span: &tracing::Span,
    watch: Watch,
    err: sqlx::Error,
    scope: &'static str,
) -> Begun<'c, 't, DB, T, E> {
    let done = Err(Error::Store(err));
    span::record_outcome(span, watch, scope, &done);
    Begun::Done(done)
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    /// Lease mode reaches the backend's `Leases` through the table `lease_mode` keeps. A claim
    /// built without it (generated code never does) is a store error that says it is a bug,
    /// before anything is written, not a panic.
    #[tokio::test]
    async fn lease_mode_without_its_table_is_a_store_error_that_says_so() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        crate::migrate(&pool).await.unwrap();
        let claim = Claim::<sqlx::Sqlite>::new("s").key(&"k");
        let done = match claim.begin_lease::<(), ()>(&pool).await {
            Begun::Done(done) => done,
            Begun::Run(..) => panic!("a lease-mode claim without its table ran"),
        };
        match done {
            Err(Error::Store(err)) => assert!(
                err.to_string().contains(
                    "a bug: `Claim::begin_lease` on a claim built without `Claim::lease_mode`"
                ),
                "{err}"
            ),
            other => panic!("expected a store error, got {other:?}"),
        }
        let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(records, 0, "nothing written");
        // With it, the same claim takes its lease and runs.
        let claim = Claim::<sqlx::Sqlite>::new("s").key(&"k").lease_mode();
        assert!(matches!(
            claim.begin_lease::<(), ()>(&pool).await,
            Begun::Run(..)
        ));
    }
}

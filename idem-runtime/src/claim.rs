//! One delivery of a message, from its key to its outcome: what the generated code calls.
//!
//! The expansion of `#[idempotent]` builds a [`Claim`], [`begins`](Claim::begin) it on a
//! [`Source`], runs the body on the transaction it gets back, then [`finishes`](Run::finish).
//! Everything that decides lives here, as ordinary functions.

use std::future::Future;
use std::time::Duration;

use futures_core::future::BoxFuture;
use sqlx::{Pool, Transaction};
use tracing::Instrument as _;

use crate::context::Context;
use crate::error::{Error, KeyError, KeyPart, KeyProblem};
use crate::key::{Key, KeyDisplay, MAX_KEY_LEN};
use crate::outcome::Outcome;
use crate::source::{Held, Opening, Source};
use crate::store::{LeaseClaim, Record, Store, VersionCheck};
use crate::version::Version;

/// The values of one delivery: scope, key and optional version and entity, checked as they are
/// added; the first problem is kept and reported by [`Claim::begin`] before anything is written.
///
/// ```
/// use idem_runtime::__private::Claim;
/// let claim = Claim::new("billing::charge").key(&"msg-1").version(&7_u64);
/// assert_eq!(claim.scope(), "billing::charge");
/// ```
#[derive(Debug)]
pub struct Claim {
    scope: &'static str,
    key: Vec<u8>,
    entity: Option<Vec<u8>>,
    version: Option<i64>,
    retention: Duration,
    lease: Option<Duration>,
    problem: Option<KeyError>,
}

/// How long a record is kept when the handler does not say (`retention = "..."`): 30 days,
/// longer than the redelivery window of common brokers.
///
/// ```
/// assert_eq!(idem_runtime::DEFAULT_RETENTION.as_secs(), 30 * 24 * 3600);
/// ```
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a lease lasts when a lease-mode handler does not say (`lease = "..."`): 30 seconds.
///
/// ```
/// assert_eq!(idem_runtime::DEFAULT_LEASE.as_secs(), 30);
/// ```
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// What [`Claim::begin`] decided: run the body on this transaction, or return at once.
pub enum Begun<'c, 't, DB: Store, T, E> {
    /// The message is claimed inside the held transaction; run the body, then [`Run::finish`].
    Run(Held<'c, 't, DB>, Run<DB>),
    /// Duplicate, stale, or an error: the handler's return value, nothing written.
    Done(Result<Outcome<T>, Error<E>>),
}

/// A claimed delivery, until [`Run::finish`]: its span, its context, and its lease if any.
pub struct Run<DB: Store> {
    span: tracing::Span,
    context: Context,
    lease: Option<Lease<DB>>,
}

/// The lease a lease-mode delivery holds, to complete or release.
struct Lease<DB: Store> {
    pool: Pool<DB>,
    token: i64,
}

/// Why a delivery does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    Duplicate,
    Stale { latest: i64 },
    InProgress,
}

impl Skip {
    fn outcome<T>(self) -> Outcome<T> {
        match self {
            Skip::Duplicate => Outcome::Duplicate,
            Skip::Stale { latest } => Outcome::Stale { latest },
            Skip::InProgress => Outcome::InProgress,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Skip::Duplicate => "duplicate",
            Skip::Stale { .. } => "stale",
            Skip::InProgress => "in_progress",
        }
    }
}

/// The decision about one delivery, taken inside its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Apply,
    /// Do not run; `wrote_record` says the message's record was inserted and must be undone.
    Skip {
        skip: Skip,
        wrote_record: bool,
    },
}

/// A claimed transaction, a reason not to run, or the store's error.
pub(crate) type Claimed<'c, 't, DB> = Result<Result<Held<'c, 't, DB>, Skip>, sqlx::Error>;

impl Claim {
    /// A delivery for the handler with this scope.
    pub fn new(scope: &'static str) -> Self {
        Claim {
            scope,
            key: Vec::new(),
            entity: None,
            version: None,
            retention: DEFAULT_RETENTION,
            lease: None,
            problem: None,
        }
    }

    /// The handler's scope.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// The encoded key.
    pub(crate) fn key_bytes(&self) -> &[u8] {
        &self.key
    }

    /// The record this delivery writes.
    pub(crate) fn record(&self) -> Record<'_> {
        Record {
            scope: self.scope,
            key: &self.key,
            retention: self.retention,
        }
    }

    /// Sets how long the record of the message is kept (default [`DEFAULT_RETENTION`]).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the lease of a lease-mode handler (default [`DEFAULT_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// What the handler's [`Context`] parameter shows.
    fn into_context(self) -> Context {
        Context::new(self.scope, self.key, self.version)
    }

    /// Whether deciding writes a record of the message (all modes but key + version).
    pub(crate) fn needs_record(&self) -> bool {
        self.version.is_none() || self.entity.is_some()
    }

    /// The entity whose version this delivery must advance, and the version, in the modes
    /// that have one.
    pub(crate) fn version_target(&self) -> Option<(&[u8], i64)> {
        let version = self.version?;
        Some((self.entity.as_deref().unwrap_or(&self.key), version))
    }

    /// Sets the idempotency key.
    pub fn key<K: Key + ?Sized>(mut self, key: &K) -> Self {
        self.key = self.encode(KeyPart::Key, key);
        self
    }

    /// Sets the entity whose version orders this message (default: the key).
    pub fn entity<K: Key + ?Sized>(mut self, entity: &K) -> Self {
        self.entity = Some(self.encode(KeyPart::Entity, entity));
        self
    }

    /// Sets the version of the entity this message carries.
    pub fn version<V: Version + ?Sized>(mut self, version: &V) -> Self {
        match version.to_version() {
            Ok(v) => self.version = Some(v),
            Err(out) => self.refuse(KeyPart::Version, KeyProblem::OutOfRange(out.0)),
        }
        self
    }

    fn encode<K: Key + ?Sized>(&mut self, part: KeyPart, key: &K) -> Vec<u8> {
        let mut bytes = Vec::new();
        key.write_key(&mut bytes);
        if bytes.is_empty() {
            self.refuse(part, KeyProblem::Empty);
        } else if bytes.len() > MAX_KEY_LEN {
            self.refuse(
                part,
                KeyProblem::TooLong {
                    len: bytes.len(),
                    max: MAX_KEY_LEN,
                },
            );
        }
        bytes
    }

    fn refuse(&mut self, part: KeyPart, problem: KeyProblem) {
        self.problem
            .get_or_insert(KeyError::new(self.scope, part, problem));
    }

    /// Opens the delivery's transaction on `source` and claims the message in it.
    ///
    /// Returns [`Begun::Run`] when the body should run, else the handler's final result:
    /// `Duplicate`, `Stale`, a store error, or a key error (before touching the database).
    pub async fn begin<'c, 't: 'c, DB: Store, T, E>(
        self,
        source: impl Source<'c, 't, DB>,
    ) -> Begun<'c, 't, DB, T, E> {
        if let Some(problem) = self.problem {
            tracing::warn!(scope = self.scope, error = %problem, "idempotent handler refused its key");
            return Begun::Done(Err(Error::Key(problem)));
        }
        let batch = match source.open() {
            Opening::Begin(begin) => Err(begin),
            Opening::Batch(batch, _) if batch.is_collecting() => {
                // A batch's first pass only gathers the claims; its result is discarded.
                batch.collect(self);
                return Begun::Done(Ok(Outcome::Duplicate));
            }
            Opening::Batch(batch, cast) => Ok((batch, cast)),
        };
        let span = tracing::info_span!(
            "idempotent",
            scope = self.scope,
            key = %KeyDisplay(&self.key),
            outcome = tracing::field::Empty,
        );
        let claimed = match batch {
            Err(begin) => self.claim_own(begin).instrument(span.clone()).await,
            Ok((batch, cast)) => batch.claim(&self, cast).instrument(span.clone()).await,
        };
        match claimed {
            Ok(Ok(held)) => Begun::Run(
                held,
                Run {
                    span,
                    context: self.into_context(),
                    lease: None,
                },
            ),
            Ok(Err(skip)) => {
                span.record("outcome", skip.as_str());
                Begun::Done(Ok(skip.outcome()))
            }
            Err(err) => {
                span.record("outcome", "error");
                Begun::Done(Err(Error::Store(err)))
            }
        }
    }

    /// Lease mode: takes the message's lease in a statement of its own, committed at once so
    /// other consumers see it, then opens the body's transaction on `pool`.
    ///
    /// A delivery of a message in progress elsewhere returns `InProgress`; of a done one,
    /// `Duplicate`. [`Run::finish`] marks it done in the body's transaction, or releases it.
    pub async fn begin_lease<'c, 't: 'c, DB: Store, T, E>(
        self,
        pool: &Pool<DB>,
    ) -> Begun<'c, 't, DB, T, E> {
        if let Some(problem) = self.problem {
            tracing::warn!(scope = self.scope, error = %problem, "idempotent handler refused its key");
            return Begun::Done(Err(Error::Key(problem)));
        }
        let span = tracing::info_span!(
            "idempotent",
            scope = self.scope,
            key = %KeyDisplay(&self.key),
            outcome = tracing::field::Empty,
        );
        let token = lease_token();
        let lease = self.lease.unwrap_or(DEFAULT_LEASE);
        let claimed = async {
            let mut conn = pool.acquire().await?;
            match DB::claim_lease(&mut conn, self.record(), lease, token).await? {
                LeaseClaim::Acquired => {}
                LeaseClaim::Done => return Ok(Err(Skip::Duplicate)),
                LeaseClaim::InProgress => return Ok(Err(Skip::InProgress)),
            }
            match pool.begin().await {
                Ok(tx) => Ok(Ok(tx)),
                Err(err) => {
                    // Give the lease back, so the redelivery need not wait for it to expire.
                    let _ = DB::release_lease(&mut conn, self.scope, &self.key, token).await;
                    Err(err)
                }
            }
        }
        .instrument(span.clone())
        .await;
        match claimed {
            Ok(Ok(tx)) => {
                let lease = Some(Lease {
                    pool: pool.clone(),
                    token,
                });
                Begun::Run(
                    Held::Own(tx),
                    Run {
                        span,
                        context: self.into_context(),
                        lease,
                    },
                )
            }
            Ok(Err(skip)) => {
                span.record("outcome", skip.as_str());
                Begun::Done(Ok(skip.outcome()))
            }
            Err(err) => {
                span.record("outcome", "error");
                Begun::Done(Err(Error::Store(err)))
            }
        }
    }

    /// Claims the message in a transaction of its own, rolled back if the body must not run.
    pub(crate) async fn claim_own<'c, 't: 'c, DB: Store>(
        &self,
        begin: BoxFuture<'c, Result<Transaction<'t, DB>, sqlx::Error>>,
    ) -> Claimed<'c, 't, DB> {
        let mut tx = begin.await?;
        match self.decide::<DB>(&mut tx, None, None).await? {
            Decision::Apply => Ok(Ok(Held::Own(tx))),
            Decision::Skip { skip, .. } => {
                // Nothing of a skipped delivery may stay, but the caller need not wait for it:
                // dropping the transaction queues its ROLLBACK, which sqlx sends before anything
                // else on the connection — at once in the background when a pool connection is
                // released (its release ping flushes it), or before the caller's next statement
                // for a savepoint. This saves the duplicate path a round trip.
                drop(tx);
                Ok(Err(skip))
            }
        }
    }

    /// Decides inside the delivery's transaction, through the database's unique constraint and
    /// conditional upsert. `recorded` and `checked` are the results of a record insert and a
    /// version advance already made for this message (by a batch); `None` makes them here.
    pub(crate) async fn decide<DB: Store>(
        &self,
        conn: &mut DB::Connection,
        recorded: Option<bool>,
        checked: Option<VersionCheck>,
    ) -> Result<Decision, sqlx::Error> {
        let duplicate = Decision::Skip {
            skip: Skip::Duplicate,
            wrote_record: false,
        };
        match (self.version, &self.entity) {
            // key only: the unique record decides.
            (None, _) => {
                let inserted = match recorded {
                    Some(inserted) => inserted,
                    None => DB::insert_record(conn, self.record()).await?,
                };
                Ok(if inserted { Decision::Apply } else { duplicate })
            }
            // key + version: the key is the entity; equal is a duplicate, lower is stale.
            (Some(version), None) => {
                let check = match checked {
                    Some(check) => check,
                    None => DB::advance_version(conn, self.scope, &self.key, version).await?,
                };
                Ok(match check {
                    VersionCheck::Advanced => Decision::Apply,
                    VersionCheck::Equal => duplicate,
                    VersionCheck::Behind { latest } => Decision::Skip {
                        skip: Skip::Stale { latest },
                        wrote_record: false,
                    },
                })
            }
            // key + version + entity: a seen key is a duplicate; else the version must advance.
            (Some(version), Some(entity)) => {
                let check = match recorded {
                    Some(false) => None,
                    Some(true) => Some(match checked {
                        Some(check) => check,
                        None => DB::advance_version(conn, self.scope, entity, version).await?,
                    }),
                    None => DB::record_and_advance(conn, self.record(), entity, version).await?,
                };
                let latest = match check {
                    None => return Ok(duplicate),
                    Some(VersionCheck::Advanced) => return Ok(Decision::Apply),
                    Some(VersionCheck::Equal) => version,
                    Some(VersionCheck::Behind { latest }) => latest,
                };
                Ok(Decision::Skip {
                    skip: Skip::Stale { latest },
                    wrote_record: true,
                })
            }
        }
    }
}

impl<DB: Store> Run<DB> {
    /// Runs the handler body inside this delivery's tracing span.
    pub fn instrument<F: Future>(&self, body: F) -> tracing::instrument::Instrumented<F> {
        body.instrument(self.span.clone())
    }

    /// The delivery, for a [`Context`] parameter of the handler.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Commits the body's effect with the record of the message, or rolls both back on `Err`.
    /// In a batch, the batch commits; an `Err` makes it roll back and retry without this message.
    /// In lease mode, success marks the message done in the same transaction; an `Err` releases
    /// the lease.
    pub async fn finish<T, E>(
        self,
        held: Held<'_, '_, DB>,
        result: Result<T, E>,
    ) -> Result<Outcome<T>, Error<E>> {
        let span = self.span.clone();
        let outcome = match (held, result) {
            (Held::Own(tx), Ok(value)) => self.commit(tx, value).instrument(span.clone()).await,
            (Held::Own(tx), Err(err)) => {
                if let Err(rollback) = tx.rollback().instrument(span.clone()).await {
                    // The handler's error matters more; sqlx closes a connection it cannot roll back.
                    tracing::debug!(parent: &span, error = %rollback, "rollback after a handler error failed");
                }
                if let Some(lease) = &self.lease {
                    lease.release(&self.context).instrument(span.clone()).await;
                }
                Err(Error::Handler(err))
            }
            (Held::Batch { .. }, Ok(value)) => Ok(Outcome::Applied(value)),
            (Held::Batch { failed, .. }, Err(err)) => {
                *failed = true;
                Err(Error::Handler(err))
            }
        };
        span.record(
            "outcome",
            match &outcome {
                Ok(outcome) => outcome.as_str(),
                Err(Error::Handler(_)) => "failed",
                Err(_) => "error",
            },
        );
        outcome
    }

    async fn commit<T, E>(
        &self,
        mut tx: Transaction<'_, DB>,
        value: T,
    ) -> Result<Outcome<T>, Error<E>> {
        if let Some(lease) = &self.lease {
            let ctx = &self.context;
            match DB::complete_lease(&mut tx, ctx.scope(), ctx.key(), lease.token).await {
                Ok(true) => {}
                Ok(false) => {
                    // Another delivery took the expired lease over: it will do the work; undo ours.
                    let _ = tx.rollback().await;
                    return Err(Error::LeaseLost);
                }
                Err(err) => return Err(Error::Store(err)),
            }
        }
        match tx.commit().await {
            Ok(()) => Ok(Outcome::Applied(value)),
            Err(err) => Err(Error::Store(err)),
        }
    }
}

impl<DB: Store> Lease<DB> {
    /// Best effort: if this fails, the lease expires on its own.
    async fn release(&self, ctx: &Context) {
        let released = async {
            let mut conn = self.pool.acquire().await?;
            DB::release_lease(&mut conn, ctx.scope(), ctx.key(), self.token).await
        };
        if let Err(err) = released.await {
            tracing::debug!(error = %err, "releasing a lease failed; it will expire");
        }
    }
}

impl<DB: Store> std::fmt::Debug for Run<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("context", &self.context)
            .field("lease", &self.lease.is_some())
            .finish()
    }
}

/// A token that tells this delivery's lease from any other's: unique per process and call.
fn lease_token() -> i64 {
    random_u64() as i64
}

/// 64 bits that differ between calls, processes and machines (not cryptographic).
pub(crate) fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = nanos ^ (u64::from(std::process::id()) << 40) ^ NEXT.fetch_add(1, Ordering::Relaxed);
    // splitmix64: spreads the bits, so tokens of nearby calls and processes differ everywhere.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Names the result of a handler body: `Result<T, E>` or an alias of it (`anyhow::Result<T>`).
///
/// ```
/// use idem_runtime::__private::HandlerResult;
/// fn ok_type<R: HandlerResult<Ok = u8>>() {}
/// ok_type::<Result<u8, std::io::Error>>();
/// ```
#[diagnostic::on_unimplemented(
    message = "an `#[idempotent]` handler must return a `Result`, not `{Self}`",
    label = "expected `Result<T, E>`",
    note = "return `Result<(), YourError>` (or an alias such as `anyhow::Result<()>`); an `Err` rolls the delivery back"
)]
pub trait HandlerResult {
    /// The `T` of `Result<T, E>`.
    type Ok;
    /// The `E` of `Result<T, E>`.
    type Err;
}

impl<T, E> HandlerResult for Result<T, E> {
    type Ok = T;
    type Err = E;
}

/// The return type of a generated handler whose body returns `R = Result<T, E>`:
/// `Result<Outcome<T>, Error<E>>`.
///
/// ```
/// let _: idem_runtime::Handled<Result<u8, String>> = Ok(idem_runtime::Outcome::Applied(1));
/// ```
pub type Handled<R> = Result<Outcome<<R as HandlerResult>::Ok>, Error<<R as HandlerResult>::Err>>;

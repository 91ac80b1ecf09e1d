//! One delivery of a message, from its key to its outcome: what the generated code calls.
//!
//! The expansion of `#[idempotent]` builds a [`Claim`], [`begins`](Claim::begin) it on a
//! [`Source`], runs the body on the transaction it gets back, then [`finishes`](Run::finish).
//! Everything that decides lives here, as ordinary functions.

use std::future::Future;

use futures_core::future::BoxFuture;
use sqlx::Transaction;
use tracing::Instrument as _;

use crate::error::{Error, KeyError, KeyPart, KeyProblem};
use crate::key::{Key, KeyDisplay, MAX_KEY_LEN};
use crate::outcome::Outcome;
use crate::source::{Held, Opening, Source};
use crate::store::{Store, VersionCheck};
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
    problem: Option<KeyError>,
}

/// What [`Claim::begin`] decided: run the body on this transaction, or return at once.
pub enum Begun<'c, 't, DB: sqlx::Database, T, E> {
    /// The message is claimed inside the held transaction; run the body, then [`Run::finish`].
    Run(Held<'c, 't, DB>, Run),
    /// Duplicate, stale, or an error: the handler's return value, nothing written.
    Done(Result<Outcome<T>, Error<E>>),
}

/// The span of a claimed delivery, until [`Run::finish`].
#[derive(Debug)]
pub struct Run {
    span: tracing::Span,
}

/// Why a delivery does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    Duplicate,
    Stale { latest: i64 },
}

impl Skip {
    fn outcome<T>(self) -> Outcome<T> {
        match self {
            Skip::Duplicate => Outcome::Duplicate,
            Skip::Stale { latest } => Outcome::Stale { latest },
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Skip::Duplicate => "duplicate",
            Skip::Stale { .. } => "stale",
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

    /// Whether deciding writes a record of the message (all modes but key + version).
    pub(crate) fn needs_record(&self) -> bool {
        self.version.is_none() || self.entity.is_some()
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
            Ok(Ok(held)) => Begun::Run(held, Run { span }),
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
        match self.decide::<DB>(&mut tx, None).await? {
            Decision::Apply => Ok(Ok(Held::Own(tx))),
            Decision::Skip { skip, .. } => {
                // Nothing of a skipped delivery may stay; a failed rollback closes the connection.
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "rollback after a skipped delivery failed");
                }
                Ok(Err(skip))
            }
        }
    }

    /// Decides inside the delivery's transaction, through the database's unique constraint and
    /// conditional upsert. `recorded` is the result of a record insert already made for this
    /// message (by a batch); `None` inserts it here when the mode needs one.
    pub(crate) async fn decide<DB: Store>(
        &self,
        conn: &mut DB::Connection,
        recorded: Option<bool>,
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
                    None => DB::insert_record(conn, self.scope, &self.key).await?,
                };
                Ok(if inserted { Decision::Apply } else { duplicate })
            }
            // key + version: the key is the entity; equal is a duplicate, lower is stale.
            (Some(version), None) => Ok(
                match DB::advance_version(conn, self.scope, &self.key, version).await? {
                    VersionCheck::Advanced => Decision::Apply,
                    VersionCheck::Equal => duplicate,
                    VersionCheck::Behind { latest } => Decision::Skip {
                        skip: Skip::Stale { latest },
                        wrote_record: false,
                    },
                },
            ),
            // key + version + entity: a seen key is a duplicate; else the version must advance.
            (Some(version), Some(entity)) => {
                let inserted = match recorded {
                    Some(inserted) => inserted,
                    None => DB::insert_record(conn, self.scope, &self.key).await?,
                };
                if !inserted {
                    return Ok(duplicate);
                }
                let latest = match DB::advance_version(conn, self.scope, entity, version).await? {
                    VersionCheck::Advanced => return Ok(Decision::Apply),
                    VersionCheck::Equal => version,
                    VersionCheck::Behind { latest } => latest,
                };
                Ok(Decision::Skip {
                    skip: Skip::Stale { latest },
                    wrote_record: true,
                })
            }
        }
    }
}

impl Run {
    /// Runs the handler body inside this delivery's tracing span.
    pub fn instrument<F: Future>(&self, body: F) -> tracing::instrument::Instrumented<F> {
        body.instrument(self.span.clone())
    }

    /// Commits the body's effect with the record of the message, or rolls both back on `Err`.
    /// In a batch, the batch commits; an `Err` makes it roll back and retry without this message.
    pub async fn finish<DB: sqlx::Database, T, E>(
        self,
        held: Held<'_, '_, DB>,
        result: Result<T, E>,
    ) -> Result<Outcome<T>, Error<E>> {
        match (held, result) {
            (Held::Own(tx), Ok(value)) => match tx.commit().instrument(self.span.clone()).await {
                Ok(()) => {
                    self.span.record("outcome", "applied");
                    Ok(Outcome::Applied(value))
                }
                Err(err) => {
                    self.span.record("outcome", "error");
                    Err(Error::Store(err))
                }
            },
            (Held::Own(tx), Err(err)) => {
                self.span.record("outcome", "failed");
                if let Err(rollback) = tx.rollback().instrument(self.span.clone()).await {
                    // The handler's error matters more; sqlx closes a connection it cannot roll back.
                    tracing::debug!(parent: &self.span, error = %rollback, "rollback after a handler error failed");
                }
                Err(Error::Handler(err))
            }
            (Held::Batch { .. }, Ok(value)) => {
                self.span.record("outcome", "applied");
                Ok(Outcome::Applied(value))
            }
            (Held::Batch { failed, .. }, Err(err)) => {
                self.span.record("outcome", "failed");
                *failed = true;
                Err(Error::Handler(err))
            }
        }
    }
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

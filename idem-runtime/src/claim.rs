//! One delivery of a message, from its key to its outcome: what the generated code calls.
//!
//! The expansion of `#[idempotent]` builds a [`Claim`], [`begins`](Claim::begin) it on a
//! [`Source`], runs the body on the transaction it gets back, then [`finishes`](Run::finish).
//! Everything that decides lives here, as ordinary functions.

use std::future::Future;

use sqlx::Transaction;
use tracing::Instrument as _;

use crate::error::{Error, KeyError, KeyPart, KeyProblem};
use crate::key::{Key, KeyDisplay, MAX_KEY_LEN};
use crate::outcome::Outcome;
use crate::store::{Source, Store, VersionCheck};
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
#[derive(Debug)]
pub enum Begun<'c, DB: sqlx::Database, T, E> {
    /// The message is claimed inside `Transaction`; run the body, then [`Run::finish`].
    Run(Transaction<'c, DB>, Run),
    /// Duplicate, stale, or an error: the handler's return value, nothing written.
    Done(Result<Outcome<T>, Error<E>>),
}

/// The span and scope of a claimed delivery, until [`Run::finish`].
#[derive(Debug)]
pub struct Run {
    span: tracing::Span,
}

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

    /// Opens a transaction on `source` and claims the message in it.
    ///
    /// Returns [`Begun::Run`] when the body should run, else the handler's final result:
    /// `Duplicate`, `Stale`, a store error, or a key error (before touching the database).
    pub async fn begin<'c, DB: Store, T, E>(
        self,
        source: impl Source<'c, DB>,
    ) -> Begun<'c, DB, T, E> {
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
        let claimed = self.claim(source).instrument(span.clone()).await;
        match claimed {
            Ok(Ok(tx)) => Begun::Run(tx, Run { span }),
            Ok(Err(skipped)) => {
                span.record("outcome", skipped.as_str());
                Begun::Done(Ok(skipped))
            }
            Err(err) => {
                span.record("outcome", "error");
                Begun::Done(Err(Error::Store(err)))
            }
        }
    }

    /// The decision itself: `Ok(tx)` to apply, `Err(outcome)` when the body must not run.
    async fn claim<'c, DB: Store, T>(
        &self,
        source: impl Source<'c, DB>,
    ) -> Result<Result<Transaction<'c, DB>, Outcome<T>>, sqlx::Error> {
        let mut tx = source.begin().await?;
        let decision = match (self.version, &self.entity) {
            // key only: the unique record decides.
            (None, _) => {
                if DB::insert_record(&mut tx, self.scope, &self.key).await? {
                    None
                } else {
                    Some(Outcome::Duplicate)
                }
            }
            // key + version: the key is the entity; equal is a duplicate, lower is stale.
            (Some(version), None) => {
                match DB::advance_version(&mut tx, self.scope, &self.key, version).await? {
                    VersionCheck::Advanced => None,
                    VersionCheck::Equal => Some(Outcome::Duplicate),
                    VersionCheck::Behind { latest } => Some(Outcome::Stale { latest }),
                }
            }
            // key + version + entity: a seen key is a duplicate; else the version must advance.
            // The record is written first; a stale message rolls it back below.
            (Some(version), Some(entity)) => {
                if !DB::insert_record(&mut tx, self.scope, &self.key).await? {
                    Some(Outcome::Duplicate)
                } else {
                    match DB::advance_version(&mut tx, self.scope, entity, version).await? {
                        VersionCheck::Advanced => None,
                        VersionCheck::Equal => Some(Outcome::Stale { latest: version }),
                        VersionCheck::Behind { latest } => Some(Outcome::Stale { latest }),
                    }
                }
            }
        };
        match decision {
            None => Ok(Ok(tx)),
            Some(outcome) => {
                // Nothing of a skipped delivery may stay; a failed rollback closes the connection.
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "rollback after a skipped delivery failed");
                }
                Ok(Err(outcome))
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
    pub async fn finish<DB: sqlx::Database, T, E>(
        self,
        tx: Transaction<'_, DB>,
        result: Result<T, E>,
    ) -> Result<Outcome<T>, Error<E>> {
        match result {
            Ok(value) => match tx.commit().instrument(self.span.clone()).await {
                Ok(()) => {
                    self.span.record("outcome", "applied");
                    Ok(Outcome::Applied(value))
                }
                Err(err) => {
                    self.span.record("outcome", "error");
                    Err(Error::Store(err))
                }
            },
            Err(err) => {
                self.span.record("outcome", "failed");
                if let Err(rollback) = tx.rollback().instrument(self.span.clone()).await {
                    // The handler's error matters more; sqlx closes a connection it cannot roll back.
                    tracing::debug!(parent: &self.span, error = %rollback, "rollback after a handler error failed");
                }
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

//! A claimed delivery until its body has run: [`Run::finish`] commits the effect with the
//! record, or rolls both back.

use std::future::Future;

use sqlx::Transaction;
use tracing::Instrument as _;

use crate::context::Context;
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::{RecordKey, Store};

use super::lease::Lease;
use super::source::Held;

/// A claimed delivery, until [`Run::finish`]: its span, its context, and its lease if any.
pub struct Run<DB: Store> {
    span: tracing::Span,
    context: Context,
    lease: Option<Lease<DB>>,
}

impl<DB: Store> Run<DB> {
    pub(crate) fn new(span: tracing::Span, context: Context, lease: Option<Lease<DB>>) -> Self {
        Run {
            span,
            context,
            lease,
        }
    }

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
                    lease.release(self.record()).instrument(span.clone()).await;
                }
                Err(Error::Handler(err))
            }
            (Held::Batch { .. }, Ok(value)) => Ok(Outcome::Applied(value)),
            (Held::Batch { failed, .. }, Err(err)) => {
                *failed = true;
                Err(Error::Handler(err))
            }
        };
        super::span::record_outcome(&span, &outcome);
        outcome
    }

    fn record(&self) -> RecordKey<'_> {
        RecordKey {
            scope: self.context.scope(),
            key: self.context.key(),
        }
    }

    async fn commit<T, E>(
        &self,
        mut tx: Transaction<'_, DB>,
        value: T,
    ) -> Result<Outcome<T>, Error<E>> {
        if let Some(lease) = &self.lease {
            match lease.complete(&mut tx, self.record()).await {
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

impl<DB: Store> std::fmt::Debug for Run<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("context", &self.context)
            .field("lease", &self.lease.is_some())
            .finish()
    }
}

/// Names the result of a handler body: `Result<T, E>` or an alias of it (`anyhow::Result<T>`).
///
/// ```
/// use idem::__private::HandlerResult;
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
/// let _: idem::Handled<Result<u8, String>> = Ok(idem::Outcome::Applied(1));
/// ```
pub type Handled<R> = Result<Outcome<<R as HandlerResult>::Ok>, Error<<R as HandlerResult>::Err>>;

//! A claimed delivery until its body has run: [`Run::finish`] commits the effect with the
//! record, or rolls both back.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use sqlx::{Pool, Transaction};

use crate::context::Context;
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::{FailedAttempt, RecordKey, Stamp, StampKey, StampRow, Store, MAX_ERROR_LEN};

use super::builder::Claim;
use super::kept::{Kept, KeptStamp};
use super::lease::Lease;
use super::ops::{AttemptOps, StampOps};
use super::span::Watch;
use super::transact::Held;

/// `replay = true`: the largest body value kept for replay, as JSON: 64 KiB. Over it, the
/// delivery fails with [`Error::Replay`] and nothing is written.
pub const MAX_REPLAY_LEN: usize = 64 * 1024;

/// A claimed delivery, until [`Run::finish`]: its span, its context, its lease if any, and
/// what its options keep (stamp, replayed value, failed attempts).
// At most 128 bytes, with or without `metrics` (a unit test says so): a `Run` is moved
// several times a delivery, and larger values are copied by a call to `memcpy`
// (docs/design/performance.md#moves-over-128-bytes). What only some handlers use is boxed.
pub struct Run<DB: Store> {
    span: tracing::Span,
    watch: Watch,
    context: Context,
    /// `None` for a handler without lease, `fingerprint`, `replay` or `max_attempts`.
    options: Option<Box<Options<DB>>>,
}

/// What a delivery's lease and handler options keep until [`Run::finish`].
struct Options<DB: Store> {
    lease: Option<Lease<DB>>,
    /// `fingerprint` / `replay`: the row to stamp, and the fingerprint.
    stamp: Option<ToStamp<DB>>,
    /// `replay`: the body's value as JSON, or why it cannot be kept ([`Run::encode`]).
    encoded: Option<Result<Vec<u8>, String>>,
    /// `max_attempts`: where failures are counted, and how many were before this one.
    attempts: Option<Counted<DB>>,
    /// `max_attempts`: the text of the body's error ([`Run::failed_with`]).
    error: Option<String>,
}

/// `fingerprint` / `replay`: what an applied delivery stamps, where, and through which table.
struct ToStamp<DB: Store> {
    row: StampRow,
    fingerprint: Option<[u8; 32]>,
    ops: &'static StampOps<DB>,
}

/// `max_attempts`: where failures are counted, how many were before this delivery, and
/// through which table.
struct Counted<DB: Store> {
    pool: Pool<DB>,
    seen: u32,
    ops: &'static AttemptOps<DB>,
}

impl<DB: Store> Default for Options<DB> {
    fn default() -> Self {
        Options {
            lease: None,
            stamp: None,
            encoded: None,
            attempts: None,
            error: None,
        }
    }
}

/// How a body that did not succeed ended.
enum Failure<E> {
    /// It returned `Err`: counted (with `max_attempts`).
    Handler(E),
    /// Its value cannot be kept for replay: not counted, the body itself succeeded.
    Refused(Error<E>),
}

impl<DB: Store> Run<DB> {
    /// A claimed delivery. `attempts` (the pool of a source that counts failures, and the
    /// failures counted so far) is kept when the claim has `max_attempts`.
    pub(crate) fn new(
        span: tracing::Span,
        watch: Watch,
        claim: Claim<DB>,
        lease: Option<Lease<DB>>,
        attempts: Option<(Pool<DB>, u32)>,
    ) -> Self {
        // A fingerprint the claim's insert already wrote needs no stamp. A value to replay still
        // does, and so does a lease's record: taking a lease does not write the fingerprint.
        let stamp = claim.stamp_ops().and_then(|ops| {
            let written = ops.records_fingerprint && lease.is_none() && claim.needs_record();
            (claim.replays() || (claim.fingerprint_bytes().is_some() && !written)).then(|| {
                ToStamp {
                    row: claim.stamp_key().row,
                    fingerprint: claim.fingerprint_bytes().copied(),
                    ops,
                }
            })
        });
        let attempts = match (attempts, claim.attempt_limit()) {
            (Some((pool, seen)), Some((_, ops))) => Some(Counted { pool, seen, ops }),
            _ => None,
        };
        let options = (lease.is_some() || stamp.is_some() || attempts.is_some()).then(|| {
            Box::new(Options {
                lease,
                stamp,
                attempts,
                ..Options::default()
            })
        });
        Run {
            span,
            watch,
            context: claim.into_context(),
            options,
        }
    }

    fn options_mut(&mut self) -> &mut Options<DB> {
        self.options.get_or_insert_with(Box::default)
    }

    fn lease(&self) -> Option<&Lease<DB>> {
        self.options.as_ref()?.lease.as_ref()
    }

    fn stamp(&self) -> Option<&ToStamp<DB>> {
        self.options.as_ref()?.stamp.as_ref()
    }

    fn attempts(&self) -> Option<&Counted<DB>> {
        self.options.as_ref()?.attempts.as_ref()
    }

    /// Runs the handler body inside this delivery's tracing span.
    pub fn in_span<F: Future>(&self, body: F) -> super::span::InSpan<F> {
        super::span::within(&self.span, body)
    }

    /// The delivery, for a [`Context`] parameter of the handler.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// `replay = true`: serializes the body's `Ok` value (checked against
    /// [`MAX_REPLAY_LEN`]), for [`Run::finish`] to keep with the record.
    pub fn encode<T: Replayable, E>(&mut self, result: &Result<T, E>) {
        if let Ok(value) = result {
            self.options_mut().encoded = Some(match serde_json::to_vec(value) {
                Ok(json) if json.len() > MAX_REPLAY_LEN => Err(format!(
                    "the handler's value is {} bytes as JSON; at most {MAX_REPLAY_LEN} are kept",
                    json.len()
                )),
                Ok(json) => Ok(json),
                Err(err) => Err(format!("the handler's value does not serialize: {err}")),
            });
        }
    }

    /// `max_attempts`: the text of the body's error, for `idem_attempts.last_error` (the
    /// generated code passes its Display text, see [`ErrorText`]).
    pub fn failed_with(&mut self, text: String) {
        self.options_mut().error = Some(text);
    }

    /// Commits the body's effect with the record of the message, or rolls both back on `Err`.
    /// In a batch, the batch commits; an `Err` makes it roll back and retry without this message.
    /// In lease mode, success marks the message done in the same transaction; an `Err` releases
    /// the lease. With `max_attempts`, an `Err` is counted after the rollback.
    pub async fn finish<T, E>(
        mut self,
        held: Held<'_, '_, DB>,
        result: Result<T, E>,
    ) -> Result<Outcome<T>, Error<E>> {
        // Taken, not cloned: nothing reads the run's span after this.
        let span = std::mem::replace(&mut self.span, tracing::Span::none());
        let encoded = self.options.as_mut().and_then(|o| o.encoded.take());
        let outcome = match (result, encoded) {
            (Ok(_), Some(Err(problem))) => {
                let refused = Error::Replay {
                    scope: self.context.scope(),
                    problem,
                };
                super::span::within(&span, self.fail(held, Failure::Refused(refused))).await
            }
            (Ok(value), json) => {
                let json = json.and_then(Result::ok);
                // Two awaits, not one over a `match`: a batched delivery's future is then only
                // `keep_in_batch`'s, where the commit's (~750 bytes) would be copied twice a
                // message (docs/design/performance.md#futures-moved-whole).
                match held {
                    Held::Own(tx) => {
                        super::span::within(&span, self.commit(tx, value, json.as_deref())).await
                    }
                    Held::Batch { tx, failed, kept } => {
                        // A handler without options keeps nothing: no future to await.
                        let kept = match self.options {
                            None => Ok(()),
                            Some(_) => {
                                super::span::within(&span, self.keep_in_batch(tx, kept, json)).await
                            }
                        };
                        match kept {
                            Ok(()) => Ok(Outcome::Applied(value)),
                            Err(err) => {
                                *failed = true;
                                Err(Error::Store(err))
                            }
                        }
                    }
                }
            }
            (Err(err), _) => {
                super::span::within(&span, self.fail(held, Failure::Handler(err))).await
            }
        };
        super::span::record_outcome(&span, self.watch, self.context.scope(), &outcome);
        outcome
    }

    /// `max_attempts`: the body panicked. Rolls back, counts the attempt, and resumes the
    /// panic. In a batch, the batch rolls back and runs this message alone, where it is counted.
    pub async fn panicked<T, E>(
        self,
        held: Held<'_, '_, DB>,
        panic: Box<dyn Any + Send>,
    ) -> Result<Outcome<T>, Error<E>> {
        let span = self.span.clone();
        super::span::record_panic(&span, self.watch, self.context.scope());
        match held {
            Held::Own(tx) => {
                super::span::within(&span, self.roll_back(tx)).await;
                let message = panic_message(&*panic);
                super::seen::note(self.context.scope(), self.context.key(), Some(&message));
                super::span::within(&span, self.count(&message)).await;
                std::panic::resume_unwind(panic)
            }
            Held::Batch { failed, .. } => {
                *failed = true;
                Err(Error::Deferred)
            }
        }
    }

    fn record(&self) -> RecordKey<'_> {
        RecordKey {
            scope: self.context.scope(),
            key: self.context.key(),
        }
    }

    async fn fail<T, E>(
        &self,
        held: Held<'_, '_, DB>,
        failure: Failure<E>,
    ) -> Result<Outcome<T>, Error<E>> {
        match held {
            Held::Own(tx) => {
                self.roll_back(tx).await;
                if let Failure::Handler(_) = failure {
                    let error = self.options.as_ref().and_then(|o| o.error.as_ref());
                    let text = match error {
                        Some(text) => text.clone(),
                        None => ErrorText(&()).name::<E>(),
                    };
                    super::seen::note(self.context.scope(), self.context.key(), Some(&text));
                    self.count(&text).await;
                }
            }
            Held::Batch { failed, .. } => *failed = true,
        }
        Err(match failure {
            Failure::Handler(err) => Error::Handler(err),
            Failure::Refused(err) => err,
        })
    }

    /// Rolls back a failed delivery's own transaction, and gives its lease back.
    async fn roll_back(&self, tx: Transaction<'_, DB>) {
        if let Err(rollback) = tx.rollback().await {
            // The handler's error matters more; sqlx closes a connection it cannot roll back.
            tracing::debug!(error = %rollback, "rollback after a handler error failed");
        }
        if let Some(lease) = self.lease() {
            lease.release(self.record()).await;
        }
    }

    /// `max_attempts`: counts a failed attempt in a short transaction of its own. The body's
    /// transaction has ended by now, so on SQLite this never waits on it. Best effort: a store
    /// error here is logged, and the handler's own failure is what the caller sees.
    async fn count(&self, error: &str) {
        let Some(counted) = self.attempts() else {
            return;
        };
        let error = bounded(error);
        let counted = async {
            let mut tx = crate::pooled::begin(&counted.pool).await?;
            let attempt = FailedAttempt {
                record: self.record(),
                error: &error,
            };
            let attempts = (counted.ops.count_attempt)(&mut tx, attempt).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(attempts)
        };
        match counted.await {
            Ok(attempts) => tracing::debug!(attempts, "failed attempt counted"),
            Err(err) => tracing::warn!(error = %err, "counting a failed attempt failed"),
        }
    }

    /// What the handler's options keep in the body's transaction: the stamp (fingerprint,
    /// replayed value), and with `max_attempts` the end of the failures counted so far.
    async fn keep(
        &self,
        tx: &mut Transaction<'_, DB>,
        json: Option<&[u8]>,
    ) -> Result<(), sqlx::Error> {
        if let Some(to_stamp) = self.stamp() {
            let stamp = Stamp {
                at: StampKey {
                    row: to_stamp.row,
                    scope: self.context.scope(),
                    key: self.context.key(),
                },
                fingerprint: to_stamp.fingerprint.as_ref().map(<[u8; 32]>::as_slice),
                result: json,
            };
            (to_stamp.ops.save_stamp)(tx, stamp).await?;
        }
        self.clear_attempts(tx).await
    }

    /// [`Run::keep`] in a batch: the stamp, with the value moved in, is left in `kept` for the
    /// batch to write with the others' in one statement (before it reads a stamp, and before
    /// it commits).
    async fn keep_in_batch(
        &self,
        tx: &mut Transaction<'_, DB>,
        kept: &mut Kept<DB>,
        json: Option<Vec<u8>>,
    ) -> Result<(), sqlx::Error> {
        if let Some(to_stamp) = self.stamp() {
            let (scope, key) = (self.context.scope(), self.context.key());
            let stamp = KeptStamp::new(to_stamp.row, scope, key, to_stamp.fingerprint, json);
            kept.push(to_stamp.ops, stamp);
        }
        self.clear_attempts(tx).await
    }

    /// `max_attempts`: ends the count of failures of a message that had failed before.
    async fn clear_attempts(&self, tx: &mut Transaction<'_, DB>) -> Result<(), sqlx::Error> {
        if let Some(counted) = self.attempts() {
            // Known from the claim: a message that never failed pays no round trip here.
            if counted.seen > 0 {
                (counted.ops.clear_attempts)(tx, self.record()).await?;
            }
        }
        Ok(())
    }

    async fn commit<T, E>(
        &self,
        mut tx: Transaction<'_, DB>,
        value: T,
        json: Option<&[u8]>,
    ) -> Result<Outcome<T>, Error<E>> {
        if let Some(lease) = self.lease() {
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
        if let Err(err) = self.keep(&mut tx, json).await {
            return Err(Error::Store(err));
        }
        match tx.commit().await {
            Ok(()) => Ok(Outcome::Applied(value)),
            Err(err) => Err(Error::Store(err)),
        }
    }
}

/// `text` cut to at most [`MAX_ERROR_LEN`] bytes, at a character boundary, ending with `…`.
fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_ERROR_LEN {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = MAX_ERROR_LEN - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

/// How the generated code of a `max_attempts` handler names its body's error for
/// `idem_attempts.last_error`: `(&&ErrorText(&err)).text()` is the Display text when the error
/// type implements Display ([`DisplayText`]), else its type name ([`NameText`]).
#[doc(hidden)]
pub struct ErrorText<'a, E>(pub &'a E);

impl<E> ErrorText<'_, E> {
    fn name<F>(&self) -> String {
        format!("Err({})", std::any::type_name::<F>())
    }
}

/// The Display text of an error (chosen first, by auto-ref, when there is one).
#[doc(hidden)]
pub trait DisplayText {
    /// The error's text.
    fn text(&self) -> String;
}

impl<E: std::fmt::Display> DisplayText for &ErrorText<'_, E> {
    fn text(&self) -> String {
        self.0.to_string()
    }
}

/// The type name of an error without Display.
#[doc(hidden)]
pub trait NameText {
    /// `Err(path::Type)`.
    fn text(&self) -> String;
}

impl<E> NameText for ErrorText<'_, E> {
    fn text(&self) -> String {
        self.name::<E>()
    }
}

/// The text of a panic's payload (`panic!("...")`), for the attempts table.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("panicked: {text}")
}

/// `max_attempts`: runs a handler body, catching its panic so that the attempt is counted
/// ([`Run::panicked`] resumes it).
pub fn catch_unwind<F: Future>(body: F) -> CatchUnwind<F> {
    CatchUnwind(Box::pin(body))
}

/// The future of [`catch_unwind`].
pub struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let body = self.0.as_mut();
        // The body is not polled again after a panic: what it left half done is dropped.
        match std::panic::catch_unwind(AssertUnwindSafe(|| body.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// A value `replay = true` can keep: serde's `Serialize` and `DeserializeOwned` (as JSON).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed: `replay = true` keeps the handler's value as JSON",
    label = "the `Ok` type of this handler must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
    note = "derive `Serialize` and `Deserialize` for it, or remove `replay = true`"
)]
pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}

impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

/// `replay = true`: turns a duplicate's stored value into `Outcome::Replayed`. Named with the
/// handler's result type `R` (`replayed::<Result<T, E>>`), so that when `T` is not
/// [`Replayable`] the error points at the return type the user wrote.
pub fn replayed<R>(
    done: Result<Outcome<R::Ok>, Error<R::Err>>,
) -> Result<Outcome<R::Ok>, Error<R::Err>>
where
    R: HandlerResult,
    R::Ok: Replayable,
{
    match done {
        Err(Error::Stored { scope, json }) => match serde_json::from_slice(&json) {
            Ok(value) => Ok(Outcome::Replayed(value)),
            Err(err) => Err(Error::Replay {
                scope,
                problem: format!("the stored value no longer deserializes: {err}"),
            }),
        },
        done => done,
    }
}

impl<DB: Store> std::fmt::Debug for Run<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("context", &self.context)
            .field("lease", &self.lease().is_some())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[test]
    fn a_run_is_moved_inline() {
        // Over 128 bytes, each move of a `Run` is a call to `memcpy` (see `Run`).
        assert!(std::mem::size_of::<Run<sqlx::Sqlite>>() <= 128);
    }

    #[test]
    fn an_error_text_is_bounded_at_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let at = "é".repeat(MAX_ERROR_LEN / 2);
        assert_eq!(bounded(&at), at);
        let over = format!("a{at}");
        let cut = bounded(&over);
        assert!(cut.len() <= MAX_ERROR_LEN, "{}", cut.len());
        assert!(cut.ends_with('…') && over.starts_with(cut.trim_end_matches('…')));
    }

    // The borrows are the generated code's, which picks the Display text by auto-ref.
    #[allow(clippy::needless_borrow)]
    #[test]
    fn an_error_is_named_by_its_display_text_or_else_its_type() {
        let err = std::io::Error::other("card expired");
        assert_eq!((&&ErrorText(&err)).text(), "card expired");
        struct Opaque;
        assert!((&&ErrorText(&Opaque)).text().ends_with("Opaque)"));
    }
}

//! Batches: many deliveries in one transaction, their records claimed in one round trip.
//!
//! [`batch`] runs the handler closure twice per message. The first pass only gathers each
//! delivery's claim (no database work, the bodies do not run); then one statement inserts every
//! record, the second pass runs the bodies on the shared transaction without savepoints, and one
//! commit ends the batch. If a body fails, the batch rolls back and is split: the messages before
//! the failure run again as a batch, the failing one alone in a transaction of its own (so its
//! error is reported and nothing of it stays), and the rest as another batch.

use std::collections::HashMap;
use std::ops::Range;

use sqlx::{Database, Pool, Transaction};

use crate::claim::{Claim, Claimed, Decision};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::source::{Held, Opening, Source};
use crate::store::{Record, Store, VersionCheck, VersionEntry};

/// The source a [`batch`] hands its closure: pass it on to `#[idempotent]` handlers.
///
/// ```
/// fn is_source<'c, S: idem_runtime::Source<'c, 'static, sqlx::Sqlite>>(_: S) {}
/// fn check(batch: &mut idem_runtime::Batch<sqlx::Sqlite>) { is_source(batch) }
/// ```
pub struct Batch<DB: Database> {
    mode: Mode<DB>,
    /// The claims gathered for each message of the batch, in call order.
    plans: Vec<Vec<Planned>>,
    /// The message being handled, and how many of its claims were already made.
    current: usize,
    cursor: usize,
    /// Set when a body failed: the batch rolls back and splits.
    failed: bool,
}

enum Mode<DB: Database> {
    /// First pass: gather claims, run nothing.
    Collect,
    /// Second pass: run the bodies in this transaction.
    Apply(Transaction<'static, DB>),
    /// One message alone, in a transaction of its own from this pool.
    Single(Pool<DB>),
}

/// A claim gathered in the first pass, and whether its record was new when the batch inserted it.
struct Planned {
    scope: &'static str,
    key: Vec<u8>,
    retention: std::time::Duration,
    needs_record: bool,
    recorded: Option<bool>,
    /// The entity and version it advances, in the modes with a version.
    target: Option<(Vec<u8>, i64)>,
    /// The result of advancing its version in the first pass's statement.
    checked: Option<VersionCheck>,
    /// Whether the second pass claimed it. A record inserted for a claim that the second pass
    /// never makes (a closure that branches on an outcome) would mark its message handled
    /// without its effect: the batch is then run again one message at a time.
    consumed: bool,
}

impl<'c, DB: Database> Source<'c, 'static, DB> for &'c mut Batch<DB> {
    fn open(self) -> Opening<'c, 'static, DB> {
        // Here the handler's transaction lifetime is `'static`, so the cast is the identity.
        Opening::Batch(self, |tx| tx)
    }
}

/// Turns the batch's `'static` transaction into the handler's `'t` one. Only [`Batch`]'s
/// `Source` impl, where `'t` is `'static`, can make one: it is the identity, and it lets
/// `Batch` carry no lifetime, which keeps a batch's future `Send` for `tokio::spawn`.
#[doc(hidden)]
pub type TxCast<'c, 't, DB> = fn(&'c mut Transaction<'static, DB>) -> &'c mut Transaction<'t, DB>;

impl<DB: Database> Batch<DB> {
    fn new(mode: Mode<DB>, messages: usize) -> Self {
        Batch {
            mode,
            plans: (0..messages).map(|_| Vec::new()).collect(),
            current: 0,
            cursor: 0,
            failed: false,
        }
    }

    fn start(&mut self, message: usize) {
        self.current = message;
        self.cursor = 0;
    }

    async fn roll_back(&mut self) {
        if let Mode::Apply(tx) = std::mem::replace(&mut self.mode, Mode::Collect) {
            if let Err(err) = tx.rollback().await {
                tracing::debug!(error = %err, "rollback of a batch failed");
            }
        }
    }

    pub(crate) fn is_collecting(&self) -> bool {
        matches!(self.mode, Mode::Collect)
    }

    pub(crate) fn collect(&mut self, claim: Claim) {
        let needs_record = claim.needs_record();
        let Record { key, retention, .. } = claim.record();
        let planned = Planned {
            scope: claim.scope(),
            key: key.to_vec(),
            retention,
            needs_record,
            recorded: None,
            target: claim
                .version_target()
                .map(|(entity, version)| (entity.to_vec(), version)),
            checked: None,
            consumed: false,
        };
        if let Some(plan) = self.plans.get_mut(self.current) {
            plan.push(planned);
        }
    }

    /// Claims one delivery of the second pass (or of a message run alone).
    pub(crate) async fn claim<'c, 't: 'c>(
        &'c mut self,
        claim: &Claim,
        cast: TxCast<'c, 't, DB>,
    ) -> Claimed<'c, 't, DB>
    where
        DB: Store,
    {
        let tx = match &mut self.mode {
            Mode::Apply(tx) => tx,
            Mode::Single(pool) => {
                let pool = pool.clone();
                let begin = async move {
                    let tx: Transaction<'t, DB> = pool.begin().await?;
                    Ok(tx)
                };
                return claim.claim_own::<DB>(Box::pin(begin)).await;
            }
            // `Claim::begin` handles the first pass without coming here; claim as if alone.
            Mode::Collect => return Ok(Err(crate::claim::Skip::Duplicate)),
        };
        // The record inserted for this claim in the first pass, if the handler asks again for
        // the same scope and key in the same order (it does unless it is not deterministic).
        let planned = self
            .plans
            .get_mut(self.current)
            .and_then(|plan| plan.get_mut(self.cursor))
            .filter(|p| p.scope == claim.scope() && p.key == claim.key_bytes());
        let (recorded, checked) = planned.map_or((None, None), |p| {
            p.consumed = true;
            (p.recorded, p.checked)
        });
        self.cursor += 1;
        let decided = async {
            match claim.decide::<DB>(tx, recorded, checked).await? {
                Decision::Skip { skip, wrote_record } => {
                    if wrote_record {
                        DB::delete_record(tx, claim.scope(), claim.key_bytes()).await?;
                    }
                    Ok(Some(skip))
                }
                Decision::Apply => Ok(None),
            }
        }
        .await;
        match decided {
            Ok(Some(skip)) => Ok(Err(skip)),
            Ok(None) => Ok(Ok(Held::Batch {
                tx: cast(tx),
                failed: &mut self.failed,
            })),
            Err(err) => {
                // In PostgreSQL an error aborts the transaction: the whole batch must go again.
                self.failed = true;
                Err(err)
            }
        }
    }
}

/// Makes every gathered claim's writes in as few statements as the database allows: the
/// records in one call, then the versions of the deliveries that still need one (key +
/// version; key + version + entity with a new record) in another, and notes each result.
async fn claim_planned<DB: Store>(
    conn: &mut DB::Connection,
    plans: &mut [Vec<Planned>],
) -> Result<(), sqlx::Error> {
    insert_planned_records::<DB>(conn, plans).await?;
    let mut slots = Vec::new();
    let mut entries = Vec::new();
    for (m, plan) in plans.iter().enumerate() {
        for (c, planned) in plan.iter().enumerate() {
            let Some((entity, version)) = &planned.target else {
                continue;
            };
            // With a record, only a new one goes on to its version; a seen key is a duplicate.
            if planned.needs_record && planned.recorded != Some(true) {
                continue;
            }
            slots.push((m, c));
            entries.push(VersionEntry {
                scope: planned.scope,
                entity,
                version: *version,
            });
        }
    }
    if entries.is_empty() {
        return Ok(());
    }
    let checks = DB::advance_versions(conn, &entries).await?;
    drop(entries);
    for ((m, c), check) in slots.into_iter().zip(checks) {
        plans[m][c].checked = Some(check);
    }
    Ok(())
}

/// Inserts the records of every gathered claim in one call, and notes for each whether it was new.
async fn insert_planned_records<DB: Store>(
    conn: &mut DB::Connection,
    plans: &mut [Vec<Planned>],
) -> Result<(), sqlx::Error> {
    let mut unique: Vec<Record<'_>> = Vec::new();
    let mut index: HashMap<(&str, &[u8]), usize> = HashMap::new();
    let mut slots = Vec::new();
    for (m, plan) in plans.iter().enumerate() {
        for (c, planned) in plan.iter().enumerate() {
            if !planned.needs_record {
                continue;
            }
            let pair = (planned.scope, planned.key.as_slice());
            let at = *index.entry(pair).or_insert_with(|| {
                unique.push(Record {
                    scope: pair.0,
                    key: pair.1,
                    retention: planned.retention,
                });
                unique.len() - 1
            });
            slots.push((m, c, at));
        }
    }
    if unique.is_empty() {
        return Ok(());
    }
    let inserted = DB::insert_records(conn, &unique).await?;
    // A key given twice in the batch is new at its first place only.
    let mut first = vec![true; unique.len()];
    let decided: Vec<(usize, usize, bool)> = slots
        .into_iter()
        .map(|(m, c, at)| {
            let new = inserted.get(at).copied().unwrap_or(false) && std::mem::take(&mut first[at]);
            (m, c, new)
        })
        .collect();
    for (m, c, new) in decided {
        plans[m][c].recorded = Some(new);
    }
    Ok(())
}

/// One piece of work of [`batch`]: a range run as a batch, or one message alone.
enum Work {
    Batch(Range<usize>),
    Alone(usize),
}

/// Handles `messages` through `handler` in as few transactions as possible: normally one,
/// with one round trip to claim every record and one commit. Returns each message's result, in
/// order, exactly as the handler returned it; `Err` only when the batch itself could not begin,
/// claim or commit (then nothing of the failed part was written).
///
/// `handler` is called twice per message (the first call only gathers claims, and every handler
/// in it returns `Duplicate` without running), so it should do nothing but call `#[idempotent]`
/// handlers with the batch it is given. It may branch on their outcomes: when the second pass
/// does not make a claim the first one did, the batch rolls back and runs its messages one at
/// a time, so no record is left without its effect.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem_runtime::{batch, Batch, Outcome};
/// use idem_runtime::__private::{Begun, Claim};
///
/// // What `#[idempotent(key = "id")]` generates for a handler whose body does nothing:
/// async fn handle<'c>(source: &'c mut Batch<sqlx::Sqlite>, id: &u32) -> idem_runtime::Handled<Result<(), sqlx::Error>> {
///     match Claim::new("demo").key(id).begin(source).await {
///         Begun::Run(held, run) => run.finish(held, Ok(())).await,
///         Begun::Done(done) => done,
///     }
/// }
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem_runtime::migrate(&pool).await?;
/// let results = batch(&pool, &[1, 2, 1], async |b, id| handle(b, id).await).await?;
/// assert_eq!(results[0].as_ref().unwrap(), &Outcome::Applied(()));
/// assert_eq!(results[2].as_ref().unwrap(), &Outcome::Duplicate);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub async fn batch<DB, M, T, E, F>(
    pool: &Pool<DB>,
    messages: &[M],
    mut handler: F,
) -> Result<Vec<Result<Outcome<T>, Error<E>>>, sqlx::Error>
where
    DB: Store,
    F: AsyncFnMut(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    let mut results = Vec::with_capacity(messages.len());
    // A stack, so that work is done (and results pushed) in message order.
    let mut work = vec![Work::Batch(0..messages.len())];
    while let Some(next) = work.pop() {
        match next {
            Work::Batch(range) if range.is_empty() => {}
            Work::Batch(range) => {
                match run_batch(pool, &messages[range.clone()], &mut handler).await? {
                    Attempt::Committed(done) => results.extend(done),
                    Attempt::Unplanned => {
                        tracing::debug!("the second pass did not make the claims of the first: one message at a time");
                        work.extend(range.rev().map(Work::Alone));
                    }
                    Attempt::Failed(failed) => {
                        let at = range.start + failed;
                        tracing::debug!(
                            message = at,
                            "a body failed: the batch is split around it"
                        );
                        work.push(Work::Batch(at + 1..range.end));
                        work.push(Work::Alone(at));
                        work.push(Work::Batch(range.start..at));
                    }
                }
            }
            Work::Alone(at) => {
                let mut alone = Batch::new(Mode::Single(pool.clone()), 1);
                results.push(handler(&mut alone, &messages[at]).await);
            }
        }
    }
    Ok(results)
}

/// How one attempt at a batch ended.
enum Attempt<T, E> {
    /// Committed, with each message's result.
    Committed(Vec<Result<Outcome<T>, Error<E>>>),
    /// The body of this message failed; all rolled back.
    Failed(usize),
    /// The second pass did not make a claim whose record the first pass inserted (the closure
    /// branched differently); all rolled back.
    Unplanned,
}

/// One attempt at a batch.
async fn run_batch<DB, M, T, E, F>(
    pool: &Pool<DB>,
    messages: &[M],
    handler: &mut F,
) -> Result<Attempt<T, E>, sqlx::Error>
where
    DB: Store,
    F: AsyncFnMut(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    let mut batch = Batch::new(Mode::Collect, messages.len());
    for (i, message) in messages.iter().enumerate() {
        batch.start(i);
        // Gathers the claims; the bodies do not run and the results mean nothing.
        let _ = handler(&mut batch, message).await;
    }
    let mut tx = pool.begin().await?;
    claim_planned::<DB>(&mut tx, &mut batch.plans).await?;
    batch.mode = Mode::Apply(tx);

    let mut results = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        batch.start(i);
        let result = handler(&mut batch, message).await;
        if batch.failed {
            batch.roll_back().await;
            return Ok(Attempt::Failed(i));
        }
        results.push(result);
    }
    let unplanned = batch
        .plans
        .iter()
        .flatten()
        .any(|p| (p.recorded == Some(true) || p.checked.is_some()) && !p.consumed);
    if unplanned {
        batch.roll_back().await;
        return Ok(Attempt::Unplanned);
    }
    if let Mode::Apply(tx) = std::mem::replace(&mut batch.mode, Mode::Collect) {
        tx.commit().await?;
    }
    Ok(Attempt::Committed(results))
}

//! Batches: many deliveries in one transaction, their records claimed in one round trip.
//!
//! [`batch`] runs the handler closure twice per message. The first pass only gathers each
//! delivery's claim (no database work, the bodies do not run); then one statement inserts every
//! record, the second pass runs the bodies on the shared transaction without savepoints, and one
//! commit ends the batch. If a body fails, the batch rolls back and is split: the messages before
//! the failure run again as a batch, the failing one alone in a transaction of its own (so its
//! error is reported and nothing of it stays), and the rest as another batch.

use std::future::Future;
use std::ops::Range;

use foldhash::HashMap;
use futures_core::future::BoxFuture;
use sqlx::{Database, Pool, Transaction};

use crate::claim::{
    claim_alone, decide, settled, Claim, Claimed, Decision, Kept, PooledTransact, Prefetched, Skip,
    Transact,
};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::{Inserted, Record, StampKey, Store, VersionCheck, VersionEntry};

/// The source a [`batch`] hands its closure: pass it on to `#[idempotent]` handlers.
///
/// ```
/// fn is_source<'c, S: idem::Transact<'c, 'static, idem::sqlx::Sqlite>>(_: S) {}
/// fn check(batch: &mut idem::Batch<idem::sqlx::Sqlite>) { is_source(batch) }
/// ```
pub struct Batch<DB: Database> {
    mode: Mode<DB>,
    /// Where handlers with `max_attempts` count their failures.
    pool: Pool<DB>,
    /// The claims gathered in the first pass, message after message, each in call order.
    plans: Vec<Planned<DB>>,
    /// Where each message's claims start in `plans`; one more entry closes the last.
    starts: Vec<usize>,
    /// The message being handled, and how many of its claims were already made.
    current: usize,
    cursor: usize,
    /// Set when a body failed: the batch rolls back and splits.
    failed: bool,
    /// The stamps of the applied deliveries, written together before a stamp is read and
    /// before the commit.
    kept: Kept<DB>,
}

enum Mode<DB: Database> {
    /// First pass: gather claims, run nothing.
    Collect,
    /// Second pass: run the bodies in this transaction.
    Apply(Transaction<'static, DB>),
    /// One message alone, in a transaction of its own from this pool.
    Single(Pool<DB>),
}

/// A claim gathered in the first pass, and what the batch's statements wrote for it.
struct Planned<DB: Database> {
    claim: Claim<DB>,
    done: Prefetched,
    /// Whether the second pass claimed it. A record inserted for a claim that the second pass
    /// never makes (a closure that branches on an outcome) would mark its message handled
    /// without its effect: the batch is then run again one message at a time.
    consumed: bool,
    /// A later copy, in this batch, of a message whose record the batch inserts new: the place
    /// of its first copy, whose decision it follows (`settle_copies`).
    copy_of: Option<usize>,
}

impl<'c, DB: Store> Transact<'c, 'static, DB> for &'c mut Batch<DB> {
    fn claim<'a>(
        self,
        claim: &'a Claim<DB>,
    ) -> BoxFuture<'a, Result<Claimed<'c, 'static, DB>, sqlx::Error>>
    where
        Self: 'a,
        'c: 'a,
    {
        // Only claims with a statement left to send get here (`settle` decides the others):
        // the future is written into its box, not copied there.
        crate::pooled::in_place(|| self.claim_one(claim))
    }

    fn gather(&mut self, claim: Claim<DB>) -> Option<Claim<DB>> {
        self.collect(claim)
    }

    fn settle(self, claim: &Claim<DB>) -> Result<Claimed<'c, 'static, DB>, Self> {
        // Decided first, then borrowed: the transaction is lent out only when it settles.
        let Some(skip) = self.settled(claim) else {
            return Err(self);
        };
        if let Some(skip) = skip {
            return Ok(Claimed::Skip(skip));
        }
        match self.mode {
            Mode::Apply(ref mut tx) => Ok(lent(tx, &mut self.failed, &mut self.kept)),
            // `settled` decides only in the second pass.
            Mode::Collect | Mode::Single(_) => Err(self),
        }
    }
}

impl<'c, DB: Store> PooledTransact<'c, 'static, DB> for &'c mut Batch<DB> {
    fn pool(&self) -> Pool<DB> {
        self.pool.clone()
    }
}

impl<DB: Store> Batch<DB> {
    /// First pass: keeps `claim` for the current message; otherwise gives it back.
    fn collect(&mut self, claim: Claim<DB>) -> Option<Claim<DB>> {
        if !matches!(self.mode, Mode::Collect) {
            return Some(claim);
        }
        self.plans.push(Planned {
            claim,
            done: Prefetched::default(),
            consumed: false,
            copy_of: None,
        });
        None
    }

    /// The second pass's decision for `claim` when the batch's statements made it and nothing
    /// is left to send: `Some(None)` to run the body, `Some(Some(skip))` to skip it. The claim
    /// the first pass gathered at this place is then consumed, and a stamp judged by is moved
    /// out of it. `None` leaves the plan as it was, for [`Batch::claim_one`].
    fn settled(&mut self, claim: &Claim<DB>) -> Option<Option<Skip>> {
        if !matches!(self.mode, Mode::Apply(_)) {
            return None;
        }
        let planned = planned_at(&mut self.plans, &self.starts, self.current, self.cursor)
            .filter(|p| same_claim(&p.claim, claim))?;
        // `settled` takes the stamp only where it decides a skip with nothing to undo.
        let skip = match settled(claim, &mut planned.done)? {
            Decision::Apply => None,
            Decision::Skip {
                skip,
                wrote_record: false,
            } => Some(skip),
            // The batch inserted its record: `claim_one` deletes it.
            Decision::Skip {
                wrote_record: true, ..
            } => return None,
        };
        planned.consumed = true;
        self.cursor += 1;
        Some(skip)
    }

    /// Claims `claim` in the batch's transaction (second pass), or alone in a transaction of its
    /// own. The first pass never gets here: `Claim::begin` gathers first (`Transact::gather`).
    async fn claim_one(
        &mut self,
        claim: &Claim<DB>,
    ) -> Result<Claimed<'_, 'static, DB>, sqlx::Error> {
        match &mut self.mode {
            Mode::Collect => Err(sqlx::Error::Protocol(
                "idem: a batch's first pass claimed a message instead of gathering it".into(),
            )),
            Mode::Single(pool) => claim_single(pool, claim).await,
            Mode::Apply(tx) => {
                // What the batch wrote for this claim; its stamp is moved out, not copied:
                // nothing reads it from the plan again.
                let done = planned_at(&mut self.plans, &self.starts, self.current, self.cursor)
                    .filter(|p| same_claim(&p.claim, claim))
                    .map_or_else(Prefetched::default, |p| {
                        p.consumed = true;
                        let stamp = p.done.stamp.take();
                        Prefetched {
                            stamp,
                            ..p.done.clone()
                        }
                    });
                self.cursor += 1;
                // A claim the batch's statements decided never gets here (`settle`): this one
                // has a statement left to send.
                match decide_in_batch::<DB>(claim, tx, &mut self.kept, done).await {
                    Ok(None) => Ok(lent(tx, &mut self.failed, &mut self.kept)),
                    Ok(Some(skip)) => Ok(Claimed::Skip(skip)),
                    Err(err) => {
                        // In PostgreSQL an error aborts the transaction: the whole batch must go again.
                        self.failed = true;
                        Err(err)
                    }
                }
            }
        }
    }
}

/// Claims `claim` alone, in a transaction of its own from `pool`.
async fn claim_single<'c, DB: Store>(
    pool: &Pool<DB>,
    claim: &Claim<DB>,
) -> Result<Claimed<'c, 'static, DB>, sqlx::Error> {
    let tx = crate::pooled::begin(pool).await?;
    claim_alone(claim, tx).await
}

/// Decides one claim in the batch's transaction; a skipped claim whose record the batch
/// inserted has it removed, since the message did not run. A claim that may read a stamp
/// first writes the ones kept so far: an earlier delivery of the batch may have stamped its row.
async fn decide_in_batch<DB: Store>(
    claim: &Claim<DB>,
    tx: &mut Transaction<'static, DB>,
    kept: &mut Kept<DB>,
    done: Prefetched,
) -> Result<Option<crate::claim::Skip>, sqlx::Error> {
    if claim.stamps() {
        kept.write(tx).await?;
    }
    match decide::<DB>(claim, tx, done).await? {
        Decision::Apply => Ok(None),
        Decision::Skip { skip, wrote_record } => {
            if wrote_record {
                DB::delete_record(tx, claim.record().id()).await?;
            }
            Ok(Some(skip))
        }
    }
}

/// A claimed delivery's view of the batch: its transaction, where a failed body says so, and
/// where an applied one leaves its stamp.
fn lent<'c, DB: Store>(
    tx: &'c mut Transaction<'static, DB>,
    failed: &'c mut bool,
    kept: &'c mut Kept<DB>,
) -> Claimed<'c, 'static, DB> {
    Claimed::Batch {
        tx,
        failed,
        kept,
        // Here the handler's transaction lifetime is `'static`: the identity.
        cast: |tx| tx,
    }
}

/// Whether the second pass asks again for what the first gathered at this place: the same
/// scope and key (it does unless the closure is not deterministic).
fn same_claim<DB: Database>(planned: &Claim<DB>, claim: &Claim<DB>) -> bool {
    planned.scope() == claim.scope() && planned.key_bytes() == claim.key_bytes()
}

/// The claim the first pass gathered as the `cursor`-th of message `current`, if it made one.
fn planned_at<'p, DB: Database>(
    plans: &'p mut [Planned<DB>],
    starts: &[usize],
    current: usize,
    cursor: usize,
) -> Option<&'p mut Planned<DB>> {
    let at = starts.get(current)? + cursor;
    if at < *starts.get(current + 1)? {
        plans.get_mut(at)
    } else {
        None
    }
}

impl<DB: Database> Batch<DB> {
    fn new(mode: Mode<DB>, pool: &Pool<DB>, messages: usize) -> Self {
        let gathers = matches!(mode, Mode::Collect);
        Batch {
            mode,
            pool: pool.clone(),
            // One allocation each for the batch, sized for one claim a message.
            plans: Vec::with_capacity(if gathers { messages } else { 0 }),
            starts: Vec::with_capacity(if gathers { messages + 1 } else { 0 }),
            current: 0,
            cursor: 0,
            failed: false,
            kept: Kept::default(),
        }
    }

    fn start(&mut self, message: usize) {
        self.current = message;
        self.cursor = 0;
        if matches!(self.mode, Mode::Collect) {
            self.starts.push(self.plans.len());
        }
    }

    /// First pass over: closes the last message's claims.
    fn gathered(&mut self) {
        self.starts.push(self.plans.len());
    }

    async fn roll_back(&mut self) {
        if let Mode::Apply(tx) = std::mem::replace(&mut self.mode, Mode::Collect) {
            if let Err(err) = tx.rollback().await {
                tracing::debug!(error = %err, "rollback of a batch failed");
            }
        }
    }
}

/// Makes every gathered claim's writes in as few statements as the database allows: the
/// records in one call, then the versions of the deliveries that still need one (key +
/// version; key + version + entity with a new record) in another, and notes each result.
async fn claim_planned<DB: Store>(
    conn: &mut DB::Connection,
    plans: &mut [Planned<DB>],
) -> Result<(), sqlx::Error> {
    let copies = insert_planned_records::<DB>(conn, plans).await?;
    let mut slots = Vec::new();
    let mut entries: Vec<VersionEntry<'_>> = Vec::new();
    for (at, planned) in plans.iter().enumerate() {
        let Some(entry) = planned.claim.version_entry() else {
            continue;
        };
        // With a record, only a new one goes on to its version; a seen key is a duplicate.
        // A later copy of a record new in this batch is checked too, in its place, in case its
        // first copy turns out stale (`settle_copies`): only with the first copy's version,
        // which cannot advance there where the first's did not.
        if planned.claim.needs_record()
            && planned.done.recorded != Some(true)
            && planned
                .copy_of
                .is_none_or(|first| plans[first].claim.version_entry() != Some(entry))
        {
            continue;
        }
        slots.push(at);
        entries.push(entry);
    }
    if !entries.is_empty() {
        let checks = DB::advance_versions(conn, &entries).await?;
        drop(entries);
        for (at, check) in slots.into_iter().zip(checks) {
            plans[at].done.checked = Some(check);
        }
    }
    if copies {
        settle_copies(plans);
    }
    load_planned_stamps::<DB>(conn, plans).await
}

/// key + version + entity: the later copies, in this batch, of a message whose record the batch
/// inserted new follow their first copy. If it applies, they are its duplicates. If it turns out
/// stale, its record is taken back and each copy is stale too, as it would be delivered alone
/// after it: against the latest version its own check found in its place
/// ([`Prefetched::stale_copy`]). A copy with another version than its first (a key reused for
/// another message) was not checked, and is decided by a statement of its own in the second pass.
fn settle_copies<DB: Database>(plans: &mut [Planned<DB>]) {
    for at in 0..plans.len() {
        let Some(first) = plans[at].copy_of else {
            continue;
        };
        let Some(entry) = plans[at].claim.version_entry() else {
            continue;
        };
        let first_applies = plans[first].done.checked == Some(VersionCheck::Advanced);
        let copy = &mut plans[at].done;
        match (first_applies, copy.checked.take()) {
            // A duplicate of the applied first copy (`recorded` is already false).
            (true, _) => {}
            (false, Some(VersionCheck::Behind { latest })) => copy.stale_copy = Some(latest),
            (false, Some(VersionCheck::Equal)) => copy.stale_copy = Some(entry.version),
            (false, _) => *copy = Prefetched::default(),
        }
    }
}

/// `fingerprint` / `replay`: reads in one call the stamps of the batch's duplicates, for
/// their claims to be judged by. A key claimed more than once in the batch is left out: its
/// first claim stamps its row during the second pass, so the later ones read it then.
async fn load_planned_stamps<DB: Store>(
    conn: &mut DB::Connection,
    plans: &mut [Planned<DB>],
) -> Result<(), sqlx::Error> {
    // Every stamped claim of the batch has the same table: `DB`'s.
    let Some(ops) = plans.iter().find_map(|p| p.claim.stamp_ops()) else {
        return Ok(());
    };
    let mut claimed: HashMap<(&str, &[u8]), usize> = HashMap::default();
    for planned in plans.iter() {
        *claimed
            .entry((planned.claim.scope(), planned.claim.key_bytes()))
            .or_default() += 1;
    }
    let mut slots = Vec::new();
    let mut keys: Vec<StampKey<'_>> = Vec::new();
    for (at, planned) in plans.iter().enumerate() {
        let claim = &planned.claim;
        let duplicate = if claim.needs_record() {
            planned.done.recorded == Some(false)
        } else {
            planned.done.checked == Some(VersionCheck::Equal)
        };
        let unread = planned.done.stamp.is_none();
        if claim.stamps()
            && duplicate
            && unread
            && claimed[&(claim.scope(), claim.key_bytes())] == 1
        {
            slots.push(at);
            keys.push(claim.stamp_key());
        }
    }
    if keys.is_empty() {
        return Ok(());
    }
    let stamps = (ops.load_stamps)(conn, &keys).await?;
    drop(keys);
    drop(claimed);
    for (at, stamp) in slots.into_iter().zip(stamps) {
        plans[at].done.stamp = Some(stamp);
    }
    Ok(())
}

/// Inserts the records of every gathered claim in one call, and notes for each whether it was
/// new, and for a later copy of a record new in the batch, the place of its first copy.
/// Returns whether there is such a copy.
async fn insert_planned_records<DB: Store>(
    conn: &mut DB::Connection,
    plans: &mut [Planned<DB>],
) -> Result<bool, sqlx::Error> {
    // Sized for one claim a message: grown, the map was reallocated six times a batch of 100.
    let mut unique: Vec<Record<'_>> = Vec::with_capacity(plans.len());
    let mut index: HashMap<(&str, &[u8]), usize> =
        HashMap::with_capacity_and_hasher(plans.len(), Default::default());
    let mut slots = Vec::with_capacity(plans.len());
    for (at, planned) in plans.iter().enumerate() {
        if !planned.claim.needs_record() {
            continue;
        }
        let record = planned.claim.record();
        let row = *index.entry((record.scope, record.key)).or_insert_with(|| {
            unique.push(record);
            unique.len() - 1
        });
        slots.push((at, row));
    }
    if unique.is_empty() {
        return Ok(false);
    }
    // `fingerprint` / `replay`: a found record's stamp, where the insert can read it.
    let stamping = plans.iter().find_map(|p| {
        p.claim
            .needs_record()
            .then(|| p.claim.stamp_ops())
            .flatten()
    });
    // A batch of one (a consumer's `batch(1)`) takes the plain one-row insert, cheaper for the
    // server than the multi-row statement.
    let mut inserted: Vec<Inserted> = match (unique.as_slice(), stamping) {
        ([one], None) => vec![Inserted::unread(DB::insert_record(conn, *one).await?)],
        ([one], Some(ops)) => vec![match (ops.insert_record_or_read_stamp)(conn, *one).await? {
            None => Inserted::unread(true),
            Some(stamp) => Inserted { new: false, stamp },
        }],
        (_, None) => DB::insert_records(conn, &unique)
            .await?
            .into_iter()
            .map(Inserted::unread)
            .collect(),
        (_, Some(ops)) => (ops.insert_records_reading_stamps)(conn, &unique).await?,
    };
    drop(index);
    drop(unique);
    // A key given twice in the batch is new at its first place only. Its later places are
    // copies of a record this batch writes: their stamp is read in the second pass, once the
    // first place has stamped it, and they follow the first place's decision.
    let mut first = vec![usize::MAX; inserted.len()];
    let mut claimed = vec![0_usize; inserted.len()];
    for (_, row) in &slots {
        claimed[*row] += 1;
    }
    let mut copies = false;
    for (at, row) in slots {
        let Some(found) = inserted.get_mut(row) else {
            plans[at].done.recorded = Some(false);
            continue;
        };
        let new = found.new && first[row] == usize::MAX;
        if new {
            first[row] = at;
        } else if found.new {
            plans[at].copy_of = Some(first[row]);
            copies = true;
        }
        plans[at].done.recorded = Some(new);
        if !new && claimed[row] == 1 && plans[at].claim.stamps() {
            plans[at].done.stamp = found.stamp.take().map(Some);
        }
    }
    Ok(copies)
}

/// What a batch returns: each message's result, in order; `Err` when the batch itself could
/// not begin, claim or commit.
pub(crate) type Results<T, E> = Result<Vec<Result<Outcome<T>, Error<E>>>, sqlx::Error>;

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
/// `handler` is called twice per message (the first call only gathers claims: every handler in
/// it returns at once without running, and that result is discarded), so it should do nothing
/// but call `#[idempotent]`
/// handlers with the batch it is given. It may branch on their outcomes: when the second pass
/// does not make a claim the first one did, the batch rolls back and runs its messages one at
/// a time, so no record is left without its effect.
///
/// Twice, because the batch needs every message's claim before its one claiming statement. A
/// batch that calls `handler` once, with every message's future parked at its claim until all
/// are claimed, was measured slower: 2 to 3% more instructions a message on SQLite, its boxes,
/// lock and copied claims costing more than the second call saves
/// (docs/design/performance.md#why-the-closure-still-runs-twice).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem::{batch, Batch, Outcome};
/// use idem::__private::{Begun, Claim};
///
/// // What `#[idempotent(key = "id")]` generates for a handler whose body does nothing:
/// async fn handle<'c>(source: &'c mut Batch<sqlx::Sqlite>, id: &u32) -> idem::Handled<Result<(), sqlx::Error>> {
///     match Claim::new("demo").key(id).begin(source).await {
///         Begun::Run(held, run) => run.finish(held, Ok(())).await,
///         Begun::Done(done) => done,
///     }
/// }
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// let results = batch(&pool, &[1, 2, 1], async |b, id| handle(b, id).await).await?;
/// assert_eq!(results[0].as_ref().unwrap(), &Outcome::Applied(()));
/// assert_eq!(results[2].as_ref().unwrap(), &Outcome::Duplicate);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
// `batch_with`'s future itself, not an `async fn` around it: each layer deepens the types the
// compiler lays out for the caller's future, which has a depth limit (`recursion_limit`).
pub fn batch<'a, DB, M, T, E, F>(
    pool: &'a Pool<DB>,
    messages: &'a [M],
    handler: F,
) -> impl Future<Output = Results<T, E>> + use<'a, DB, M, T, E, F>
where
    DB: Store,
    F: AsyncFnMut(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    batch_with(pool, messages, Owned(handler))
}

/// What a batch calls for each message: the closure given to [`batch`], owned, or one the
/// consumer shares between the batches it runs at once.
///
/// A wrapper rather than `&F` as an `AsyncFnMut`: through that blanket impl the compiler can
/// no longer prove the batch's future `Send` (it asks for the impl at every lifetime of the
/// reference), and a consumer could not be `tokio::spawn`ed.
pub(crate) trait Handler<DB: Database, M, T, E> {
    /// The closure's own future, not wrapped in another (each wrapper deepens the types the
    /// compiler lays out for the caller's future).
    fn call<'a>(
        &'a mut self,
        batch: &'a mut Batch<DB>,
        message: &'a M,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + 'a;

    /// Writes more in a batch's transaction just before its commit, knowing each message's
    /// result (the consumer deletes the parked retries the batch decided); an error rolls the
    /// batch back as a store error. By default nothing.
    fn before_commit<'a>(
        &'a mut self,
        conn: &'a mut DB::Connection,
        messages: &'a [M],
        results: &'a [Result<Outcome<T>, Error<E>>],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + 'a {
        let _ = (conn, messages, results);
        std::future::ready(Ok(()))
    }
}

/// The closure given to [`batch`].
struct Owned<F>(F);

impl<DB, M, T, E, F> Handler<DB, M, T, E> for Owned<F>
where
    DB: Database,
    F: AsyncFnMut(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
{
    fn call<'a>(
        &'a mut self,
        batch: &'a mut Batch<DB>,
        message: &'a M,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + 'a {
        (self.0)(batch, message)
    }
}

/// [`batch`], through a [`Handler`].
pub(crate) async fn batch_with<DB, M, T, E, H>(
    pool: &Pool<DB>,
    messages: &[M],
    mut handler: H,
) -> Results<T, E>
where
    DB: Store,
    H: Handler<DB, M, T, E>,
{
    let mut results = Vec::with_capacity(messages.len());
    // A stack, so that work is done (and results pushed) in message order.
    let mut work = vec![Work::Batch(0..messages.len())];
    while let Some(next) = work.pop() {
        match next {
            Work::Batch(range) if range.is_empty() => {}
            Work::Batch(range) => match run_batch(pool, &messages[range.clone()], &mut handler)
                .await?
            {
                Attempt::Committed(done) => results.extend(done),
                Attempt::Unplanned => {
                    tracing::debug!("the second pass did not make the claims of the first: one message at a time");
                    work.extend(range.rev().map(Work::Alone));
                }
                Attempt::Failed(failed) => {
                    let at = range.start + failed;
                    tracing::debug!(message = at, "a body failed: the batch is split around it");
                    work.push(Work::Batch(at + 1..range.end));
                    work.push(Work::Alone(at));
                    work.push(Work::Batch(range.start..at));
                }
            },
            Work::Alone(at) => {
                let mut alone = Batch::new(Mode::Single(pool.clone()), pool, 1);
                results.push(handler.call(&mut alone, &messages[at]).await);
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

/// Opens the batch's transaction and makes every gathered claim in it. As for a delivery alone
/// ([`claim_alone`]), an error the backend says may be retried at once (MySQL's deadlock) begins
/// again in a new transaction: idem opened this one, and no body has run in it.
async fn claim_batch<DB: Store>(
    pool: &Pool<DB>,
    plans: &mut [Planned<DB>],
) -> Result<Transaction<'static, DB>, sqlx::Error> {
    let mut attempt = 1;
    loop {
        let mut tx = crate::pooled::begin(pool).await?;
        match claim_planned::<DB>(&mut tx, plans).await {
            Ok(()) => return Ok(tx),
            Err(err) if attempt < crate::claim::CLAIM_ATTEMPTS && DB::retry_claim(&err) => {
                tracing::debug!(attempt, error = %err, "batch claim rolled back by the database; claiming again");
                attempt += 1;
                let _ = tx.rollback().await;
                for planned in plans.iter_mut() {
                    planned.done = Prefetched::default();
                    planned.copy_of = None;
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// One attempt at a batch.
async fn run_batch<DB, M, T, E, H>(
    pool: &Pool<DB>,
    messages: &[M],
    handler: &mut H,
) -> Result<Attempt<T, E>, sqlx::Error>
where
    DB: Store,
    H: Handler<DB, M, T, E>,
{
    let mut batch = Batch::new(Mode::Collect, pool, messages.len());
    for (i, message) in messages.iter().enumerate() {
        batch.start(i);
        // Gathers the claims; the bodies do not run and the results mean nothing.
        let _ = handler.call(&mut batch, message).await;
    }
    batch.gathered();
    let tx = claim_batch(pool, &mut batch.plans).await?;
    batch.mode = Mode::Apply(tx);

    let mut results = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        batch.start(i);
        let result = handler.call(&mut batch, message).await;
        if batch.failed {
            batch.roll_back().await;
            return Ok(Attempt::Failed(i));
        }
        results.push(result);
    }
    let unplanned = batch
        .plans
        .iter()
        .any(|p| (p.done.recorded == Some(true) || p.done.checked.is_some()) && !p.consumed);
    if unplanned {
        batch.roll_back().await;
        return Ok(Attempt::Unplanned);
    }
    if let Mode::Apply(mut tx) = std::mem::replace(&mut batch.mode, Mode::Collect) {
        batch.kept.write(&mut tx).await?;
        handler.before_commit(&mut tx, messages, &results).await?;
        tx.commit().await?;
    }
    Ok(Attempt::Committed(results))
}

// A claim names its database: the tests need one.
#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::*;

    // SQLite's here.
    #[cfg(feature = "sqlite")]
    fn planned(scope: &'static str) -> Planned<sqlx::Sqlite> {
        Planned {
            claim: Claim::new(scope),
            done: Prefetched::default(),
            consumed: false,
            copy_of: None,
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn a_message_finds_its_own_claims_and_no_other() {
        // Message 0 made two claims, message 1 none, message 2 one.
        let mut plans = vec![planned("a"), planned("b"), planned("c")];
        let starts = [0, 2, 2, 3];
        let scope = |plans: &mut [Planned<sqlx::Sqlite>], message, cursor| {
            planned_at(plans, &starts, message, cursor).map(|p| p.claim.scope())
        };
        assert_eq!(scope(&mut plans, 0, 0), Some("a"));
        assert_eq!(scope(&mut plans, 0, 1), Some("b"));
        assert_eq!(
            scope(&mut plans, 0, 2),
            None,
            "message 1's claims start here"
        );
        assert_eq!(scope(&mut plans, 1, 0), None);
        assert_eq!(scope(&mut plans, 2, 0), Some("c"));
        assert_eq!(scope(&mut plans, 2, 1), None);
        assert_eq!(scope(&mut plans, 3, 0), None, "past the last message");
    }

    /// A batched message's claim is boxed once per message, so all of it is copied once per
    /// message: it must not hold sqlx's `pool.begin()` inline (8.7 KB on PostgreSQL in a
    /// release build; it did once, through the path of a message run alone). See
    /// docs/design/performance.md#futures-moved-whole. Checked on PostgreSQL, whose begin is
    /// large; SQLite's is
    /// small (it connects on a worker thread), so there the sizes would prove nothing.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn the_batch_claim_holds_no_pool_begin_inline() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://idem@127.0.0.1/never_connected")
            .unwrap();
        let mut batch = Batch::new(Mode::Collect, &pool, 1);
        let claim = Claim::new("size");
        let claim_size = std::mem::size_of_val(&batch.claim_one(&claim));
        let begin_size = std::mem::size_of_val(&pool.begin());
        assert!(
            claim_size < begin_size,
            "the batch's claim future ({claim_size} bytes) holds pool.begin()'s ({begin_size})"
        );
    }
}

//! [`Consumer`]: the broker-neutral loop. Deliveries in, decoded, grouped into batches, run
//! through [`batch`](crate::batch) (or one at a time for lease-mode handlers), and settled each
//! only after its transaction committed.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Fuse, FusedFuture as _};
use futures_util::stream::{FuturesUnordered, Stream, StreamExt as _};
use futures_util::FutureExt as _;
use sqlx::Pool;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::batch::Batch;
use crate::error::Error;
use crate::outcome::Outcome;
use crate::recover::RecoveryStore;
use crate::store::Store;

use super::counts::Counts;
use super::delivery::Delivery;
use super::flight::Flight;
use super::health::{Health, Monitor};
use super::probe::Probe;
use super::recovering::{Described, Failed, OnStore, Recovering, Taken};
use super::recovery::Recovery;
use super::runner::{EachAlone, InBatch, Runner, Tracked};
use super::settle::{verdict, Counted, DeadLetterReason, Settle, Verdict};
use super::source::Source;

/// A consumer: how many deliveries go in one transaction, how many transactions run at once,
/// and how long things may take. Build it, then [`run`](Consumer::run) it on a stream of
/// deliveries from a broker adapter.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use idem::consume::{memory::MemoryQueue, Consumer};
/// use idem::{idempotent, Tx};
/// use idem::sqlx::Sqlite;
///
/// #[idempotent(key = "id", scope = "demo::seen")]
/// async fn seen(tx: &mut Tx<'_, Sqlite>, id: &u64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO seen (id) VALUES (?)").bind(*id as i64).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE seen (id INTEGER NOT NULL)").execute(&pool).await?;
///
/// let queue = MemoryQueue::new();
/// for id in [1_u64, 2, 1, 3, 2] {
///     queue.publish(id.to_string().into_bytes());
/// }
/// let counts = Consumer::new(pool.clone())
///     .batch(10)
///     .run(queue.deliveries(), idem::consume::json::<u64>,
///          async |b, id| seen(b, id).await, queue.idle())
///     .await;
/// assert_eq!((counts.applied, counts.duplicate), (3, 2));
/// let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen").fetch_one(&pool).await?;
/// assert_eq!(rows, 3);
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Consumer<DB: Store> {
    pool: Pool<DB>,
    batch: usize,
    linger: Duration,
    concurrency: usize,
    handler_timeout: Duration,
    drain_timeout: Duration,
    settle_timeout: Duration,
    max_deliveries: Option<u32>,
    retry_delay: Duration,
    max_retry_delay: Duration,
    in_progress_delay: Duration,
    /// Durable retries and dead letters in the database, when on.
    recovery: Option<Recovering<DB>>,
    /// What this consumer's run took and has not settled (the in-flight gauge's share).
    flight: Flight,
    /// Its health settings and handle (`health.rs`).
    pub(super) monitor: Monitor,
}

impl<DB: Store> Consumer<DB> {
    /// A consumer writing through `pool`: batches of 1, one at a time, a 30 s handler
    /// time-out, a 10 s drain, no `max_deliveries`.
    pub fn new(pool: Pool<DB>) -> Self {
        Consumer {
            pool,
            batch: 1,
            linger: Duration::from_millis(5),
            concurrency: 1,
            handler_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            settle_timeout: Duration::from_secs(5),
            max_deliveries: None,
            retry_delay: Duration::from_millis(100),
            max_retry_delay: Duration::from_secs(30),
            in_progress_delay: Duration::from_secs(1),
            recovery: None,
            flight: Flight::default(),
            monitor: Monitor::default(),
        }
    }

    /// Up to `n` deliveries in one transaction (at least 1). Size the broker's prefetch to
    /// `batch × concurrency`.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long a batch waits for more deliveries once it has one (default 5 ms).
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How many batches are in flight at once (at least 1).
    pub fn concurrency(mut self, k: usize) -> Self {
        self.concurrency = k.max(1);
        self
    }

    /// A batch that runs longer is cancelled (its transaction rolls back) and its deliveries
    /// requeued, so a hung handler cannot hold messages and row locks forever (default 30 s).
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// After the shutdown signal, how long in-flight batches may take to finish and settle;
    /// then they are cancelled and their deliveries requeued (default 10 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Dead-letter a delivery that the broker has delivered more than `n` times, without
    /// running it: the net for crashes that idem's own attempt count cannot see.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n.max(1));
        self
    }

    /// The wait before a failed delivery comes back: `first`, doubled per earlier delivery
    /// (where the broker counts them), at most `max` (defaults 100 ms and 30 s).
    pub fn retry_delay(mut self, first: Duration, max: Duration) -> Self {
        self.retry_delay = first;
        self.max_retry_delay = max.max(first);
        self
    }

    /// The wait before a message whose lease is held elsewhere comes back (default 1 s).
    pub fn in_progress_delay(mut self, delay: Duration) -> Self {
        self.in_progress_delay = delay;
        self
    }

    /// Durable retries and dead letters in the database ([`Recovery`]): a failed delivery is
    /// parked in `idem_parked` (with durable retries on) and one that gives up is kept in
    /// `idem_dead_letters`, each committed before the broker is told. Without it, failures are
    /// requeued in place and dead letters go to the broker only.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use std::time::Duration;
    /// use idem::consume::{Consumer, Recovery};
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// idem::migrate(&pool).await?;
    /// let consumer = Consumer::new(pool).recovery(
    ///     Recovery::new("billing").durable_retries(8, Duration::from_secs(1), Duration::from_secs(60)),
    /// );
    /// # Ok::<(), sqlx::Error>(()) }).unwrap();
    /// ```
    pub fn recovery(mut self, recovery: Recovery) -> Self
    where
        DB: RecoveryStore,
    {
        self.recovery = Some(Recovering {
            settings: recovery,
            ops: std::sync::Arc::new(OnStore),
            token: crate::claim::random_u64() as i64,
        });
        self
    }

    /// Consumes `deliveries` until the stream ends or `shutdown` completes, running each batch
    /// through `handler` (the closure [`batch`](crate::batch) takes: it calls
    /// `#[idempotent]` handlers with the batch it is given), and settles each delivery after
    /// its transaction committed. Returns what it did. An error item from the stream is logged
    /// and skipped (the adapter decides whether the stream goes on). The future is `Send`: it
    /// may run on a task of its own (`tokio::spawn`).
    pub async fn run<S, D, SE, M, DE, T, E>(
        self,
        deliveries: S,
        decode: impl Fn(&[u8]) -> Result<M, DE>,
        handler: impl AsyncFn(&mut Batch<DB>, &M) -> Result<Outcome<T>, Error<E>>,
        shutdown: impl Future<Output = ()>,
    ) -> Counts
    where
        S: Stream<Item = Result<D, SE>>,
        D: Delivery,
        SE: std::fmt::Display,
        DE: std::fmt::Display,
        E: std::fmt::Display,
    {
        let runner = InBatch {
            pool: &self.pool,
            handler,
            recovery: self.recovery.as_ref(),
        };
        self.drive(deliveries, &decode, &runner, self.batch, shutdown)
            .await
    }

    /// Like [`run`](Consumer::run), for handlers that take a pool (lease mode): one delivery
    /// at a time per slot of `concurrency`, never batched.
    pub async fn run_each<S, D, SE, M, DE, T, E>(
        self,
        deliveries: S,
        decode: impl Fn(&[u8]) -> Result<M, DE>,
        handler: impl AsyncFn(&Pool<DB>, &M) -> Result<Outcome<T>, Error<E>>,
        shutdown: impl Future<Output = ()>,
    ) -> Counts
    where
        S: Stream<Item = Result<D, SE>>,
        D: Delivery,
        SE: std::fmt::Display,
        DE: std::fmt::Display,
        E: std::fmt::Display,
    {
        let runner = EachAlone {
            pool: &self.pool,
            handler,
            watch: self.recovery.is_some(),
        };
        self.drive(deliveries, &decode, &runner, 1, shutdown).await
    }

    /// The loop: keeps up to `concurrency` groups in flight, fills the next group from the
    /// stream (up to `size`, or what came within `linger`), and drains on shutdown.
    async fn drive<S, D, SE, M, DE, T, E>(
        &self,
        deliveries: S,
        decode: &impl Fn(&[u8]) -> Result<M, DE>,
        runner: &impl Runner<M, T, E>,
        size: usize,
        shutdown: impl Future<Output = ()>,
    ) -> Counts
    where
        S: Stream<Item = Result<D, SE>>,
        D: Delivery,
        SE: std::fmt::Display,
        DE: std::fmt::Display,
        E: std::fmt::Display,
    {
        let _checks = self.monitor.start(&self.pool, self.handler_timeout);
        let mut deliveries = pin!(deliveries);
        let mut shutdown = pin!(shutdown.fuse());
        let (cancel, cancelled) = watch::channel(false);
        let mut in_flight = FuturesUnordered::new();
        let mut pending: Vec<Taken<D>> = Vec::with_capacity(size);
        let mut linger_until: Option<Instant> = None;
        let mut counts = Counts::default();
        let mut open = true;
        // When to look for due parked retries next (recovery with durable retries only), and
        // the look in progress: polled beside the batches in flight, which it may wait on
        // (SQLite's one writer), never instead of them.
        let mut next_take = self.takes_parked().then(Instant::now);
        let take_parked = |room: usize| async move {
            match &self.recovery {
                Some(recovery) => recovery.take(&self.pool, room).await,
                None => (Vec::new(), Instant::now() + Duration::from_secs(3600)),
            }
        };
        let mut taking = pin!(Fuse::terminated());
        if let Some(recovery) = &self.recovery {
            if let Err(problem) = recovery.settings.check() {
                tracing::error!(%problem, "recovery cannot park or keep dead letters: failures are requeued in place");
            }
        }

        while open {
            let room = in_flight.len() < self.concurrency;
            let full = pending.len() >= size;
            if room
                && (full
                    || (!pending.is_empty() && linger_until.is_some_and(|t| t <= Instant::now())))
            {
                let group = std::mem::replace(&mut pending, Vec::with_capacity(size));
                linger_until = None;
                in_flight.push(self.process(group, decode, runner, cancelled.clone()));
                continue;
            }
            let linger = async {
                match linger_until {
                    Some(at) if room => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            let take_at = match next_take {
                Some(at) if room && !full && taking.is_terminated() => Some(at),
                _ => None,
            };
            let take = async {
                match take_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => open = false,
                Some(done) = in_flight.next(), if !in_flight.is_empty() => counts.add(&done),
                next = deliveries.next(), if !full && taking.is_terminated() => match next {
                    Some(Ok(delivery)) => {
                        if pending.is_empty() {
                            linger_until = Some(Instant::now() + self.linger);
                        }
                        self.flight.took();
                        pending.push(Taken::Broker(delivery));
                    }
                    Some(Err(err)) => tracing::warn!(error = %err, "the broker's stream gave an error"),
                    None => open = false,
                },
                () = linger => {}
                () = take => {
                    // No delivery is taken meanwhile: what the look brings fits the batch.
                    taking.set(take_parked(size.saturating_sub(pending.len())).fuse());
                }
                (taken, again) = &mut taking, if !taking.is_terminated() => {
                    if pending.is_empty() && !taken.is_empty() {
                        linger_until = Some(Instant::now() + self.linger);
                    }
                    for parked in taken {
                        self.flight.took();
                        pending.push(Taken::Parked(parked));
                    }
                    next_take = Some(again);
                }
            }
        }

        // Stop taking; what was taken but not started goes back to the broker (a look for
        // parked retries under way ends first, so that its rows go back at once).
        self.monitor.draining();
        if !taking.is_terminated() {
            let (taken, _) = taking.await;
            for parked in taken {
                self.flight.took();
                pending.push(Taken::Parked(parked));
            }
        }
        for delivery in pending {
            let requeue = Settle::Requeue {
                delay: Duration::ZERO,
            };
            self.settle(delivery, requeue, Counted::Requeued, &mut counts)
                .await;
        }
        // Finish what is in flight, within the drain time-out; then cancel the rest, which
        // rolls their transactions back and requeues their deliveries.
        let deadline = tokio::time::sleep(self.drain_timeout);
        let mut deadline = pin!(deadline);
        loop {
            tokio::select! {
                done = in_flight.next() => match done {
                    Some(done) => counts.add(&done),
                    None => break,
                },
                () = &mut deadline, if !*cancel.borrow() => {
                    tracing::warn!(in_flight = in_flight.len(), "drain time-out: cancelling the batches still running");
                    let _ = cancel.send(true);
                }
            }
        }
        counts
    }

    /// Whether this consumer takes parked retries (recovery with durable retries).
    fn takes_parked(&self) -> bool {
        self.recovery
            .as_ref()
            .is_some_and(|r| r.settings.retries.is_some())
    }

    /// One group: dead-letters what cannot run, runs the rest in one transaction (bounded by
    /// the handler time-out, waiting out store outages), then settles every delivery.
    async fn process<D, M, DE, T, E>(
        &self,
        group: Vec<Taken<D>>,
        decode: &impl Fn(&[u8]) -> Result<M, DE>,
        runner: &impl Runner<M, T, E>,
        mut cancelled: watch::Receiver<bool>,
    ) -> Counts
    where
        D: Delivery,
        DE: std::fmt::Display,
        E: std::fmt::Display,
    {
        let in_flight = self.monitor.batch();
        let mut counts = Counts::default();
        let mut runnable = Vec::with_capacity(group.len());
        let mut messages = Vec::with_capacity(group.len());
        for delivery in group {
            if delivery.revoked() {
                // Its partition went to another consumer, which delivers it again.
                tracing::debug!(delivery = %delivery.describe(), "dropping a delivery whose partition was revoked");
                counts.requeued += 1;
                continue;
            }
            match self.admit(&delivery, decode) {
                Ok(message) => {
                    let parked = match &delivery {
                        Taken::Parked(row) => Some((row.id, row.token)),
                        Taken::Broker(_) => None,
                    };
                    messages.push(Tracked::new(message, parked));
                    runnable.push(delivery);
                }
                Err(reason) => {
                    tracing::warn!(delivery = %delivery.describe(), %reason, "dead-lettering a delivery that cannot run");
                    let failed = Failed {
                        error: reason.detail(),
                        seen: None,
                    };
                    let dead = Settle::DeadLetter { reason };
                    self.settle_failed(delivery, dead, Counted::DeadLettered, failed, &mut counts)
                        .await;
                }
            }
        }
        if runnable.is_empty() {
            return counts;
        }
        #[cfg(feature = "otel")]
        let span = super::trace::process_span(&runnable);
        let mut pause = self.retry_delay;
        loop {
            let run = runner.run(&messages);
            #[cfg(feature = "otel")]
            let run = tracing::Instrument::instrument(run, span.clone());
            let attempt = AssertUnwindSafe(run).catch_unwind();
            let timed = tokio::time::timeout(self.handler_timeout, attempt);
            let outcome = tokio::select! {
                outcome = timed => outcome,
                () = until_cancelled(&mut cancelled) => {
                    return self.requeue_all(runnable, counts).await;
                }
            };
            #[cfg(feature = "otel")]
            super::trace::record_outcome(&span, &outcome);
            match outcome {
                Ok(Ok(Ok(results))) if results.len() == messages.len() => {
                    // Settle what was decided; only the deliveries whose store failed wait.
                    (runnable, messages) = self
                        .settle_decided(runnable, messages, results, &mut counts)
                        .await;
                    if runnable.is_empty() {
                        return counts;
                    }
                }
                Ok(Ok(Ok(results))) => {
                    tracing::error!(
                        deliveries = runnable.len(),
                        results = results.len(),
                        "the batch returned a result count unlike its message count; requeued"
                    );
                    let why = "the batch returned a result count unlike its message count";
                    return self.fail_all(runnable, &messages, why, counts).await;
                }
                Ok(Ok(Err(_))) => {}
                Ok(Err(_panic)) => {
                    tracing::error!(
                        deliveries = runnable.len(),
                        "a handler panicked; its batch was rolled back and is requeued"
                    );
                    return self
                        .fail_all(runnable, &messages, "a handler panicked", counts)
                        .await;
                }
                Err(_elapsed) => {
                    tracing::error!(
                        deliveries = runnable.len(),
                        timeout_ms = self.handler_timeout.as_millis() as u64,
                        "a batch ran over the handler time-out; rolled back and requeued"
                    );
                    let why = "the batch ran over the handler time-out";
                    return self.fail_all(runnable, &messages, why, counts).await;
                }
            }
            // The store failed: not the messages' fault. Wait, then run what is left again in
            // place (not requeued: the broker's delivery count must not grow for it).
            counts.store_pauses += 1;
            #[cfg(feature = "metrics")]
            crate::metrics::consumer_store_paused();
            tracing::warn!(
                deliveries = runnable.len(),
                pause_ms = pause.as_millis() as u64,
                "the store failed; pausing before running these deliveries again"
            );
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = until_cancelled(&mut cancelled) => return self.requeue_all(runnable, counts).await,
            }
            pause = (pause * 2).min(self.max_retry_delay);
            in_flight.again();
        }
    }

    /// Settles every delivery whose result is decided (the acks first, in one go where the
    /// adapter can); hands back, in order, the deliveries (and their messages) whose store
    /// failed, to be run again after a pause.
    async fn settle_decided<D, M, T, E>(
        &self,
        runnable: Vec<Taken<D>>,
        messages: Vec<Tracked<M>>,
        results: Vec<Result<Outcome<T>, Error<E>>>,
        counts: &mut Counts,
    ) -> (Vec<Taken<D>>, Vec<Tracked<M>>)
    where
        D: Delivery,
        E: std::fmt::Display,
    {
        let mut acks = Vec::with_capacity(runnable.len());
        let mut others = Vec::new();
        let mut again = (Vec::new(), Vec::new());
        for ((delivery, message), result) in runnable.into_iter().zip(messages).zip(results) {
            let retry = self.retry_delay_for(&delivery);
            match verdict(&result, retry, self.in_progress_delay) {
                Verdict::Settle(Settle::Ack, counted) => {
                    acks.push((delivery, counted, message.unparked()));
                }
                Verdict::Settle(settle, counted) => {
                    let error = match &result {
                        Err(err) => {
                            tracing::debug!(delivery = %delivery.describe(), error = %err, "delivery failed");
                            err.to_string()
                        }
                        Ok(_) => String::new(),
                    };
                    let failed = Failed {
                        error,
                        seen: message.seen(),
                    };
                    others.push((delivery, settle, counted, failed));
                }
                Verdict::StoreDown => {
                    again.0.push(delivery);
                    again.1.push(message);
                }
            }
        }
        self.ack_all(acks, counts).await;
        for (delivery, settle, counted, failed) in others {
            self.settle_failed(delivery, settle, counted, failed, counts)
                .await;
        }
        again
    }

    /// Counts and acks deliveries whose transactions committed, in one go where the adapter
    /// can ([`Delivery::ack_all`]), within the settle time-out; failures are logged and counted.
    /// A parked retry that was decided is deleted from `idem_parked`, unless its batch did so
    /// in its own transaction (`unparked`).
    async fn ack_all<D: Delivery>(
        &self,
        acks: Vec<(Taken<D>, Counted, bool)>,
        counts: &mut Counts,
    ) {
        if acks.is_empty() {
            return;
        }
        let n = acks.len();
        let mut deliveries = Vec::with_capacity(n);
        let mut parked = Vec::new();
        for (taken, counted, unparked) in acks {
            count(counts, counted);
            #[cfg(feature = "metrics")]
            crate::metrics::consumer_settled(counted.as_str(), &Settle::Ack);
            match taken {
                Taken::Broker(delivery) => deliveries.push(delivery),
                Taken::Parked(row) if !unparked => parked.push(row),
                Taken::Parked(_) => {}
            }
        }
        let mut failed = 0;
        if !deliveries.is_empty() {
            let sent = deliveries.len();
            let results = tokio::time::timeout(self.settle_timeout, D::ack_all(deliveries)).await;
            failed += match results {
                Ok(results) => {
                    let mut failed = sent.saturating_sub(results.len());
                    for err in results.into_iter().filter_map(Result::err) {
                        failed += 1;
                        tracing::warn!(error = %err, "acking failed; the broker will deliver it again");
                    }
                    failed
                }
                Err(_) => {
                    tracing::warn!(
                        deliveries = sent,
                        "acking timed out; the broker will deliver them again"
                    );
                    sent
                }
            };
        }
        for row in parked {
            let unparked = match &self.recovery {
                Some(recovery) => recovery.unpark(&self.pool, &row, self.settle_timeout).await,
                None => false,
            };
            if !unparked {
                failed += 1;
            }
        }
        self.flight.left(n);
        counts.settle_failures += failed as u64;
        #[cfg(feature = "metrics")]
        crate::metrics::consumer_settle_failed(failed as u64);
    }

    /// Decodes a delivery, unless the broker has delivered it too often.
    fn admit<D: Delivery, M, DE: std::fmt::Display>(
        &self,
        delivery: &Taken<D>,
        decode: &impl Fn(&[u8]) -> Result<M, DE>,
    ) -> Result<M, DeadLetterReason> {
        if let (Some(max), Some(deliveries)) = (self.max_deliveries, delivery.deliveries()) {
            if deliveries > max {
                return Err(DeadLetterReason::TooManyDeliveries { deliveries });
            }
        }
        decode(delivery.payload()).map_err(|err| DeadLetterReason::Undecodable(err.to_string()))
    }

    /// The backoff of a failed delivery: doubled per earlier delivery, where the broker counts.
    fn retry_delay_for<D: Delivery>(&self, delivery: &Taken<D>) -> Duration {
        self.backoff_after(delivery.deliveries())
    }

    /// The backoff after the broker's `deliveries` of a message (1 where it does not count).
    fn backoff_after(&self, deliveries: Option<u32>) -> Duration {
        let earlier = deliveries.unwrap_or(1).saturating_sub(1).min(20);
        self.retry_delay
            .saturating_mul(1 << earlier)
            .min(self.max_retry_delay)
    }

    /// Every delivery of a group whose run failed as a whole (panic, time-out) goes back with
    /// backoff (or is parked, with durable retries).
    async fn fail_all<D: Delivery, M>(
        &self,
        group: Vec<Taken<D>>,
        messages: &[Tracked<M>],
        why: &str,
        mut counts: Counts,
    ) -> Counts {
        for (i, delivery) in group.into_iter().enumerate() {
            let delay = self.retry_delay_for(&delivery);
            let seen = messages.get(i).and_then(Tracked::seen);
            let error = seen
                .as_ref()
                .and_then(|seen| seen.error.clone())
                .unwrap_or_else(|| why.to_string());
            let failed = Failed { error, seen };
            let requeue = Settle::Requeue { delay };
            self.settle_failed(delivery, requeue, Counted::Failed, failed, &mut counts)
                .await;
        }
        counts
    }

    /// Every delivery of a cancelled group goes back at once (shutdown).
    async fn requeue_all<D: Delivery>(&self, group: Vec<Taken<D>>, mut counts: Counts) -> Counts {
        for delivery in group {
            let requeue = Settle::Requeue {
                delay: Duration::ZERO,
            };
            self.settle(delivery, requeue, Counted::Requeued, &mut counts)
                .await;
        }
        counts
    }

    /// Settles a delivery that was not applied (requeued untried, in progress elsewhere).
    async fn settle<D: Delivery>(
        &self,
        delivery: Taken<D>,
        settle: Settle,
        counted: Counted,
        counts: &mut Counts,
    ) {
        self.settle_failed(delivery, settle, counted, Failed::default(), counts)
            .await;
    }

    /// Counts one delivery as `counted` and settles it within the settle time-out; a failure
    /// is logged and counted. With recovery, a failure to retry is parked first (durable
    /// retries) and a dead letter kept in the database first, each committed before the
    /// broker is told; a parked retry is put back, or becomes a dead letter.
    async fn settle_failed<D: Delivery>(
        &self,
        delivery: Taken<D>,
        settle: Settle,
        counted: Counted,
        failed: Failed,
        counts: &mut Counts,
    ) {
        count(counts, counted);
        #[cfg(feature = "metrics")]
        crate::metrics::consumer_settled(counted.as_str(), &settle);
        let name = delivery.describe();
        let delivery = match delivery {
            Taken::Broker(delivery) => delivery,
            Taken::Parked(row) => {
                let Some(recovery) = &self.recovery else {
                    return; // only a consumer with recovery takes parked retries
                };
                let timeout = self.settle_timeout;
                let settled = recovery
                    .settle_parked(&self.pool, row, settle, counted, failed, counts, timeout);
                let ok = tokio::time::timeout(self.settle_timeout, settled).await;
                self.flight.left(1);
                if ok.is_err() {
                    counts.settle_failures += 1;
                    tracing::warn!(delivery = %name, "settling a parked retry timed out; its lease runs out and it runs again");
                }
                return;
            }
        };
        let settle = match &self.recovery {
            Some(recovery) if !matches!(settle, Settle::Ack) => {
                // What recovery keeps of the delivery, taken before any await: a delivery
                // need not be `Sync`.
                let described = Described::of_delivery(&delivery);
                let deliveries = delivery.deliveries();
                let requeue_delay = self.backoff_after(deliveries);
                recovery
                    .recover(
                        &self.pool,
                        described,
                        deliveries,
                        &name,
                        settle,
                        counted,
                        &failed,
                        counts,
                        requeue_delay,
                    )
                    .await
            }
            _ => settle,
        };
        let result = tokio::time::timeout(self.settle_timeout, delivery.settle(settle)).await;
        self.flight.left(1);
        match result {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                counts.settle_failures += 1;
                #[cfg(feature = "metrics")]
                crate::metrics::consumer_settle_failed(1);
                tracing::warn!(delivery = %name, error = %err, "settling failed; the broker will deliver it again");
            }
            Err(_) => {
                counts.settle_failures += 1;
                #[cfg(feature = "metrics")]
                crate::metrics::consumer_settle_failed(1);
                tracing::warn!(delivery = %name, "settling timed out; the broker will deliver it again");
            }
        }
    }
}

fn count(counts: &mut Counts, counted: Counted) {
    match counted {
        Counted::Applied => counts.applied += 1,
        Counted::Duplicate => counts.duplicate += 1,
        Counted::Stale => counts.stale += 1,
        Counted::Replayed => counts.replayed += 1,
        Counted::InProgress => counts.in_progress += 1,
        Counted::Failed => counts.failed += 1,
        Counted::DeadLettered => counts.dead_lettered += 1,
        Counted::Requeued => counts.requeued += 1,
    }
}

/// Resolves once the drain time-out cancelled the batches in flight. The `Ref` that
/// `wait_for` returns (a lock guard, not `Send`) is dropped here, not held in the loop's state.
async fn until_cancelled(cancelled: &mut watch::Receiver<bool>) {
    let _ = cancelled.wait_for(|c| *c).await;
}

impl<DB: Store> Consumer<DB> {
    /// This consumer's [`Health`]: take it before [`run`](Consumer::run) and hand it to what
    /// answers probes. A clone of the consumer shares it (a reconnect loop that runs clones one
    /// after another keeps one handle); give consumers that run at the same time handles of
    /// their own (each its own [`Consumer::new`]).
    pub fn health(&self) -> Health {
        self.monitor.health.clone()
    }

    /// Checks `source`'s broker for readiness: `Consumer::new(pool).health_of(&source)`, the
    /// same for every adapter ([`Source::probe`]). Without it (or [`probe`](Consumer::probe))
    /// only the database is checked.
    pub fn health_of<S: Source>(self, source: &S) -> Self {
        self.probe(source.probe())
    }

    /// Checks the broker with `probe` for readiness (a probe of your own; see
    /// [`health_of`](Consumer::health_of)).
    pub fn probe(mut self, probe: Probe) -> Self {
        self.monitor.probe = probe;
        self
    }

    /// How often the health checks run, each bounded by the interval (default 5 s; at least
    /// 10 ms): an outage shows in [`Health::ready`] within two intervals, and so does its end.
    pub fn health_every(mut self, interval: Duration) -> Self {
        self.monitor.every = interval.max(Duration::from_millis(10));
        self
    }

    /// How long one attempt of a batch may run before [`Health::live`] says stuck (default
    /// twice the [`handler_timeout`](Consumer::handler_timeout), which cancels an attempt that
    /// yields; one still running past that blocks its thread).
    pub fn stuck_after(mut self, bound: Duration) -> Self {
        self.monitor.stuck_after = Some(bound);
        self
    }
}

//! What the broker rules and a broker crate's own tests share: skipping without a server, a
//! rule's broker and database with their cleanup ([`with`]), time limits, delivery wrappers
//! that count settlements or SIGKILL their process at a settle, the databases a child process
//! reopens ([`Reopen`]), and the consumer settings of the rules.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt as _, Stream, StreamExt as _};
use idem::consume::{json, Consumer, Counts, Delivery, Settle, SettleError, Source};
use idem::store::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::Pool;
use tokio::sync::Notify;

use super::{model, Broker, DeadLetter, Settings, Spec};
use crate::{Backend, Kit};

pub use crate::backends::unique_name;

/// Says why a test does not run (its server is not there) and returns `None`; panics instead
/// when the environment variable `CI` is set, since CI must run them all.
pub fn skip<T>(what: &str, why: impl std::fmt::Display) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run this test, but {what}: {why}");
    }
    eprintln!("skipped: {what}: {why}");
    None
}

/// Whether `IDEM_SOAK=1` asks for the long sizes.
pub fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v != "0")
}

/// A seed from `IDEM_KIT_SEED`, or a fresh one; printed, to replay the run.
pub fn seed() -> u64 {
    let seed = std::env::var("IDEM_KIT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed: IDEM_KIT_SEED={seed}");
    seed
}

/// A random generator from `seed`, for a rule's choices (kill points, …).
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ 0x5eed_c4a5)
}

/// `future`, or a panic naming `what` after `limit`: a bug fails a rule instead of hanging it.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the consumers let go ([`Broker::gone`]), then until
/// [`unsettled`](Broker::unsettled) is `expected` (up to 20 s, as a broker takes back what a
/// closed or killed consumer held), and panics if it does not get there.
pub async fn assert_unsettled<B: Broker>(b: &B, expected: u64) {
    b.gone().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let unsettled = b.unsettled().await;
        if unsettled == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {unsettled} messages unsettled, expected {expected}",
            B::NAME
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Completes once [`unsettled`](Broker::unsettled) is 0: a consumer's shutdown signal for "all
/// is handled".
pub async fn settled<B: Broker>(b: &B) {
    while b.unsettled().await > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a rule's `body` on a fresh input of `B` (made as `spec` says) and a fresh database of
/// `D`, then deletes both, also when `body` panics (the panic goes on after). Returns at once,
/// having printed why, when either server is absent.
pub async fn with<B: Broker, D: Backend>(spec: Spec, body: impl AsyncFnOnce(&B, &Kit<D>)) {
    if let Some(broker) = B::create(spec).await {
        on(broker, body).await;
    }
}

/// [`with`] on an input made otherwise (a broker's own settings, in its own tests).
pub async fn on<B: Broker, D: Backend>(broker: B, body: impl AsyncFnOnce(&B, &Kit<D>)) {
    let Some(kit) = Kit::<D>::open().await else {
        broker.teardown().await;
        return;
    };
    let outcome = AssertUnwindSafe(body(&broker, &kit)).catch_unwind().await;
    broker.teardown().await;
    kit.close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The consumer of the rules: `batch` deliveries a transaction, 2 at a time, retries after
/// 20 ms doubling to 200 ms.
pub fn consumer<DB: Store>(pool: Pool<DB>, batch: usize) -> Consumer<DB> {
    Consumer::new(pool)
        .batch(batch)
        .concurrency(2)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(200))
}

/// Settlements of [`Tracked`] deliveries, once the broker took them, and how many deliveries
/// were taken and let go (settled, or dropped unsettled).
#[derive(Debug, Default)]
pub struct Tally {
    acked: AtomicU64,
    dead_lettered: AtomicU64,
    requeued: AtomicU64,
    taken: AtomicU64,
    released: AtomicU64,
    changed: Notify,
}

impl Tally {
    /// A new tally.
    pub fn new() -> Arc<Tally> {
        Arc::new(Tally::default())
    }

    /// Deliveries acked.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Deliveries dead-lettered.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::SeqCst)
    }

    /// Deliveries requeued.
    pub fn requeued(&self) -> u64 {
        self.requeued.load(Ordering::SeqCst)
    }

    /// Whether every delivery taken was let go: settled (or tried to be), or dropped.
    pub fn idle(&self) -> bool {
        self.released.load(Ordering::SeqCst) == self.taken.load(Ordering::SeqCst)
    }

    fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Completes once `done(acked, dead_lettered)` holds: a consumer's shutdown signal.
    pub async fn until(self: Arc<Self>, done: impl Fn(u64, u64) -> bool) {
        loop {
            let changed = self.changed.notified();
            if done(self.acked(), self.dead_lettered()) {
                return;
            }
            changed.await;
        }
    }
}

/// A delivery whose settlement a [`Tally`] counts once the broker took it; it forwards the
/// adapter's own batch ack (`ack_all`: one `multiple` ack on RabbitMQ).
pub struct Tracked<D> {
    /// `None` once settled.
    inner: Option<D>,
    tally: Arc<Tally>,
}

impl<D> Tracked<D> {
    fn inner(&self) -> &D {
        self.inner.as_ref().expect("a delivery not yet settled")
    }

    fn take(mut self) -> (D, Arc<Tally>) {
        let inner = self.inner.take().expect("a delivery not yet settled");
        self.tally.add(&self.tally.released, 1);
        (inner, self.tally.clone())
    }
}

impl<D> Drop for Tracked<D> {
    fn drop(&mut self) {
        if self.inner.is_some() {
            // Dropped unsettled (revoked, or at shutdown).
            self.tally.add(&self.tally.released, 1);
        }
    }
}

impl<D: Delivery> Delivery for Tracked<D> {
    fn payload(&self) -> &[u8] {
        self.inner().payload()
    }

    fn deliveries(&self) -> Option<u32> {
        self.inner().deliveries()
    }

    fn revoked(&self) -> bool {
        self.inner().revoked()
    }

    fn describe(&self) -> String {
        self.inner().describe()
    }

    fn headers(&self) -> Vec<(String, String)> {
        self.inner().headers()
    }

    fn origin(&self) -> idem::recover::Origin {
        self.inner().origin()
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let (inner, tally) = self.take();
        let counter = match &settle {
            Settle::Ack => &tally.acked,
            Settle::DeadLetter { .. } => &tally.dead_lettered,
            _ => &tally.requeued,
        };
        let result = inner.settle(settle).await;
        if result.is_ok() {
            tally.add(counter, 1);
        }
        result
    }

    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(tally) = deliveries.first().map(|d| d.tally.clone()) else {
            return Vec::new();
        };
        let inner: Vec<D> = deliveries.into_iter().map(|d| d.take().0).collect();
        let results = D::ack_all(inner).await;
        let acked = results.iter().filter(|r| r.is_ok()).count() as u64;
        tally.add(&tally.acked, acked);
        results
    }
}

/// Runs `consumer` on a new source of `b` (`settings`), its deliveries counted by a new
/// [`Tally`] and decoded as [`model::Event`]s for [`model::handle`] on `k`'s database, until
/// `done(acked, dead_lettered)`, all within 60 s (else panics naming `what`); then closes the
/// source. Gives the consumer's counts and the tally.
pub async fn consume<B: Broker, D: Backend>(
    b: &B,
    k: &Kit<D>,
    (what, settings): (&str, Settings),
    consumer: Consumer<D::Db>,
    done: impl Fn(u64, u64) -> bool,
) -> (Counts, Arc<Tally>) {
    let handler = async |batch: &mut idem::Batch<D::Db>, e: &model::Event| {
        model::handle(batch, e, &k.dialect).await
    };
    let limit = Duration::from_secs(60);
    consume_with(b, (what, settings), limit, consumer, handler, done).await
}

/// [`consume`] with another `handler` and time `limit`.
pub async fn consume_with<B: Broker, DB: Store, T, E: std::fmt::Display>(
    b: &B,
    (what, settings): (&str, Settings),
    limit: Duration,
    consumer: Consumer<DB>,
    handler: impl AsyncFn(
        &mut idem::Batch<DB>,
        &model::Event,
    ) -> Result<idem::Outcome<T>, idem::Error<E>>,
    done: impl Fn(u64, u64) -> bool,
) -> (Counts, Arc<Tally>) {
    let tally = Tally::new();
    let source = b.source(settings).await;
    let deliveries = track(source.deliveries(), &tally);
    let run = consumer.run(deliveries, json, handler, tally.clone().until(done));
    let counts = within(limit, what, run).await;
    within(Duration::from_secs(40), "close", source.close())
        .await
        .expect("the source closes cleanly");
    (counts, tally)
}

/// The dead letters of `b`, once at least `n` arrived (else panics after 20 s).
pub async fn dead_letters<B: Broker>(b: &B, n: usize) -> Vec<DeadLetter> {
    let mut letters = Vec::new();
    let what = format!("{n} dead letters arrived");
    eventually(&what, Duration::from_secs(20), async || {
        letters = b.dead_letters().await;
        letters.len() >= n
    })
    .await;
    letters
}

/// Wraps each delivery of `stream` so that `tally` counts it and its settlement.
pub fn track<D, E>(
    stream: impl Stream<Item = Result<D, E>>,
    tally: &Arc<Tally>,
) -> impl Stream<Item = Result<Tracked<D>, E>> {
    let tally = tally.clone();
    stream.map(move |item| {
        item.map(|inner| {
            tally.add(&tally.taken, 1);
            Tracked {
                inner: Some(inner),
                tally: tally.clone(),
            }
        })
    })
}

/// A delivery that SIGKILLs its process at the `n`-th ack of the stream it came from: after
/// the commit, before the broker heard of it. It forwards `ack_all` (the kill then comes before
/// the batch's ack).
pub struct KillAtAck<D> {
    inner: D,
    countdown: Arc<AtomicUsize>,
}

impl<D> KillAtAck<D> {
    fn count(&self, acks: usize) {
        let before = self
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(acks))
            })
            .unwrap_or_default();
        if before > 0 && before <= acks {
            sigkill_self();
        }
    }
}

/// SIGKILLs this process: no destructor, no goodbye to the broker, as a crash.
pub fn sigkill_self() -> ! {
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    // SIGKILL cannot be caught; the signal is delivered before kill(2) returns to a
    // single-threaded caller and at once to a multi-threaded one.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl<D: Delivery> Delivery for KillAtAck<D> {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }

    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }

    fn revoked(&self) -> bool {
        self.inner.revoked()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn headers(&self) -> Vec<(String, String)> {
        self.inner.headers()
    }

    fn origin(&self) -> idem::recover::Origin {
        self.inner.origin()
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        if settle == Settle::Ack {
            self.count(1);
        }
        self.inner.settle(settle).await
    }

    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        if let Some(first) = deliveries.first() {
            first.count(deliveries.len());
        }
        D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await
    }
}

/// Wraps each delivery of `stream` so that the process SIGKILLs itself at the `n`-th ack
/// (never with `None`).
pub fn kill_at_ack<D, E>(
    stream: impl Stream<Item = Result<D, E>>,
    n: Option<usize>,
) -> impl Stream<Item = Result<KillAtAck<D>, E>> {
    let countdown = Arc::new(AtomicUsize::new(n.unwrap_or(0)));
    stream.map(move |item| {
        item.map(|inner| KillAtAck {
            inner,
            countdown: countdown.clone(),
        })
    })
}

/// Slows `stream` down by `pace` a delivery while `paced` holds (a file the parent creates
/// once its kills are made ends it), so that kills land mid-stream on a fast machine too.
pub fn paced<T>(
    stream: impl Stream<Item = T>,
    pace: Duration,
    paced: Arc<AtomicBool>,
) -> impl Stream<Item = T> {
    stream.then(move |item| {
        let slow = paced.load(Ordering::Relaxed);
        async move {
            if slow {
                tokio::time::sleep(pace).await;
            }
            item
        }
    })
}

/// A database that a child process can open again: where [`Backend::setup`] put it, and how
/// to reach it from another process (not migrated again, not deleted on close).
pub trait Reopen: Backend {
    /// The kind, as the child reads it (`sqlite`, `postgres`).
    const KIND: &'static str;

    /// Where the database of `pool` is (a file, a schema).
    fn location(pool: &Pool<Self::Db>) -> impl Future<Output = String> + Send;

    /// A pool on the database at `location`.
    fn reopen(location: &str) -> impl Future<Output = Pool<Self::Db>> + Send;
}

#[cfg(feature = "sqlite")]
impl Reopen for crate::backends::Sqlite {
    const KIND: &'static str = "sqlite";

    async fn location(pool: &sqlx::SqlitePool) -> String {
        pool.connect_options()
            .get_filename()
            .to_string_lossy()
            .into_owned()
    }

    async fn reopen(location: &str) -> sqlx::SqlitePool {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        let options = SqliteConnectOptions::new()
            .filename(location)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .unwrap_or_else(|err| panic!("opening {location}: {err}"))
    }
}

#[cfg(feature = "postgres")]
impl Reopen for crate::backends::Postgres {
    const KIND: &'static str = "postgres";

    async fn location(pool: &sqlx::PgPool) -> String {
        sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(pool)
            .await
            .expect("the pool's schema")
    }

    async fn reopen(location: &str) -> sqlx::PgPool {
        use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
        let url = crate::backends::Postgres::url();
        let options: PgConnectOptions = url.parse().expect("IDEM_POSTGRES_URL");
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.options([("search_path", location)]))
            .await
            .unwrap_or_else(|err| panic!("opening schema {location}: {err}"))
    }
}

/// A random delay in `range` (milliseconds).
pub fn jitter(rng: &mut StdRng, range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

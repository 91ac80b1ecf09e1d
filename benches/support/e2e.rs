//! End to end through a broker (`benches/rabbitmq.rs`, `nats.rs`, `redis.rs`, `kafka.rs`): the
//! five consumers, the wire format, each backend's database, idem's consumer with the counter of
//! what it acked (the bench's stop signal), the classic pattern's statements, the interleaved
//! rounds with their table, and the `main` that runs each backend. Each bench keeps what is its
//! broker's own: publishing, the hand-written consumers, idem's source.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{Stream, StreamExt as _};
use idem::consume::{Consumer, Delivery, Settle, SettleError};
use idem::Tx;
use serde::{Deserialize, Serialize};
use sqlx::Pool;
use tokio::sync::Notify;

use super::backends::{create_tables_postgres, create_tables_sqlite, PostgresDb, SqliteDb};
use super::order::Rounds;
use super::stats::median;
use super::workload::Credit;

/// The consumers, in table order: (1) hand-written per message, (2) idem `batch(1)`, (3) idem
/// `batch(100)` with `concurrency(1)` and `(4)`, (4) hand-written batched.
pub const CONSUMERS: [&str; 5] = [
    "hand/1",
    "idem b1",
    "idem b100 c1",
    "idem b100 c4",
    "hand/100",
];

/// `(batch, concurrency)` of idem's consumer number `which` (1 to 3).
pub fn idem_shape(which: usize) -> (usize, usize) {
    match which {
        1 => (1, 1),
        2 => (100, 1),
        _ => (100, 4),
    }
}

/// The message on the wire.
#[derive(Serialize, Deserialize)]
struct Wire {
    id: String,
    account: i64,
    amount: i64,
    version: i64,
}

/// A message as JSON.
pub fn encode(m: &Credit) -> Vec<u8> {
    serde_json::to_vec(&Wire {
        id: m.id.clone(),
        account: m.account,
        amount: m.amount,
        version: m.version,
    })
    .unwrap_or_default()
}

/// A message from JSON.
pub fn decode(bytes: &[u8]) -> Result<Credit, serde_json::Error> {
    let w: Wire = serde_json::from_slice(bytes)?;
    Ok(Credit {
        id: w.id,
        account: w.account,
        amount: w.amount,
        version: w.version,
    })
}

/// Counts the deliveries idem's consumer acked, and wakes whoever waits for a count.
#[derive(Clone, Default)]
pub struct Acked(Arc<(AtomicU64, Notify)>);

impl Acked {
    /// `delivery`, counted here when it is acked. A batch's acks go one delivery at a time (the
    /// trait's default), as the NATS, Redis and Kafka tables were measured.
    pub fn wrap<D>(&self, delivery: D) -> Counted<D> {
        self.counted(delivery, false)
    }

    /// `delivery`, counted here when it is acked; a batch's acks forwarded to the adapter's
    /// own `ack_all` (RabbitMQ's one `multiple` ack), as the RabbitMQ table was measured.
    pub fn wrap_batched<D>(&self, delivery: D) -> Counted<D> {
        self.counted(delivery, true)
    }

    fn counted<D>(&self, delivery: D, batched: bool) -> Counted<D> {
        Counted {
            inner: delivery,
            acked: self.clone(),
            batched,
        }
    }

    fn add(&self, n: u64) {
        (self.0).0.fetch_add(n, Ordering::SeqCst);
        (self.0).1.notify_waiters();
    }

    /// Completes once `n` deliveries were acked: the consumer's shutdown signal.
    pub fn until(&self, n: u64) -> impl Future<Output = ()> + use<> {
        let acked = self.0.clone();
        async move {
            loop {
                let changed = acked.1.notified();
                if acked.0.load(Ordering::SeqCst) >= n {
                    return;
                }
                changed.await;
            }
        }
    }
}

/// A delivery that counts its ack.
pub struct Counted<D> {
    inner: D,
    acked: Acked,
    batched: bool,
}

impl<D: Delivery> Delivery for Counted<D> {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
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
        let ack = matches!(settle, Settle::Ack);
        let result = self.inner.settle(settle).await;
        if ack && result.is_ok() {
            self.acked.add(1);
        }
        result
    }
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(first) = deliveries.first() else {
            return Vec::new();
        };
        let (acked, batched) = (first.acked.clone(), first.batched);
        if !batched {
            let mut results = Vec::with_capacity(deliveries.len());
            for delivery in deliveries {
                results.push(delivery.settle(Settle::Ack).await);
            }
            return results;
        }
        let results = D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await;
        acked.add(results.iter().filter(|r| r.is_ok()).count() as u64);
        results
    }
}

/// A backend the broker benches run on (SQLite, PostgreSQL): the classic pattern's statements
/// and idem's consumer, on its sqlx database, so that a bench's consumers are written once.
pub trait Backend: sqlx::Database {
    /// The classic pattern's two statements in the caller's transaction: the message id into a
    /// processed table (`ON CONFLICT DO NOTHING`) for `consumer`, and the effect if it was new.
    fn classic(
        tx: &mut Tx<'_, Self>,
        consumer: &str,
        msg: &Credit,
    ) -> impl Future<Output = Result<(), sqlx::Error>>;

    /// idem's consumer of `turn` (1 to 3, see [`idem_shape`]) on `deliveries`, each made
    /// [`Counted`] by `count` (`Acked::wrap` or `Acked::wrap_batched`), with the key-only
    /// handler and a 5 ms linger, until the turn's `n` were acked; checks that all were applied.
    fn idem<S, D, E>(
        turn: &Turn<'_, Self>,
        deliveries: S,
        count: fn(&Acked, D) -> Counted<D>,
    ) -> impl Future<Output = anyhow::Result<()>>
    where
        S: Stream<Item = Result<D, E>>,
        D: Delivery,
        E: std::fmt::Display;
}

macro_rules! backend {
    ($db:ty, $h:ident) => {
        impl Backend for $db {
            async fn classic(
                tx: &mut Tx<'_, Self>,
                consumer: &str,
                msg: &Credit,
            ) -> Result<(), sqlx::Error> {
                let fresh = sqlx::query(
                    "INSERT INTO bench_processed (consumer, message_id) VALUES ($1, $2) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(consumer)
                .bind(&msg.id)
                .execute(&mut **tx)
                .await?
                .rows_affected()
                    == 1;
                if fresh {
                    super::handlers::$h::effect(tx, msg).await?;
                }
                Ok(())
            }

            async fn idem<S, D, E>(
                turn: &Turn<'_, Self>,
                deliveries: S,
                count: fn(&Acked, D) -> Counted<D>,
            ) -> anyhow::Result<()>
            where
                S: Stream<Item = Result<D, E>>,
                D: Delivery,
                E: std::fmt::Display,
            {
                let ((batch, concurrency), n) = (idem_shape(turn.which), turn.n);
                let acked = Acked::default();
                let counted = {
                    let acked = acked.clone();
                    deliveries.map(move |d| d.map(|inner| count(&acked, inner)))
                };
                let counts = Consumer::new(turn.pool.clone())
                    .batch(batch)
                    .concurrency(concurrency)
                    .linger(Duration::from_millis(5))
                    .run(
                        counted,
                        decode,
                        async |b, m| super::handlers::$h::credit_key(b, m).await,
                        acked.until(n),
                    )
                    .await;
                anyhow::ensure!(counts.applied == n, "applied {counts:?}, expected {n}");
                Ok(())
            }
        }
    };
}

backend!(sqlx::Sqlite, sq);
backend!(sqlx::Postgres, pg);

/// The hand-written batched consumers' gathering: the next message, then whatever more comes
/// within 5 ms, up to `batch` (an error in those 5 ms ends the gathering).
pub async fn gather<S, T, E>(messages: &mut S, batch: usize) -> anyhow::Result<Vec<T>>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    anyhow::Error: From<E>,
{
    let first = messages.next().await.context("consumer ended")??;
    let mut gathered = vec![first];
    let linger = tokio::time::Instant::now() + Duration::from_millis(5);
    while gathered.len() < batch {
        match tokio::time::timeout_at(linger, messages.next()).await {
            Ok(Some(Ok(m))) => gathered.push(m),
            _ => break,
        }
    }
    Ok(gathered)
}

/// One consumer's turn in a round: the backend's pool, which consumer (its index in
/// [`CONSUMERS`]), and the number of new messages it takes.
pub struct Turn<'a, DB: sqlx::Database> {
    pub pool: &'a Pool<DB>,
    pub which: usize,
    pub n: u64,
}

impl<DB: sqlx::Database> Turn<'_, DB> {
    /// Times the turn: `hand(1)` for hand/1, `hand(100)` for hand/100, `idem()` for idem's three.
    pub async fn time(
        &self,
        hand: impl AsyncFnOnce(usize) -> anyhow::Result<()>,
        idem: impl AsyncFnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        match self.which {
            0 => hand(1).await?,
            4 => hand(100).await?,
            _ => idem().await?,
        }
        Ok(started.elapsed())
    }
}

/// One backend's database for a run: a SQLite file or a PostgreSQL schema of its own (8
/// connections), with the bench tables.
pub enum Db {
    Sqlite(SqliteDb),
    Postgres(PostgresDb),
}

/// `$run` with `$pool` bound to the pool of `$db` (a [`Db`]), whichever backend it is: a
/// consumer's [`Turn`] on the run's backend.
#[allow(unused_macros)] // the broker benches use it; the others share this module
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $run:expr) => {
        match $db {
            $crate::support::e2e::Db::Sqlite(db) => {
                let $pool = &db.pool;
                $run
            }
            $crate::support::e2e::Db::Postgres(db) => {
                let $pool = &db.pool;
                $run
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_pool;

impl Db {
    /// `backend`: `sqlite` or `postgres`.
    pub async fn open(backend: &str) -> anyhow::Result<Db> {
        Ok(if backend == "sqlite" {
            let db = SqliteDb::open(8).await?;
            create_tables_sqlite(&db.pool).await?;
            Db::Sqlite(db)
        } else {
            let db = PostgresDb::open(8).await?;
            create_tables_postgres(&db.pool).await?;
            Db::Postgres(db)
        })
    }

    pub async fn close(self) {
        match self {
            Db::Sqlite(db) => db.close().await,
            Db::Postgres(db) => db.close().await,
        }
    }
}

/// A broker bench's `main`: `bench(backend, msgs, rounds)` for SQLite, then PostgreSQL (or the
/// one `BENCH_ONLY` names), with `msgs` and `rounds` from the env knobs named (default 2,000
/// and 10).
pub fn main(
    msgs: &str,
    rounds: &str,
    mut bench: impl AsyncFnMut(&'static str, usize, usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    super::run(|| async move {
        let msgs = super::env_usize(msgs, 2_000);
        let rounds = super::env_usize(rounds, 10);
        let only = std::env::var("BENCH_ONLY").ok();
        for backend in ["sqlite", "postgres"] {
            if only.as_deref().is_none_or(|o| o == backend) {
                bench(backend, msgs, rounds).await?;
            }
        }
        Ok(())
    })
}

/// Runs `rounds` rounds; in each, every consumer in a shuffled order (`BENCH_ORDER`) gets `one(which)`, which
/// publishes its messages and returns the time its consumer took. Returns the total time per
/// consumer and the per-round ratios of hand/1's time to each consumer's.
pub async fn interleave<F, Fut>(
    rounds: usize,
    mut one: F,
) -> anyhow::Result<([Duration; 5], Vec<Vec<f64>>)>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let mut totals = [Duration::ZERO; CONSUMERS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); CONSUMERS.len()];
    let mut order = Rounds::from_env();
    for round in 0..rounds {
        let mut times = [Duration::ZERO; CONSUMERS.len()];
        for which in order.next(round, CONSUMERS.len()) {
            times[which] = one(which).await?;
        }
        for (i, t) in times.iter().enumerate() {
            totals[i] += *t;
            ratios[i].push(times[0].as_secs_f64() / t.as_secs_f64());
        }
    }
    Ok((totals, ratios))
}

/// Prints the table of one backend under `heading`, and the ratios the targets name
/// (with `c1`, also idem b100 c1 against hand/100).
pub fn print_table(
    heading: &str,
    msgs: usize,
    rounds: usize,
    totals: &[Duration; 5],
    ratios: &[Vec<f64>],
    c1: bool,
) {
    let n = (msgs * rounds) as f64;
    println!(
        "\n{heading}: {} messages per consumer ({rounds} rounds of {msgs})",
        msgs * rounds
    );
    println!(
        "{:<14} {:>9} {:>22} {:>20}",
        "consumer", "msg/s", "× hand/1 (whole run)", "× hand/1 (median)"
    );
    for (i, name) in CONSUMERS.iter().enumerate() {
        println!(
            "{:<14} {:>9.0} {:>22.2} {:>20.2}",
            name,
            n / totals[i].as_secs_f64(),
            totals[0].as_secs_f64() / totals[i].as_secs_f64(),
            median(&ratios[i])
        );
    }
    let ratio = |a: usize, b: usize| totals[a].as_secs_f64() / totals[b].as_secs_f64();
    print!(
        "idem b1 / hand/1 cost: {:.3}; idem b100 c4 / hand/100 throughput: {:.3}",
        ratio(1, 0),
        ratio(4, 3)
    );
    if c1 {
        print!("; idem b100 c1 / hand/100 throughput: {:.3}", ratio(4, 2));
    }
    println!();
}

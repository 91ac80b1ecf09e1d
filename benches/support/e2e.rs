//! End to end through a broker (`benches/nats.rs`, `benches/redis.rs`; `benches/rabbitmq.rs`
//! keeps its own copy): the five consumers, the wire format, the counter of what idem's
//! consumer acked (the bench's stop signal), the classic pattern's statements, and the
//! interleaved rounds with their table.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::consume::{Delivery, Settle, SettleError};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

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
    /// `delivery`, counted here when it is acked.
    pub fn wrap<D>(&self, delivery: D) -> Counted<D> {
        Counted {
            inner: delivery,
            acked: self.clone(),
        }
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
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let ack = matches!(settle, Settle::Ack);
        let result = self.inner.settle(settle).await;
        if ack && result.is_ok() {
            (self.acked.0).0.fetch_add(1, Ordering::SeqCst);
            (self.acked.0).1.notify_waiters();
        }
        result
    }
}

macro_rules! classic {
    ($db:ty, $h:ident) => {
        use idem::Tx;

        use crate::support::workload::Credit;

        /// The classic pattern's two statements in the caller's transaction: the message id
        /// into a processed table (`ON CONFLICT DO NOTHING`), and the effect if it was new.
        pub async fn classic(
            tx: &mut Tx<'_, $db>,
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
                crate::support::handlers::$h::effect(tx, msg).await?;
            }
            Ok(())
        }
    };
}

/// The classic pattern on SQLite.
pub mod sq {
    classic!(sqlx::Sqlite, sq);
}

/// The classic pattern on PostgreSQL.
pub mod pg {
    classic!(sqlx::Postgres, pg);
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

/// Prints the table of one backend.
pub fn print_table(
    broker: &str,
    backend: &str,
    msgs: usize,
    rounds: usize,
    totals: &[Duration; 5],
    ratios: &[Vec<f64>],
) {
    let n = (msgs * rounds) as f64;
    println!(
        "\n{broker}, {backend}: {} messages per consumer ({rounds} rounds of {msgs})",
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
    println!(
        "idem b1 / hand/1 cost: {:.3}; idem b100 c4 / hand/100 throughput: {:.3}; \
         idem b100 c1 / hand/100 throughput: {:.3}",
        totals[1].as_secs_f64() / totals[0].as_secs_f64(),
        totals[4].as_secs_f64() / totals[3].as_secs_f64(),
        totals[4].as_secs_f64() / totals[2].as_secs_f64()
    );
}

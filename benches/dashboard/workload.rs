//! The run's workload: two queues in memory, `orders` (status changes, versioned per order,
//! some delivered out of order, each publishing a shipment through the outbox) and `payments`
//! (some failing once or twice, a few every time), a producer at a rate that changes over the
//! run with about one message in five sent twice, and a few payloads no handler can read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::consume::memory::MemoryQueue;
use idem::{idempotent, Context, Tx};
use serde::{Deserialize, Serialize};
use sqlx::Sqlite;

/// A status change of an order: versions 1 to 4 per order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusChanged {
    pub id: String,
    pub order: i64,
    pub version: i64,
    pub status: String,
}

/// A payment; `fails` is how many runs of its handler fail before one succeeds
/// (`u32::MAX`: every run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payment {
    pub id: String,
    pub cents: i64,
    pub fails: u32,
}

pub const STATUSES: [&str; 4] = ["placed", "paid", "packed", "shipped"];

/// The tables the handlers write.
pub async fn create_tables(pool: &sqlx::SqlitePool) -> sqlx::Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE dash_orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);
         CREATE TABLE dash_payments (id TEXT PRIMARY KEY, cents INTEGER NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[idempotent(
    key = "msg.id",
    version = "msg.version",
    entity = "msg.order",
    scope = "dashboard::order_status"
)]
pub async fn on_status(
    tx: &mut Tx<'_, Sqlite>,
    msg: &StatusChanged,
    ctx: &Context,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dash_orders (id, status, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(msg.order)
    .bind(&msg.status)
    .bind(msg.version)
    .execute(&mut **tx)
    .await?;
    let shipment = serde_json::json!({ "order": msg.order, "status": msg.status });
    ctx.publish(tx, "shipments", &shipment).await?;
    Ok(())
}

/// Runs so far per payment id, shared by the handler's calls, and whether the cause of the
/// failures was fixed (then every run succeeds).
#[derive(Debug, Clone, Default)]
pub struct Runs {
    runs: Arc<Mutex<HashMap<String, u32>>>,
    pub fixed: Arc<AtomicBool>,
}

#[idempotent(key = "msg.id", scope = "dashboard::payment")]
pub async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Payment, runs: &Runs) -> Result<(), String> {
    let run = {
        let mut runs = runs.runs.lock().map_err(|_| "runs poisoned".to_string())?;
        let run = runs.entry(msg.id.clone()).or_insert(0);
        *run += 1;
        *run
    };
    if run <= msg.fails && !runs.fixed.load(Ordering::Relaxed) {
        return Err(format!(
            "the card processor refused payment {} (run {run})",
            msg.id
        ));
    }
    sqlx::query("INSERT INTO dash_payments (id, cents) VALUES (?1, ?2)")
        .bind(&msg.id)
        .bind(msg.cents)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The outbox's publisher: a broker that confirms every batch after a millisecond.
#[derive(Debug, Clone, Default)]
pub struct Shipments(pub Arc<AtomicU64>);

impl idem::outbox::Publisher for Shipments {
    async fn publish(
        &self,
        batch: &[idem::outbox::Message],
    ) -> Result<(), idem::outbox::PublishError> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// A small deterministic generator (xorshift64*), so a run's messages repeat.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// What the producer sent, by kind.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    pub orders: u64,
    pub payments: u64,
    pub copies: u64,
    pub swaps: u64,
    pub unreadable: u64,
}

/// Writes messages to both queues: status changes of a rolling set of 200 orders (one in
/// twenty swapped with the next version of its order, so the older one arrives stale) and
/// payments (one in twenty-five failing once or twice, one in three hundred every time);
/// about one message in five is sent twice, and one in five hundred is not JSON.
pub struct Producer {
    pub orders: MemoryQueue,
    pub payments: MemoryQueue,
    rng: Rng,
    /// Each open order's last version.
    open: Vec<(i64, i64)>,
    next_order: i64,
    next_payment: u64,
    pub sent: Sent,
}

impl Producer {
    pub fn new(orders: MemoryQueue, payments: MemoryQueue) -> Self {
        Producer {
            orders,
            payments,
            rng: Rng::new(0xda5b_0a2d),
            open: (0..200).map(|n| (n, 0)).collect(),
            next_order: 200,
            next_payment: 0,
            sent: Sent::default(),
        }
    }

    /// Sends `n` messages, about half to each queue.
    pub fn send(&mut self, n: usize) {
        for _ in 0..n {
            if self.rng.chance(0.5) {
                self.status_change();
            } else {
                self.payment();
            }
        }
    }

    fn publish(&mut self, queue: &MemoryQueue, payload: Vec<u8>) {
        if self.rng.chance(0.2) {
            queue.publish(payload.clone());
            self.sent.copies += 1;
        }
        queue.publish(payload);
    }

    fn event(order: i64, version: i64) -> Vec<u8> {
        let event = StatusChanged {
            id: format!("order-{order}-v{version}"),
            order,
            version,
            status: STATUSES[(version - 1) as usize % STATUSES.len()].to_string(),
        };
        serde_json::to_vec(&event).unwrap_or_default()
    }

    fn status_change(&mut self) {
        if self.rng.chance(0.002) {
            let queue = self.orders.clone();
            queue.publish(b"{\"id\": truncated".to_vec());
            self.sent.unreadable += 1;
            return;
        }
        let slot = (self.rng.next_u64() % self.open.len() as u64) as usize;
        let (order, version) = self.open[slot];
        let swap = version <= 2 && self.rng.chance(0.05);
        let queue = self.orders.clone();
        if swap {
            // The next two versions, the later one first: the earlier one comes stale.
            self.publish(&queue, Self::event(order, version + 2));
            self.publish(&queue, Self::event(order, version + 1));
            self.sent.swaps += 1;
            self.sent.orders += 2;
        } else {
            self.publish(&queue, Self::event(order, version + 1));
            self.sent.orders += 1;
        }
        let version = version + if swap { 2 } else { 1 };
        self.open[slot] = if version >= STATUSES.len() as i64 {
            self.next_order += 1;
            (self.next_order, 0)
        } else {
            (order, version)
        };
    }

    fn payment(&mut self) {
        let fails = if self.rng.chance(1.0 / 300.0) {
            u32::MAX
        } else if self.rng.chance(0.04) {
            1 + (self.rng.next_u64() % 2) as u32
        } else {
            0
        };
        self.next_payment += 1;
        let payment = Payment {
            id: format!("pay-{}", self.next_payment),
            cents: 100 + (self.rng.next_u64() % 10_000) as i64,
            fails,
        };
        let queue = self.payments.clone();
        self.publish(&queue, serde_json::to_vec(&payment).unwrap_or_default());
        self.sent.payments += 1;
    }
}

//! What recovery (`Consumer::recovery`) costs: on the happy path (nothing fails), and per
//! failed message (a durable retry beside a retry in place), on PostgreSQL through the
//! in-memory broker.
//!
//! ```text
//! cargo bench --bench recovery --features postgres
//! ```
//!
//! The modes, each a run of the consumer (batches of 100, 2 in flight) over `BENCH_MESSAGES`
//! credits on a fresh in-memory queue until every credit is applied:
//! - `off`: no recovery, nothing fails;
//! - `on`: recovery with durable retries, nothing fails (the happy path's cost of recovery;
//!   it looks for due retries at the default interval, 1 s);
//! - `in place, 1 of 10 fails once`: no recovery; every tenth credit fails its first run and is
//!   requeued in place;
//! - `durable, 1 of 10 fails once`: recovery; every tenth credit fails its first run and is
//!   parked, taken when due (no backoff) and applied.
//!
//! The modes run interleaved round by round in an order shuffled each round (`BENCH_ORDER`);
//! each round's rate is divided by `off`'s of the same round, and the median ratio over
//! rounds is reported. Then the statements one failed message costs are counted (sqlx's
//! statement log) for each way of retrying, with a poll of 200 ms so that the consumer looks
//! for due retries once before the failure is parked and once after. Environment: `IDEM_POSTGRES_URL`, `BENCH_ROUNDS`
//! (15), `BENCH_MESSAGES` (2,000).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::consume::{memory::MemoryQueue, Consumer, Recovery};
use idem::sqlx::{PgPool, Postgres};
use idem::{idempotent, Batch, Tx};

#[allow(dead_code)] // shared by every bench; this one uses the backends, order, stats, counter
mod support;

use support::backends::PostgresDb;
use support::order::Rounds;
use support::round_trips::{count, fold};
use support::stats::{median, spread, spread3};
use support::{env_usize, run};

#[derive(serde::Serialize, serde::Deserialize)]
struct Credit {
    id: String,
    account: i64,
    fails: bool,
}

/// How many times each failing credit's body ran: it fails its first delivery, whose body runs
/// twice (in its batch, then alone, where its error is reported).
#[derive(Clone, Default)]
struct Failed(Arc<Mutex<HashMap<String, u32>>>);

#[idempotent(key = "msg.id", scope = "bench::recovery")]
async fn credit(tx: &mut Tx<'_, Postgres>, msg: &Credit, failed: &Failed) -> Result<(), String> {
    let fail = msg.fails && {
        let mut runs = failed.0.lock().unwrap();
        let n = runs.entry(msg.id.clone()).or_default();
        *n += 1;
        *n <= 2
    };
    if fail {
        return Err(format!("credit {} failed once", msg.id));
    }
    sqlx::query("UPDATE bench_accounts SET balance = balance + 1 WHERE id = $1")
        .bind(msg.account)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The bench's own check that no parked retry is left (not the consumer's).
const PARKED_LEFT: &str = "SELECT COUNT(*) FROM idem_parked";

/// Parked retries of the consumer `name`.
async fn parked(pool: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "{PARKED_LEFT} WHERE consumer = $1"
    )))
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap_or(0)
}

/// How often the durable modes look for due retries while none is due.
const POLL: Duration = Duration::from_millis(5);

const MODES: [&str; 4] = [
    "off",
    "on",
    "in place, 1 of 10 fails once",
    "durable, 1 of 10 fails once",
];

/// One run of `mode` over `n` new credits (ids from `first`), looking for due retries every
/// `poll`; returns messages per second.
async fn once(
    pool: &PgPool,
    mode: usize,
    first: usize,
    n: usize,
    poll: Duration,
) -> anyhow::Result<f64> {
    let queue = MemoryQueue::new();
    let failing = mode >= 2;
    for i in first..first + n {
        let msg = Credit {
            id: format!("c{i}"),
            account: (i % 100) as i64,
            fails: failing && i % 10 == 0,
        };
        queue.publish(serde_json::to_vec(&msg)?);
    }
    let failed = Failed::default();
    let name = format!("bench-{mode}");
    let mut consumer = Consumer::new(pool.clone())
        .batch(100)
        .concurrency(2)
        .retry_delay(Duration::ZERO, Duration::ZERO);
    if mode == 1 || mode == 3 {
        // `on` looks for due retries at the default interval (1 s), as a consumer in
        // production; the failing mode at `poll`, so that its retries run at once.
        let poll = if mode == 1 {
            Duration::from_secs(1)
        } else {
            poll
        };
        consumer = consumer.recovery(
            Recovery::new(name.clone())
                .durable_retries(5, Duration::ZERO, Duration::ZERO)
                .poll(poll),
        );
    }
    // Done once every delivery was settled and no parked retry is left (the durable modes'
    // `SELECT COUNT(*) FROM idem_parked` is left out of the statement counts).
    let done = async {
        queue.idle().await;
        if mode == 1 || mode == 3 {
            while parked(pool, &name).await > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let started = Instant::now();
    let handler = async |b: &mut Batch<Postgres>, m: &Credit| credit(b, m, &failed).await;
    let counts = consumer
        .run(
            queue.deliveries(),
            idem::consume::json::<Credit>,
            handler,
            done,
        )
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        counts.applied as usize == n,
        "{}: applied {} of {n}: {counts:?}",
        MODES[mode],
        counts.applied
    );
    Ok(n as f64 / elapsed)
}

/// The statements that retrying one failed credit costs in `mode` (2: in place, 3: durable),
/// beyond the run that applies it.
async fn statements(pool: &PgPool, mode: usize, first: usize) -> anyhow::Result<String> {
    let (_, _, log) = count(true, async {
        once(pool, mode, first, 1, Duration::from_millis(200)).await?;
        Ok((0, 0))
    })
    .await?;
    let log: Vec<String> = log
        .into_iter()
        .filter(|s| !s.starts_with(PARKED_LEFT))
        .collect();
    Ok(format!("{}: {}", log.len(), fold(&log)))
}

async fn bench() -> anyhow::Result<()> {
    let rounds = env_usize("BENCH_ROUNDS", 15);
    let messages = env_usize("BENCH_MESSAGES", 2_000);
    let db = PostgresDb::open(6).await?;
    sqlx::query("CREATE TABLE bench_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)")
        .execute(&db.pool)
        .await?;
    sqlx::query("INSERT INTO bench_accounts SELECT g, 0 FROM generate_series(0, 99) g")
        .execute(&db.pool)
        .await?;
    let mut next = 0;
    // Warm every connection and statement once.
    for mode in 0..MODES.len() {
        once(&db.pool, mode, next, 200, POLL).await?;
        next += 200;
    }
    let mut order = Rounds::from_env();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for mode in order.next(round, MODES.len()) {
            rates[mode].push(once(&db.pool, mode, next, messages, POLL).await?);
            next += messages;
        }
    }
    let ratios = |mode: usize| -> Vec<f64> {
        rates[mode]
            .iter()
            .zip(&rates[0])
            .map(|(r, p)| r / p)
            .collect()
    };
    println!(
        "\n{rounds} rounds in {} order, {messages} messages per mode and round, batches of 100, 2 in flight, PostgreSQL\n",
        order.order().describe()
    );
    println!("| mode | messages/s (median) | spread | ratio to `off` (median) | spread |");
    println!("|---|---:|---|---:|---|");
    for (mode, name) in MODES.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {} | {:.3} | {} |",
            median(&rates[mode]),
            spread(&rates[mode]),
            median(&ratios(mode)),
            spread3(&ratios(mode)),
        );
    }
    // One failing credit (id 0 of a run fails once), each way: all the statements of its run.
    let base = next - next % 10 + 10;
    println!("\nstatements of one credit that fails once, then applies:");
    println!("- in place: {}", statements(&db.pool, 2, base).await?);
    println!("- durable:  {}", statements(&db.pool, 3, base + 10).await?);
    db.close().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    run(bench)
}

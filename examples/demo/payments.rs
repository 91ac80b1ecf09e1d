//! Effects outside the database: a consumer charges a payment provider, crashes after the call
//! and before its commit, and on redelivery charges once.
//!
//! ```text
//! cargo run --example payments
//! ```
//!
//! The provider keeps its charges in a database of its own (another SQLite file) and honours
//! idempotency keys, as real providers do. The consumer is a child process: the first time it
//! handles `pay-2` it calls the provider and then aborts, a real crash, so its transaction never
//! commits and its lease is left behind. The parent waits for the lease to expire and starts the
//! consumer again; the redelivery calls the provider with the same derived key
//! (`Context::derive`), so the provider returns the first charge instead of charging twice. It
//! exits 1 if the provider charged twice or a payment is missing.

#[path = "harness.rs"]
#[allow(dead_code)] // each demo uses its part
mod harness;

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use harness::orders::{open, Check};
use harness::Run;
use idem::{idempotent, Context, Outcome, Tx};
use sqlx::{Sqlite, SqlitePool};

/// The payment provider's side: a charge per idempotency key, whatever the number of calls.
struct Provider {
    db: SqlitePool,
}

impl Provider {
    async fn charge(
        &self,
        idempotency_key: &str,
        account: &str,
        amount: i64,
    ) -> Result<String, sqlx::Error> {
        sqlx::query("UPDATE calls SET n = n + 1")
            .execute(&self.db)
            .await?;
        sqlx::query("INSERT INTO charges (idempotency_key, account, amount) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
            .bind(idempotency_key)
            .bind(account)
            .bind(amount)
            .execute(&self.db)
            .await?;
        let id: i64 = sqlx::query_scalar("SELECT id FROM charges WHERE idempotency_key = ?")
            .bind(idempotency_key)
            .fetch_one(&self.db)
            .await?;
        Ok(format!("ch_{id}"))
    }
}

struct ChargeRequested {
    id: String,
    account: String,
    amount: i64,
}

#[idempotent(
    key = "msg.id",
    scope = "payments::charge",
    mode = "lease",
    lease = "2s"
)]
async fn charge(
    tx: &mut Tx<'_, Sqlite>,
    msg: &ChargeRequested,
    ctx: &Context,
    provider: &Provider,
) -> Result<String, sqlx::Error> {
    let charge_id = provider
        .charge(&ctx.derive("charge"), &msg.account, msg.amount)
        .await?;
    if std::env::var("CRASH_AFTER_CHARGE").as_deref() == Ok(msg.id.as_str()) {
        eprintln!(
            "consumer: charged {} as {charge_id}, crashing before the commit",
            msg.id
        );
        std::process::abort();
    }
    sqlx::query("INSERT INTO payments (message, charge_id) VALUES (?, ?)")
        .bind(&msg.id)
        .bind(&charge_id)
        .execute(&mut **tx)
        .await?;
    Ok(charge_id)
}

/// The consumer: handles the inbox's unacknowledged messages, acknowledging each after its commit.
async fn consume(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let pool = open(&dir.join("shop.db")).await?;
    let provider = Provider {
        db: open(&dir.join("provider.db")).await?,
    };
    let inbox: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT id, account, amount FROM inbox WHERE acked = 0 ORDER BY id")
            .fetch_all(&pool)
            .await?;
    for (id, account, amount) in inbox {
        let msg = ChargeRequested {
            id,
            account,
            amount,
        };
        loop {
            match charge(&pool, &msg, &provider).await? {
                Outcome::InProgress => {
                    // A crashed delivery's lease: wait for it to expire, as a broker's delayed requeue would.
                    println!(
                        "consumer: {} is in progress elsewhere; retrying shortly",
                        msg.id
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                outcome => {
                    println!("consumer: {} -> {outcome:?}", msg.id);
                    break;
                }
            }
        }
        sqlx::query("UPDATE inbox SET acked = 1 WHERE id = ?")
            .bind(&msg.id)
            .execute(&pool)
            .await?;
    }
    Ok(())
}

fn run_consumer(
    dir: &Path,
    crash_after: Option<&str>,
) -> Result<std::process::ExitStatus, std::io::Error> {
    let mut child = Command::new(std::env::current_exe()?);
    child.arg("consume").arg(dir);
    if let Some(id) = crash_after {
        child.env("CRASH_AFTER_CHARGE", id);
    }
    child.status()
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("consume") {
        consume(Path::new(&args[2])).await?;
        return Ok(ExitCode::SUCCESS);
    }

    let run = Run::new("payments")?;
    let dir = run.dir().to_path_buf();
    let shop = open(&run.path("shop.db")).await?;
    sqlx::raw_sql(
        "CREATE TABLE inbox (id TEXT PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL, acked INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE payments (message TEXT NOT NULL, charge_id TEXT NOT NULL);
         INSERT INTO inbox (id, account, amount) VALUES ('pay-1', 'ada', 1200), ('pay-2', 'brian', 4500), ('pay-3', 'chen', 800);",
    )
    .execute(&shop)
    .await?;
    let provider = open(&run.path("provider.db")).await?;
    sqlx::raw_sql(
        "CREATE TABLE charges (id INTEGER PRIMARY KEY, idempotency_key TEXT UNIQUE NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL);
         CREATE TABLE calls (n INTEGER NOT NULL); INSERT INTO calls VALUES (0);",
    )
    .execute(&provider)
    .await?;

    println!("run 1: the consumer crashes after charging pay-2");
    let crashed = run_consumer(&dir, Some("pay-2"))?;
    println!("run 1 ended: {crashed}");
    println!("run 2: the broker redelivers what was not acknowledged");
    let status = run_consumer(&dir, None)?;
    if !status.success() {
        return Err(format!("the second consumer failed: {status}").into());
    }

    let calls: i64 = sqlx::query_scalar("SELECT n FROM calls")
        .fetch_one(&provider)
        .await?;
    let charges: Vec<(String, i64)> =
        sqlx::query_as("SELECT account, amount FROM charges ORDER BY account")
            .fetch_all(&provider)
            .await?;
    let payments: Vec<(String, String)> =
        sqlx::query_as("SELECT message, charge_id FROM payments ORDER BY message")
            .fetch_all(&shop)
            .await?;
    println!(
        "\nprovider: {calls} calls, {} charges: {charges:?}",
        charges.len()
    );
    println!("shop: {} payments: {payments:?}", payments.len());
    shop.close().await;
    provider.close().await;

    let want = vec![
        ("ada".to_string(), 1200),
        ("brian".to_string(), 4500),
        ("chen".to_string(), 800),
    ];
    let mut check = Check::default();
    check.that(!crashed.success(), || {
        "the first consumer did not crash".into()
    });
    check.that(calls == 4, || format!("{calls} provider calls, want 4"));
    check.that(charges == want, || {
        format!("charges {charges:?}, want {want:?}")
    });
    check.that(payments.len() == 3, || {
        format!("{} payments, want 3", payments.len())
    });
    Ok(check.finish("pay-2 was sent to the provider twice and charged once"))
}

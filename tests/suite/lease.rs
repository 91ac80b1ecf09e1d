//! Lease mode and `Context`: effects outside the database, made safe by derived keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Context, Error, Outcome, Tx};
use sqlx::Pool;
use tokio::sync::Notify;

use super::super::{database, release, Db};

/// A payment provider that honours idempotency keys, as real ones do: a key seen before
/// returns the first charge instead of charging again.
#[derive(Default, Clone)]
struct Provider {
    charges: Arc<Mutex<HashMap<String, (String, i64)>>>,
    calls: Arc<Mutex<u32>>,
}

impl Provider {
    fn charge(&self, idempotency_key: &str, amount: i64) -> String {
        *self.calls.lock().unwrap() += 1;
        let mut charges = self.charges.lock().unwrap();
        let next = charges.len() + 1;
        charges
            .entry(idempotency_key.to_string())
            .or_insert_with(|| (format!("ch_{next}"), amount))
            .0
            .clone()
    }

    fn charged(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// What a test makes the handler do after it has called the provider.
#[derive(Clone, Default)]
enum After {
    #[default]
    Commit,
    Fail,
    Panic,
    /// Waits until the test says go, holding the lease meanwhile.
    Wait(Arc<Notify>),
    Sleep(Duration),
}

#[derive(Clone)]
struct ChargeRequested {
    id: String,
    amount: i64,
    after: After,
}

fn request(id: &str, amount: i64) -> ChargeRequested {
    ChargeRequested {
        id: id.into(),
        amount,
        after: After::Commit,
    }
}

#[idempotent(
    key = "msg.id",
    scope = "lease::charge",
    mode = "lease",
    lease = "1s",
    retention = "7d"
)]
async fn charge(
    tx: &mut Tx<'_, Db>,
    msg: &ChargeRequested,
    ctx: &Context,
    provider: &Provider,
) -> Result<String, sqlx::Error> {
    let charge_id = provider.charge(&ctx.derive("charge"), msg.amount);
    match &msg.after {
        After::Commit => {}
        After::Fail => return Err(sqlx::Error::Protocol("declined after the charge".into())),
        After::Panic => panic!("crashed after the charge, before the commit"),
        After::Wait(go) => go.notified().await,
        After::Sleep(duration) => tokio::time::sleep(*duration).await,
    }
    sqlx::query("INSERT INTO payments (message, charge_id, amount) VALUES ($1, $2, $3)")
        .bind(&msg.id)
        .bind(&charge_id)
        .bind(msg.amount)
        .execute(&mut **tx)
        .await?;
    Ok(charge_id)
}

async fn setup(pool: &Pool<Db>) {
    sqlx::query("CREATE TABLE payments (message TEXT NOT NULL, charge_id TEXT NOT NULL, amount BIGINT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn payments(pool: &Pool<Db>) -> Vec<(String, String)> {
    sqlx::query_as("SELECT message, charge_id FROM payments ORDER BY message")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// `None`: no record; `Some(true)`: in progress; `Some(false)`: done.
async fn lease_state(pool: &Pool<Db>, key: &str) -> Option<bool> {
    sqlx::query_scalar("SELECT lease_until IS NOT NULL FROM idem_records WHERE scope = 'lease::charge' AND msg_key = $1")
        .bind(key.as_bytes())
        .fetch_optional(pool)
        .await
        .unwrap()
}

macro_rules! db {
    () => {
        match database().await {
            Some(pool) => pool,
            None => return,
        }
    };
}

#[tokio::test]
async fn lease_applies_once_and_marks_the_message_done() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let msg = request("pay-1", 500);
    assert_eq!(
        charge(&pool, &msg, &provider).await.unwrap(),
        Outcome::Applied("ch_1".to_string())
    );
    assert_eq!(lease_state(&pool, "pay-1").await, Some(false));
    assert_eq!(
        charge(&pool, &msg, &provider).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(*provider.calls.lock().unwrap(), 1);
    assert_eq!(
        payments(&pool).await,
        [("pay-1".to_string(), "ch_1".to_string())]
    );
    release(pool).await;
}

#[tokio::test]
async fn a_delivery_while_in_progress_is_told_so_and_runs_nothing() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let go = Arc::new(Notify::new());
    let mut slow = request("pay-2", 70);
    slow.after = After::Wait(go.clone());
    let first = {
        let (pool, provider) = (pool.clone(), provider.clone());
        tokio::spawn(async move { charge(&pool, &slow, &provider).await })
    };
    // Wait until the first delivery is inside its body, past the provider call.
    while *provider.calls.lock().unwrap() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(lease_state(&pool, "pay-2").await, Some(true));
    assert_eq!(
        charge(&pool, &request("pay-2", 70), &provider)
            .await
            .unwrap(),
        Outcome::InProgress
    );
    assert_eq!(
        *provider.calls.lock().unwrap(),
        1,
        "the second delivery did not call out"
    );
    go.notify_one();
    assert!(first.await.unwrap().unwrap().is_applied());
    assert_eq!(
        charge(&pool, &request("pay-2", 70), &provider)
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(payments(&pool).await.len(), 1);
    release(pool).await;
}

#[tokio::test]
async fn an_error_releases_the_lease_and_the_redelivery_runs_at_once() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let mut msg = request("pay-3", 20);
    msg.after = After::Fail;
    assert!(matches!(
        charge(&pool, &msg, &provider).await,
        Err(Error::Handler(_))
    ));
    assert_eq!(
        lease_state(&pool, "pay-3").await,
        None,
        "released, not left in progress"
    );
    assert!(payments(&pool).await.is_empty());
    msg.after = After::Commit;
    assert!(charge(&pool, &msg, &provider).await.unwrap().is_applied());
    // The retry called the provider again with the same derived key: one charge.
    assert_eq!(*provider.calls.lock().unwrap(), 2);
    assert_eq!(provider.charged(), 1);
    release(pool).await;
}

#[tokio::test]
async fn a_crash_leaves_the_lease_to_expire_and_the_derived_key_prevents_a_second_charge() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let mut msg = request("pay-4", 900);
    msg.after = After::Panic;
    let crashed = {
        let (pool, provider, msg) = (pool.clone(), provider.clone(), msg.clone());
        tokio::spawn(async move { charge(&pool, &msg, &provider).await })
    };
    assert!(crashed.await.unwrap_err().is_panic());
    assert_eq!(
        lease_state(&pool, "pay-4").await,
        Some(true),
        "the crash left the lease"
    );
    msg.after = After::Commit;
    assert_eq!(
        charge(&pool, &msg, &provider).await.unwrap(),
        Outcome::InProgress
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await; // the lease (1 s) expires
    assert_eq!(
        charge(&pool, &msg, &provider).await.unwrap(),
        Outcome::Applied("ch_1".to_string())
    );
    assert_eq!(*provider.calls.lock().unwrap(), 2);
    assert_eq!(provider.charged(), 1, "charged once, though called twice");
    assert_eq!(
        payments(&pool).await,
        [("pay-4".to_string(), "ch_1".to_string())]
    );
    assert_eq!(lease_state(&pool, "pay-4").await, Some(false));
    release(pool).await;
}

#[tokio::test]
async fn racing_workers_run_the_message_once() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (pool, provider) = (pool.clone(), provider.clone());
        tasks.push(tokio::spawn(async move {
            let mut msg = request("pay-5", 10);
            msg.after = After::Sleep(Duration::from_millis(50));
            charge(&pool, &msg, &provider).await.unwrap()
        }));
    }
    let mut applied = 0;
    for task in tasks {
        match task.await.unwrap() {
            Outcome::Applied(_) => applied += 1,
            Outcome::InProgress | Outcome::Duplicate => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(*provider.calls.lock().unwrap(), 1);
    assert_eq!(payments(&pool).await.len(), 1);
    release(pool).await;
}

#[tokio::test]
async fn a_lease_that_expires_under_a_slow_handler_is_taken_over_and_the_slow_one_undone() {
    let pool = db!();
    setup(&pool).await;
    let provider = Provider::default();
    let mut slow = request("pay-6", 33);
    slow.after = After::Sleep(Duration::from_millis(2_500));
    let first = {
        let (pool, provider) = (pool.clone(), provider.clone());
        tokio::spawn(async move { charge(&pool, &slow, &provider).await })
    };
    while lease_state(&pool, "pay-6").await != Some(true) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await; // past the 1 s lease
    assert!(charge(&pool, &request("pay-6", 33), &provider)
        .await
        .unwrap()
        .is_applied());
    assert!(matches!(first.await.unwrap(), Err(Error::LeaseLost)));
    assert_eq!(
        payments(&pool).await.len(),
        1,
        "the slow delivery's write was rolled back"
    );
    assert_eq!(provider.charged(), 1);
    release(pool).await;
}

#[idempotent(key = "msg.0", version = "msg.1", scope = "lease::ctx")]
async fn with_context(
    tx: &mut Tx<'_, Db>,
    msg: (String, u32),
    ctx: Context,
) -> Result<(String, String), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok((ctx.to_string(), ctx.derive("email")))
}

#[tokio::test]
async fn the_context_names_the_delivery_and_derives_the_same_key_every_time() {
    let pool = db!();
    let (seen, key) = with_context(&pool, ("order-9".into(), 4))
        .await
        .unwrap()
        .applied()
        .unwrap();
    assert_eq!(seen, "lease::ctx/order-9@4");
    assert_eq!(
        key,
        Context::new("lease::ctx", b"order-9".to_vec(), Some(4)).derive("email")
    );
    // Another process, another day: the same delivery derives the same key.
    let (_, again) = with_context(&pool, ("order-9".into(), 5))
        .await
        .unwrap()
        .applied()
        .unwrap();
    assert_ne!(again, key, "a new version is a new message");
    release(pool).await;
}

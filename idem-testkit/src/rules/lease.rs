//! Lease mode (`mode = "lease"`) and `Context`: effects outside the database, made safe by a
//! lease and by derived keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::Leases;
use idem::{idempotent, Context, Error, Outcome, Tx};
use tokio::sync::Notify;

use crate::backend::{exec, Kit, KitDb};
use crate::{Backend, Dialect};

/// A payment provider that honours idempotency keys, as real ones do: a key seen before
/// returns the first charge instead of charging again.
#[derive(Default, Clone)]
pub struct Provider {
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

    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }

    fn charged(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// What a rule makes the handler do after it has called the provider.
#[derive(Clone, Default)]
pub enum After {
    /// Write and commit.
    #[default]
    Commit,
    /// Return an error.
    Fail,
    /// Panic, as a crash would stop it.
    Panic,
    /// Wait until the rule says go, holding the lease meanwhile.
    Wait(Arc<Notify>),
    /// Sleep, holding the lease meanwhile.
    Sleep(Duration),
}

/// A charge to make once.
#[derive(Clone)]
pub struct ChargeRequested {
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

/// Charges through the provider with a derived key, then records the payment.
#[idempotent(
    key = "msg.id",
    scope = "lease::charge",
    mode = "lease",
    lease = "1s",
    retention = "7d"
)]
pub async fn charge<DB: KitDb + Leases>(
    tx: &mut Tx<'_, DB>,
    msg: &ChargeRequested,
    ctx: &Context,
    provider: &Provider,
    d: &Dialect,
) -> Result<String, sqlx::Error> {
    let charge_id = provider.charge(&ctx.derive("charge"), msg.amount);
    match &msg.after {
        After::Commit => {}
        After::Fail => return Err(sqlx::Error::Protocol("declined after the charge".into())),
        After::Panic => panic!("crashed after the charge, before the commit"),
        After::Wait(go) => go.notified().await,
        After::Sleep(duration) => tokio::time::sleep(*duration).await,
    }
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO payments (message, charge_id, amount) VALUES ($1, $2, $3)",
        &[(&msg.id).into(), (&charge_id).into(), msg.amount.into()],
    )
    .await?;
    Ok(charge_id)
}

async fn setup<B: Backend>(k: &Kit<B>) {
    k.exec(
        "CREATE TABLE payments (message TEXT NOT NULL, charge_id TEXT NOT NULL, \
         amount BIGINT NOT NULL)",
        &[],
    )
    .await;
}

async fn payments<B: Backend>(k: &Kit<B>) -> Vec<(String, String)> {
    k.text_pairs(
        "SELECT message, charge_id FROM payments ORDER BY message",
        &[],
    )
    .await
}

/// `None`: no record; `Some(true)`: in progress; `Some(false)`: done.
async fn lease_state<B: Backend>(k: &Kit<B>, key: &str) -> Option<bool> {
    let sql = "SELECT COUNT(*) FROM idem_records WHERE scope = 'lease::charge' AND msg_key = $1";
    let binds = [key.as_bytes().into()];
    if k.int(sql, &binds).await == 0 {
        return None;
    }
    let held = k
        .int(&format!("{sql} AND lease_until IS NOT NULL"), &binds)
        .await;
    Some(held == 1)
}

/// A lease-mode delivery applies once and marks the message done; a redelivery is a duplicate.
pub async fn applies_once_and_marks_the_message_done<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let msg = request("pay-1", 500);
    assert_eq!(
        charge(&k.pool, &msg, &provider, &d).await.unwrap(),
        Outcome::Applied("ch_1".to_string())
    );
    assert_eq!(lease_state(&k, "pay-1").await, Some(false));
    assert_eq!(
        charge(&k.pool, &msg, &provider, &d).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(provider.calls(), 1);
    assert_eq!(
        payments(&k).await,
        [("pay-1".to_string(), "ch_1".to_string())]
    );
    k.close().await;
}

/// A delivery while another holds the lease is `InProgress` and runs nothing.
pub async fn delivery_while_in_progress_runs_nothing<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let go = Arc::new(Notify::new());
    let mut slow = request("pay-2", 70);
    slow.after = After::Wait(go.clone());
    let first = {
        let (pool, provider) = (k.pool.clone(), provider.clone());
        tokio::spawn(async move { charge(&pool, &slow, &provider, &d).await })
    };
    // Wait until the first delivery is inside its body, past the provider call.
    while provider.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(lease_state(&k, "pay-2").await, Some(true));
    assert_eq!(
        charge(&k.pool, &request("pay-2", 70), &provider, &d)
            .await
            .unwrap(),
        Outcome::InProgress
    );
    assert_eq!(provider.calls(), 1, "the second delivery did not call out");
    go.notify_one();
    assert!(first.await.unwrap().unwrap().is_applied());
    assert_eq!(
        charge(&k.pool, &request("pay-2", 70), &provider, &d)
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(payments(&k).await.len(), 1);
    k.close().await;
}

/// A handler error releases the lease, so the redelivery runs at once (and the derived key
/// keeps the provider from charging twice).
pub async fn error_releases_the_lease<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let mut msg = request("pay-3", 20);
    msg.after = After::Fail;
    assert!(matches!(
        charge(&k.pool, &msg, &provider, &d).await,
        Err(Error::Handler(_))
    ));
    assert_eq!(
        lease_state(&k, "pay-3").await,
        None,
        "released, not left in progress"
    );
    assert!(payments(&k).await.is_empty());
    msg.after = After::Commit;
    assert!(charge(&k.pool, &msg, &provider, &d)
        .await
        .unwrap()
        .is_applied());
    // The retry called the provider again with the same derived key: one charge.
    assert_eq!(provider.calls(), 2);
    assert_eq!(provider.charged(), 1);
    assert_eq!(lease_state(&k, "pay-3").await, Some(false));
    k.close().await;
}

/// A crash leaves the lease until it expires; then a redelivery runs, and the derived key
/// keeps the provider from charging twice.
pub async fn crash_leaves_the_lease_to_expire<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let mut msg = request("pay-4", 900);
    msg.after = After::Panic;
    let crashed = {
        let (pool, provider, msg) = (k.pool.clone(), provider.clone(), msg.clone());
        tokio::spawn(async move { charge(&pool, &msg, &provider, &d).await })
    };
    assert!(crashed.await.unwrap_err().is_panic());
    assert_eq!(
        lease_state(&k, "pay-4").await,
        Some(true),
        "the crash left the lease"
    );
    msg.after = After::Commit;
    assert_eq!(
        charge(&k.pool, &msg, &provider, &d).await.unwrap(),
        Outcome::InProgress
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await; // the lease (1 s) expires
    assert_eq!(
        charge(&k.pool, &msg, &provider, &d).await.unwrap(),
        Outcome::Applied("ch_1".to_string())
    );
    assert_eq!(provider.calls(), 2);
    assert_eq!(provider.charged(), 1, "charged once, though called twice");
    assert_eq!(
        payments(&k).await,
        [("pay-4".to_string(), "ch_1".to_string())]
    );
    assert_eq!(lease_state(&k, "pay-4").await, Some(false));
    k.close().await;
}

/// Racing workers with one message run it once.
pub async fn racing_workers_run_the_message_once<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (pool, provider) = (k.pool.clone(), provider.clone());
        tasks.push(tokio::spawn(async move {
            let mut msg = request("pay-5", 10);
            msg.after = After::Sleep(Duration::from_millis(50));
            charge(&pool, &msg, &provider, &d).await.unwrap()
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
    assert_eq!(provider.calls(), 1);
    assert_eq!(payments(&k).await.len(), 1);
    assert_eq!(lease_state(&k, "pay-5").await, Some(false));
    k.close().await;
}

/// A lease that expires under a slow handler is taken over; the slow delivery's write is rolled
/// back with `LeaseLost`.
pub async fn expired_lease_is_taken_over_and_the_slow_one_undone<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let provider = Provider::default();
    let mut slow = request("pay-6", 33);
    slow.after = After::Sleep(Duration::from_millis(2_500));
    let first = {
        let (pool, provider) = (k.pool.clone(), provider.clone());
        tokio::spawn(async move { charge(&pool, &slow, &provider, &d).await })
    };
    while lease_state(&k, "pay-6").await != Some(true) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await; // past the 1 s lease
    assert!(charge(&k.pool, &request("pay-6", 33), &provider, &d)
        .await
        .unwrap()
        .is_applied());
    assert!(matches!(first.await.unwrap(), Err(Error::LeaseLost)));
    assert_eq!(
        payments(&k).await.len(),
        1,
        "the slow delivery's write was rolled back"
    );
    assert_eq!(provider.charged(), 1);
    assert_eq!(lease_state(&k, "pay-6").await, Some(false));
    k.close().await;
}

#[idempotent(key = "msg.0", version = "msg.1", scope = "lease::ctx")]
async fn with_context<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: (String, u32),
    ctx: Context,
    d: &Dialect,
) -> Result<(String, String), sqlx::Error> {
    crate::backend::fetch::<DB>(&mut **tx, d, "SELECT 1", &[], &[]).await?;
    Ok((ctx.to_string(), ctx.derive("email")))
}

/// The `Context` names the delivery and derives the same key every time, and another for a new
/// version.
pub async fn context_derives_the_same_key_every_time<B: Backend>() {
    let k = crate::__open!(B);
    let d = k.dialect;
    let (seen, key) = with_context(&k.pool, ("order-9".into(), 4), &d)
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
    let (_, again) = with_context(&k.pool, ("order-9".into(), 5), &d)
        .await
        .unwrap()
        .applied()
        .unwrap();
    assert_ne!(again, key, "a new version is a new message");
    assert_eq!(
        crate::fixtures::stored_version(&k, "lease::ctx", b"order-9").await,
        Some(5)
    );
    k.close().await;
}

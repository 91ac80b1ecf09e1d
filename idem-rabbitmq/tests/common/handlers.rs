// The body of `model::sqlite` and `model::postgres`: `Db` is the backend.

use std::collections::BTreeMap;

use idem::{idempotent, Batch, Error, Outcome, Tx};
use sqlx::Pool;

use crate::common::{Credit, Event, Oracle, Status};

/// Key only: the credit is added to its account once.
#[idempotent(key = "msg.id", scope = "rmq::on_credit")]
pub async fn on_credit(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), String> {
    if msg.fail {
        return Err(format!("{} always fails", msg.id));
    }
    sqlx::query("INSERT INTO ledger (id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO balances (account, balance) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET balance = balances.balance + excluded.balance",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Key + version + entity: an order moves to a newer version only.
#[idempotent(key = "msg.id", version = "msg.version", entity = "msg.order", scope = "rmq::on_status")]
pub async fn on_status(tx: &mut Tx<'_, Db>, msg: &Status) -> Result<(), String> {
    if msg.fail {
        return Err(format!("{} always fails", msg.id));
    }
    sqlx::query("INSERT INTO ledger (id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO orders (id, version) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET version = excluded.version",
    )
    .bind(msg.order)
    .bind(msg.version)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// The batch handler the consumer runs.
pub async fn handle(b: &mut Batch<Db>, event: &Event) -> Result<Outcome<()>, Error<String>> {
    match event {
        Event::Credit(c) => on_credit(b, c).await,
        Event::Status(s) => on_status(b, s).await,
    }
}

/// The tables: `ledger` has a row per application (no unique constraint, so a double
/// application shows).
pub async fn schema(pool: &Pool<Db>) {
    for sql in [
        "CREATE TABLE IF NOT EXISTS ledger (id TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS balances (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// How many times each message was applied.
pub async fn ledger(pool: &Pool<Db>) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("SELECT id, COUNT(*) FROM ledger GROUP BY id")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// The database equals the exactly-once oracle, and nothing was applied twice.
pub async fn verify(pool: &Pool<Db>, oracle: &Oracle) {
    let ledger = ledger(pool).await;
    let twice: Vec<_> = ledger.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    for id in oracle.credits.iter().chain(&oracle.latest) {
        assert!(ledger.contains_key(id), "{id} was never applied");
    }
    for id in ledger.keys() {
        assert!(
            oracle.credits.contains(id) || oracle.statuses.contains(id),
            "{id} applied but never published"
        );
    }
    let balances: BTreeMap<i64, i64> =
        sqlx::query_as::<_, (i64, i64)>("SELECT account, balance FROM balances")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(balances, oracle.balances, "balances differ from the oracle");
    let orders: BTreeMap<i64, i64> =
        sqlx::query_as::<_, (i64, i64)>("SELECT id, version FROM orders")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(orders, oracle.orders, "order versions differ from the oracle");
}

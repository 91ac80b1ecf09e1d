//! `fingerprint`, `replay` and `max_attempts`, alone and together, in every mode (lease mode
//! with `version` and `entity` too), under
//! `deny(warnings)`; the futures stay `Send`, and a `max_attempts` handler runs in a batch.
#![deny(warnings)]

#[path = "../support.rs"]
mod support;

use idem::{idempotent, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::Sqlite;

struct Msg {
    id: String,
    body: Vec<u8>,
    version: i64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    total: i64,
}

#[idempotent(key = "msg.id", fingerprint = "msg.body", replay = true, max_attempts = 5)]
async fn all_three(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    let _ = tx;
    Ok(Receipt { total: 7 })
}

#[idempotent(key = msg.id, version = msg.version, fingerprint = (msg.id.as_str(), &msg.body), replay = false)]
async fn versioned(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "msg.id", mode = "lease", replay = true, max_attempts = 2)]
async fn leased(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<String, sqlx::Error> {
    let _ = tx;
    Ok(msg.id.clone())
}

#[idempotent(key = "msg.id", version = "msg.version", mode = "lease", fingerprint = "msg.body", replay = true)]
async fn leased_versions(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(msg.version)
}

#[idempotent(key = "msg.id", version = "msg.version", entity = "msg.body", mode = "lease", max_attempts = 3)]
async fn leased_entity(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let msg = Msg {
        id: "m1".into(),
        body: b"payload".to_vec(),
        version: 1,
    };
    assert_send(all_three(&pool, &msg));
    assert_send(leased(&pool, &msg));
    assert!(all_three(&pool, &msg).await.unwrap().is_applied());
    assert_eq!(
        all_three(&pool, &msg).await.unwrap(),
        Outcome::Replayed(Receipt { total: 7 })
    );
    let mut tx = pool.begin().await.unwrap();
    assert!(versioned(&mut tx, &msg).await.unwrap().is_applied());
    tx.commit().await.unwrap();
    assert!(leased(&pool, &msg).await.unwrap().is_applied());
    assert_send(leased_versions(&pool, &msg));
    assert!(leased_versions(&pool, &msg).await.unwrap().is_applied());
    assert_eq!(leased_versions(&pool, &msg).await.unwrap(), Outcome::Replayed(1));
    assert!(leased_entity(&pool, &msg).await.unwrap().is_applied());
    let results = idem::batch(&pool, &[msg], async |b, m| all_three(b, m).await)
        .await
        .unwrap();
    assert_eq!(results.len(), 1);
}

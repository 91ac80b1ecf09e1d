//! The forms a key, version or entity expression may take: bare or in a string, composite keys,
//! method calls, casts, destructured parameters, and an unused transaction binding.
#[path = "../support.rs"]
mod support;
use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

struct Msg {
    tenant: String,
    id: u64,
    seq: u32,
    order: (i64, String),
}

#[idempotent(key = (msg.tenant.as_str(), msg.id), version = msg.seq, scope = "pass::expr::bare")]
async fn bare(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(
    key = "msg.id",
    version = "msg.seq as i64 * 10",
    entity = "&msg.order.1",
    scope = "pass::expr::string"
)]
async fn string(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "id", version = "seq", scope = "pass::expr::destructured")]
async fn destructured(
    _: &mut Tx<'_, Sqlite>,
    Msg { id, seq, .. }: &Msg,
) -> Result<u32, sqlx::Error> {
    Ok(*seq)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let msg = Msg {
        tenant: "eu".into(),
        id: 9,
        seq: 2,
        order: (1, "o-1".into()),
    };
    assert_eq!(bare(&pool, &msg).await.unwrap(), Outcome::Applied(()));
    assert_eq!(bare(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(string(&pool, &msg).await.unwrap(), Outcome::Applied(()));
    let later = Msg {
        id: 10,
        seq: 1,
        ..msg
    };
    assert_eq!(
        string(&pool, &later).await.unwrap(),
        Outcome::Stale { latest: 20 }
    );
    assert_eq!(
        destructured(&pool, &later).await.unwrap(),
        Outcome::Applied(1)
    );
}

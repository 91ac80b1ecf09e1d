//! Stacks with `#[tracing::instrument]`, above or below.
#[path = "../support.rs"]
mod support;
use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

// The outer attribute expands first. Here `instrument` sees the generated fn: its span covers
// the claim, and it must skip the source, which is not `Debug`.
#[idempotent(key = "msg.id", scope = "pass::instrument::below")]
#[tracing::instrument(skip_all, fields(id = %msg.id), err)]
async fn below(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(())
}

// Here `instrument` sees the fn as written, and wraps the body, inside idem's transaction.
#[tracing::instrument(skip(tx, msg), err)]
#[idempotent(key = "msg.id", scope = "pass::instrument::above")]
async fn above(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let msg = Msg { id: "m".into() };
    assert_eq!(below(&pool, &msg).await.unwrap(), Outcome::Applied(()));
    assert_eq!(below(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(above(&pool, &msg).await.unwrap(), Outcome::Applied(()));
    assert_eq!(above(&pool, &msg).await.unwrap(), Outcome::Duplicate);
}

//! Generic handlers: over the message type, and over the database itself (with the capability
//! each option needs).
#[path = "../support.rs"]
mod support;
use idem::store::{Attempts, Leases, Stamps, Store};
use idem::{idempotent, Key, Outcome, Tx};
use sqlx::Sqlite;

trait Message {
    type Id: Key;
    fn id(&self) -> &Self::Id;
}

struct Paid(u64);

impl Message for Paid {
    type Id = u64;
    fn id(&self) -> &u64 {
        &self.0
    }
}

#[idempotent(key = "msg.id()", scope = "pass::generic::message")]
async fn on_msg<M: Message + Sync>(tx: &mut Tx<'_, Sqlite>, msg: &M) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(())
}

// Any database with an idem store: the transaction's database is a type parameter.
#[idempotent(key = "id", scope = "pass::generic::database")]
async fn on_any<DB: Store, const N: usize>(
    tx: &mut Tx<'_, DB>,
    id: [u8; N],
) -> Result<usize, std::convert::Infallible> {
    let _ = tx;
    Ok(N)
}

// Any database that keeps stamps and counts attempts: what these options need.
#[idempotent(
    key = "id",
    fingerprint = "body",
    replay = true,
    max_attempts = 3,
    scope = "pass::generic::options"
)]
async fn on_any_with_options<DB: Stamps + Attempts>(
    tx: &mut Tx<'_, DB>,
    id: &str,
    body: &str,
) -> Result<usize, std::convert::Infallible> {
    let _ = tx;
    Ok(body.len())
}

// Any database that holds leases.
#[idempotent(key = "id", mode = "lease", scope = "pass::generic::lease")]
async fn on_any_leased<DB: Leases>(tx: &mut Tx<'_, DB>, id: &str) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    assert_eq!(on_msg(&pool, &Paid(7)).await.unwrap(), Outcome::Applied(()));
    assert_eq!(on_msg(&pool, &Paid(7)).await.unwrap(), Outcome::Duplicate);
    assert_eq!(on_any(&pool, *b"abc").await.unwrap(), Outcome::Applied(3));
    assert_eq!(on_any(&pool, *b"abc").await.unwrap(), Outcome::Duplicate);
    let first = on_any_with_options(&pool, "m", "body").await.unwrap();
    assert_eq!(first, Outcome::Applied(4));
    let again = on_any_with_options(&pool, "m", "body").await.unwrap();
    assert_eq!(again, Outcome::Replayed(4));
    assert!(matches!(
        on_any_with_options(&pool, "m", "other").await,
        Err(idem::Error::Conflict { .. })
    ));
    assert_eq!(on_any_leased(&pool, "l").await.unwrap(), Outcome::Applied(()));
    assert_eq!(on_any_leased(&pool, "l").await.unwrap(), Outcome::Duplicate);
}

//! The body may return any alias of `Result`: `anyhow::Result`, `std::io::Result`, or one of the
//! crate's own.
#[path = "../support.rs"]
mod support;
use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

#[derive(Debug, PartialEq)]
struct AppError;

type AppResult<T> = std::result::Result<T, AppError>;

#[idempotent(key = "id", scope = "pass::result_alias::anyhow")]
async fn with_anyhow(tx: &mut Tx<'_, Sqlite>, id: u32) -> anyhow::Result<u32> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    anyhow::ensure!(id > 0, "ids start at 1");
    Ok(id)
}

#[idempotent(key = "id", scope = "pass::result_alias::io")]
async fn with_io(tx: &mut Tx<'_, Sqlite>, id: u32) -> std::io::Result<()> {
    let _ = (tx, id);
    Ok(())
}

#[idempotent(key = "id", scope = "pass::result_alias::own")]
async fn with_own(tx: &mut Tx<'_, Sqlite>, id: u32) -> AppResult<()> {
    let _ = tx;
    if id == 0 {
        return Err(AppError);
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    assert_eq!(with_anyhow(&pool, 1).await.unwrap(), Outcome::Applied(1));
    match with_anyhow(&pool, 0).await {
        Err(idem::Error::Handler(err)) => assert_eq!(err.to_string(), "ids start at 1"),
        other => panic!("expected the handler's error, got {}", other.is_ok()),
    }
    assert_eq!(with_io(&pool, 1).await.unwrap(), Outcome::Applied(()));
    assert!(matches!(
        with_own(&pool, 0).await,
        Err(idem::Error::Handler(AppError))
    ));
    // The failed delivery recorded nothing: the redelivery applies.
    assert_eq!(with_own(&pool, 1).await.unwrap(), Outcome::Applied(()));
}

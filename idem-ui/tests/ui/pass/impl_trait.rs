//! `impl Trait` in parameters, and in the `Ok` type of the return type (which the generated
//! `let` cannot name, so it is inferred there).
#[path = "../support.rs"]
mod support;
use std::fmt::Display;

use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

#[idempotent(key = "id.as_ref()", scope = "pass::impl_trait::param")]
async fn on_id(
    tx: &mut Tx<'_, Sqlite>,
    id: impl AsRef<str> + Send,
    note: impl Display + Send,
) -> Result<String, sqlx::Error> {
    let _ = tx;
    Ok(format!("{}: {note}", id.as_ref()))
}

#[idempotent(key = "id", scope = "pass::impl_trait::ret")]
async fn shown(tx: &mut Tx<'_, Sqlite>, id: u8) -> Result<impl Display, sqlx::Error> {
    let _ = tx;
    Ok(id * 2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let first = on_id(&pool, "a", 1).await.unwrap();
    assert_eq!(first, Outcome::Applied("a: 1".to_string()));
    assert_eq!(
        on_id(&pool, String::from("a"), 2).await.unwrap(),
        Outcome::Duplicate
    );
    let shown = shown(&pool, 21).await.unwrap();
    match shown {
        Outcome::Applied(value) => assert_eq!(value.to_string(), "42"),
        _ => panic!("expected Applied"),
    }
}

//! `crate = "..."` for teams that re-export idem from a platform crate or module.
#[path = "../support.rs"]
mod support;

mod my_reexport {
    pub use ::idem;
}

use my_reexport::idem::{idempotent, Outcome, Tx};

#[idempotent(
    key = "id",
    scope = "pass::crate_reexport::root",
    crate = "my_reexport::idem"
)]
async fn at_root(tx: &mut Tx<'_, sqlx::Sqlite>, id: u32) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

mod nested {
    use crate::my_reexport::idem::{idempotent, Tx};

    #[idempotent(
        key = "id",
        scope = "pass::crate_reexport::nested",
        crate = "crate::my_reexport::idem"
    )]
    pub async fn nested(tx: &mut Tx<'_, sqlx::Sqlite>, id: u32) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::connect().await;
    my_reexport::idem::migrate(&pool).await.unwrap();
    assert_eq!(at_root(&pool, 1).await.unwrap(), Outcome::Applied(()));
    assert_eq!(
        nested::nested(&pool, 1).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(nested::nested(&pool, 1).await.unwrap(), Outcome::Duplicate);
}

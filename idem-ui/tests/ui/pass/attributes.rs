//! Visibility, doc comments and other attributes are kept on the generated fn: under
//! `deny(missing_docs, warnings)` this would not compile if the doc comment or the `allow` were lost.
#![deny(missing_docs, warnings)]
//! A consumer.

#[path = "../support.rs"]
mod support;

/// Handlers.
pub mod handlers {
    use idem::{idempotent, Tx};
    use sqlx::Sqlite;

    /// A documented handler.
    #[idempotent(key = "id", scope = "pass::attributes::documented")]
    #[allow(unused_variables)]
    pub async fn documented(tx: &mut Tx<'_, Sqlite>, id: u32) -> Result<(), sqlx::Error> {
        let unused = 1;
        let _ = tx;
        Ok(())
    }

    #[idempotent(key = "id", scope = "pass::attributes::crate_visible")]
    #[inline]
    pub(crate) async fn crate_visible(
        tx: &mut Tx<'_, Sqlite>,
        id: u32,
    ) -> Result<u32, sqlx::Error> {
        let _ = tx;
        Ok(id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    handlers::documented(&pool, 1).await.unwrap();
    handlers::crate_visible(&pool, 1).await.unwrap();
}

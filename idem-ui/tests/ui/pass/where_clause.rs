//! Where clauses, on a free fn and on a method of a generic impl.
#[path = "../support.rs"]
mod support;
use std::fmt::Display;
use std::marker::PhantomData;

use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

#[idempotent(key = "id.to_string()", scope = "pass::where_clause::free")]
async fn on_id<I>(tx: &mut Tx<'_, Sqlite>, id: I) -> Result<String, sqlx::Error>
where
    I: Display + Send,
{
    let _ = tx;
    Ok(format!("<{id}>"))
}

struct Consumer<S> {
    suffix: S,
}

impl<S> Consumer<S>
where
    S: AsRef<str> + Sync,
{
    #[idempotent(
        key = "(id, self.suffix.as_ref())",
        scope = "pass::where_clause::method"
    )]
    async fn on_id<T>(
        &self,
        tx: &mut Tx<'_, Sqlite>,
        id: u32,
        _marker: PhantomData<T>,
    ) -> Result<u32, sqlx::Error>
    where
        T: Send,
    {
        let _ = tx;
        Ok(id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    assert_eq!(
        on_id(&pool, 4).await.unwrap(),
        Outcome::Applied("<4>".into())
    );
    assert_eq!(on_id(&pool, "4").await.unwrap(), Outcome::Duplicate);
    let consumer = Consumer { suffix: "x" };
    let ok = consumer.on_id::<()>(&pool, 1, PhantomData).await.unwrap();
    assert_eq!(ok, Outcome::Applied(1));
}

//! Methods: `&self` and `&mut self`; the key may read `self` and the message.
#[path = "../support.rs"]
mod support;
use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

struct Consumer {
    tenant: &'static str,
    seen: u32,
}

impl Consumer {
    #[idempotent(key = "(self.tenant, &msg.id)", scope = "pass::method::by_ref")]
    async fn on_msg(&self, tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<usize, sqlx::Error> {
        sqlx::query("SELECT 1").execute(&mut **tx).await?;
        Ok(self.tenant.len() + msg.id.len())
    }

    #[idempotent(key = "msg.id", scope = "pass::method::by_mut")]
    async fn count(&mut self, tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<u32, sqlx::Error> {
        let _ = tx;
        self.seen += 1;
        Ok(self.seen)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let mut consumer = Consumer {
        tenant: "eu",
        seen: 0,
    };
    let msg = Msg { id: "m-1".into() };
    assert_eq!(
        consumer.on_msg(&pool, &msg).await.unwrap(),
        Outcome::Applied(5)
    );
    assert_eq!(
        consumer.on_msg(&pool, &msg).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        consumer.count(&pool, &msg).await.unwrap(),
        Outcome::Applied(1)
    );
    assert_eq!(
        consumer.count(&pool, &msg).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(consumer.seen, 1);
}

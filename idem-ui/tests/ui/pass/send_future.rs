//! The future of a generated handler is `Send`: it can be spawned on a multi-threaded runtime.
#[path = "../support.rs"]
mod support;
use std::sync::Arc;

use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    version: i64,
}

#[idempotent(key = "msg.id", version = "msg.version", scope = "pass::send_future")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.version)
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main]
async fn main() {
    let pool = support::pool().await;
    let msg = Arc::new(Msg {
        id: "m".into(),
        version: 2,
    });
    let _ = assert_send(on_msg(&pool, &msg));
    let task = tokio::spawn({
        let (pool, msg) = (pool.clone(), msg.clone());
        async move { on_msg(&pool, &msg).await }
    });
    assert_eq!(task.await.unwrap().unwrap(), Outcome::Applied(2));
    // Through an open transaction too.
    let task = tokio::spawn(async move {
        let mut tx = pool.begin().await?;
        let outcome = on_msg(&mut tx, &msg).await;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(outcome)
    });
    assert_eq!(task.await.unwrap().unwrap().unwrap(), Outcome::Duplicate);
}

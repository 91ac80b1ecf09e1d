use idem::{idempotent, Tx};
use sqlx::{Sqlite, SqlitePool};

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id", max_attempts = 5)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn caller(pool: &SqlitePool, msg: &Msg) {
    // A pool is fine: failures are counted in transactions of their own.
    let _ = on_msg(pool, msg).await;
    // A caller's transaction is not: the count would roll back with it.
    let mut tx = pool.begin().await.unwrap();
    let _ = on_msg(&mut tx, msg).await;
}

fn main() {}

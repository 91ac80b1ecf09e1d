use idem::{idempotent, Tx};
use sqlx::{Sqlite, SqlitePool};

struct Msg {
    id: String,
    version: i64,
}

#[idempotent(key = "msg.id", version = "msg.version", mode = "lease")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn caller(pool: &SqlitePool, msg: &Msg) {
    // A pool is fine: the lease commits on a connection of its own before the body runs.
    let _ = on_msg(pool, msg).await;
    // A caller's transaction is not: the lease could not commit on its own.
    let mut tx = pool.begin().await.unwrap();
    let _ = on_msg(&mut tx, msg).await;
}

fn main() {}

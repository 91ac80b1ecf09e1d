use idem::{idempotent, Tx};
use sqlx::{Sqlite, SqlitePool};

struct Msg {
    id: String,
}

// The transaction must come first.
#[idempotent(key = "msg.id")]
async fn on_msg(msg: &Msg, tx: &mut Tx<'_, Sqlite>) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.id);
    Ok(())
}

// A pool is what callers pass; the body writes through a transaction.
#[idempotent(key = "msg.id")]
async fn on_other(pool: &SqlitePool, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (pool, msg);
    Ok(())
}

fn main() {}

use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id", replay = 1)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<u32, sqlx::Error> {
    let _ = tx;
    Ok(1)
}

#[idempotent(key = "msg.id", replay = "yes")]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<u32, sqlx::Error> {
    let _ = tx;
    Ok(1)
}

fn main() {}

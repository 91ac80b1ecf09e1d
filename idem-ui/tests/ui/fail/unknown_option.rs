use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    version: u64,
}

#[idempotent(key = "msg.id", versoin = "msg.version")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "msg.id", retries = 3)]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

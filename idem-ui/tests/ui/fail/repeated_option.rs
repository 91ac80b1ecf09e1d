use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    version: u64,
}

#[idempotent(key = "msg.id", version = "msg.version", key = "msg.version")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

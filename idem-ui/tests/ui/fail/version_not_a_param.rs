use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    version: u64,
}

// Written bare, the error points at the exact token.
#[idempotent(key = msg.id, version = message.version)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, msg.version);
    Ok(())
}

fn main() {}

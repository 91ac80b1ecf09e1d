use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    version: u64,
}

#[idempotent(version = "msg.version")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, msg);
    Ok(())
}

fn main() {}

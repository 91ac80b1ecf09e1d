use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.id);
    Ok(())
}

fn main() {}

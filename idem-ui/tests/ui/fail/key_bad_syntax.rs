use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.id);
    Ok(())
}

// The attribute itself is malformed: `=` is missing.
#[idempotent(key "msg.id")]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.id);
    Ok(())
}

fn main() {}

use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Option<u8> {
    let _ = tx;
    Some(1)
}

#[idempotent(key = "msg.id")]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) {
    let _ = (tx, msg);
}

fn main() {}

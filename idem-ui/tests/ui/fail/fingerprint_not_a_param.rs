use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    body: String,
}

#[idempotent(key = "msg.id", fingerprint = "payload.body")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.body);
    Ok(())
}

fn main() {}

use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    order_id: i64,
}

#[idempotent(key = "msg.id", entity = "msg.order_id")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    version: u64,
    order_id: i64,
}

#[idempotent(key = "msg.id", version = "msg.version", entity = "order.id")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, msg.order_id);
    Ok(())
}

// A key read from the transaction: the transaction is opened after the key is read.
#[idempotent(key = "tx.id")]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, msg);
    Ok(())
}

fn main() {}

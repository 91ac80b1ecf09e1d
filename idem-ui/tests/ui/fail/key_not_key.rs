use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct OrderId(i64);

struct Msg {
    id: OrderId,
    amount: f64,
}

#[idempotent(key = "msg.id")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, msg.id.0);
    Ok(())
}

#[idempotent(key = msg.amount)]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

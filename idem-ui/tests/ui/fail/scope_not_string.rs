use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id", scope = billing::on_paid)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

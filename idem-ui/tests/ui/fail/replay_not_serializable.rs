use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

/// Neither `Serialize` nor `Deserialize`.
struct Receipt {
    total: i64,
}

#[idempotent(key = "msg.id", replay = true)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    let _ = tx;
    Ok(Receipt { total: 1 })
}

fn main() {}

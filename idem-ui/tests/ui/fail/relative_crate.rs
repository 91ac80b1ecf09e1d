use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

pub mod platform {
    pub use idem;
}

#[idempotent(key = "msg.id", crate = "self::platform::idem")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

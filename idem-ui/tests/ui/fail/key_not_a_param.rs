use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

// A typo in the string: the error points at the literal and names the bad segment.
#[idempotent(key = "mgs.id")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = (tx, &msg.id);
    Ok(())
}

fn main() {}

use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    // A float timestamp: versions are integers or `chrono`/`time` timestamps.
    sent_at: f64,
}

#[idempotent(key = "msg.id", version = "msg.sent_at")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

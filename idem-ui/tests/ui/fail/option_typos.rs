use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
    body: String,
}

#[idempotent(key = "msg.id", fingerprnt = "msg.body", replay_result = true, max_attempt = 3)]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "msg.id", replay = true, replay = false, max_attempts = 2, max_attempts = 3)]
async fn on_other(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

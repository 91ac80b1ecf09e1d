use idem::{idempotent, Tx};
use sqlx::Sqlite;

struct Msg {
    id: String,
}

// PostgreSQL text cannot hold a NUL: refused here rather than by the database at run time.
#[idempotent(key = "msg.id", scope = "billing\0on_paid")]
async fn nul_scope(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "msg.id", retention = "0s")]
async fn no_retention(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "msg.id", mode = "lease", lease = "0ms")]
async fn no_lease(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

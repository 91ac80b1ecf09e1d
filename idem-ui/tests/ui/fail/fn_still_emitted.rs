use idem::{idempotent, Outcome, Tx};
use sqlx::{Sqlite, SqlitePool};

struct Msg {
    id: String,
    version: u64,
}

// One mistake in the options: the fn is still generated, with the signature the caller
// expects, so the only error is the misspelled option, not one at each call site.
#[idempotent(key = "msg.id", verison = "msg.version")]
async fn on_msg(tx: &mut Tx<'_, Sqlite>, msg: &Msg) -> Result<u8, sqlx::Error> {
    let _ = tx;
    Ok(1)
}

async fn consume(pool: &SqlitePool, msg: &Msg) -> Result<(), idem::Error<sqlx::Error>> {
    assert_eq!(on_msg(pool, msg).await?, Outcome::Applied(1));
    let mut tx = pool.begin().await.map_err(idem::Error::Store)?;
    on_msg(&mut tx, msg).await?;
    Ok(())
}

fn main() {
    let _ = consume;
}

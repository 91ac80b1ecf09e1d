//! `max_attempts` needs a database that counts attempts (`idem::store::Attempts`): a handler
//! generic over `DB: Store` alone does not compile, and the error is at the option.
use idem::store::Store;
use idem::{idempotent, Tx};

#[idempotent(key = "id", max_attempts = 5)]
async fn counted<DB: Store>(tx: &mut Tx<'_, DB>, id: &str) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

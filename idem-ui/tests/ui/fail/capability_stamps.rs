//! `fingerprint` and `replay` need a database that keeps stamps (`idem::store::Stamps`): a
//! handler generic over `DB: Store` alone does not compile, and the error is at the option.
use idem::store::Store;
use idem::{idempotent, Tx};

#[idempotent(key = "id", fingerprint = "body")]
async fn checked<DB: Store>(tx: &mut Tx<'_, DB>, id: &str, body: &str) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key = "id", replay = true)]
async fn replayed<DB: Store>(tx: &mut Tx<'_, DB>, id: &str) -> Result<u64, sqlx::Error> {
    let _ = tx;
    Ok(7)
}

fn main() {}

//! `mode = "lease"` needs a database that holds leases (`idem::store::Leases`): a handler
//! generic over `DB: Store` alone does not compile, and the error is at the option.
use idem::store::Store;
use idem::{idempotent, Tx};

#[idempotent(key = "id", mode = "lease")]
async fn leased<DB: Store>(tx: &mut Tx<'_, DB>, id: &str) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}

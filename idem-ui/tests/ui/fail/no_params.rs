use idem::idempotent;

#[idempotent(key = "msg.id")]
async fn on_msg() -> Result<(), sqlx::Error> {
    Ok(())
}

struct Handler;

impl Handler {
    #[idempotent(key = "self.id")]
    async fn on_msg(&self) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

fn main() {}

use idem::idempotent;

struct Msg {
    id: String,
    order_id: i64,
}

// Every independent mistake is reported in one build.
#[idempotent(kye = "msg.id", entity = "msg.order_id", scope = 7, scope = "orders")]
fn on_msg(msg: &Msg) -> Result<(), sqlx::Error> {
    let _ = msg;
    Ok(())
}

fn main() {}

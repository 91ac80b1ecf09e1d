use idem::idempotent;

#[idempotent(key = "self.id")]
struct Handler {
    id: String,
}

fn main() {
    let _ = Handler { id: String::new() }.id;
}

//! Messages that borrow: `Msg<'a>`, elided and named lifetimes.
#[path = "../support.rs"]
mod support;
use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

struct Msg<'a> {
    id: &'a str,
    version: u32,
    body: &'a [u8],
}

#[idempotent(
    key = "msg.id",
    version = "msg.version",
    scope = "pass::lifetimes::elided"
)]
async fn elided(tx: &mut Tx<'_, Sqlite>, msg: &Msg<'_>) -> Result<usize, sqlx::Error> {
    let _ = tx;
    Ok(msg.body.len())
}

#[idempotent(key = "msg.id", scope = "pass::lifetimes::named")]
async fn named<'a, 'b: 'a>(
    tx: &mut Tx<'_, Sqlite>,
    msg: Msg<'a>,
    extra: &'b str,
) -> Result<&'a str, sqlx::Error> {
    let _ = (tx, extra);
    Ok(msg.id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool = support::pool().await;
    let id = String::from("m-1");
    let msg = Msg {
        id: &id,
        version: 3,
        body: b"xyz",
    };
    assert_eq!(elided(&pool, &msg).await.unwrap(), Outcome::Applied(3));
    assert_eq!(elided(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    let returned = named(&pool, msg, "x").await.unwrap();
    assert_eq!(returned, Outcome::Applied("m-1"));
}

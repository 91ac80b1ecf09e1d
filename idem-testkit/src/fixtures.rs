//! The suite's business: credits to accounts (key only), order status changes (key + version,
//! key + version + entity), an audit table, and the queries the rules assert the database with.
//! Every handler is generic over the database and takes the backend's [`Dialect`].

use idem::{idempotent, Outcome, Tx};

use crate::backend::{exec, fetch, Backend, Kit, KitDb, Ty, Value};
use crate::dialect::{Dialect, Set};

/// A credit of `amount` to `account`, as message `id`; `fail`/`panic` make the handler fail
/// after its write.
#[derive(Clone, Debug)]
pub struct Credit {
    /// The message id (the key).
    pub id: String,
    /// The account credited.
    pub account: String,
    /// How much.
    pub amount: i64,
    /// Return an error after the write.
    pub fail: bool,
    /// Panic after the write.
    pub panic: bool,
}

/// A credit that succeeds.
pub fn credit(id: &str, account: &str, amount: i64) -> Credit {
    Credit {
        id: id.into(),
        account: account.into(),
        amount,
        fail: false,
        panic: false,
    }
}

/// A change of an order's status to `status` at `version`, as event `event_id`.
#[derive(Clone, Debug)]
pub struct StatusChanged {
    /// The event id (the key with an entity).
    pub event_id: String,
    /// The order (the entity).
    pub order_id: i64,
    /// The order's version.
    pub version: i64,
    /// The new status.
    pub status: String,
}

/// A status change.
pub fn status(event_id: &str, order_id: i64, version: i64, status: &str) -> StatusChanged {
    StatusChanged {
        event_id: event_id.into(),
        order_id,
        version,
        status: status.into(),
    }
}

/// Creates `accounts`, `orders` and `audit`.
pub async fn setup<B: Backend>(k: &Kit<B>) {
    let key = k.dialect.key_type;
    k.exec(
        &format!("CREATE TABLE accounts (id {key} PRIMARY KEY, balance BIGINT NOT NULL)"),
        &[],
    )
    .await;
    k.exec(
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)",
        &[],
    )
    .await;
    k.exec("CREATE TABLE audit (note TEXT NOT NULL)", &[]).await;
}

/// Key only: adds the amount to the account, returns the new balance.
#[idempotent(key = "msg.id", scope = "suite::apply_credit")]
pub async fn apply_credit<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Credit,
    d: &Dialect,
) -> Result<i64, sqlx::Error> {
    let balance =
        add_to_account::<DB>(&mut **tx, d, msg.account.clone().into(), msg.amount).await?;
    if msg.panic {
        panic!("handler panicked after its write");
    }
    if msg.fail {
        return Err(sqlx::Error::Protocol(
            "handler failed after its write".into(),
        ));
    }
    Ok(balance)
}

/// Upserts `amount` into `accounts` row `account` and returns the balance: with `RETURNING`
/// where the dialect has it, else read back in the same transaction.
pub async fn add_to_account<DB: KitDb>(
    conn: &mut DB::Connection,
    d: &Dialect,
    account: Value,
    amount: i64,
) -> Result<i64, sqlx::Error> {
    let upsert = d.upsert(
        "accounts",
        &["id", "balance"],
        &["id"],
        &[("balance", Set::Add)],
    );
    let binds = [account.clone(), amount.into()];
    if d.returning {
        let rows = fetch::<DB>(
            conn,
            d,
            &format!("{upsert} RETURNING balance"),
            &binds,
            &[Ty::Int],
        )
        .await?;
        return Ok(rows[0][0].int());
    }
    exec::<DB>(&mut *conn, d, &upsert, &binds).await?;
    let rows = fetch::<DB>(
        conn,
        d,
        "SELECT balance FROM accounts WHERE id = $1",
        &[account],
        &[Ty::Int],
    )
    .await?;
    Ok(rows[0][0].int())
}

/// The same message, handled by a second consumer of its own (another scope).
#[idempotent(key = "msg.id", scope = "suite::notify")]
pub async fn notify<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Credit,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    note::<DB>(&mut **tx, d, &format!("credited {}", msg.account)).await
}

/// Inserts a row of `audit`.
pub async fn note<DB: KitDb>(
    conn: &mut DB::Connection,
    d: &Dialect,
    note: &str,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        conn,
        d,
        "INSERT INTO audit (note) VALUES ($1)",
        &[note.into()],
    )
    .await
}

/// Delivers `msg` to [`apply_credit`] on the rule's pool and asserts its outcome.
pub async fn credit_is<B: Backend>(k: &Kit<B>, msg: &Credit, want: Outcome<i64>) {
    let got = apply_credit(&k.pool, msg, &k.dialect).await.unwrap();
    assert_eq!(got, want, "{msg:?}");
}

/// Delivers `msg` to [`on_status`] on the rule's pool and asserts its outcome.
pub async fn on_status_is<B: Backend>(k: &Kit<B>, msg: &StatusChanged, want: Outcome<()>) {
    let got = on_status(&k.pool, msg, &k.dialect).await.unwrap();
    assert_eq!(got, want, "{msg:?}");
}

/// Key + version: the order id is the key and the entity.
#[idempotent(
    key = "msg.order_id",
    version = "msg.version",
    scope = "suite::set_status"
)]
pub async fn set_status<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &StatusChanged,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    upsert_order::<DB>(&mut **tx, d, msg).await
}

/// Key + version + entity: each event once, and never an older version over a newer one.
#[idempotent(key = msg.event_id, version = msg.version, entity = msg.order_id, scope = "suite::on_status")]
pub async fn on_status<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &StatusChanged,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    upsert_order::<DB>(&mut **tx, d, msg).await
}

async fn upsert_order<DB: KitDb>(
    conn: &mut DB::Connection,
    d: &Dialect,
    msg: &StatusChanged,
) -> Result<(), sqlx::Error> {
    let sql = d.upsert(
        "orders",
        &["id", "status", "version"],
        &["id"],
        &[("status", Set::New), ("version", Set::New)],
    );
    exec::<DB>(
        conn,
        d,
        &sql,
        &[
            msg.order_id.into(),
            (&msg.status).into(),
            msg.version.into(),
        ],
    )
    .await
}

/// An order's row.
#[derive(Debug, PartialEq, Eq)]
pub struct Order {
    /// Its id.
    pub id: i64,
    /// Its status.
    pub status: String,
    /// Its version.
    pub version: i64,
}

/// The balance of `account`, if it has a row.
pub async fn balance<B: Backend>(k: &Kit<B>, account: &str) -> Option<i64> {
    k.opt_int(
        "SELECT balance FROM accounts WHERE id = $1",
        &[account.into()],
    )
    .await
}

/// Records of `scope`.
pub async fn records<B: Backend>(k: &Kit<B>, scope: &str) -> i64 {
    k.int(
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1",
        &[scope.into()],
    )
    .await
}

/// Whether `scope` has a record of `key`.
pub async fn recorded<B: Backend>(k: &Kit<B>, scope: &str, key: &str) -> bool {
    k.int(
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND msg_key = $2",
        &[scope.into(), key.as_bytes().into()],
    )
    .await
        == 1
}

/// The keys of `scope`'s records, sorted.
pub async fn keys<B: Backend>(k: &Kit<B>, scope: &str) -> Vec<Vec<u8>> {
    let sql = "SELECT msg_key FROM idem_records WHERE scope = $1";
    let column = k.column(sql, &[scope.into()], Ty::Bytes).await;
    let mut keys: Vec<Vec<u8>> = column.iter().map(Value::bytes).collect();
    keys.sort();
    keys
}

/// The stored version of `entity` in `scope`.
pub async fn stored_version<B: Backend>(k: &Kit<B>, scope: &str, entity: &[u8]) -> Option<i64> {
    k.opt_int(
        "SELECT version FROM idem_versions WHERE scope = $1 AND entity = $2",
        &[scope.into(), entity.into()],
    )
    .await
}

/// The row of order `id`.
pub async fn order<B: Backend>(k: &Kit<B>, id: i64) -> Option<Order> {
    let rows = k
        .rows(
            "SELECT id, status, version FROM orders WHERE id = $1",
            &[id.into()],
            &[Ty::Int, Ty::Text, Ty::Int],
        )
        .await;
    rows.first().map(|row| Order {
        id: row[0].int(),
        status: row[1].text(),
        version: row[2].int(),
    })
}

/// Rows in `table` (a constant of the suite).
pub async fn rows_in<B: Backend>(k: &Kit<B>, table: &str) -> i64 {
    k.int(&format!("SELECT COUNT(*) FROM {table}"), &[]).await
}

/// Opens the rule's database, or returns from the rule (the backend printed why it skipped);
/// `__open!(B, setup)` then runs `setup` on it and gives `(kit, dialect)`.
#[macro_export]
#[doc(hidden)]
macro_rules! __open {
    ($b:ty) => {
        match $crate::Kit::<$b>::open().await {
            Some(kit) => kit,
            None => return,
        }
    };
    // Then creates the rule's tables with `setup`; gives the kit and its dialect.
    ($b:ty, $setup:path) => {{
        let kit = $crate::__open!($b);
        $setup(&kit).await;
        let dialect = kit.dialect;
        (kit, dialect)
    }};
}

//! The business the broker rules run: credits (key only) and order status changes (key +
//! version + entity) as JSON events, their `#[idempotent]` handlers and tables, a generated
//! stream with copies and swapped neighbours, and its exactly-once oracle; and the outbox's
//! orders (service A publishes a payment for each) and payments (service B, keyed on the
//! outbox's message id). Every handler is generic over the database and takes its
//! [`Dialect`].

use std::collections::{BTreeMap, BTreeSet};

use idem::outbox::OutboxStore;
use idem::store::Attempts;
use idem::{idempotent, Batch, Context, Error, Outcome, Tx};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::Raw;
use crate::dialect::Set;
use crate::{exec, Backend, Dialect, Kit, KitDb, Ty};

/// An event of the stream: a credit or a status change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    /// Key only.
    Credit(Credit),
    /// Key + version + entity.
    Status(Status),
}

/// A credit of `amount` to `account`, as message `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credit {
    /// The message id (the key).
    pub id: String,
    /// The account credited.
    pub account: i64,
    /// How much.
    pub amount: i64,
    /// The handler always fails on it (a poison message).
    #[serde(default)]
    pub fail: bool,
}

/// Order `order` moves to `version`, as event `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The event id (the key).
    pub id: String,
    /// The order (the entity).
    pub order: i64,
    /// The order's version.
    pub version: i64,
    /// The handler always fails on it.
    #[serde(default)]
    pub fail: bool,
}

impl Event {
    /// The event's id.
    pub fn id(&self) -> &str {
        match self {
            Event::Credit(c) => &c.id,
            Event::Status(s) => &s.id,
        }
    }

    /// The event as published: its id and its JSON.
    pub fn raw(&self) -> Raw {
        Raw {
            id: self.id().to_string(),
            // A derived Serialize of strings and integers does not fail.
            payload: serde_json::to_vec(self).unwrap_or_default(),
        }
    }
}

/// A credit that succeeds.
pub fn credit(id: &str, account: i64, amount: i64) -> Event {
    Event::Credit(Credit {
        id: id.to_string(),
        account,
        amount,
        fail: false,
    })
}

/// A credit the handler always fails on.
pub fn poison(id: &str) -> Event {
    Event::Credit(Credit {
        id: id.to_string(),
        account: 999,
        amount: 1_000,
        fail: true,
    })
}

/// The events as published.
pub fn raws(events: &[Event]) -> Vec<Raw> {
    events.iter().map(Event::raw).collect()
}

/// `unique` distinct events (half credits over 40 accounts, half status changes of 60 orders,
/// versions counting up per order), neighbours swapped so that versions arrive out of order,
/// then about 30% of the published messages are copies of earlier ones, up to 300 places
/// later. `unique` is at least 32.
pub fn generate(seed: u64, unique: usize) -> Vec<Event> {
    let unique = unique.max(32);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_version: BTreeMap<i64, i64> = BTreeMap::new();
    let mut events: Vec<Event> = (0..unique)
        .map(|i| {
            if rng.random_bool(0.5) {
                Event::Credit(Credit {
                    id: format!("c{i}"),
                    account: rng.random_range(0..40),
                    amount: rng.random_range(1..1_000),
                    fail: false,
                })
            } else {
                let order = rng.random_range(0..60);
                let version = next_version.entry(order).or_default();
                *version += 1;
                Event::Status(Status {
                    id: format!("s{i}"),
                    order,
                    version: *version,
                    fail: false,
                })
            }
        })
        .collect();
    for _ in 0..unique / 5 {
        let i = rng.random_range(0..events.len() - 16);
        let j = i + rng.random_range(1..=16);
        events.swap(i, j);
    }
    let copies = unique * 3 / 7;
    for _ in 0..copies {
        let i = rng.random_range(0..events.len());
        let j = rng.random_range(i + 1..=(i + 300).min(events.len()));
        let copy = events[i].clone();
        events.insert(j, copy);
    }
    events
}

/// What applying every distinct event exactly once ends with, in any order: balances are
/// sums; an order ends at its highest version.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Oracle {
    /// Each account's balance.
    pub balances: BTreeMap<i64, i64>,
    /// Each order's version.
    pub orders: BTreeMap<i64, i64>,
    /// The ids of the credits (each applied once).
    pub credits: BTreeSet<String>,
    /// The ids of the status changes (each applied at most once).
    pub statuses: BTreeSet<String>,
    /// The id of each order's highest version: always applied.
    pub latest: BTreeSet<String>,
}

/// The oracle of `events` (poison ones left out: they never apply).
pub fn oracle(events: &[Event]) -> Oracle {
    let mut o = Oracle::default();
    let mut latest: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    for event in events {
        match event {
            Event::Credit(c) if !c.fail && o.credits.insert(c.id.clone()) => {
                *o.balances.entry(c.account).or_default() += c.amount;
            }
            Event::Status(s) if !s.fail => {
                o.statuses.insert(s.id.clone());
                let best = latest.entry(s.order).or_insert((0, String::new()));
                if s.version > best.0 {
                    *best = (s.version, s.id.clone());
                }
            }
            _ => {}
        }
    }
    for (order, (version, id)) in latest {
        o.orders.insert(order, version);
        o.latest.insert(id);
    }
    o
}

/// Creates the tables: `ledger` (a row per application, no unique constraint, so that a
/// double application shows), `balances`, `orders`, and `payments` (service B's).
pub async fn schema<D: Backend>(k: &Kit<D>) {
    for sql in [
        "CREATE TABLE ledger (id TEXT NOT NULL)",
        "CREATE TABLE balances (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, version BIGINT NOT NULL)",
        "CREATE TABLE payments (order_id TEXT NOT NULL, n BIGINT NOT NULL)",
    ] {
        k.exec(sql, &[]).await;
    }
}

/// A row an event upserts: the table, its key column, the value column, what the upsert does.
type Target = (&'static str, &'static str, &'static str, Set);

/// What an event writes: its id (its row of `ledger`), whether it is poison (it fails before it
/// writes), the row it upserts and that row's key and value.
trait Writes {
    fn writes(&self) -> (&str, bool, Target, (i64, i64));
}

impl Writes for Credit {
    fn writes(&self) -> (&str, bool, Target, (i64, i64)) {
        let balances = ("balances", "account", "balance", Set::Add);
        (&self.id, self.fail, balances, (self.account, self.amount))
    }
}

impl Writes for Status {
    fn writes(&self) -> (&str, bool, Target, (i64, i64)) {
        let orders = ("orders", "id", "version", Set::New);
        (&self.id, self.fail, orders, (self.order, self.version))
    }
}

/// The body of the stream's handlers: what `msg` writes, or its failure.
async fn apply<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &impl Writes,
    d: &Dialect,
) -> Result<(), String> {
    let (id, fail, (table, key_column, column, set), (key, value)) = msg.writes();
    if fail {
        return Err(format!("{id} always fails"));
    }
    let e = |e: sqlx::Error| e.to_string();
    let ledger = "INSERT INTO ledger (id) VALUES ($1)";
    exec::<DB>(&mut **tx, d, ledger, &[id.into()])
        .await
        .map_err(e)?;
    let upsert = d.upsert(
        table,
        &[key_column, column],
        &[key_column],
        &[(column, set)],
    );
    exec::<DB>(&mut **tx, d, &upsert, &[key.into(), value.into()])
        .await
        .map_err(e)
}

crate::options::handlers! {
    apply(msg: &Credit, d: &Dialect) -> Result<(), String>;
    /// Key only: the credit is added to its account once.
    pub on_credit<>(key = "msg.id", scope = "kit_broker::on_credit");
    /// Key only, poisoned after 3 failed attempts (`max_attempts = 3`).
    pub on_credit_counted<Attempts>(
        key = "msg.id", max_attempts = 3, scope = "kit_broker::on_credit_counted"
    );
}

crate::options::handlers! {
    apply(msg: &Status, d: &Dialect) -> Result<(), String>;
    /// Key + version + entity: an order moves to a newer version only, each event once.
    pub on_status<>(
        key = "msg.id", version = "msg.version", entity = "msg.order",
        scope = "kit_broker::on_status"
    );
}

/// The consumer's handler: each event through its own `#[idempotent]` handler.
pub async fn handle<DB: KitDb>(
    b: &mut Batch<DB>,
    event: &Event,
    d: &Dialect,
) -> Result<Outcome<()>, Error<String>> {
    match event {
        Event::Credit(c) => on_credit(b, c, d).await,
        Event::Status(s) => on_status(b, s, d).await,
    }
}

/// The same, with credits through [`on_credit_counted`] (`max_attempts = 3`).
pub async fn handle_counted<DB: KitDb + Attempts>(
    b: &mut Batch<DB>,
    event: &Event,
    d: &Dialect,
) -> Result<Outcome<()>, Error<String>> {
    if let Event::Credit(c) = event {
        return on_credit_counted(b, c, d).await;
    }
    handle(b, event, d).await
}

/// How many times each message was applied.
pub async fn ledger<D: Backend>(k: &Kit<D>) -> BTreeMap<String, i64> {
    let rows = k.text_ints("SELECT id, COUNT(*) FROM ledger GROUP BY id", &[]);
    rows.await.into_iter().collect()
}

/// Applications in the ledger.
pub async fn applied<D: Backend>(k: &Kit<D>) -> u64 {
    k.int("SELECT COUNT(*) FROM ledger", &[]).await as u64
}

/// Ids applied more than once (must be none).
pub async fn applied_twice<D: Backend>(k: &Kit<D>) -> Vec<String> {
    ledger(k)
        .await
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect()
}

/// The database equals the exactly-once oracle: nothing applied twice, every credit and every
/// order's latest version applied, nothing applied that was not published, balances and order
/// versions as the oracle says.
pub async fn verify<D: Backend>(k: &Kit<D>, oracle: &Oracle) {
    let ledger = ledger(k).await;
    let twice: Vec<_> = ledger.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    for id in oracle.credits.iter().chain(&oracle.latest) {
        assert!(ledger.contains_key(id), "{id} was never applied");
    }
    for id in ledger.keys() {
        assert!(
            oracle.credits.contains(id) || oracle.statuses.contains(id),
            "{id} applied but never published (or poison)"
        );
    }
    let pairs = |sql: &'static str| async move {
        k.rows(sql, &[], &[Ty::Int, Ty::Int])
            .await
            .into_iter()
            .map(|row| (row[0].int(), row[1].int()))
            .collect::<BTreeMap<i64, i64>>()
    };
    assert_eq!(
        pairs("SELECT account, balance FROM balances").await,
        oracle.balances,
        "balances differ from the oracle"
    );
    assert_eq!(
        pairs("SELECT id, version FROM orders").await,
        oracle.orders,
        "order versions differ from the oracle"
    );
}

/// An incoming order, for service A.
#[derive(Debug, Clone)]
pub struct Order {
    /// The order's id (the key).
    pub id: String,
    /// The partition key: a customer's payments stay in order.
    pub customer: String,
    /// Where the payment goes.
    pub destination: String,
    /// The handler fails after it published.
    pub fail: bool,
}

/// What service A publishes for an order, through the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The order (or the partition key, in [`seed_outbox`]).
    pub order: String,
    /// 1 for an order; the position in its key's sequence in [`seed_outbox`].
    pub n: i64,
}

/// Service A: publishes a payment for the order (partition key: the customer; header `kind`),
/// then fails if asked to; returns the payment's message id.
#[idempotent(key = "msg.id", scope = "kit_broker::on_order")]
pub async fn on_order<DB: KitDb + OutboxStore>(
    tx: &mut Tx<'_, DB>,
    msg: &Order,
    ctx: &Context,
) -> Result<String, sqlx::Error> {
    let payment = Payment {
        order: msg.id.clone(),
        n: 1,
    };
    let id = ctx
        .outgoing(&msg.destination)
        .partition_key(msg.customer.clone())
        .header("kind", "payment")
        .publish(tx, &payment)
        .await?;
    if msg.fail {
        return Err(sqlx::Error::Protocol(
            "the handler failed after publishing".into(),
        ));
    }
    Ok(id)
}

/// A payment as service B sees it: the message id the outbox gave it is the key.
#[derive(Debug, Clone)]
pub struct Received {
    /// The outbox's message id.
    pub message_id: String,
    /// The payment.
    pub payment: Payment,
}

/// Service B: records the payment once per message id.
#[idempotent(key = "msg.message_id", scope = "kit_broker::on_payment")]
pub async fn on_payment<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Received,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO payments (order_id, n) VALUES ($1, $2)",
        &[msg.payment.order.as_str().into(), msg.payment.n.into()],
    )
    .await
}

/// Service A handles `n` orders of `customer` (ids `<customer>-order-<i>`), each committed;
/// the payments' message ids, in order.
pub async fn commit_orders<D: Backend>(
    k: &Kit<D>,
    destination: &str,
    customer: &str,
    n: usize,
) -> Vec<String>
where
    D::Db: OutboxStore,
{
    let mut ids = Vec::new();
    for i in 0..n {
        let order = Order {
            id: format!("{customer}-order-{i}"),
            customer: customer.into(),
            destination: destination.into(),
            fail: false,
        };
        match on_order(&k.pool, &order).await {
            Ok(Outcome::Applied(id)) => ids.push(id),
            other => panic!("{order:?}: {other:?}"),
        }
    }
    ids
}

/// Writes `rows` outbox messages to `destination` over `keys` partition keys (`key-<k>`; a
/// key's payments count up in `n`), 200 per transaction.
pub async fn seed_outbox<D: Backend>(k: &Kit<D>, destination: &str, rows: usize, keys: usize)
where
    D::Db: OutboxStore,
{
    let mut tx = k.pool.begin().await.expect("a transaction");
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("kit_broker::seed", i.to_be_bytes().to_vec(), None);
        let payment = Payment {
            order: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing(destination)
            .partition_key(key)
            .publish(&mut tx, &payment)
            .await
            .expect("an outbox row");
        if i % 200 == 199 {
            tx.commit().await.expect("a commit");
            tx = k.pool.begin().await.expect("a transaction");
        }
    }
    tx.commit().await.expect("a commit");
}

/// Outbox rows not yet marked sent.
pub async fn unsent<D: Backend>(k: &Kit<D>) -> i64 {
    k.int(
        "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL",
        &[],
    )
    .await
}

//! The behaviour suite, shared by `tests/sqlite.rs` and `tests/postgres.rs` through `super::Db`.
//! Every test asserts the state of the database, not only what the handler returned.

use std::sync::Arc;

use idem::key::{KeyPart, KeyProblem};
use idem::{idempotent, Error, Outcome, Tx};
use sqlx::Pool;

use super::{database, release, Db};

mod lease;
mod retention;

/// Opens the test database, or skips (with the reason already printed) when there is none.
macro_rules! db {
    () => {
        match database().await {
            Some(pool) => pool,
            None => return,
        }
    };
}

#[derive(Clone, Debug)]
struct Credit {
    id: String,
    account: String,
    amount: i64,
    fail: bool,
    panic: bool,
}

fn credit(id: &str, account: &str, amount: i64) -> Credit {
    Credit {
        id: id.into(),
        account: account.into(),
        amount,
        fail: false,
        panic: false,
    }
}

#[derive(Debug, sqlx::FromRow)]
struct Status {
    id: i64,
    status: String,
    version: i64,
}

#[derive(Clone, Debug)]
struct StatusChanged {
    event_id: String,
    order_id: i64,
    version: i64,
    status: String,
}

async fn setup(pool: &Pool<Db>) {
    sqlx::query("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE audit (note TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Key only: adds the amount to the account.
#[idempotent(key = "msg.id", scope = "suite::apply_credit")]
async fn apply_credit(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<i64, sqlx::Error> {
    let balance: i64 = sqlx::query_scalar(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance RETURNING balance",
    )
    .bind(&msg.account)
    .bind(msg.amount)
    .fetch_one(&mut **tx)
    .await?;
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

/// The same message, handled by a second consumer of its own (another scope).
#[idempotent(key = "msg.id", scope = "suite::notify")]
async fn notify(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit (note) VALUES ($1)")
        .bind(format!("credited {}", msg.account))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Key + version: the order id is the key and the entity.
#[idempotent(
    key = "msg.order_id",
    version = "msg.version",
    scope = "suite::set_status"
)]
async fn set_status(tx: &mut Tx<'_, Db>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    upsert_order(tx, msg).await
}

/// Key + version + entity: each event once, and never an older version over a newer one.
#[idempotent(key = msg.event_id, version = msg.version, entity = msg.order_id, scope = "suite::on_status")]
async fn on_status(tx: &mut Tx<'_, Db>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    upsert_order(tx, msg).await
}

async fn upsert_order(tx: &mut Tx<'_, Db>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(msg.order_id)
    .bind(&msg.status)
    .bind(msg.version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn status(event_id: &str, order_id: i64, version: i64, status: &str) -> StatusChanged {
    StatusChanged {
        event_id: event_id.into(),
        order_id,
        version,
        status: status.into(),
    }
}

async fn balance(pool: &Pool<Db>, account: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
        .bind(account)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn records(pool: &Pool<Db>, scope: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE scope = $1")
        .bind(scope)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn recorded(pool: &Pool<Db>, scope: &str, key: &str) -> bool {
    sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND msg_key = $2",
    )
    .bind(scope)
    .bind(key.as_bytes())
    .fetch_one(pool)
    .await
    .unwrap()
        == 1
}

async fn stored_version(pool: &Pool<Db>, scope: &str, entity: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT version FROM idem_versions WHERE scope = $1 AND entity = $2")
        .bind(scope)
        .bind(entity.as_bytes())
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn order(pool: &Pool<Db>, id: i64) -> Option<Status> {
    sqlx::query_as("SELECT id, status, version FROM orders WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn key_only_applies_the_first_delivery() {
    let pool = db!();
    setup(&pool).await;
    let msg = credit("m-1", "alice", 10);
    assert_eq!(
        apply_credit(&pool, &msg).await.unwrap(),
        Outcome::Applied(10)
    );
    assert_eq!(apply_credit(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(apply_credit(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(
        apply_credit(&pool, &credit("m-2", "alice", 5))
            .await
            .unwrap(),
        Outcome::Applied(15)
    );
    assert_eq!(balance(&pool, "alice").await, Some(15));
    assert_eq!(records(&pool, "suite::apply_credit").await, 2);
    assert!(recorded(&pool, "suite::apply_credit", "m-1").await);
    release(pool).await;
}

#[tokio::test]
async fn key_and_version_orders_one_entity() {
    let pool = db!();
    setup(&pool).await;
    let scope = "suite::set_status";
    let outcomes = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (2, "paid", Outcome::Duplicate),
        (1, "placed", Outcome::Stale { latest: 2 }),
        (4, "shipped", Outcome::Applied(())),
        (3, "packed", Outcome::Stale { latest: 4 }),
    ];
    for (version, name, expected) in outcomes {
        let got = set_status(&pool, &status("unused", 7, version, name))
            .await
            .unwrap();
        assert_eq!(got, expected, "version {version}");
    }
    let row = order(&pool, 7).await.unwrap();
    assert_eq!(
        (row.id, row.status.as_str(), row.version),
        (7, "shipped", 4)
    );
    assert_eq!(stored_version(&pool, scope, "7").await, Some(4));
    // This mode keeps a version per entity, not a record per message.
    assert_eq!(records(&pool, scope).await, 0);
    release(pool).await;
}

#[tokio::test]
async fn key_version_and_entity() {
    let pool = db!();
    setup(&pool).await;
    let scope = "suite::on_status";
    let steps = [
        (status("e1", 9, 1, "placed"), Outcome::Applied(())),
        (status("e1", 9, 1, "placed"), Outcome::Duplicate),
        (
            status("e2", 9, 1, "placed-again"),
            Outcome::Stale { latest: 1 },
        ),
        (status("e3", 9, 3, "shipped"), Outcome::Applied(())),
        (status("e4", 9, 2, "paid"), Outcome::Stale { latest: 3 }),
        (status("e3", 9, 3, "shipped"), Outcome::Duplicate),
        (status("e5", 10, 1, "placed"), Outcome::Applied(())),
    ];
    for (msg, expected) in steps {
        assert_eq!(on_status(&pool, &msg).await.unwrap(), expected, "{msg:?}");
    }
    assert_eq!(order(&pool, 9).await.unwrap().status, "shipped");
    assert_eq!(order(&pool, 10).await.unwrap().version, 1);
    assert_eq!(stored_version(&pool, scope, "9").await, Some(3));
    // Stale deliveries leave no record: e2 and e4 were rolled back.
    assert_eq!(records(&pool, scope).await, 3);
    assert!(!recorded(&pool, scope, "e2").await);
    assert!(!recorded(&pool, scope, "e4").await);
    release(pool).await;
}

#[tokio::test]
async fn handler_error_rolls_back_and_the_redelivery_applies() {
    let pool = db!();
    setup(&pool).await;
    let mut msg = credit("m-err", "bob", 7);
    msg.fail = true;
    let err = apply_credit(&pool, &msg).await.unwrap_err();
    assert!(
        matches!(err, Error::Handler(sqlx::Error::Protocol(_))),
        "{err:?}"
    );
    assert_eq!(
        balance(&pool, "bob").await,
        None,
        "the effect was rolled back"
    );
    assert_eq!(
        records(&pool, "suite::apply_credit").await,
        0,
        "nothing recorded"
    );
    msg.fail = false;
    assert_eq!(
        apply_credit(&pool, &msg).await.unwrap(),
        Outcome::Applied(7)
    );
    assert_eq!(apply_credit(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(balance(&pool, "bob").await, Some(7));
    release(pool).await;
}

#[tokio::test]
async fn handler_panic_rolls_back_and_the_redelivery_applies() {
    let pool = db!();
    setup(&pool).await;
    let mut msg = credit("m-panic", "carol", 3);
    msg.panic = true;
    let task = {
        let (pool, msg) = (pool.clone(), msg.clone());
        tokio::spawn(async move { apply_credit(&pool, &msg).await })
    };
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(balance(&pool, "carol").await, None);
    assert_eq!(records(&pool, "suite::apply_credit").await, 0);
    msg.panic = false;
    assert_eq!(
        apply_credit(&pool, &msg).await.unwrap(),
        Outcome::Applied(3)
    );
    assert_eq!(apply_credit(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(balance(&pool, "carol").await, Some(3));
    release(pool).await;
}

#[tokio::test]
async fn inside_a_callers_transaction_that_rolls_back_nothing_survives() {
    let pool = db!();
    setup(&pool).await;
    let msg = credit("m-sp", "dave", 4);
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO audit (note) VALUES ('caller')")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        apply_credit(&mut tx, &msg).await.unwrap(),
        Outcome::Applied(4)
    );
    tx.rollback().await.unwrap();
    assert_eq!(balance(&pool, "dave").await, None);
    assert_eq!(records(&pool, "suite::apply_credit").await, 0);
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audit, 0);
    // The redelivery applies, since nothing was recorded.
    assert_eq!(
        apply_credit(&pool, &msg).await.unwrap(),
        Outcome::Applied(4)
    );
    release(pool).await;
}

#[tokio::test]
async fn inside_a_callers_transaction_that_commits_everything_survives() {
    let pool = db!();
    setup(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO audit (note) VALUES ('caller')")
        .execute(&mut *tx)
        .await
        .unwrap();
    // A batch in one transaction: three messages, one of them twice, one failing.
    assert!(apply_credit(&mut tx, &credit("b-1", "erin", 1))
        .await
        .unwrap()
        .is_applied());
    assert!(apply_credit(&mut tx, &credit("b-2", "erin", 2))
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        apply_credit(&mut tx, &credit("b-1", "erin", 1))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    let mut failing = credit("b-3", "erin", 100);
    failing.fail = true;
    assert!(apply_credit(&mut tx, &failing).await.is_err());
    // The failed message rolled back to its savepoint only; the caller's transaction goes on.
    sqlx::query("INSERT INTO audit (note) VALUES ('after')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(balance(&pool, "erin").await, Some(3));
    assert_eq!(records(&pool, "suite::apply_credit").await, 2);
    assert!(!recorded(&pool, "suite::apply_credit", "b-3").await);
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audit, 2);
    release(pool).await;
}

#[tokio::test]
async fn two_scopes_each_handle_the_message_once() {
    let pool = db!();
    setup(&pool).await;
    let msg = credit("m-both", "frank", 2);
    assert!(apply_credit(&pool, &msg).await.unwrap().is_applied());
    assert!(notify(&pool, &msg).await.unwrap().is_applied());
    assert_eq!(notify(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(apply_credit(&pool, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(balance(&pool, "frank").await, Some(2));
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audit, 1);
    assert!(recorded(&pool, "suite::notify", "m-both").await);
    release(pool).await;
}

#[tokio::test]
async fn concurrent_deliveries_apply_each_message_exactly_once() {
    let pool = db!();
    setup(&pool).await;
    const WORKERS: usize = 8;
    const MESSAGES: i64 = 40;
    let messages: Arc<Vec<Credit>> = Arc::new(
        (0..MESSAGES)
            .map(|i| credit(&format!("c-{i}"), &format!("acct-{}", i % 4), i + 1))
            .collect(),
    );
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (pool, messages) = (pool.clone(), messages.clone());
        tasks.push(tokio::spawn(async move {
            let mut applied = 0;
            // Each worker walks the stream from a different place, so the same message is
            // in flight on several workers at once.
            for i in 0..messages.len() {
                let msg = &messages[(i + worker * 5) % messages.len()];
                match apply_credit(&pool, msg).await {
                    Ok(Outcome::Applied(_)) => applied += 1,
                    Ok(Outcome::Duplicate) => {}
                    other => panic!("worker {worker}, {}: {other:?}", msg.id),
                }
            }
            applied
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += task.await.unwrap();
    }
    assert_eq!(applied, MESSAGES);
    assert_eq!(records(&pool, "suite::apply_credit").await, MESSAGES);
    for account in 0..4 {
        let expected: i64 = (0..MESSAGES)
            .filter(|i| i % 4 == account)
            .map(|i| i + 1)
            .sum();
        assert_eq!(
            balance(&pool, &format!("acct-{account}")).await,
            Some(expected)
        );
    }
    release(pool).await;
}

#[tokio::test]
async fn racing_versions_end_in_the_newest_state() {
    let pool = db!();
    setup(&pool).await;
    const ORDERS: i64 = 12;
    let mut tasks = Vec::new();
    for order_id in 0..ORDERS {
        // Versions 5 and 6 of each order race; the older one is sent first half of the time.
        for (version, name) in [(5, "paid"), (6, "shipped")] {
            let pool = pool.clone();
            let msg = status(&format!("ev-{order_id}-{version}"), order_id, version, name);
            tasks.push(tokio::spawn(async move { on_status(&pool, &msg).await }));
        }
        if order_id % 2 == 0 {
            let n = tasks.len();
            tasks.swap(n - 1, n - 2);
        }
    }
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert!(
            matches!(outcome, Outcome::Applied(()) | Outcome::Stale { latest: 6 }),
            "{outcome:?}"
        );
    }
    for order_id in 0..ORDERS {
        let row = order(&pool, order_id).await.unwrap();
        assert_eq!(
            (row.status.as_str(), row.version),
            ("shipped", 6),
            "order {order_id}"
        );
        assert_eq!(
            stored_version(&pool, "suite::on_status", &order_id.to_string()).await,
            Some(6)
        );
    }
    release(pool).await;
}

#[idempotent(key = "msg.0", version = "msg.1", scope = "suite::raw")]
async fn raw(tx: &mut Tx<'_, Db>, msg: (Vec<u8>, u64)) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit (note) VALUES ('raw')")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(
    key = "msg.id",
    entity = "msg.account",
    version = "msg.amount",
    scope = "suite::by_account"
)]
async fn by_account(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit (note) VALUES ('by_account')")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(key = "(msg.0, msg.1)", scope = "suite::composite")]
async fn composite(tx: &mut Tx<'_, Db>, msg: (&str, &str)) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit (note) VALUES ('composite')")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn nothing_written(pool: &Pool<Db>) {
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(pool)
        .await
        .unwrap();
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(pool)
        .await
        .unwrap();
    let versions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_versions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!((audit, records, versions), (0, 0, 0));
}

#[tokio::test]
async fn bad_keys_and_versions_are_refused_before_any_write() {
    let pool = db!();
    setup(&pool).await;
    let expect =
        |result: Result<Outcome<()>, Error<sqlx::Error>>, part: KeyPart, problem: KeyProblem| {
            match result {
                Err(Error::Key(err)) => {
                    assert_eq!((err.part(), err.problem()), (part, &problem));
                    assert_eq!(
                        err.scope(),
                        if part == KeyPart::Version {
                            "suite::raw"
                        } else {
                            err.scope()
                        }
                    );
                    err.to_string()
                }
                other => panic!("expected a key error, got {other:?}"),
            }
        };
    let text = expect(
        raw(&pool, (Vec::new(), 1)).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    assert_eq!(text, "idempotent handler `suite::raw`: key is empty");
    let long = vec![b'k'; idem::key::MAX_KEY_LEN + 1];
    expect(
        raw(&pool, (long, 1)).await,
        KeyPart::Key,
        KeyProblem::TooLong { len: 513, max: 512 },
    );
    let text = expect(
        raw(&pool, (b"ok".to_vec(), u64::MAX)).await,
        KeyPart::Version,
        KeyProblem::OutOfRange(u64::MAX.to_string()),
    );
    assert!(
        text.contains("18446744073709551615 does not fit in an i64"),
        "{text}"
    );
    let mut empty_entity = credit("k", "", 1);
    expect(
        by_account(&pool, &empty_entity).await,
        KeyPart::Entity,
        KeyProblem::Empty,
    );
    // A composite key with a blank part would fold every such message into one: refused.
    expect(
        composite(&pool, ("acme", "")).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    expect(
        composite(&pool, ("", "m-1")).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    nothing_written(&pool).await;
    assert!(composite(&pool, ("acme", "m-1"))
        .await
        .unwrap()
        .is_applied());
    // The longest allowed key and the largest version are fine.
    let max = vec![b'k'; idem::key::MAX_KEY_LEN];
    assert!(raw(&pool, (max, i64::MAX as u64))
        .await
        .unwrap()
        .is_applied());
    empty_entity.account = "acct".into();
    assert!(by_account(&pool, &empty_entity).await.unwrap().is_applied());
    release(pool).await;
}

#[tokio::test]
async fn migrate_is_idempotent_and_safe_to_run_concurrently() {
    let pool = db!();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { idem::migrate(&pool).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied, 1);
    release(pool).await;
}

#[tokio::test]
async fn a_batch_applies_each_message_once_in_one_transaction() {
    let pool = db!();
    setup(&pool).await;
    assert!(apply_credit(&pool, &credit("old", "gina", 100))
        .await
        .unwrap()
        .is_applied());
    let messages = vec![
        credit("n-1", "gina", 1),
        credit("n-2", "gina", 2),
        credit("n-1", "gina", 1),   // a redelivery inside the batch
        credit("old", "gina", 100), // already applied before the batch
        credit("n-3", "hal", 3),
    ];
    let task = {
        let pool = pool.clone();
        // Spawned: a batch's future is Send.
        tokio::spawn(async move {
            idem::batch(&pool, &messages, async |b, msg| apply_credit(b, msg).await).await
        })
    };
    let results = task.await.unwrap().unwrap();
    let outcomes: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(101),
            Outcome::Applied(103),
            Outcome::Duplicate,
            Outcome::Duplicate,
            Outcome::Applied(3)
        ]
    );
    assert_eq!(balance(&pool, "gina").await, Some(103));
    assert_eq!(balance(&pool, "hal").await, Some(3));
    assert_eq!(records(&pool, "suite::apply_credit").await, 4);
    release(pool).await;
}

#[tokio::test]
async fn a_failing_message_splits_the_batch_and_only_it_is_lost() {
    let pool = db!();
    setup(&pool).await;
    let mut messages: Vec<Credit> = (0..10)
        .map(|i| credit(&format!("s-{i}"), "ivan", 1 << i))
        .collect();
    messages[3].fail = true;
    messages[7].fail = true;
    let results = idem::batch(&pool, &messages, async |b, msg| apply_credit(b, msg).await)
        .await
        .unwrap();
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (3 | 7, Err(Error::Handler(_))) => {}
            (3 | 7, other) => panic!("message {i}: {other:?}"),
            (_, Ok(Outcome::Applied(_))) => {}
            (_, other) => panic!("message {i}: {other:?}"),
        }
    }
    let expected: i64 = (0..10).filter(|i| *i != 3 && *i != 7).map(|i| 1 << i).sum();
    assert_eq!(balance(&pool, "ivan").await, Some(expected));
    assert_eq!(records(&pool, "suite::apply_credit").await, 8);
    assert!(!recorded(&pool, "suite::apply_credit", "s-3").await);
    // The failed ones apply on redelivery, once.
    messages[3].fail = false;
    messages[7].fail = false;
    let again = idem::batch(&pool, &messages, async |b, msg| apply_credit(b, msg).await)
        .await
        .unwrap();
    let applied = again
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Applied(_))))
        .count();
    assert_eq!(applied, 2);
    assert_eq!(balance(&pool, "ivan").await, Some(1023));
    release(pool).await;
}

#[tokio::test]
async fn a_batch_keeps_versions_and_scopes_apart() {
    let pool = db!();
    setup(&pool).await;
    let events = vec![
        status("v-1", 1, 1, "placed"),
        status("v-3", 1, 3, "shipped"),
        status("v-2", 1, 2, "paid"),    // stale inside the batch
        status("v-3", 1, 3, "shipped"), // duplicate inside the batch
        status("w-1", 2, 1, "placed"),
    ];
    let results = idem::batch(&pool, &events, async |b, msg| on_status(b, msg).await)
        .await
        .unwrap();
    let outcomes: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Stale { latest: 3 },
            Outcome::Duplicate,
            Outcome::Applied(())
        ]
    );
    assert_eq!(order(&pool, 1).await.unwrap().status, "shipped");
    assert_eq!(
        stored_version(&pool, "suite::on_status", "1").await,
        Some(3)
    );
    // The stale message's record was taken back.
    assert!(!recorded(&pool, "suite::on_status", "v-2").await);
    assert_eq!(records(&pool, "suite::on_status").await, 3);

    // Two handlers of one message in one batch: each scope once.
    let credits = vec![credit("x-1", "jan", 5), credit("x-1", "jan", 5)];
    let results = idem::batch(&pool, &credits, async |b, msg| {
        let first = apply_credit(&mut *b, msg).await?;
        let second = notify(b, msg).await?;
        Ok(match (first, second) {
            (Outcome::Applied(_), Outcome::Applied(())) => Outcome::Applied(()),
            (Outcome::Duplicate, Outcome::Duplicate) => Outcome::Duplicate,
            other => panic!("{other:?}"),
        })
    })
    .await
    .unwrap();
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        [Outcome::Applied(()), Outcome::Duplicate]
    );
    assert_eq!(balance(&pool, "jan").await, Some(5));
    assert!(recorded(&pool, "suite::notify", "x-1").await);
    release(pool).await;
}

#[tokio::test]
async fn a_batch_whose_closure_branches_on_an_outcome_loses_nothing() {
    let pool = db!();
    setup(&pool).await;
    // `notify` runs only for messages `apply_credit` did not apply. The first pass sees every
    // `apply_credit` as not applied (it only gathers claims), so it plans `notify` for all; the
    // second pass applies the new ones and never calls `notify` for them. Their planned
    // `notify` records must not stay, or those messages would count as notified without an
    // audit row.
    assert!(apply_credit(&pool, &credit("br-old", "kim", 1))
        .await
        .unwrap()
        .is_applied());
    let messages = vec![
        credit("br-1", "kim", 2),
        credit("br-old", "kim", 1),
        credit("br-2", "kim", 3),
    ];
    let results = idem::batch(&pool, &messages, async |b, msg| {
        let credited = apply_credit(&mut *b, msg).await?;
        if credited.is_applied() {
            return Ok(Outcome::Applied(()));
        }
        notify(b, msg).await
    })
    .await
    .unwrap();
    let outcomes: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Applied(())
        ]
    );
    assert_eq!(balance(&pool, "kim").await, Some(6));
    // Only br-old was notified, and the records say exactly that.
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audit, 1);
    assert_eq!(records(&pool, "suite::notify").await, 1);
    assert!(recorded(&pool, "suite::notify", "br-old").await);
    assert!(!recorded(&pool, "suite::notify", "br-1").await);
    release(pool).await;
}

#[tokio::test]
async fn versions_in_a_batch_decide_as_if_one_after_another() {
    let pool = db!();
    setup(&pool).await;
    assert!(set_status(&pool, &status("-", 7, 2, "paid"))
        .await
        .unwrap()
        .is_applied());
    let events = vec![
        status("-", 7, 1, "placed"),  // behind the stored 2
        status("-", 7, 3, "packed"),  // applies
        status("-", 7, 3, "packed"),  // equal: a duplicate
        status("-", 8, 1, "placed"),  // a new entity
        status("-", 7, 5, "shipped"), // applies
        status("-", 7, 4, "late"),    // behind the batch's own 5
    ];
    let results = idem::batch(&pool, &events, async |b, msg| set_status(b, msg).await)
        .await
        .unwrap();
    let outcomes: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Stale { latest: 2 },
            Outcome::Applied(()),
            Outcome::Duplicate,
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Stale { latest: 5 },
        ]
    );
    let row = order(&pool, 7).await.unwrap();
    assert_eq!((row.status.as_str(), row.version), ("shipped", 5));
    assert_eq!(
        stored_version(&pool, "suite::set_status", "7").await,
        Some(5)
    );
    assert_eq!(
        stored_version(&pool, "suite::set_status", "8").await,
        Some(1)
    );
    release(pool).await;
}

#[tokio::test]
async fn concurrent_batches_over_the_same_entities_end_in_the_newest_state() {
    let pool = db!();
    setup(&pool).await;
    let mut tasks = Vec::new();
    for worker in 0..4_i64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            // Every worker sends every version of every order, each in its own order.
            let mut events: Vec<StatusChanged> = (1..=6)
                .flat_map(|version| {
                    (0..5).map(move |order| {
                        status(&format!("c-{order}-{version}"), order, version, "s")
                    })
                })
                .collect();
            events.rotate_left((worker * 7) as usize);
            let mut applied = 0;
            for chunk in events.chunks(10) {
                for result in idem::batch(&pool, chunk, async |b, msg| on_status(b, msg).await)
                    .await
                    .unwrap()
                {
                    match result.unwrap() {
                        Outcome::Applied(()) => applied += 1,
                        Outcome::Duplicate | Outcome::Stale { .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
            }
            applied
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += task.await.unwrap();
    }
    assert!(
        applied >= 5,
        "each order applied at least its newest version"
    );
    for order_id in 0..5 {
        assert_eq!(
            order(&pool, order_id).await.unwrap().version,
            6,
            "order {order_id}"
        );
        assert_eq!(
            stored_version(&pool, "suite::on_status", &order_id.to_string()).await,
            Some(6)
        );
    }
    // Every applied event has its record; no event was applied twice.
    assert_eq!(records(&pool, "suite::on_status").await, applied);
    release(pool).await;
}

//! Recoverability ([`RecoveryStore`]): failed deliveries parked for a retry later
//! (`idem_parked`), taken when due by one consumer at a time under a lease and token, put back
//! or deleted only under that token; deliveries that gave up written as dead letters
//! (`idem_dead_letters`), with the parked row they came from deleted in the same transaction.
//! Each rule calls the backend's methods and reads the rows back from the tables; each uses a
//! consumer name of its own and deletes its rows at the end.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use idem::recover::{Failure, InvalidFailure, NewDeadLetter, Origin, Parked, RecoveryStore};
use idem::store::{Attempts, FailedAttempt, RecordKey};

use crate::backend::Kit;
use crate::backends::unique_name;
use crate::{Backend, Ty, Value};

const HOUR: Duration = Duration::from_secs(3600);
const HOUR_MS: i64 = 3_600_000;
/// How far apart two of the database's "now"s of one rule may be (a slow, shared machine).
const SLACK_MS: i64 = 60_000;
/// A first failure in the past, in epoch milliseconds (2023-11-14T22:13:20.123Z).
const FIRST_FAILED_MS: i64 = 1_700_000_000_123;

/// One rule's consumer and the delivery it parks.
struct Case {
    consumer: String,
    origin: Origin,
    headers: Vec<(String, String)>,
}

impl Case {
    fn new() -> Case {
        Case {
            consumer: unique_name("recovery"),
            origin: Origin {
                broker: "kafka".into(),
                source: "orders".into(),
                coordinates: "partition 3 offset 1042".into(),
                destination: "orders".into(),
            },
            headers: vec![("trace".into(), "t-1".into())],
        }
    }

    /// A failure of this case's consumer, first failed now.
    fn failure<'a>(&'a self, payload: &'a [u8], attempts: u32, error: &'a str) -> Failure<'a> {
        Failure {
            consumer: &self.consumer,
            payload,
            headers: &self.headers,
            origin: &self.origin,
            attempts,
            error,
            first_failed_ms: None,
        }
    }

    /// A dead letter of `failure`, with its scope and key.
    fn dead<'a>(&self, failure: Failure<'a>, key: &'a [u8]) -> NewDeadLetter<'a> {
        NewDeadLetter {
            failure,
            reason: "retries_exhausted",
            scope: Some("billing::charge"),
            key: Some(key),
            shape: "card # declined",
            group: "00112233aabbccdd",
        }
    }

    /// Parks `payload` (1 attempt, error `e`), due in `due_in`.
    async fn park<B: Backend<Db: RecoveryStore>>(
        &self,
        k: &Kit<B>,
        payload: &[u8],
        due_in: Duration,
    ) -> i64 {
        B::Db::park(&k.pool, &self.failure(payload, 1, "e"), due_in)
            .await
            .unwrap()
    }

    /// Takes this consumer's due rows under `token`.
    async fn take<B: Backend<Db: RecoveryStore>>(
        &self,
        k: &Kit<B>,
        limit: u32,
        lease: Duration,
        token: i64,
    ) -> Vec<Parked> {
        B::Db::take_due(&k.pool, &self.consumer, limit, lease, token)
            .await
            .unwrap()
    }

    /// The ids of this consumer's rows in `table`, in id order.
    async fn ids<B: Backend>(&self, k: &Kit<B>, table: &str) -> Vec<i64> {
        let sql = format!("SELECT id FROM {table} WHERE consumer = $1 ORDER BY id");
        k.column(&sql, &[self.consumer.as_str().into()], Ty::Int)
            .await
            .iter()
            .map(Value::int)
            .collect()
    }

    /// Deletes this consumer's rows, and checks that none are left.
    async fn clean<B: Backend>(&self, k: &Kit<B>) {
        for table in ["idem_parked", "idem_dead_letters"] {
            let sql = format!("DELETE FROM {table} WHERE consumer = $1");
            k.exec(&sql, &[self.consumer.as_str().into()]).await;
            assert!(self.ids(k, table).await.is_empty(), "{table}");
        }
    }
}

/// A row of `idem_parked`, read from the table (times in epoch milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParkedRow {
    consumer: String,
    payload: Vec<u8>,
    headers: Option<String>,
    origin: Origin,
    attempts: i64,
    last_error: Option<String>,
    first_failed_ms: i64,
    due_ms: i64,
    lease_until_ms: Option<i64>,
    lease_token: Option<i64>,
}

/// A row of `idem_dead_letters`, read from the table (times in epoch milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeadRow {
    consumer: String,
    scope: Option<String>,
    key: Option<Vec<u8>>,
    reason: String,
    error: String,
    shape: String,
    group: String,
    payload: Vec<u8>,
    headers: Option<String>,
    origin: Origin,
    attempts: i64,
    first_failed_ms: i64,
    last_failed_ms: i64,
    state: String,
    settled_ms: Option<i64>,
    replayed_as: Option<String>,
}

/// `expr` of row `id` of `table`, or `None` when `column` is NULL there.
async fn nullable<B: Backend>(
    k: &Kit<B>,
    table: &str,
    column: &str,
    expr: &str,
    id: i64,
    ty: Ty,
) -> Option<Value> {
    let sql = format!("SELECT {expr} FROM {table} WHERE id = $1 AND {column} IS NOT NULL");
    let mut rows = k.rows(&sql, &[id.into()], &[ty]).await;
    assert!(rows.len() <= 1, "{sql}");
    rows.pop().map(|mut row| row.swap_remove(0))
}

/// The common columns of both tables, then `more` (`attempts + 0 * id` reads an INTEGER as a
/// BIGINT on PostgreSQL too).
fn select(table: &str, more: &[String]) -> String {
    format!(
        "SELECT consumer, payload, broker, source, coordinates, destination, attempts + 0 * id, \
         {} FROM {table} WHERE id = $1",
        more.join(", ")
    )
}

/// The origin in columns 2 to 5 of a row that [`select`] read.
fn origin_of(row: &[Value]) -> Origin {
    Origin {
        broker: row[2].text(),
        source: row[3].text(),
        coordinates: row[4].text(),
        destination: row[5].text(),
    }
}

/// Row `id` of `idem_parked`, if there is one.
async fn parked_row<B: Backend>(k: &Kit<B>, id: i64) -> Option<ParkedRow> {
    let d = k.dialect;
    let sql = select("idem_parked", &[d.ms("first_failed_at"), d.ms("due_at")]);
    let types = [
        Ty::Text,
        Ty::Bytes,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Int,
        Ty::Int,
        Ty::Int,
    ];
    let row = k.rows(&sql, &[id.into()], &types).await.pop()?;
    let text = |v: Option<Value>| v.map(|v| v.text());
    let int = |v: Option<Value>| v.map(|v| v.int());
    let table = "idem_parked";
    Some(ParkedRow {
        consumer: row[0].text(),
        payload: row[1].bytes(),
        headers: text(nullable(k, table, "headers", "headers", id, Ty::Text).await),
        origin: origin_of(&row),
        attempts: row[6].int(),
        last_error: text(nullable(k, table, "last_error", "last_error", id, Ty::Text).await),
        first_failed_ms: row[7].int(),
        due_ms: row[8].int(),
        lease_until_ms: int(
            nullable(k, table, "lease_until", &d.ms("lease_until"), id, Ty::Int).await,
        ),
        lease_token: int(nullable(k, table, "lease_token", "lease_token", id, Ty::Int).await),
    })
}

/// Row `id` of `idem_dead_letters`, if there is one.
async fn dead_row<B: Backend>(k: &Kit<B>, id: i64) -> Option<DeadRow> {
    let d = k.dialect;
    let more = [
        "reason".to_string(),
        "error".to_string(),
        "error_shape".to_string(),
        "error_group".to_string(),
        "state".to_string(),
        d.ms("first_failed_at"),
        d.ms("last_failed_at"),
    ];
    let sql = select("idem_dead_letters", &more);
    let types = [
        Ty::Text,
        Ty::Bytes,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Int,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Text,
        Ty::Int,
        Ty::Int,
    ];
    let row = k.rows(&sql, &[id.into()], &types).await.pop()?;
    let text = |v: Option<Value>| v.map(|v| v.text());
    let table = "idem_dead_letters";
    Some(DeadRow {
        consumer: row[0].text(),
        scope: text(nullable(k, table, "scope", "scope", id, Ty::Text).await),
        key: nullable(k, table, "msg_key", "msg_key", id, Ty::Bytes)
            .await
            .map(|v| v.bytes()),
        reason: row[7].text(),
        error: row[8].text(),
        shape: row[9].text(),
        group: row[10].text(),
        payload: row[1].bytes(),
        headers: text(nullable(k, table, "headers", "headers", id, Ty::Text).await),
        origin: origin_of(&row),
        attempts: row[6].int(),
        first_failed_ms: row[12].int(),
        last_failed_ms: row[13].int(),
        state: row[11].text(),
        settled_ms: nullable(k, table, "settled_at", &d.ms("settled_at"), id, Ty::Int)
            .await
            .map(|v| v.int()),
        replayed_as: text(nullable(k, table, "replayed_as", "replayed_as", id, Ty::Text).await),
    })
}

/// Row `id` of `idem_parked`, which must be there.
async fn must_be_parked<B: Backend>(k: &Kit<B>, id: i64) -> ParkedRow {
    parked_row(k, id)
        .await
        .unwrap_or_else(|| panic!("parked row {id} is gone"))
}

/// The field of an [`InvalidFailure`] that `result` was refused with.
fn refused<T: std::fmt::Debug>(result: Result<T, sqlx::Error>) -> &'static str {
    match result {
        Err(sqlx::Error::Encode(err)) => match err.downcast_ref::<InvalidFailure>() {
            Some(invalid) => invalid.field(),
            None => panic!("an encode error other than InvalidFailure: {err}"),
        },
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Lets the database's clock pass a lease of a millisecond (and any rounding of it).
async fn let_time_pass() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// `park` writes an unleased row with the failure's attempts and error, first failed now (or
/// when given) and due `due_in` after now.
pub async fn park_writes_an_unleased_row_due_after_its_delay<B: Backend<Db: RecoveryStore>>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let now = B::Db::park(&k.pool, &c.failure(b"p1", 3, "timeout"), Duration::ZERO)
        .await
        .unwrap();
    let later = Failure {
        first_failed_ms: Some(FIRST_FAILED_MS),
        ..c.failure(b"p2", 4, "declined")
    };
    let in_an_hour = B::Db::park(&k.pool, &later, HOUR).await.unwrap();
    assert_eq!(c.ids(&k, "idem_parked").await, [now, in_an_hour]);

    let row = must_be_parked(&k, now).await;
    assert_eq!(
        row,
        ParkedRow {
            consumer: c.consumer.clone(),
            payload: b"p1".to_vec(),
            headers: Some(r#"[["trace","t-1"]]"#.into()),
            origin: c.origin.clone(),
            attempts: 3,
            last_error: Some("timeout".into()),
            first_failed_ms: row.first_failed_ms,
            due_ms: row.first_failed_ms,
            lease_until_ms: None,
            lease_token: None,
        },
        "due now: due_at is the first failure's now"
    );
    let other = must_be_parked(&k, in_an_hour).await;
    assert_eq!(other.first_failed_ms, FIRST_FAILED_MS, "as given");
    assert_eq!(
        (other.attempts, other.last_error.as_deref()),
        (4, Some("declined"))
    );
    assert_eq!((other.lease_until_ms, other.lease_token), (None, None));
    let delay = other.due_ms - row.first_failed_ms;
    assert!(
        (HOUR_MS..HOUR_MS + SLACK_MS).contains(&delay),
        "due an hour after it was parked: {delay} ms"
    );
    c.clean(&k).await;
    k.close().await;
}

/// `take_due` takes only rows that are due, oldest due first and at most `limit`, and holds each
/// under the token and lease given; a row due later is left alone until then.
pub async fn take_due_takes_a_row_only_once_due_oldest_due_first<B: Backend<Db: RecoveryStore>>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let hour = c.park(&k, b"hour", HOUR).await;
    let second = c.park(&k, b"second", Duration::from_secs(1)).await;
    let a = c.park(&k, b"a", Duration::ZERO).await;
    let b = c.park(&k, b"b", Duration::ZERO).await;
    let due = |row: ParkedRow| row.due_ms;
    let (due_a, due_b) = (
        due(must_be_parked(&k, a).await),
        due(must_be_parked(&k, b).await),
    );
    let due_second = due(must_be_parked(&k, second).await);
    assert!(
        due_a <= due_b && due_b < due_second,
        "parking took more than a second: {due_a} {due_b} {due_second}"
    );

    // Two rows are due, a and b (parked after the one due in a second): a first, then b.
    let first = c.take(&k, 1, HOUR, 1).await;
    assert_eq!(first.iter().map(|p| p.id).collect::<Vec<_>>(), [a]);
    assert_eq!(
        (first[0].token, first[0].payload.as_slice()),
        (1, &b"a"[..])
    );
    let next = c.take(&k, 1, HOUR, 2).await;
    assert_eq!(next.iter().map(|p| p.id).collect::<Vec<_>>(), [b]);
    for (id, token) in [(a, 1), (b, 2)] {
        let row = must_be_parked(&k, id).await;
        assert_eq!(row.lease_token, Some(token));
        let held_for = row.lease_until_ms.unwrap() - row.due_ms;
        assert!(
            (HOUR_MS..HOUR_MS + SLACK_MS).contains(&held_for),
            "held for an hour from its take: {held_for} ms"
        );
    }
    assert!(c.take(&k, 10, HOUR, 3).await.is_empty(), "nothing else due");

    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let now_due = c.take(&k, 10, HOUR, 4).await;
    assert_eq!(now_due.iter().map(|p| p.id).collect::<Vec<_>>(), [second]);
    let untouched = must_be_parked(&k, hour).await;
    assert_eq!(
        (untouched.lease_until_ms, untouched.lease_token),
        (None, None)
    );
    assert!(B::Db::take_due(&k.pool, &c.consumer, 0, HOUR, 5)
        .await
        .unwrap()
        .is_empty());
    let other = Case::new();
    assert!(
        other.take(&k, 10, HOUR, 6).await.is_empty(),
        "another consumer's rows are not taken"
    );
    c.clean(&k).await;
    k.close().await;
}

/// A row held under a lease is not taken again until the lease runs out; then another token
/// takes it, and the first token's `unpark`, `repark`, `release_parked` and `bury` report
/// `false` (or `None`) and change nothing.
pub async fn a_held_row_is_taken_again_only_after_its_lease_ran_out<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let long = c.park(&k, b"long", Duration::ZERO).await;
    let short = c.park(&k, b"short", Duration::ZERO).await;
    let taken = c.take(&k, 1, HOUR, 1).await;
    assert_eq!(taken.iter().map(|p| p.id).collect::<Vec<_>>(), [long]);
    let taken = c.take(&k, 1, Duration::from_millis(1), 1).await;
    assert_eq!(taken.iter().map(|p| p.id).collect::<Vec<_>>(), [short]);
    let_time_pass().await;

    let again = c.take(&k, 10, HOUR, 2).await;
    assert_eq!(
        again.iter().map(|p| p.id).collect::<Vec<_>>(),
        [short],
        "only the lapsed lease is taken over"
    );
    assert_eq!(again[0].token, 2);
    assert!(c.take(&k, 10, HOUR, 3).await.is_empty(), "both are held");
    let held = must_be_parked(&k, short).await;
    assert_eq!(held.lease_token, Some(2));

    // Token 1 lost `short`: every change it tries is refused, and the row stays as token 2 holds it.
    let mut conn = k.conn().await;
    assert!(!B::Db::unpark(&mut *conn, short, 1).await.unwrap());
    drop(conn);
    assert!(
        !B::Db::repark(&k.pool, short, 1, 9, "stale", Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(!B::Db::release_parked(&k.pool, short, 1).await.unwrap());
    let failure = c.failure(b"short", 9, "stale");
    let dead = c.dead(failure, b"k");
    assert_eq!(
        B::Db::bury(&k.pool, &dead, Some((short, 1))).await.unwrap(),
        None
    );
    assert_eq!(must_be_parked(&k, short).await, held);
    assert!(c.ids(&k, "idem_dead_letters").await.is_empty());
    assert_eq!(must_be_parked(&k, long).await.lease_token, Some(1));
    c.clean(&k).await;
    k.close().await;
}

/// Eight consumers taking at once from 50 due rows get each row exactly once, and each row is
/// held under the token of the one that got it.
pub async fn concurrent_takes_return_each_due_row_exactly_once<B: Backend<Db: RecoveryStore>>() {
    const ROWS: usize = 50;
    const TAKERS: i64 = 8;
    let k = crate::__open!(B);
    let c = Case::new();
    let mut parked = HashSet::new();
    for i in 0..ROWS {
        parked.insert(c.park(&k, format!("m{i}").as_bytes(), Duration::ZERO).await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(TAKERS as usize));
    let mut takers = Vec::new();
    for token in 1..=TAKERS {
        let (pool, consumer, start) = (k.pool.clone(), c.consumer.clone(), start.clone());
        takers.push(tokio::spawn(async move {
            start.wait().await;
            let mut got = Vec::new();
            // Until nothing is left; a backend that hands out held rows again ends too.
            for _ in 0..ROWS {
                let taken = B::Db::take_due(&pool, &consumer, 3, HOUR, token)
                    .await
                    .unwrap();
                if taken.is_empty() {
                    break;
                }
                assert!(taken.iter().all(|p| p.token == token));
                got.extend(taken.into_iter().map(|p| (p.id, token)));
            }
            got
        }));
    }
    let mut by_row: HashMap<i64, Vec<i64>> = HashMap::new();
    for taker in takers {
        for (id, token) in taker.await.unwrap() {
            by_row.entry(id).or_default().push(token);
        }
    }
    let twice: Vec<_> = by_row.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(twice.is_empty(), "rows taken more than once: {twice:?}");
    assert_eq!(by_row.keys().copied().collect::<HashSet<_>>(), parked);
    for (id, tokens) in &by_row {
        assert_eq!(must_be_parked(&k, *id).await.lease_token, Some(tokens[0]));
    }
    c.clean(&k).await;
    k.close().await;
}

/// `unpark` deletes in the caller's transaction: rolled back, the row is still there and
/// held; committed, it is gone. A wrong token deletes nothing.
pub async fn unpark_rolled_back_with_its_transaction_leaves_the_row<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let id = c.park(&k, b"p", Duration::ZERO).await;
    assert_eq!(c.take(&k, 1, HOUR, 5).await.len(), 1);
    let held = must_be_parked(&k, id).await;

    let mut tx = k.pool.begin().await.unwrap();
    assert!(
        !B::Db::unpark(&mut *tx, id, 6).await.unwrap(),
        "wrong token"
    );
    assert!(B::Db::unpark(&mut *tx, id, 5).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(must_be_parked(&k, id).await, held, "the rollback undid it");

    let mut tx = k.pool.begin().await.unwrap();
    assert!(B::Db::unpark(&mut *tx, id, 5).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(parked_row(&k, id).await, None);
    let mut conn = k.conn().await;
    assert!(
        !B::Db::unpark(&mut *conn, id, 5).await.unwrap(),
        "already gone"
    );
    drop(conn);
    c.clean(&k).await;
    k.close().await;
}

/// `repark` sets the attempts, the last error and the next due time, and clears the lease: the
/// row is taken again only once due, and its old token changes nothing more.
pub async fn repark_sets_attempts_error_and_due_and_clears_the_lease<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let later = c.park(&k, b"later", Duration::ZERO).await;
    let soon = c.park(&k, b"soon", Duration::ZERO).await;
    assert_eq!(c.take(&k, 10, HOUR, 9).await.len(), 2);
    let before = must_be_parked(&k, later).await;

    assert!(B::Db::repark(&k.pool, later, 9, 2, "second failure", HOUR)
        .await
        .unwrap());
    let row = must_be_parked(&k, later).await;
    let delay = row.due_ms - before.due_ms;
    assert!(
        (HOUR_MS..HOUR_MS + SLACK_MS).contains(&delay),
        "due an hour from the repark: {delay} ms"
    );
    assert_eq!(
        row,
        ParkedRow {
            attempts: 2,
            last_error: Some("second failure".into()),
            due_ms: row.due_ms,
            lease_until_ms: None,
            lease_token: None,
            ..before.clone()
        }
    );
    assert!(
        !B::Db::repark(&k.pool, later, 9, 3, "again", Duration::ZERO)
            .await
            .unwrap(),
        "no longer held"
    );
    assert_eq!(must_be_parked(&k, later).await, row);

    assert!(
        B::Db::repark(&k.pool, soon, 9, 7, "third failure", Duration::ZERO)
            .await
            .unwrap()
    );
    let taken = c.take(&k, 10, HOUR, 10).await;
    assert_eq!(taken.len(), 1, "only the one due now: {taken:?}");
    assert_eq!(taken[0].id, soon);
    assert_eq!(
        (taken[0].attempts, taken[0].last_error.as_deref()),
        (7, Some("third failure"))
    );
    c.clean(&k).await;
    k.close().await;
}

/// `release_parked` clears the lease and keeps the due time: the row can be taken again at
/// once, as it was; its old token changes nothing more.
pub async fn release_parked_clears_the_lease_and_keeps_the_due_time<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let id = c.park(&k, b"p", Duration::ZERO).await;
    let parked = must_be_parked(&k, id).await;
    assert_eq!(c.take(&k, 1, HOUR, 3).await.len(), 1);
    assert!(B::Db::release_parked(&k.pool, id, 3).await.unwrap());
    assert_eq!(must_be_parked(&k, id).await, parked, "as it was parked");
    assert!(!B::Db::release_parked(&k.pool, id, 3).await.unwrap());
    let again = c.take(&k, 1, HOUR, 4).await;
    assert_eq!(
        again.iter().map(|p| (p.id, p.token)).collect::<Vec<_>>(),
        [(id, 4)]
    );
    c.clean(&k).await;
    k.close().await;
}

/// `bury` without a parked row writes a dead letter with every column: state `dead`, first
/// failure as given (or now), last failure now, scope, key and headers as given (or NULL).
pub async fn bury_writes_every_column_of_a_dead_letter<B: Backend<Db: RecoveryStore>>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let key = [0x00, 0xff, b'k', 0x80];
    let failure = Failure {
        first_failed_ms: Some(FIRST_FAILED_MS),
        ..c.failure(b"{\"order\":17}", 5, "card 17 declined")
    };
    let dead = c.dead(failure, &key);
    let id = B::Db::bury(&k.pool, &dead, None).await.unwrap().unwrap();
    let row = dead_row(&k, id).await.expect("the dead letter");
    assert!(row.last_failed_ms > FIRST_FAILED_MS, "{row:?}");
    assert_eq!(
        row,
        DeadRow {
            consumer: c.consumer.clone(),
            scope: Some("billing::charge".into()),
            key: Some(key.to_vec()),
            reason: "retries_exhausted".into(),
            error: "card 17 declined".into(),
            shape: "card # declined".into(),
            group: "00112233aabbccdd".into(),
            payload: b"{\"order\":17}".to_vec(),
            headers: Some(r#"[["trace","t-1"]]"#.into()),
            origin: c.origin.clone(),
            attempts: 5,
            first_failed_ms: FIRST_FAILED_MS,
            last_failed_ms: row.last_failed_ms,
            state: "dead".into(),
            settled_ms: None,
            replayed_as: None,
        }
    );

    // Undecodable: no scope, no key, no headers; failed first now.
    let bare = Case {
        headers: Vec::new(),
        ..Case::new()
    };
    let undecodable = NewDeadLetter {
        reason: "undecodable",
        scope: None,
        key: None,
        ..bare.dead(bare.failure(&[0xc3, 0x28], 1, "expected value"), &key)
    };
    let other = B::Db::bury(&k.pool, &undecodable, None)
        .await
        .unwrap()
        .unwrap();
    let row = dead_row(&k, other).await.expect("the dead letter");
    assert_eq!((row.scope, row.key, row.headers), (None, None, None));
    assert_eq!(row.first_failed_ms, row.last_failed_ms, "both now");
    assert_eq!(
        (row.payload, row.reason),
        (vec![0xc3, 0x28], "undecodable".into())
    );
    assert_eq!(c.ids(&k, "idem_dead_letters").await, [id]);
    assert!(c.ids(&k, "idem_parked").await.is_empty());
    bare.clean(&k).await;
    c.clean(&k).await;
    k.close().await;
}

/// `bury` of a parked row deletes it and writes the dead letter in one transaction; with a token
/// that no longer holds the row it writes nothing and leaves the row.
pub async fn bury_of_a_parked_row_moves_it_and_a_stale_token_moves_nothing<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let id = c.park(&k, b"poison", Duration::ZERO).await;
    let taken = c.take(&k, 1, HOUR, 11).await;
    assert_eq!(taken.len(), 1);
    let held = must_be_parked(&k, id).await;
    let failure = Failure {
        first_failed_ms: Some(taken[0].first_failed_ms),
        ..c.failure(b"poison", 4, "still failing")
    };
    let dead = c.dead(failure, b"order-17");

    assert_eq!(
        B::Db::bury(&k.pool, &dead, Some((id, 12))).await.unwrap(),
        None
    );
    assert!(
        c.ids(&k, "idem_dead_letters").await.is_empty(),
        "nothing written"
    );
    assert_eq!(must_be_parked(&k, id).await, held, "the row stays");

    let buried = B::Db::bury(&k.pool, &dead, Some((id, 11)))
        .await
        .unwrap()
        .expect("held under 11");
    assert_eq!(parked_row(&k, id).await, None, "moved");
    assert_eq!(c.ids(&k, "idem_dead_letters").await, [buried]);
    let row = dead_row(&k, buried).await.unwrap();
    assert_eq!(
        (row.payload, row.attempts, row.error.as_str()),
        (b"poison".to_vec(), 4, "still failing")
    );
    assert_eq!(row.first_failed_ms, held.first_failed_ms);
    assert_eq!(
        B::Db::bury(&k.pool, &dead, Some((id, 11))).await.unwrap(),
        None,
        "the row is gone: buried once"
    );
    assert_eq!(c.ids(&k, "idem_dead_letters").await, [buried]);
    c.clean(&k).await;
    k.close().await;
}

/// Payload bytes (not UTF-8, NUL included), headers (in order, repeated names, quotes, non-ASCII,
/// empty values) and the origin (non-ASCII, 255 bytes) come back from `take_due` as parked; no
/// headers are stored as NULL and come back empty.
pub async fn headers_origin_and_payload_round_trip<B: Backend<Db: RecoveryStore>>() {
    let k = crate::__open!(B);
    // 255 bytes in 128 characters: the most a name may hold.
    let longest = format!("{}q", "é".repeat(127));
    let c = Case {
        origin: Origin {
            broker: "rabbitmq".into(),
            source: longest.clone(),
            coordinates: "delivery tag 7, ünïcode".into(),
            destination: "orders-ëu".into(),
        },
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-ünï".into(), "välue \"quoted\" \\ back".into()),
            ("dup".into(), "1".into()),
            ("dup".into(), "2".into()),
            ("empty".into(), String::new()),
        ],
        ..Case::new()
    };
    let payload = [0xff, 0x00, 0xfe, b'{', 0x80];
    let failure = Failure {
        first_failed_ms: Some(FIRST_FAILED_MS),
        ..c.failure(&payload, 2, "ünïcode error")
    };
    let id = B::Db::park(&k.pool, &failure, Duration::ZERO)
        .await
        .unwrap();
    let taken = c.take(&k, 10, HOUR, 77).await;
    assert_eq!(
        taken,
        [Parked {
            id,
            token: 77,
            payload: payload.to_vec(),
            headers: c.headers.clone(),
            origin: c.origin.clone(),
            attempts: 2,
            last_error: Some("ünïcode error".into()),
            first_failed_ms: FIRST_FAILED_MS,
        }]
    );
    let row = must_be_parked(&k, id).await;
    assert_eq!(row.origin.source.len(), 255);
    assert_eq!(
        (row.payload, row.origin),
        (payload.to_vec(), c.origin.clone())
    );

    let bare = Case {
        headers: Vec::new(),
        ..Case::new()
    };
    let empty = bare.park(&k, b"", Duration::ZERO).await;
    assert_eq!(must_be_parked(&k, empty).await.headers, None);
    let taken = bare.take(&k, 10, HOUR, 78).await;
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].payload.len(), taken[0].headers.len()), (0, 0));
    bare.clean(&k).await;
    c.clean(&k).await;
    k.close().await;
}

/// A value some database could not hold (over its column's bytes, outside ASCII in an ASCII
/// column, a NUL in a name) is refused as `sqlx::Error::Encode` naming the field, on every
/// backend, and nothing is written or deleted.
pub async fn values_no_database_could_hold_are_refused_before_any_write<
    B: Backend<Db: RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let c = Case::new();
    // 256 bytes in 128 characters.
    let over = "é".repeat(128);
    let with = |origin: Origin| Case {
        consumer: c.consumer.clone(),
        origin,
        headers: c.headers.clone(),
    };
    let cases = [
        (
            with(Origin {
                source: over.clone(),
                ..c.origin.clone()
            }),
            "source",
        ),
        (
            with(Origin {
                coordinates: over.clone(),
                ..c.origin.clone()
            }),
            "coordinates",
        ),
        (
            with(Origin {
                destination: over.clone(),
                ..c.origin.clone()
            }),
            "destination",
        ),
        (
            with(Origin {
                broker: "brökér".into(),
                ..c.origin.clone()
            }),
            "broker",
        ),
    ];
    for (case, field) in &cases {
        let failure = case.failure(b"p", 1, "e");
        assert_eq!(
            refused(B::Db::park(&k.pool, &failure, Duration::ZERO).await),
            *field
        );
        let dead = case.dead(failure, b"k");
        assert_eq!(refused(B::Db::bury(&k.pool, &dead, None).await), *field);
    }
    let long_consumer = Failure {
        consumer: &over,
        ..c.failure(b"p", 1, "e")
    };
    assert_eq!(
        refused(B::Db::park(&k.pool, &long_consumer, Duration::ZERO).await),
        "consumer"
    );
    let nul = with(Origin {
        coordinates: "entry\0-1".into(),
        ..c.origin.clone()
    });
    assert_eq!(
        refused(B::Db::park(&k.pool, &nul.failure(b"p", 1, "e"), Duration::ZERO).await),
        "coordinates"
    );
    assert!(c.ids(&k, "idem_parked").await.is_empty());

    // A held row: a refused bury leaves it, a refused repark does not change it.
    let id = c.park(&k, b"p", Duration::ZERO).await;
    assert_eq!(c.take(&k, 1, HOUR, 1).await.len(), 1);
    let held = must_be_parked(&k, id).await;
    let long_key = vec![1u8; 513];
    let long_scope = "s".repeat(256);
    let dead = c.dead(c.failure(b"p", 2, "e"), &long_key);
    assert_eq!(
        refused(B::Db::bury(&k.pool, &dead, Some((id, 1))).await),
        "key"
    );
    let dead = NewDeadLetter {
        scope: Some(&long_scope),
        ..c.dead(c.failure(b"p", 2, "e"), b"k")
    };
    assert_eq!(
        refused(B::Db::bury(&k.pool, &dead, Some((id, 1))).await),
        "scope"
    );
    let dead = NewDeadLetter {
        group: "00112233aabbccdd0",
        ..c.dead(c.failure(b"p", 2, "e"), b"k")
    };
    assert_eq!(
        refused(B::Db::bury(&k.pool, &dead, Some((id, 1))).await),
        "error group"
    );
    // Over a MEDIUMTEXT (16 MiB - 1 bytes).
    let huge = "e".repeat(1 << 24);
    assert_eq!(
        refused(B::Db::repark(&k.pool, id, 1, 2, &huge, Duration::ZERO).await),
        "error"
    );
    assert_eq!(must_be_parked(&k, id).await, held);
    assert!(c.ids(&k, "idem_dead_letters").await.is_empty());
    c.clean(&k).await;
    k.close().await;
}

/// A NUL in an error or its shape (text for people, which PostgreSQL's text cannot hold) is
/// written as the two characters `\0` by `park`, `repark` and `bury` alike, on every backend:
/// an odd error never keeps a message from being parked or kept.
pub async fn a_nul_in_an_error_is_written_as_backslash_zero<B: Backend<Db: RecoveryStore>>() {
    let k = crate::__open!(B);
    let c = Case::new();
    let id = B::Db::park(&k.pool, &c.failure(b"p", 1, "nul\0inside"), Duration::ZERO)
        .await
        .unwrap();
    let row = must_be_parked(&k, id).await;
    assert_eq!(row.last_error.as_deref(), Some("nul\\0inside"));
    let taken = c.take(&k, 1, HOUR, 1).await;
    assert_eq!(taken[0].last_error.as_deref(), Some("nul\\0inside"));
    assert!(B::Db::repark(&k.pool, id, 1, 2, "\0again", Duration::ZERO)
        .await
        .unwrap());
    assert_eq!(
        must_be_parked(&k, id).await.last_error.as_deref(),
        Some("\\0again")
    );
    assert_eq!(c.take(&k, 1, HOUR, 2).await.len(), 1);
    let dead = NewDeadLetter {
        shape: "shape \0",
        ..c.dead(c.failure(b"p", 3, "error \0"), b"k")
    };
    let buried = B::Db::bury(&k.pool, &dead, Some((id, 2)))
        .await
        .unwrap()
        .expect("held under 2");
    let row = dead_row(&k, buried).await.unwrap();
    assert_eq!(
        (row.error.as_str(), row.shape.as_str()),
        ("error \\0", "shape \\0")
    );
    assert_eq!(parked_row(&k, id).await, None);
    c.clean(&k).await;
    k.close().await;
}

/// `last_error` reads the error counted (`max_attempts`) for one key of one scope: the latest
/// one, none before the first count, and none for another key or scope.
pub async fn last_error_reads_the_counted_error_of_a_key<
    B: Backend<Db: RecoveryStore + Attempts>,
>() {
    let k = crate::__open!(B);
    let scope = unique_name("recovery_scope");
    let other_scope = unique_name("recovery_scope");
    let key = [0xff, 0x00, b'k'];
    let read = |scope: String, key: Vec<u8>| {
        let pool = k.pool.clone();
        async move { B::Db::last_error(&pool, &scope, &key).await.unwrap() }
    };
    assert_eq!(
        read(scope.clone(), key.to_vec()).await,
        None,
        "not counted yet"
    );
    for error in ["first", "second: ünïcode"] {
        let mut conn = k.conn().await;
        let attempt = FailedAttempt {
            record: RecordKey {
                scope: &scope,
                key: &key,
            },
            error,
        };
        B::Db::count_attempt(&mut conn, attempt).await.unwrap();
    }
    assert_eq!(
        read(scope.clone(), key.to_vec()).await.as_deref(),
        Some("second: ünïcode")
    );
    let stored = k
        .column(
            "SELECT last_error FROM idem_attempts WHERE scope = $1 AND msg_key = $2",
            &[scope.as_str().into(), key.as_slice().into()],
            Ty::Text,
        )
        .await;
    assert_eq!(stored, [Value::Text("second: ünïcode".into())]);
    assert_eq!(read(scope.clone(), b"other".to_vec()).await, None);
    assert_eq!(read(other_scope, key.to_vec()).await, None);

    k.exec(
        "DELETE FROM idem_attempts WHERE scope = $1",
        &[scope.as_str().into()],
    )
    .await;
    let left = k
        .int(
            "SELECT COUNT(*) FROM idem_attempts WHERE scope = $1",
            &[scope.as_str().into()],
        )
        .await;
    assert_eq!(left, 0);
    k.close().await;
}

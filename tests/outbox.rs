//! The outbox's writing side on real databases: `ctx.publish` writes its row in the handler's
//! transaction on every path (pool, savepoint, batch, lease), nothing when that transaction
//! rolls back, with ids that a replayed handler derives again; partition ownership between
//! two relay connections; and two relays draining one MariaDB outbox. SQLite always runs;
//! PostgreSQL and MariaDB on the servers of `IDEM_POSTGRES_URL` and `IDEM_MYSQL_URL`: ignored,
//! saying so, when the crate was built without the variable (and without `CI`).

mod common;

use idem::outbox::OutboxStore;
use idem::store::Store;
use idem::{idempotent, Context, Outcome};
use serde::Serialize;

/// An order a handler turns into a payment.
#[derive(Debug, Clone, Serialize)]
struct Order {
    id: String,
    amount: i64,
    fail: bool,
}

fn order(id: &str, fail: bool) -> Order {
    Order {
        id: id.to_string(),
        amount: 7,
        fail,
    }
}

/// The handler's error: the ids it published before it failed (to compare with a replay).
#[derive(Debug)]
enum Failed {
    AfterPublishing(Vec<String>),
    Store(#[allow(dead_code)] sqlx::Error),
}

impl From<sqlx::Error> for Failed {
    fn from(err: sqlx::Error) -> Self {
        Failed::Store(err)
    }
}

/// An outbox row as a test reads it back.
#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
struct Row {
    id: String,
    destination: String,
    partition_key: String,
    payload: Vec<u8>,
    headers: Option<String>,
}

/// The same handlers for one backend: two unlabelled publishes and a labelled one with a
/// partition key and a header, then an optional failure.
macro_rules! handlers {
    ($db:ty) => {
        use super::*;

        #[idempotent(key = "msg.id", scope = "outbox_test::placed")]
        pub async fn placed(
            tx: &mut idem::Tx<'_, $db>,
            msg: &Order,
            ctx: &Context,
        ) -> Result<Vec<String>, Failed> {
            let ids = vec![
                ctx.publish(tx, "payments", msg).await?,
                ctx.publish(tx, "audit", &msg.id).await?,
                ctx.outgoing("payments")
                    .partition_key(msg.id.clone())
                    .label("receipt")
                    .header("kind", "receipt")
                    .publish(tx, &serde_json::json!({ "receipt": msg.id }))
                    .await?,
            ];
            if msg.fail {
                return Err(Failed::AfterPublishing(ids));
            }
            Ok(ids)
        }

        #[idempotent(key = "msg.id", scope = "outbox_test::leased", mode = "lease", lease = "10s")]
        pub async fn leased(
            tx: &mut idem::Tx<'_, $db>,
            msg: &Order,
            ctx: &Context,
        ) -> Result<String, Failed> {
            let id = ctx.publish(tx, "payments", msg).await?;
            if msg.fail {
                return Err(Failed::AfterPublishing(vec![id]));
            }
            Ok(id)
        }
    };
}

mod sqlite_handlers {
    handlers!(sqlx::Sqlite);
}

#[cfg(feature = "postgres")]
mod postgres_handlers {
    handlers!(sqlx::Postgres);
}

#[cfg(feature = "mysql")]
mod mysql_handlers {
    handlers!(sqlx::MySql);
}

async fn rows<DB: Store>(pool: &sqlx::Pool<DB>) -> Vec<Row>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query_as(
        "SELECT id, destination, partition_key, payload, headers FROM idem_outbox ORDER BY seq",
    )
    .fetch_all(&mut *pool.acquire().await.unwrap())
    .await
    .unwrap()
}

/// Marks the oldest row sent and the next one failed, then purges sent rows with a retention
/// of zero; how many the purge deleted.
async fn sent_one_failed_one_and_purged<DB: OutboxStore>(pool: &sqlx::Pool<DB>) -> u64
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments: sqlx::IntoArguments<DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    use std::time::Duration;
    let mut conn = pool.acquire().await.unwrap();
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM idem_outbox ORDER BY seq LIMIT 2")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(DB::mark_sent(&mut conn, &seqs[..1]).await.unwrap(), 1);
    let failed = DB::mark_failed(&mut conn, &seqs[1..], Duration::ZERO, "refused");
    failed.await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    DB::purge_sent(&mut conn, Duration::ZERO, 1_000)
        .await
        .unwrap()
}

/// The whole contract of the writing side, on one backend.
macro_rules! writing_side {
    ($handlers:ident, $pool:expr, $other_pool:expr) => {{
        use $handlers::{leased, placed};
        let pool = $pool;

        // A handler that publishes and then fails leaves nothing.
        let Err(idem::Error::Handler(Failed::AfterPublishing(first))) =
            placed(&pool, &order("o-1", true)).await
        else {
            panic!("the handler failed")
        };
        assert!(rows(&pool).await.is_empty(), "a rolled-back handler left outbox rows");

        // Its redelivery publishes, with the ids the failed run had derived.
        let Outcome::Applied(ids) = placed(&pool, &order("o-1", false)).await.unwrap() else {
            panic!("applied")
        };
        assert_eq!(ids, first, "a replayed handler derives the same ids");
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), 3, "each publish of a handler has an id of its own");
        let stored = rows(&pool).await;
        assert_eq!(stored.len(), 3);
        assert_eq!(stored.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), ids);
        assert_eq!(stored[0].destination, "payments");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&stored[0].payload).unwrap(),
            serde_json::json!({ "id": "o-1", "amount": 7, "fail": false })
        );
        assert_eq!((stored[1].destination.as_str(), stored[1].partition_key.as_str()), ("audit", ""));
        assert_eq!(stored[2].partition_key, "o-1");
        assert_eq!(stored[2].headers.as_deref(), Some(r#"[["kind","receipt"]]"#));

        // A duplicate runs nothing and writes nothing.
        assert_eq!(placed(&pool, &order("o-1", false)).await.unwrap(), Outcome::Duplicate);
        assert_eq!(rows(&pool).await.len(), 3);

        // Savepoint path: the caller's rollback takes the rows with it; its commit keeps them.
        let mut tx = pool.begin().await.unwrap();
        placed(&mut tx, &order("o-2", false)).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(rows(&pool).await.len(), 3, "the caller rolled back");
        let mut tx = pool.begin().await.unwrap();
        let Outcome::Applied(savepoint_ids) = placed(&mut tx, &order("o-2", false)).await.unwrap()
        else {
            panic!("applied")
        };
        tx.commit().await.unwrap();
        assert_eq!(rows(&pool).await.len(), 6);

        // Batch path: the failing message is left out, the others publish once each.
        let messages = [order("o-3", false), order("o-4", true), order("o-5", false)];
        let results = idem::batch(&pool, &messages, async |b, m| placed(b, m).await)
            .await
            .unwrap();
        assert!(matches!(results[1], Err(idem::Error::Handler(_))));
        assert!(matches!(results[0], Ok(Outcome::Applied(_))) && matches!(results[2], Ok(Outcome::Applied(_))));
        let stored = rows(&pool).await;
        assert_eq!(stored.len(), 12, "{stored:?}");
        let unique: std::collections::HashSet<_> = stored.iter().map(|r| &r.id).collect();
        assert_eq!(unique.len(), 12);

        // Lease mode: the row commits with the lease's completion, or not at all.
        assert!(matches!(leased(&pool, &order("o-6", true)).await, Err(idem::Error::Handler(_))));
        assert_eq!(rows(&pool).await.len(), 12, "a failed lease-mode body left a row");
        let Outcome::Applied(lease_id) = leased(&pool, &order("o-6", false)).await.unwrap() else {
            panic!("applied")
        };
        assert_eq!(rows(&pool).await.last().unwrap().id, lease_id);

        // A purge of sent rows, however short its retention, deletes no pending row, not one
        // whose publish failed either.
        assert_eq!(sent_one_failed_one_and_purged(&pool).await, 1);
        assert_eq!(rows(&pool).await.len(), 12, "a purge deleted pending rows");

        // Ids depend on the delivery only: another database derives the same ones.
        let other = $other_pool;
        let mut tx = other.begin().await.unwrap();
        let Outcome::Applied(again) = placed(&mut tx, &order("o-2", false)).await.unwrap() else {
            panic!("applied")
        };
        tx.commit().await.unwrap();
        assert_eq!(again, savepoint_ids);
        (pool, other)
    }};
}

#[tokio::test]
async fn sqlite_writes_the_outbox_in_the_handlers_transaction() {
    writing_side!(
        sqlite_handlers,
        common::sqlite().await,
        common::sqlite().await
    );
}

#[tokio::test]
async fn a_bad_message_is_refused_before_anything_is_written() {
    let pool = common::sqlite().await;
    let ctx = Context::new("s", b"k".to_vec(), None);
    let mut tx = pool.begin().await.unwrap();
    let err = ctx.publish(&mut tx, "", &1).await.unwrap_err();
    assert!(err.to_string().contains("destination is empty"), "{err}");
    let long = "k".repeat(idem::outbox::MAX_NAME_LEN + 1);
    let err = ctx
        .outgoing("q")
        .partition_key(long)
        .publish(&mut tx, &1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("partition key"), "{err}");
    let mut bad = std::collections::HashMap::new();
    bad.insert(vec![1u8], 1); // a map with non-string keys is no JSON
    let err = ctx.publish(&mut tx, "q", &bad).await.unwrap_err();
    assert!(err.to_string().contains("does not serialize"), "{err}");
    // A header no broker could carry fails here, not at the relay on every retry.
    for (name, value, refused) in [
        ("trace", "a\r\nInjected: 1", "line break"),
        ("a b", "1", "header name"),
    ] {
        let outgoing = ctx.outgoing("q").header(name, value);
        let err = outgoing.publish(&mut tx, &1).await.unwrap_err();
        assert!(err.to_string().contains(refused), "{err}");
    }
    // None of them took an ordinal: the first good publish is ordinal 0.
    let id = ctx.publish(&mut tx, "q", &1).await.unwrap();
    tx.commit().await.unwrap();
    let fresh = Context::new("s", b"k".to_vec(), None);
    let other = common::sqlite().await;
    let mut tx = other.begin().await.unwrap();
    assert_eq!(fresh.publish(&mut tx, "q", &1).await.unwrap(), id);
    tx.commit().await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn postgres_writes_the_outbox_in_the_handlers_transaction() {
    let (Some(pool), Some(other)) = (common::postgres().await, common::postgres().await) else {
        return;
    };
    let (pool, other) = writing_side!(postgres_handlers, pool, other);
    common::drop_postgres(pool).await;
    common::drop_postgres(other).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn mysql_writes_the_outbox_in_the_handlers_transaction() {
    let (Some(pool), Some(other)) = (common::mysql().await, common::mysql().await) else {
        return;
    };
    let (pool, other) = writing_side!(mysql_handlers, pool, other);
    one_owner_per_partition(&pool).await;
    common::drop_mysql(pool).await;
    common::drop_mysql(other).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn postgres_gives_each_partition_one_owner() {
    common::with_postgres(async |pool| one_owner_per_partition(pool).await).await;
}

/// Two relay connections: a partition one owns, the other cannot take until it is given up or
/// the owner's session ends.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
async fn one_owner_per_partition<DB: OutboxStore>(pool: &sqlx::Pool<DB>) {
    use sqlx::Connection as _;
    let mut a = pool.acquire().await.unwrap().detach();
    let mut b = pool.acquire().await.unwrap().detach();
    assert_eq!(DB::try_own(&mut a, &[7]).await.unwrap(), [7]);
    assert!(
        DB::try_own(&mut b, &[7]).await.unwrap().is_empty(),
        "two owners of one partition"
    );
    assert_eq!(
        DB::try_own(&mut b, &[7, 8]).await.unwrap(),
        [8],
        "another partition is free, the owned one is not"
    );
    DB::disown(&mut a, &[7]).await.unwrap();
    assert_eq!(DB::try_own(&mut b, &[7]).await.unwrap(), [7]);
    assert!(DB::try_own(&mut a, &[8]).await.unwrap().is_empty());
    // Several given up in one call, and taken in one call, in the order asked.
    DB::disown(&mut b, &[7, 8]).await.unwrap();
    assert_eq!(DB::try_own(&mut a, &[8, 7]).await.unwrap(), [8, 7]);
    DB::disown(&mut a, &[7, 8]).await.unwrap();
    assert!(DB::try_own(&mut a, &[]).await.unwrap().is_empty());
    assert_eq!(DB::try_own(&mut b, &[8]).await.unwrap(), [8]);
    // The owner's session ends (a crashed relay): its partitions are free again.
    b.close().await.unwrap();
    let mut taken = false;
    for _ in 0..50 {
        if DB::try_own(&mut a, &[8]).await.unwrap() == [8] {
            taken = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(taken, "a closed session still owns its partition");
    a.close().await.unwrap();
}

/// A relay's read: the first rows of several partitions at once, in insertion order, a row
/// that waits out a failed publish marked not ready, sent rows gone.
async fn takes_pending_across_partitions<DB: OutboxStore>(pool: &sqlx::Pool<DB>) {
    use idem::outbox::NewRow;
    use sqlx::Connection as _;
    let mut conn = pool.acquire().await.unwrap().detach();
    let rows = [(3, "a"), (5, "b"), (3, "a"), (9, "c"), (5, "b"), (3, "a")];
    for (i, (partition_no, key)) in rows.into_iter().enumerate() {
        let id = format!("r{}", i + 1);
        let row = NewRow {
            id: &id,
            destination: "payments",
            partition_key: key,
            partition_no,
            payload: b"{}",
            headers: None,
        };
        DB::insert_outbox(&mut conn, row).await.unwrap();
    }
    let taken = |rows: Vec<idem::outbox::PendingRow>| {
        rows.into_iter()
            .map(|r| (r.id, r.partition_no, r.ready))
            .collect::<Vec<_>>()
    };
    let pending = DB::take_pending(&mut conn, &[5, 3], 10, 10).await.unwrap();
    let seqs: Vec<i64> = pending.iter().map(|r| r.seq).collect();
    assert_eq!(
        taken(pending),
        [
            ("r1".to_string(), 3, true),
            ("r2".into(), 5, true),
            ("r3".into(), 3, true),
            ("r5".into(), 5, true),
            ("r6".into(), 3, true)
        ]
    );
    let first_two = DB::take_pending(&mut conn, &[3, 5, 9], 10, 2)
        .await
        .unwrap();
    assert_eq!(taken(first_two).len(), 2);
    // `each` caps every partition, `limit` the whole, oldest first.
    let heads = DB::take_pending(&mut conn, &[3, 5, 9], 1, 10)
        .await
        .unwrap();
    assert_eq!(
        heads.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r1", "r2", "r4"]
    );
    let two_each = DB::take_pending(&mut conn, &[3, 5, 9], 2, 4).await.unwrap();
    assert_eq!(
        two_each.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["r1", "r2", "r3", "r4"]
    );
    assert!(DB::take_pending(&mut conn, &[], 10, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(DB::take_pending(&mut conn, &[4], 10, 10)
        .await
        .unwrap()
        .is_empty());

    DB::mark_sent(&mut conn, &seqs[..1]).await.unwrap();
    let hour = std::time::Duration::from_secs(3600);
    DB::mark_failed(&mut conn, &seqs[1..2], hour, "refused")
        .await
        .unwrap();
    assert_eq!(
        taken(
            DB::take_pending(&mut conn, &[3, 5, 9], 10, 10)
                .await
                .unwrap()
        ),
        [
            ("r2".to_string(), 5, false),
            ("r3".into(), 3, true),
            ("r4".into(), 9, true),
            ("r5".into(), 5, true),
            ("r6".into(), 3, true)
        ]
    );

    // The partitions with a row ready: 5's first waits, but its next is ready.
    let mut ready = DB::pending_partitions(&mut conn, 256).await.unwrap();
    ready.sort_unstable();
    assert_eq!(ready, [3, 5, 9]);
    assert_eq!(DB::pending_partitions(&mut conn, 2).await.unwrap().len(), 2);
    // r4 (9's only row) sent, r5 (5's ready one) failed: only 3 has a row ready.
    let rows = DB::take_pending(&mut conn, &[5, 9], 10, 10).await.unwrap();
    let seq_of = |id: &str| rows.iter().find(|r| r.id == id).unwrap().seq;
    DB::mark_sent(&mut conn, &[seq_of("r4")]).await.unwrap();
    DB::mark_failed(&mut conn, &[seq_of("r5")], hour, "refused")
        .await
        .unwrap();
    assert_eq!(DB::pending_partitions(&mut conn, 256).await.unwrap(), [3]);
    conn.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_takes_pending_rows_across_partitions() {
    let pool = common::sqlite().await;
    takes_pending_across_partitions(&pool).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn postgres_takes_pending_rows_across_partitions() {
    common::with_postgres(async |pool| takes_pending_across_partitions(pool).await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn mysql_takes_pending_rows_across_partitions() {
    common::with_mysql(async |pool| takes_pending_across_partitions(pool).await).await;
}

/// A step of a key's sequence, as the seeded outbox carries it.
#[cfg(feature = "mysql")]
#[derive(Serialize, serde::Deserialize)]
struct Step {
    key: String,
    n: i64,
}

/// Records each message it is handed (id, partition key, step), in publish order: the broker
/// here is the log, since this test is about the relays and the database between them.
#[cfg(feature = "mysql")]
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<(String, String, i64)>>>);

#[cfg(feature = "mysql")]
impl idem::outbox::Publisher for Log {
    async fn publish(
        &self,
        batch: &[idem::outbox::Message],
    ) -> Result<(), idem::outbox::PublishError> {
        let mut log = self.0.lock().unwrap();
        for message in batch {
            let step: Step = serde_json::from_slice(&message.payload).unwrap();
            log.push((message.id.clone(), message.partition_key.clone(), step.n));
        }
        Ok(())
    }
}

/// Two relays on one MariaDB outbox (named locks for ownership, the per-partition probe for
/// the partitions with work): every row published once, one relay at a time per key, each
/// key in order, and every row marked sent in the database.
#[cfg(feature = "mysql")]
#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn mysql_relays_share_the_outbox_and_keep_per_key_order() {
    use std::time::Duration;
    let Some(pool) = common::mysql().await else {
        return;
    };
    let (rows, keys) = (1_000_usize, 40_usize);
    let mut tx = pool.begin().await.unwrap();
    for i in 0..rows {
        let key = format!("key-{}", i % keys);
        let ctx = Context::new("outbox_test::seed", i.to_be_bytes().to_vec(), None);
        let step = Step {
            key: key.clone(),
            n: (i / keys) as i64,
        };
        ctx.outgoing("payments")
            .partition_key(key)
            .publish(&mut tx, &step)
            .await
            .unwrap();
        if i % 200 == 199 {
            tx.commit().await.unwrap();
            tx = pool.begin().await.unwrap();
        }
    }
    tx.commit().await.unwrap();

    let pending = |pool: sqlx::MySqlPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // Until the outbox is empty; bounded, so that a relay that stopped publishing fails the
    // assertions below instead of hanging the test.
    let done = |pool: sqlx::MySqlPool| async move {
        let started = std::time::Instant::now();
        while pending(pool.clone()).await > 0 && started.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let log = Log::default();
    let publisher = idem_testkit::outbox::Watched::new(log.clone());
    let relay = |pool: sqlx::MySqlPool| {
        idem::outbox::Relay::new(pool, publisher.clone())
            .batch(20)
            .batches_per_turn(2)
    };
    let (a, b) = tokio::join!(
        relay(pool.clone()).run(done(pool.clone())),
        relay(pool.clone()).run(done(pool.clone()))
    );
    eprintln!("relay A published {}, relay B {}", a.published, b.published);
    assert_eq!(pending(pool.clone()).await, 0, "rows left unsent");
    assert_eq!(a.published + b.published, rows as u64);
    assert!(
        !publisher.overlapped(),
        "two relays published one key at the same time"
    );
    let log = log.0.lock().unwrap().clone();
    assert_eq!(log.len(), rows, "every row published once");
    let ids: std::collections::HashSet<&str> = log.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids.len(), rows);
    let mut last: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for (_, key, n) in &log {
        let expected = last.get(key.as_str()).map_or(0, |n| n + 1);
        assert_eq!(*n, expected, "key {key} out of order");
        last.insert(key, *n);
    }
    assert_eq!(last.len(), keys);
    common::drop_mysql(pool).await;
}

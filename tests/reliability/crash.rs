// The body of `tests/reliability_crash.rs`, included once per backend: it sees that backend's
// `Db`, `BACKEND`, `database()`, `connect()` and `release()`. (Included: no inner doc comments.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use idem::{idempotent, Outcome, Tx};
use sqlx::{Pool, QueryBuilder};

use crate::{Entry, Kills, Msg, Oracle};

/// One row of the durable log: `a` is the account or the order, `b` the amount or the version.
#[derive(Debug, sqlx::FromRow)]
struct LogRow {
    seq: i64,
    kind: String,
    msg_id: String,
    a: i64,
    b: i64,
    first_copy: i64,
}

/// Key only: one ledger line and the credit.
#[idempotent(key = "msg.msg_id", scope = "crash::credit")]
async fn on_credit(tx: &mut Tx<'_, Db>, msg: &LogRow) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (msg_id) VALUES ($1)")
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance",
    )
    .bind(msg.a)
    .bind(msg.b)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Key + version + entity: one ledger line and the order's new status.
#[idempotent(
    key = "msg.msg_id",
    version = "msg.b",
    entity = "msg.a",
    scope = "crash::status"
)]
async fn on_status(tx: &mut Tx<'_, Db>, msg: &LogRow) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (msg_id) VALUES ($1)")
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(msg.a)
    .bind(format!("v{}", msg.b))
    .bind(msg.b)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The consumer process: from the last acknowledged entry to the end of the log, one message at a
/// time: handle (the handler's transaction commits), then acknowledge in a transaction of its own.
/// Prints `acked <seq>` after each acknowledgement and `redelivered <seq>` when the first copy of
/// a message turns out to be applied already (a previous life committed it and died before its
/// ack). With `kill_after = Some(n)` it SIGKILLs itself after its n-th applied message, between
/// the commit and the ack.
pub async fn consume(location: &str, kill_after: Option<usize>) {
    let pool = connect(location).await;
    let mut applied = 0;
    loop {
        let pos: i64 = sqlx::query_scalar("SELECT pos FROM offsets WHERE consumer = 'main'")
            .fetch_one(&pool)
            .await
            .unwrap();
        let batch: Vec<LogRow> = sqlx::query_as(
            "SELECT seq, kind, msg_id, a, b, first_copy FROM log WHERE seq > $1 ORDER BY seq LIMIT 100",
        )
        .bind(pos)
        .fetch_all(&pool)
        .await
        .unwrap();
        if batch.is_empty() {
            println!("done");
            pool.close().await;
            return;
        }
        for row in batch {
            let outcome = match row.kind.as_str() {
                "credit" => on_credit(&pool, &row).await,
                _ => on_status(&pool, &row).await,
            }
            .unwrap_or_else(|err| panic!("seq {}: {err:?}", row.seq));
            if outcome.is_applied() {
                applied += 1;
                if kill_after == Some(applied) {
                    crate::sigkill_self();
                }
            }
            if row.first_copy == 1 && outcome == Outcome::Duplicate {
                println!("redelivered {}", row.seq);
            }
            // The ack: exactly the next entry, or the log was skipped or re-read.
            let acked =
                sqlx::query("UPDATE offsets SET pos = $1 WHERE consumer = 'main' AND pos = $2")
                    .bind(row.seq)
                    .bind(row.seq - 1)
                    .execute(&pool)
                    .await
                    .unwrap()
                    .rows_affected();
            assert_eq!(acked, 1, "ack of seq {}", row.seq);
            println!("acked {}", row.seq);
        }
    }
}

async fn write_log(pool: &Pool<Db>, log: &[Entry]) {
    for sql in [
        "CREATE TABLE log (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL, msg_id TEXT NOT NULL, \
         a BIGINT NOT NULL, b BIGINT NOT NULL, first_copy BIGINT NOT NULL)",
        "CREATE TABLE offsets (consumer TEXT PRIMARY KEY, pos BIGINT NOT NULL)",
        "INSERT INTO offsets (consumer, pos) VALUES ('main', 0)",
        // No unique constraint: a message applied twice leaves two lines.
        "CREATE TABLE ledger (msg_id TEXT NOT NULL)",
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    for chunk in log.chunks(500) {
        let mut insert =
            QueryBuilder::new("INSERT INTO log (seq, kind, msg_id, a, b, first_copy) ");
        insert.push_values(chunk, |mut row, entry| {
            let (kind, a, b) = match &entry.msg {
                Msg::Credit {
                    account, amount, ..
                } => ("credit", *account, *amount),
                Msg::Status { order, version, .. } => ("status", *order, *version),
            };
            row.push_bind(entry.seq)
                .push_bind(kind)
                .push_bind(entry.msg.id().to_string())
                .push_bind(a)
                .push_bind(b)
                .push_bind(i64::from(entry.first_copy));
        });
        insert.build().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Shows at most a few items of a set that should be empty.
fn few<T: std::fmt::Debug>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    items.into_iter().take(5).collect()
}

async fn verify(pool: &Pool<Db>, log: &[Entry], oracle: &Oracle) {
    let pos: i64 = sqlx::query_scalar("SELECT pos FROM offsets WHERE consumer = 'main'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        pos,
        log.len() as i64,
        "the consumer acknowledged the whole log"
    );

    let lines: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg_id, COUNT(*) FROM ledger GROUP BY msg_id")
            .fetch_all(pool)
            .await
            .unwrap();
    let lines: BTreeMap<String, i64> = lines.into_iter().collect();
    let lost: Vec<&String> = oracle
        .applied
        .iter()
        .filter(|id| !lines.contains_key(*id))
        .collect();
    let doubled: Vec<(&String, &i64)> = lines.iter().filter(|(_, &n)| n > 1).collect();
    let extra: Vec<&String> = lines
        .keys()
        .filter(|id| !oracle.applied.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} lost, e.g. {:?}",
        lost.len(),
        few(lost.iter())
    );
    assert!(
        doubled.is_empty(),
        "{} doubled, e.g. {:?}",
        doubled.len(),
        few(doubled.iter())
    );
    assert!(
        extra.is_empty(),
        "{} applied against the oracle, e.g. {:?}",
        extra.len(),
        few(extra.iter())
    );

    let balances: Vec<(i64, i64)> = sqlx::query_as("SELECT id, balance FROM accounts")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(
        balances.into_iter().collect::<BTreeMap<_, _>>(),
        oracle.balances,
        "balances"
    );
    let orders: Vec<(i64, String, i64)> = sqlx::query_as("SELECT id, status, version FROM orders")
        .fetch_all(pool)
        .await
        .unwrap();
    let orders: BTreeMap<i64, (String, i64)> =
        orders.into_iter().map(|(id, s, v)| (id, (s, v))).collect();
    assert_eq!(orders, oracle.orders, "order states");

    for (scope, expected) in [
        ("crash::credit", oracle.credits.clone()),
        (
            "crash::status",
            oracle
                .applied
                .difference(&oracle.credits)
                .cloned()
                .collect::<BTreeSet<_>>(),
        ),
    ] {
        let keys: Vec<Vec<u8>> =
            sqlx::query_scalar("SELECT msg_key FROM idem_records WHERE scope = $1")
                .bind(scope)
                .fetch_all(pool)
                .await
                .unwrap();
        let keys: BTreeSet<String> = keys
            .into_iter()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        assert_eq!(keys, expected, "records of {scope}");
    }
}

#[test]
fn sigkilled_consumers_lose_and_double_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some((pool, location)) = rt.block_on(database()) else {
        return;
    };
    let seed = crate::seed();
    let log = crate::generate(seed);
    let oracle = crate::oracle(&log);
    rt.block_on(write_log(&pool, &log));
    let started = Instant::now();
    let kills: Kills = crate::run_with_kills(BACKEND, &location, log.len(), seed);
    let elapsed = started.elapsed();
    rt.block_on(verify(&pool, &log, &oracle));
    assert!(kills.random >= 20, "{kills:?}");
    assert_eq!(kills.after_commit, crate::COMMIT_KILLS, "{kills:?}");
    assert!(
        kills.redelivered >= kills.after_commit,
        "every kill between commit and ack is followed by a redelivery: {kills:?}"
    );
    eprintln!(
        "{BACKEND}: {} log entries ({} distinct, {} redeliveries; oracle: {} duplicates, {} stale), \
         {} lives: {} SIGKILLs at random moments, {} between commit and ack; \
         {} committed but unacknowledged messages redelivered after a crash; {} applied, \
         0 lost, 0 doubled, in {elapsed:.1?}",
        log.len(),
        log.iter().filter(|e| e.first_copy).count(),
        log.iter().filter(|e| !e.first_copy).count(),
        oracle.duplicates,
        oracle.stale,
        kills.lives,
        kills.random,
        kills.after_commit,
        kills.redelivered,
        oracle.applied.len(),
    );
    rt.block_on(release(pool, &location));
}

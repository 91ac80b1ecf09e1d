// The log in a database, included once per backend by `support/log.rs`: it sees that backend's
// `Db` and `connect()`. Its tables, its two handlers, the consumer process that reads it and the
// checks of the database against the oracle. (Included: no inner doc comments.)

use std::collections::{BTreeMap, BTreeSet};

use idem::{idempotent, Outcome, RetryPolicy, Tx};
use sqlx::{Pool, QueryBuilder};

use super::{Entry, Oracle};
use crate::support::assert_none;

/// One row of the log: `a` is the account or the order, `b` the amount or the version.
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
#[idempotent(key = "msg.msg_id", scope = "log::credit")]
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

/// Key + version + entity: one ledger line and the order's new status, refused (an error, so
/// the run fails) if the order is already at this version or a newer one.
#[idempotent(
    key = "msg.msg_id",
    version = "msg.b",
    entity = "msg.a",
    scope = "log::status"
)]
async fn on_status(tx: &mut Tx<'_, Db>, msg: &LogRow) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (msg_id) VALUES ($1)")
        .bind(&msg.msg_id)
        .execute(&mut **tx)
        .await?;
    let moved = sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version \
         WHERE orders.version < excluded.version",
    )
    .bind(msg.a)
    .bind(format!("v{}", msg.b))
    .bind(msg.b)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved != 1 {
        return Err(sqlx::Error::Protocol(format!(
            "{} applied out of order: order {} is already at version {} or newer",
            msg.msg_id, msg.a, msg.b
        )));
    }
    Ok(())
}

/// A consumer process of `consumers` that share the log: from its last acknowledged entry to the
/// end of its share (entries with `seq % consumers == share`), one at a time: handle through
/// `idem::retry(policy)` (the handler's transaction commits), then acknowledge (advance its
/// offset) in a transaction of its own. Prints `acked <seq>` after each acknowledgement and
/// `redelivered <seq>` when the first copy of a message turns out to be applied already (a
/// previous life committed it and died before its ack). With `kill_after = Some(n)` it SIGKILLs
/// itself after its n-th applied message, between the commit and the ack.
pub async fn consume(
    location: &str,
    (share, consumers): (i64, i64),
    policy: RetryPolicy,
    kill_after: Option<usize>,
) {
    let pool = connect(location, share).await;
    let mut applied = 0;
    loop {
        let pos: i64 = sqlx::query_scalar("SELECT pos FROM offsets WHERE consumer = $1")
            .bind(share)
            .fetch_one(&pool)
            .await
            .unwrap();
        let batch: Vec<LogRow> = sqlx::query_as(
            "SELECT seq, kind, msg_id, a, b, first_copy FROM log \
             WHERE seq > $1 AND seq % $2 = $3 ORDER BY seq LIMIT 100",
        )
        .bind(pos)
        .bind(consumers)
        .bind(share)
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
                "credit" => idem::retry(policy, || on_credit(&pool, &row)).await,
                _ => idem::retry(policy, || on_status(&pool, &row)).await,
            }
            .unwrap_or_else(|err| panic!("seq {}: {err:?}", row.seq));
            if outcome.is_applied() {
                applied += 1;
                if kill_after == Some(applied) {
                    crate::support::sigkill_self();
                }
            }
            if row.first_copy == 1 && outcome == Outcome::Duplicate {
                println!("redelivered {}", row.seq);
            }
            // The ack: exactly the entry after the last one acknowledged.
            let acked = sqlx::query("UPDATE offsets SET pos = $1 WHERE consumer = $2 AND pos = $3")
                .bind(row.seq)
                .bind(share)
                .bind(row.seq - consumers)
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected();
            assert_eq!(acked, 1, "ack of seq {}", row.seq);
            println!("acked {}", row.seq);
        }
    }
}

/// Creates the log's tables, writes `log`, and starts the offsets of `consumers` consumers one
/// step below each share's first entry (seq is 1-based: of 4, share 0 takes 4, 8, ..., share 1
/// takes 1, 5, ...).
pub async fn write_log(pool: &Pool<Db>, log: &[Entry], consumers: i64) {
    for sql in [
        "CREATE TABLE log (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL, msg_id TEXT NOT NULL, \
         a BIGINT NOT NULL, b BIGINT NOT NULL, first_copy BIGINT NOT NULL)",
        "CREATE INDEX log_msg_id ON log (msg_id)",
        "CREATE TABLE offsets (consumer BIGINT PRIMARY KEY, pos BIGINT NOT NULL)",
        // No unique constraint: a message applied twice leaves two lines.
        "CREATE TABLE ledger (msg_id TEXT NOT NULL)",
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
    for share in 0..consumers {
        let first = (share + consumers - 1) % consumers + 1;
        sqlx::query("INSERT INTO offsets (consumer, pos) VALUES ($1, $2)")
            .bind(share)
            .bind(first - consumers)
            .execute(pool)
            .await
            .unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    for chunk in log.chunks(500) {
        let mut insert =
            QueryBuilder::new("INSERT INTO log (seq, kind, msg_id, a, b, first_copy) ");
        insert.push_values(chunk, |mut row, entry| {
            let (kind, a, b) = entry.msg.columns();
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

/// Entries acknowledged over all shares of `consumers`: each offset counts its share's entries
/// up to it.
pub async fn acked(pool: &Pool<Db>, consumers: i64) -> i64 {
    let offsets: Vec<i64> = sqlx::query_scalar("SELECT pos FROM offsets ORDER BY consumer")
        .fetch_all(pool)
        .await
        .unwrap();
    offsets
        .iter()
        .map(|pos| {
            if *pos <= 0 {
                0
            } else {
                (pos + consumers - 1) / consumers
            }
        })
        .sum()
}

/// Consumers whose next entry is a message delivered once in the whole log whose effect is
/// already there: it committed and was killed before its ack (a lower bound of such kills).
pub async fn committed_unacked(pool: &Pool<Db>, consumers: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM offsets o JOIN log l ON l.seq = o.pos + $1 \
         WHERE EXISTS (SELECT 1 FROM ledger g WHERE g.msg_id = l.msg_id) \
         AND (SELECT COUNT(*) FROM log c WHERE c.msg_id = l.msg_id) = 1",
    )
    .bind(consumers)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Checks the database against the oracle after `consumers` consumers read `log`: every share
/// acknowledged to its end; no message applied twice; every credit and each order's newest
/// status applied, and nothing that is not in the log (with `in_order`, one consumer at a time:
/// exactly the oracle's messages); balances, orders and `idem_versions` equal to the oracle's;
/// the records of each scope exactly the messages whose effect is there.
pub async fn verify(
    pool: &Pool<Db>,
    log: &[Entry],
    oracle: &Oracle,
    consumers: i64,
    in_order: bool,
) {
    let offsets: Vec<(i64, i64)> = sqlx::query_as("SELECT consumer, pos FROM offsets")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(offsets.len() as i64, consumers);
    for (share, pos) in offsets {
        let last = (1..=log.len() as i64)
            .rev()
            .find(|seq| seq % consumers == share)
            .unwrap();
        assert_eq!(pos, last, "consumer {share} acknowledged its whole share");
    }

    let lines: Vec<(String, i64)> =
        sqlx::query_as("SELECT msg_id, COUNT(*) FROM ledger GROUP BY msg_id")
            .fetch_all(pool)
            .await
            .unwrap();
    let lines: BTreeMap<String, i64> = lines.into_iter().collect();
    assert_none("doubled", lines.iter().filter(|(_, &n)| n > 1));
    let must: Vec<&String> = if in_order {
        oracle.applied.iter().collect()
    } else {
        oracle
            .credits
            .iter()
            .chain(oracle.newest.values())
            .collect()
    };
    assert_none("lost", must.iter().filter(|id| !lines.contains_key(**id)));
    let known: BTreeSet<&str> = if in_order {
        oracle.applied.iter().map(String::as_str).collect()
    } else {
        log.iter().map(|e| e.msg.id()).collect()
    };
    let extra = lines.keys().filter(|id| !known.contains(id.as_str()));
    assert_none("applied against the oracle", extra);

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
    assert_eq!(orders, oracle.orders, "every order at its newest version");
    let versions: Vec<(Vec<u8>, i64)> =
        sqlx::query_as("SELECT entity, version FROM idem_versions WHERE scope = 'log::status'")
            .fetch_all(pool)
            .await
            .unwrap();
    let versions: BTreeMap<i64, i64> = versions
        .into_iter()
        .map(|(entity, v)| (String::from_utf8(entity).unwrap().parse().unwrap(), v))
        .collect();
    let newest: BTreeMap<i64, i64> = oracle.orders.iter().map(|(o, (_, v))| (*o, *v)).collect();
    assert_eq!(versions, newest, "idem_versions at the newest");

    // Records and effects agree, scope by scope: no record without its effect, and the reverse.
    for (scope, prefix) in [("log::credit", "c"), ("log::status", "s")] {
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
        let applied: BTreeSet<String> = lines
            .keys()
            .filter(|id| id.starts_with(prefix))
            .cloned()
            .collect();
        assert_eq!(keys, applied, "records of {scope}");
    }
}

// The credits in a database, included once per backend by `support/credits.rs`: it sees that
// backend's `Db`, `PROTOCOL`, `IN_THE_CLEAR`, `ADD_TO_BALANCE` and `options()`. (Included: no
// inner doc comments.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Error, Outcome, RetryPolicy, Transient as _, Tx};
use sqlx::pool::PoolOptions;
use sqlx::Pool;
use tokio::task::JoinHandle;

use super::{Credit, Seen, Stream};
use crate::common::Stored;
use crate::support::proxy::{Cut, Proxy};

/// Adds to a balance and logs the application, so a second application of one message shows.
#[idempotent(key = "msg.id", scope = "credits::credit")]
pub async fn credit(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query(Stored::<Db>::sql(
        "INSERT INTO applied (msg_id) VALUES ($1)",
    ))
    .bind(&msg.id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(Stored::<Db>::sql(ADD_TO_BALANCE))
        .bind(msg.account)
        .bind(msg.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A pool of one connection to the database of `pool`, through a proxy.
async fn proxied(pool: &Pool<Db>) -> (Proxy, Pool<Db>) {
    let direct = options(pool).await;
    let proxy = Proxy::start(direct.get_host(), direct.get_port(), PROTOCOL).await;
    let through = direct.host("127.0.0.1").port(proxy.port());
    let proxied = PoolOptions::<Db>::new()
        .max_connections(1)
        .connect_with(through.ssl_mode(IN_THE_CLEAR))
        .await
        .unwrap();
    (proxy, proxied)
}

/// The pool of a server-crash run on a private server: migrated, with the credits' tables. Its
/// acquire time-out is short, so that the retries wait out a restart.
pub async fn crash_pool(
    options: <<Db as sqlx::Database>::Connection as sqlx::Connection>::Options,
) -> Pool<Db> {
    let pool = PoolOptions::<Db>::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    create_tables(&pool).await;
    pool
}

async fn create_tables(pool: &Pool<Db>) {
    for table in [
        // No unique key: a message applied twice leaves two rows.
        "CREATE TABLE applied (msg_id VARCHAR(64) NOT NULL)",
        "CREATE TABLE balances (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
    ] {
        sqlx::query(table).execute(pool).await.unwrap();
    }
}

/// Messages applied more than once, and how many distinct ones were applied.
async fn applications(pool: &Pool<Db>) -> (Vec<(String, i64)>, i64) {
    let twice: Vec<(String, i64)> = sqlx::query_as(
        "SELECT msg_id, COUNT(*) FROM applied GROUP BY msg_id HAVING COUNT(*) > 1 LIMIT 10",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let distinct: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT msg_id) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap();
    (twice, distinct)
}

async fn balances(pool: &Pool<Db>) -> HashMap<i64, i64> {
    sqlx::query_as::<_, (i64, i64)>("SELECT account, balance FROM balances")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn records(pool: &Pool<Db>) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn record_of(pool: &Pool<Db>, id: &str) -> i64 {
    Stored(pool).records("credits::credit", id).await
}

/// Resolves once `flag` is set.
async fn until_set(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Four workers that take the stream's messages one at a time through `idem::retry(policy)`.
/// While `pacing` is set they pace themselves and keep the last tenth of the stream back (on a
/// fast machine the stream would otherwise end before the server's crashes are made); once
/// `aborted` is set they stop at once, even inside a retry (the server will not come back).
pub fn workers(
    pool: &Pool<Db>,
    stream: &Stream,
    policy: RetryPolicy,
    pacing: &Arc<AtomicBool>,
    aborted: &Arc<AtomicBool>,
) -> Vec<JoinHandle<Seen>> {
    (0..4)
        .map(|_| {
            let (pool, queue, total) = (pool.clone(), stream.queue.clone(), stream.total);
            let (pacing, aborted) = (pacing.clone(), aborted.clone());
            tokio::spawn(async move {
                let mut seen = Seen::default();
                while !aborted.load(Ordering::SeqCst) {
                    if pacing.load(Ordering::SeqCst) {
                        let held_back = queue.lock().unwrap().len() <= total / 10;
                        let pause = if held_back { 20 } else { 5 };
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        if held_back {
                            continue;
                        }
                    }
                    let Some(msg) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    let result = tokio::select! {
                        result = idem::retry(policy, || credit(&pool, &msg)) => result,
                        () = until_set(&aborted) => break,
                    };
                    match result {
                        Ok(Outcome::Applied(())) => seen.applied += 1,
                        Ok(_) => seen.duplicate += 1,
                        Err(err) => seen.errors.push(format!("{}: {err:?}", msg.id)),
                    }
                }
                seen
            })
        })
        .collect()
}

/// What the workers saw, together.
pub async fn finish(workers: Vec<JoinHandle<Seen>>) -> Seen {
    let mut all = Seen::default();
    for worker in workers {
        let seen = worker.await.unwrap();
        all.applied += seen.applied;
        all.duplicate += seen.duplicate;
        all.errors.extend(seen.errors);
    }
    all
}

/// After a server-crash run (`crashes` says what was done to the server): no error left to a
/// caller, every delivery answered, every message applied exactly once (none lost, none
/// twice), balances and records equal to the oracle's.
pub async fn verify_crash_run(pool: &Pool<Db>, stream: &Stream, seen: &Seen, crashes: &str) {
    let messages = stream.messages;
    assert!(
        seen.errors.is_empty(),
        "errors left to callers: {:?}",
        seen.errors
    );
    assert_eq!(seen.applied + seen.duplicate, stream.total as u64);
    let (twice, distinct) = applications(pool).await;
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(distinct, i64::from(messages), "none lost");
    // A commit that went through while the connection died is an ambiguous commit: `retry`
    // runs the delivery again and sees `Duplicate`. So callers saw `Applied` at most once per
    // message, and the database, not the callers' view, says each was applied exactly once.
    assert!(seen.applied <= u64::from(messages));
    eprintln!(
        "{crashes}; {} deliveries of {messages} messages; {} commits were ambiguous (went through, then reported as Duplicate by the retry)",
        stream.total,
        u64::from(messages) - seen.applied
    );
    assert_eq!(balances(pool).await, stream.oracle);
    assert_eq!(records(pool).await, i64::from(messages));
}

/// One message, its commit cut after and before it reached the server: the caller gets a
/// transient I/O error, and the redelivery is `Duplicate` when the commit went through and
/// `Applied` when it did not; each effect is there exactly once.
pub async fn ambiguous_commit(pool: &Pool<Db>) {
    create_tables(pool).await;
    let (proxy, proxied) = proxied(pool).await;
    for (cut, id, committed) in [
        (Cut::AfterCommit, "amb-after", true),
        (Cut::BeforeCommit, "amb-before", false),
    ] {
        let msg = Credit {
            id: id.into(),
            account: if committed { 1 } else { 2 },
            amount: 10,
        };
        proxy.arm(cut);
        let err = credit(&proxied, &msg)
            .await
            .expect_err("the commit was cut");
        assert!(
            matches!(err, Error::Store(sqlx::Error::Io(_))),
            "{cut:?}: expected a store I/O error, got {err:?}"
        );
        assert!(err.is_transient(), "{cut:?}: {err:?} must be transient");
        eprintln!("{cut:?}: the caller sees: {err}");
        // What the server did, read directly.
        assert_eq!(record_of(pool, id).await, i64::from(committed), "{cut:?}");

        // The redelivery (through the proxy, disarmed) tells the caller which it was.
        let again = idem::retry(RetryPolicy::default(), || credit(&proxied, &msg))
            .await
            .unwrap();
        let expected = if committed {
            Outcome::Duplicate
        } else {
            Outcome::Applied(())
        };
        assert_eq!(again, expected, "{cut:?}");
    }
    let (twice, distinct) = applications(pool).await;
    assert!(twice.is_empty(), "{twice:?}");
    assert_eq!(distinct, 2);
    assert_eq!(balances(pool).await, HashMap::from([(1, 10), (2, 10)]));
    proxied.close().await;
}

/// The same for an `idem::batch` of 20 messages: the batch returns the I/O error, and the
/// redelivered batch is all `Duplicate` or all `Applied`.
pub async fn ambiguous_batch_commit(pool: &Pool<Db>) {
    create_tables(pool).await;
    let (proxy, proxied) = proxied(pool).await;
    for (cut, prefix, account, committed) in [
        (Cut::AfterCommit, "bat-after", 1, true),
        (Cut::BeforeCommit, "bat-before", 2, false),
    ] {
        let batch: Vec<Credit> = (0..20)
            .map(|i| Credit {
                id: format!("{prefix}-{i}"),
                account,
                amount: 1,
            })
            .collect();
        proxy.arm(cut);
        let err = idem::batch(&proxied, &batch, async |b, msg| credit(b, msg).await)
            .await
            .expect_err("the commit was cut");
        assert!(
            matches!(err, sqlx::Error::Io(_)),
            "{cut:?}: expected an I/O error, got {err:?}"
        );
        assert!(err.is_transient(), "{cut:?}: {err:?} must be transient");
        eprintln!("{cut:?} (batch of 20): the caller sees: {err}");
        for msg in &batch {
            let recorded = record_of(pool, &msg.id).await;
            assert_eq!(recorded, i64::from(committed), "{cut:?} {}", msg.id);
        }

        // The redelivered batch tells which it was, message by message.
        let again = idem::batch(&proxied, &batch, async |b, msg| credit(b, msg).await)
            .await
            .unwrap();
        for (msg, result) in batch.iter().zip(again) {
            let expected = if committed {
                Outcome::Duplicate
            } else {
                Outcome::Applied(())
            };
            assert_eq!(result.unwrap(), expected, "{cut:?} {}", msg.id);
        }
    }
    let (twice, distinct) = applications(pool).await;
    assert!(twice.is_empty(), "{twice:?}");
    assert_eq!(distinct, 40);
    assert_eq!(balances(pool).await, HashMap::from([(1, 20), (2, 20)]));
    proxied.close().await;
}

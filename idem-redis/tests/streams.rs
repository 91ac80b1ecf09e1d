//! Redis Streams through idem's consumer loop, on the real local Redis (`IDEM_REDIS_URL`,
//! default `redis://127.0.0.1:6379`) and SQLite: each test uses streams of its own and deletes
//! them, and asserts the database and the stream (pending entries, dead letters) at the end.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt as _;
use idem::consume::Consumer;
use idem::redis::Source;
use idem::sqlx::{Sqlite, SqlitePool};
use idem::{idempotent, Tx};
use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    id: String,
    account: i64,
    amount: i64,
    #[serde(default)]
    fail: bool,
}

#[idempotent(key = "msg.id", scope = "redis::credit")]
async fn apply(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), String> {
    if msg.fail {
        return Err(format!("{} always fails", msg.id));
    }
    sqlx::query("INSERT INTO applied (msg_id) VALUES (?1)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO balances (account, balance) VALUES (?1, ?2) \
         ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

fn url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Streams of this test's own, deleted on drop; `None` (with why) without a Redis server.
struct Streams {
    conn: redis::aio::MultiplexedConnection,
    name: String,
}

impl Streams {
    async fn new(test: &str) -> Option<Streams> {
        let connected = async {
            let client = redis::Client::open(url())?;
            client.get_multiplexed_async_connection().await
        };
        let conn = match connected.await {
            Ok(conn) => conn,
            Err(err) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: no Redis at {} ({err}); set IDEM_REDIS_URL", url());
                return None;
            }
            Err(err) => panic!(
                "CI must run the Redis tests, but {} did not answer: {err}",
                url()
            ),
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("idem_test:{test}:{}:{nanos}", std::process::id());
        Some(Streams { conn, name })
    }

    fn dead(&self) -> String {
        format!("{}:dead", self.name)
    }

    async fn publish(&self, payload: &[u8]) -> String {
        let mut conn = self.conn.clone();
        conn.xadd(&self.name, "*", &[("payload", payload)])
            .await
            .unwrap()
    }

    async fn len(&self) -> usize {
        self.conn.clone().xlen(&self.name).await.unwrap()
    }

    async fn pending(&self, group: &str) -> usize {
        let reply: redis::streams::StreamPendingReply =
            self.conn.clone().xpending(&self.name, group).await.unwrap();
        reply.count()
    }

    /// The dead letters: (payload, reason, deliveries).
    async fn dead_letters(&self) -> Vec<(String, String, String)> {
        let reply: redis::streams::StreamRangeReply =
            self.conn.clone().xrange_all(self.dead()).await.unwrap();
        reply
            .ids
            .iter()
            .map(|e| {
                (
                    e.get("payload").unwrap_or_default(),
                    e.get(idem::redis::headers::REASON).unwrap_or_default(),
                    e.get(idem::redis::headers::DELIVERIES).unwrap_or_default(),
                )
            })
            .collect()
    }

    async fn delete(self) {
        let mut conn = self.conn.clone();
        let _: redis::RedisResult<i64> = conn.del(&[&self.name, &self.dead()]).await;
    }
}

async fn database() -> SqlitePool {
    let path = common::temp_db("idem_redis");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    for sql in [
        "CREATE TABLE applied (msg_id TEXT NOT NULL)",
        "CREATE TABLE balances (account INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    pool
}

async fn applied(pool: &SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT msg_id) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn balances(pool: &SqlitePool) -> BTreeMap<i64, i64> {
    sqlx::query_as::<_, (i64, i64)>("SELECT account, balance FROM balances")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Resolves once `distinct` messages are applied and nothing is pending in `group` (or after
/// 30 s, so a broken run ends and its assertions say why).
async fn settled(pool: SqlitePool, streams: &Streams, group: &str, distinct: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if applied(&pool).await.1 >= distinct && streams.pending(group).await == 0 {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_in_the_stream_apply_once_and_every_entry_is_acked() {
    let Some(streams) = Streams::new("once").await else {
        return;
    };
    let pool = database().await;
    let mut oracle = BTreeMap::new();
    let mut entries = 0;
    for i in 0..400 {
        let msg = Credit {
            id: format!("r{i}"),
            account: i % 5,
            amount: i + 1,
            fail: false,
        };
        *oracle.entry(msg.account).or_insert(0) += msg.amount;
        let bytes = serde_json::to_vec(&msg).unwrap();
        streams.publish(&bytes).await;
        entries += 1;
        if i % 3 == 0 {
            streams.publish(&bytes).await; // the producer retried: same message, new entry
            entries += 1;
        }
    }
    let source = Source::builder(url(), &streams.name, "billing", "w1")
        .prefetch(50)
        .block(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(2)
        .run(
            source.deliveries(),
            idem::consume::json::<Credit>,
            async |b, msg| apply(b, msg).await,
            settled(pool.clone(), &streams, "billing", 400),
        )
        .await;
    assert_eq!(counts.applied, 400, "{counts:?}");
    assert_eq!(counts.applied + counts.duplicate, entries);
    assert_eq!(applied(&pool).await, (400, 400));
    assert_eq!(balances(&pool).await, oracle);
    assert_eq!(streams.pending("billing").await, 0);
    assert_eq!(streams.len().await as u64, entries);
    streams.delete().await;
}

#[tokio::test]
async fn poison_goes_to_the_dead_stream_after_max_deliveries_and_garbage_at_once() {
    let Some(streams) = Streams::new("poison").await else {
        return;
    };
    let pool = database().await;
    let ok = |id: &str| {
        serde_json::to_vec(&Credit {
            id: id.into(),
            account: 1,
            amount: 1,
            fail: false,
        })
        .unwrap()
    };
    let poison = serde_json::to_vec(&Credit {
        id: "poison".into(),
        account: 2,
        amount: 50,
        fail: true,
    })
    .unwrap();
    streams.publish(&ok("a")).await;
    streams.publish(&poison).await;
    streams.publish(b"{not json").await;
    streams.publish(&ok("b")).await;
    let source = Source::builder(url(), &streams.name, "billing", "w1")
        .block(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let stop = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if streams.pending("billing").await == 0 && applied(&pool).await.1 == 2 {
                return;
            }
        }
    };
    let counts = Consumer::new(pool.clone())
        .batch(4)
        .max_deliveries(3)
        .retry_delay(Duration::from_millis(10), Duration::from_millis(40))
        .run(
            source.deliveries(),
            idem::consume::json::<Credit>,
            async |b, msg| apply(b, msg).await,
            stop,
        )
        .await;
    let dead = streams.dead_letters().await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].1, "undecodable");
    assert_eq!(dead[0].0, "{not json");
    assert_eq!(dead[1].1, "too_many_deliveries");
    assert_eq!(dead[1].2, "4");
    assert_eq!(counts.failed, 3);
    assert_eq!(applied(&pool).await, (2, 2));
    assert_eq!(balances(&pool).await, BTreeMap::from([(1, 2)]));
    assert_eq!(streams.pending("billing").await, 0);
    streams.delete().await;
}

#[tokio::test]
async fn entries_a_dead_consumer_left_pending_are_taken_over_and_apply_once() {
    let Some(streams) = Streams::new("takeover").await else {
        return;
    };
    let pool = database().await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let msg = Credit {
            id: format!("t{i}"),
            account: 1,
            amount: 1,
            fail: false,
        };
        ids.push(streams.publish(&serde_json::to_vec(&msg).unwrap()).await);
    }
    // Consumer "dead" reads every entry and dies before settling any of them.
    {
        let dead = Source::builder(url(), &streams.name, "billing", "dead")
            .block(Duration::from_millis(20))
            .connect()
            .await
            .unwrap();
        let mut taken = Box::pin(dead.deliveries());
        for _ in 0..6 {
            let delivery = taken.next().await.unwrap().unwrap();
            std::mem::forget(delivery); // never settled
        }
    }
    assert_eq!(streams.pending("billing").await, 6);
    let source = Source::builder(url(), &streams.name, "billing", "heir")
        .block(Duration::from_millis(20))
        .claim_idle(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let counts = Consumer::new(pool.clone())
        .batch(10)
        .max_deliveries(5)
        .run(
            source.deliveries(),
            idem::consume::json::<Credit>,
            async |b, msg| apply(b, msg).await,
            settled(pool.clone(), &streams, "billing", 6),
        )
        .await;
    assert_eq!(counts.applied, 6, "{counts:?}");
    assert_eq!(applied(&pool).await, (6, 6));
    assert_eq!(streams.pending("billing").await, 0);
    // Taken over under their own ids: nothing was added to the stream.
    assert_eq!(streams.len().await, 6);
    assert!(streams.dead_letters().await.is_empty());
    streams.delete().await;
}

//! An order-status consumer on Redis Streams and SQLite, through idem's consumer loop.
//!
//! ```text
//! cargo run --example redis_streams --features sqlite,redis     # needs Redis on 127.0.0.1:6379
//! ```
//!
//! A producer appends status changes to a stream of its own: every order goes placed → paid →
//! packed → shipped, but some entries are appended twice (a producer's retry) and some
//! neighbours swapped (reordering). Two consumers of one group take batches, a
//! `key + version + entity` handler applies each change once and ignores stale ones, and the
//! final table is checked against what exactly-once, in-order processing gives. It exits
//! non-zero on a mismatch, and says what to start when no Redis answers.

use std::collections::BTreeMap;
use std::time::Duration;

use idem::consume::{Consumer, Counts};
use idem::redis::Source;
use idem::{idempotent, Tx};
use redis::AsyncCommands as _;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StatusChanged {
    event_id: String,
    order_id: i64,
    version: i64,
    status: String,
}

#[idempotent(
    key = "msg.event_id",
    version = "msg.version",
    entity = "msg.order_id",
    scope = "redis_example::status"
)]
async fn on_status(tx: &mut Tx<'_, Sqlite>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO orders (id, status, version) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version",
    )
    .bind(msg.order_id)
    .bind(&msg.status)
    .bind(msg.version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

const STATUSES: [&str; 4] = ["placed", "paid", "packed", "shipped"];
const ORDERS: i64 = 200;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.as_str())?;
    let mut conn = match client.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("no Redis at {url} ({err}).\nStart one: redis-server --daemonize yes --port 6379 (or set IDEM_REDIS_URL)");
            std::process::exit(2);
        }
    };
    let stream = format!("idem_example:orders:{}", std::process::id());

    // The producer: every change once, 25% again, and neighbours swapped now and then.
    let mut events = Vec::new();
    for order in 0..ORDERS {
        for (v, status) in STATUSES.iter().enumerate() {
            events.push(StatusChanged {
                event_id: format!("o{order}-v{v}"),
                order_id: order,
                version: v as i64 + 1,
                status: (*status).to_string(),
            });
        }
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut stream_of = Vec::new();
    for event in &events {
        stream_of.push(event.clone());
        if random(4) == 0 {
            stream_of.push(event.clone());
        }
    }
    for i in 1..stream_of.len() {
        if random(5) == 0 {
            stream_of.swap(i - 1, i);
        }
    }
    for event in &stream_of {
        let _: String = conn
            .xadd(
                &stream,
                "*",
                &[(idem::redis::headers::PAYLOAD, serde_json::to_vec(event)?)],
            )
            .await?;
    }

    let pool = database().await?;
    // Two consumers of one group, as two processes would be; each stops once the group has
    // read every entry and has nothing pending.
    let total = stream_of.len() as u64;
    let a = run_consumer(&pool, &client, &url, &stream, "a", total);
    let b = run_consumer(&pool, &client, &url, &stream, "b", total);
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a?, b?);
    let _: i64 = conn.del(&stream).await?;

    let applied = a.applied + b.applied;
    let skipped = a.duplicate + b.duplicate + a.stale + b.stale;
    println!(
        "{} entries for {} changes of {ORDERS} orders: applied {applied}, duplicate {}, stale {}, consumer a took {}, b took {}",
        total,
        events.len(),
        a.duplicate + b.duplicate,
        a.stale + b.stale,
        a.settled(),
        b.settled()
    );
    let got: BTreeMap<i64, (String, i64)> =
        sqlx::query_as::<_, (i64, String, i64)>("SELECT id, status, version FROM orders")
            .fetch_all(&pool)
            .await?
            .into_iter()
            .map(|(id, status, version)| (id, (status, version)))
            .collect();
    let expected: BTreeMap<i64, (String, i64)> = (0..ORDERS)
        .map(|id| (id, ("shipped".to_string(), STATUSES.len() as i64)))
        .collect();
    if got != expected || applied + skipped != total {
        eprintln!("MISMATCH: the orders table differs from exactly-once, in-order processing");
        std::process::exit(1);
    }
    println!("every order is shipped at version 4: the same as exactly-once, in-order processing");
    let path = pool.connect_options().get_filename().to_path_buf();
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    Ok(())
}

async fn run_consumer(
    pool: &SqlitePool,
    client: &redis::Client,
    url: &str,
    stream: &str,
    name: &str,
    total: u64,
) -> Result<Counts, idem::redis::Error> {
    let source = Source::builder(url, stream, "orders", name)
        .prefetch(50)
        .block(Duration::from_millis(50))
        .connect()
        .await?;
    let counts = Consumer::new(pool.clone())
        .batch(50)
        .concurrency(2)
        .run(
            source.deliveries(),
            idem::consume::json::<StatusChanged>,
            async |b, msg| on_status(b, msg).await,
            drained(client.clone(), stream.to_string(), total),
        )
        .await;
    source.close().await?; // stop reading: anything read and not settled stays pending
    Ok(counts)
}

/// Resolves once the group has read all `total` entries and has nothing pending.
async fn drained(client: redis::Client, stream: String, total: u64) {
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let groups: redis::streams::StreamInfoGroupsReply = match conn.xinfo_groups(&stream).await {
            Ok(groups) => groups,
            Err(_) => return,
        };
        let Some(group) = groups.groups.into_iter().find(|g| g.name == "orders") else {
            continue;
        };
        let read = group.entries_read.unwrap_or(0) as u64;
        if read >= total && group.pending == 0 {
            return;
        }
    }
}

async fn database() -> Result<SqlitePool, sqlx::Error> {
    let path = std::env::temp_dir().join(format!("idem_redis_example_{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    idem::migrate(&pool).await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

//! The durable log of the consumer-crash tests (`crash`, `crowd`): its messages, how a log is
//! made (distinct messages, neighbours swapped, copies inserted later), the oracle of one
//! consumer applying it in order exactly once, and, per backend, the log's tables, its handlers,
//! its consumer process and the checks of the database against the oracle (`log_db.rs`).

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::Rng;

/// A message of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Key only: credit `amount` to `account`.
    Credit {
        id: String,
        account: i64,
        amount: i64,
    },
    /// Key + version + entity: order `order` moves to status `v{version}`.
    Status {
        id: String,
        order: i64,
        version: i64,
    },
}

impl Msg {
    pub fn id(&self) -> &str {
        match self {
            Msg::Credit { id, .. } | Msg::Status { id, .. } => id,
        }
    }

    /// Its row's kind, `a` (the account or the order) and `b` (the amount or the version).
    fn columns(&self) -> (&'static str, i64, i64) {
        match self {
            Msg::Credit {
                account, amount, ..
            } => ("credit", *account, *amount),
            Msg::Status { order, version, .. } => ("status", *order, *version),
        }
    }
}

/// One entry of the durable log; `first_copy` is false for a redelivery of an earlier entry.
#[derive(Clone, Debug)]
pub struct Entry {
    pub seq: i64,
    pub msg: Msg,
    pub first_copy: bool,
}

/// `count` distinct messages: 60% credits to 50 accounts (`c<n>`), 40% status changes of
/// `orders` orders (`s<n>`), each order's versions 1, 2, ... in this order.
pub fn distinct(rng: &mut StdRng, count: usize, orders: i64) -> Vec<Msg> {
    let mut next_version: BTreeMap<i64, i64> = BTreeMap::new();
    (0..count)
        .map(|i| {
            if rng.random_bool(0.6) {
                Msg::Credit {
                    id: format!("c{i}"),
                    account: rng.random_range(0..50),
                    amount: rng.random_range(1..1_000),
                }
            } else {
                let order = rng.random_range(0..orders);
                let version = next_version.entry(order).or_default();
                *version += 1;
                Msg::Status {
                    id: format!("s{i}"),
                    order,
                    version: *version,
                }
            }
        })
        .collect()
}

/// Swaps `count` pairs of messages up to `distance` apart, so versions arrive out of order.
pub fn swap_neighbours(rng: &mut StdRng, msgs: &mut [Msg], count: usize, distance: usize) {
    for _ in 0..count {
        let i = rng.random_range(0..msgs.len() - distance);
        let j = i + rng.random_range(1..=distance);
        msgs.swap(i, j);
    }
}

/// Status changes that arrive after a newer version of their order.
pub fn behind_newer<'a>(msgs: impl IntoIterator<Item = &'a Msg>) -> usize {
    let mut newest: BTreeMap<i64, i64> = BTreeMap::new();
    let mut behind = 0;
    for msg in msgs {
        if let Msg::Status { order, version, .. } = msg {
            let at = newest.entry(*order).or_default();
            if *version < *at {
                behind += 1;
            }
            *at = (*at).max(*version);
        }
    }
    behind
}

/// The log: `msgs` with `copies` copies of random ones (a broker's redeliveries), each inserted
/// up to 400 messages after its original, numbered from 1.
pub fn with_copies(rng: &mut StdRng, msgs: Vec<Msg>, copies: usize) -> Vec<Entry> {
    // Each copy goes in before the message at index `j` (or at the end).
    let mut inserted: Vec<(usize, Msg)> = (0..copies)
        .map(|_| {
            let i = rng.random_range(0..msgs.len());
            let j = rng.random_range(i + 1..=(i + 400).min(msgs.len()));
            (j, msgs[i].clone())
        })
        .collect();
    inserted.sort_by_key(|(j, _)| *j);
    let mut inserted = inserted.into_iter().peekable();
    let mut log = Vec::with_capacity(msgs.len() + copies);
    for (at, msg) in msgs.into_iter().enumerate() {
        while let Some((_, copy)) = inserted.next_if(|(j, _)| *j == at) {
            log.push(copy);
        }
        log.push(msg);
    }
    log.extend(inserted.map(|(_, copy)| copy));
    let mut seen = BTreeSet::new();
    log.into_iter()
        .enumerate()
        .map(|(n, msg)| Entry {
            seq: n as i64 + 1,
            first_copy: seen.insert(msg.id().to_string()),
            msg,
        })
        .collect()
}

/// What one consumer reading the log in order, applying each message exactly once, ends with.
#[derive(Debug, Default)]
pub struct Oracle {
    /// The messages applied: every credit, and the status changes newer than their order's.
    pub applied: BTreeSet<String>,
    pub credits: BTreeSet<String>,
    pub balances: BTreeMap<i64, i64>,
    /// Each order's status and version: its newest.
    pub orders: BTreeMap<i64, (String, i64)>,
    /// The message of each order's newest status.
    pub newest: BTreeMap<i64, String>,
    pub duplicates: usize,
    pub stale: usize,
}

impl Oracle {
    pub fn of(log: &[Entry]) -> Oracle {
        let mut o = Oracle::default();
        for entry in log {
            let id = entry.msg.id().to_string();
            if o.applied.contains(&id) {
                o.duplicates += 1;
                continue;
            }
            match &entry.msg {
                Msg::Credit {
                    account, amount, ..
                } => {
                    *o.balances.entry(*account).or_default() += amount;
                    o.credits.insert(id.clone());
                }
                Msg::Status { order, version, .. } => {
                    if o.orders.get(order).is_some_and(|(_, at)| at >= version) {
                        o.stale += 1;
                        continue;
                    }
                    o.orders.insert(*order, (format!("v{version}"), *version));
                    o.newest.insert(*order, id.clone());
                }
            }
            o.applied.insert(id);
        }
        o
    }
}

#[cfg(feature = "sqlite")]
pub mod sqlite {
    type Db = sqlx::Sqlite;

    /// A new SQLite file for the test; its path is what the consumer is told.
    pub async fn database() -> Option<(sqlx::Pool<Db>, String)> {
        let path = crate::common::temp_db("idem_log");
        let pool = crate::common::sqlite_file(&path).await;
        Some((pool, path.to_string_lossy().into_owned()))
    }

    /// A consumer's connection to that file (a killed consumer holds no lock of it).
    async fn connect(location: &str, _share: i64) -> sqlx::Pool<Db> {
        crate::common::sqlite_file(std::path::Path::new(location)).await
    }

    pub async fn release(pool: sqlx::Pool<Db>, location: &str) {
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{location}{suffix}"));
        }
    }

    include!("log_db.rs");
}

#[cfg(feature = "postgres")]
pub mod postgres {
    type Db = sqlx::Postgres;

    /// A new schema for the test; its name is what the consumers are told.
    pub async fn database() -> Option<(sqlx::Pool<Db>, String)> {
        let pool = crate::common::postgres().await?;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await
            .unwrap();
        Some((pool, schema))
    }

    /// A consumer's connection to that schema, once the connections of the consumer of this
    /// share that was killed before it are gone: a killed consumer's server process still
    /// finishes the statement it was running (its last acknowledgement, say) before it sees
    /// that the client is gone, and this one must read the offsets after that.
    async fn connect(location: &str, share: i64) -> sqlx::Pool<Db> {
        let name = format!("idem_log_{location}_{share}");
        let options: sqlx::postgres::PgConnectOptions =
            crate::common::postgres_url().parse().unwrap();
        let options = options
            .options([("search_path", location)])
            .application_name(&name);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        for _ in 0..1_000 {
            let left: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
            )
            .bind(&name)
            .fetch_one(&pool)
            .await
            .unwrap();
            if left == 0 {
                return pool;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the connections of a killed consumer of {name} are still there after 10 s");
    }

    pub async fn release(pool: sqlx::Pool<Db>, _location: &str) {
        crate::common::drop_postgres(pool).await;
    }

    include!("log_db.rs");
}

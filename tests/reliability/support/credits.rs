//! The credits of the database-failure tests (`database_postgres`, `database_mariadb`): a
//! stream of credits with copies, its oracle, and, per backend (`credits_db.rs`), the handler
//! that applies one, the checks of its tables, the pool and the workers of a server-crash run,
//! and the ambiguous-commit tests through a [`Proxy`](super::proxy::Proxy).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rand::Rng as _;

#[derive(Debug, Clone)]
pub struct Credit {
    pub id: String,
    pub account: i64,
    pub amount: i64,
}

/// What the workers of a server-crash run take their messages from, and what they must end
/// with.
pub struct Stream {
    /// Every message once, 30% of them again, shuffled.
    pub queue: Arc<Mutex<VecDeque<Credit>>>,
    /// Distinct messages: 100,000 with `IDEM_SOAK=1`, else 3,000.
    pub messages: u32,
    /// Deliveries, copies included.
    pub total: usize,
    /// The balance of each account once every message is applied once.
    pub oracle: HashMap<i64, i64>,
}

impl Stream {
    pub fn new() -> Stream {
        let messages: u32 = if super::soak() { 100_000 } else { 3_000 };
        let mut rng = rand::rng();
        let mut stream: Vec<Credit> = (0..messages)
            .map(|i| Credit {
                id: format!("m{i}"),
                account: i64::from(i % 50),
                amount: i64::from(i % 9 + 1),
            })
            .collect();
        let mut oracle: HashMap<i64, i64> = HashMap::new();
        for msg in &stream {
            *oracle.entry(msg.account).or_default() += msg.amount;
        }
        let again: Vec<Credit> = stream
            .iter()
            .filter(|_| rng.random_bool(0.3))
            .cloned()
            .collect();
        stream.extend(again);
        for i in (1..stream.len()).rev() {
            stream.swap(i, rng.random_range(0..=i));
        }
        Stream {
            total: stream.len(),
            queue: Arc::new(Mutex::new(VecDeque::from(stream))),
            messages,
            oracle,
        }
    }
}

impl Stream {
    /// `messages` distinct messages, each once, in order (no copies): for a test that must know
    /// whether a redelivery found its message's own commit, not a copy's.
    pub fn distinct(messages: u32) -> Stream {
        let stream: Vec<Credit> = (0..messages)
            .map(|i| Credit {
                id: format!("m{i}"),
                account: i64::from(i % 50),
                amount: i64::from(i % 9 + 1),
            })
            .collect();
        let mut oracle: HashMap<i64, i64> = HashMap::new();
        for msg in &stream {
            *oracle.entry(msg.account).or_default() += msg.amount;
        }
        Stream {
            total: stream.len(),
            queue: Arc::new(Mutex::new(VecDeque::from(stream))),
            messages,
            oracle,
        }
    }
}

/// The retries of a server-crash run: `attempts`, from 20 ms apart to 500 ms apart, enough to
/// wait out a restart and the server's recovery.
pub fn patient(attempts: u32) -> idem::RetryPolicy {
    idem::RetryPolicy {
        attempts,
        first_delay: std::time::Duration::from_millis(20),
        max_delay: std::time::Duration::from_millis(500),
    }
}

/// What the workers of a server-crash run saw: `Applied`, `Duplicate`, and the errors left to
/// them by `idem::retry`.
#[derive(Debug, Default)]
pub struct Seen {
    pub applied: u64,
    pub duplicate: u64,
    pub errors: Vec<String>,
}

#[cfg(feature = "postgres")]
pub mod postgres {
    use sqlx::postgres::{PgConnectOptions, PgPool, PgSslMode};

    use crate::support::proxy::Protocol;

    type Db = sqlx::Postgres;
    const PROTOCOL: Protocol = Protocol::Postgres;
    const IN_THE_CLEAR: PgSslMode = PgSslMode::Disable;
    const ADD_TO_BALANCE: &str = "INSERT INTO balances (account, balance) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET balance = balances.balance + EXCLUDED.balance";

    /// The options of a connection of its own to the schema of `pool`.
    async fn options(pool: &PgPool) -> PgConnectOptions {
        crate::common::postgres_options(pool, &[]).await
    }

    include!("credits_db.rs");
}

#[cfg(feature = "mysql")]
pub mod mysql {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlSslMode};

    use crate::support::proxy::Protocol;

    type Db = sqlx::MySql;
    const PROTOCOL: Protocol = Protocol::MySql;
    const IN_THE_CLEAR: MySqlSslMode = MySqlSslMode::Disabled;
    const ADD_TO_BALANCE: &str = "INSERT INTO balances (account, balance) VALUES ($1, $2) \
         ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)";

    /// The options of a connection of its own to the database of `pool`.
    async fn options(pool: &MySqlPool) -> MySqlConnectOptions {
        crate::common::mysql_options(pool).await
    }

    include!("credits_db.rs");
}

/// Sets its flag if dropped while its thread panics: a crasher's, so that the workers stop
/// retrying against a server nobody will restart.
pub struct SetOnPanic(pub Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

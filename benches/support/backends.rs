//! The backends: a SQLite file (WAL, `synchronous=FULL`), a schema of its own on the PostgreSQL
//! server (`IDEM_POSTGRES_URL`) and, with feature `mysql`, a database of its own on the MySQL /
//! MariaDB server (`IDEM_MYSQL_URL`), each migrated and removed at the end; the bench tables; and
//! [`with_db`] / [`with_tables`], which run a bench on one of them and remove it, whatever
//! happened.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Database, Executor, PgPool, Pool, Postgres, Sqlite, SqlitePool};

use super::round_trips::count_acquire;
use super::workload::ACCOUNTS;

/// A backend's database for one bench run.
pub trait BenchDb: Sized {
    type Database: Database;

    /// A database of its own with `connections` connections, migrated.
    fn open(connections: u32) -> impl Future<Output = anyhow::Result<Self>>;

    fn pool(&self) -> &Pool<Self::Database>;

    /// The bench tables (below), on its pool.
    fn create_tables(pool: &Pool<Self::Database>) -> impl Future<Output = anyhow::Result<()>>;

    /// Closes the pool and removes the database.
    fn close(self) -> impl Future<Output = ()>;
}

/// Opens a `D` with `connections` connections, runs `bench` on its pool, and removes it whatever
/// `bench` returned.
pub async fn with_db<D: BenchDb, T>(
    connections: u32,
    bench: impl AsyncFnOnce(&Pool<D::Database>) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let db = D::open(connections).await?;
    let result = bench(db.pool()).await;
    db.close().await;
    result
}

/// [`with_db`], with the bench tables created first.
pub async fn with_tables<D: BenchDb, T>(
    connections: u32,
    bench: impl AsyncFnOnce(&Pool<D::Database>) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    with_db::<D, T>(connections, async |pool| {
        D::create_tables(pool).await?;
        bench(pool).await
    })
    .await
}

/// A pool of `connections` that counts each acquire (a pool ping: a round trip).
fn counting<DB: Database>(connections: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(connections)
        .before_acquire(|_, _| {
            Box::pin(async {
                count_acquire();
                Ok(true)
            })
        })
}

/// Runs `sql` (creating the run's schema or database) on a connection of its own to `url`.
async fn create<DB: Database>(url: &str, server: &str, sql: String) -> anyhow::Result<()>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let admin = Pool::<DB>::connect(url)
        .await
        .with_context(|| format!("no {server} at {url}"))?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(())
}

/// Drops `what` (the run's schema or database) with `sql`, then closes `pool`.
async fn drop_and_close<DB: Database>(pool: &Pool<DB>, what: String, sql: String)
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if let Err(err) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(pool).await {
        eprintln!("could not drop {what}: {err}");
    }
    pool.close().await;
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// `synchronous=FULL` (durable commits) unless `BENCH_SQLITE_SYNCHRONOUS` says `normal` or `off`
/// (to see the CPU cost without the fsync; those figures are not durable).
fn sqlite_synchronous() -> SqliteSynchronous {
    match std::env::var("BENCH_SQLITE_SYNCHRONOUS").as_deref() {
        Ok("off") => SqliteSynchronous::Off,
        Ok("normal") => SqliteSynchronous::Normal,
        _ => SqliteSynchronous::Full,
    }
}

/// A SQLite file in WAL mode with durable commits (`synchronous=FULL`), migrated.
pub struct SqliteDb {
    pub pool: SqlitePool,
    path: std::path::PathBuf,
}

impl SqliteDb {
    pub async fn open(connections: u32) -> anyhow::Result<Self> {
        Self::open_with(connections, sqlite_synchronous()).await
    }

    /// With the given `synchronous` (the outbox benches commit with `NORMAL`, as the broker
    /// crates' tests did where they were first measured).
    pub async fn open_with(
        connections: u32,
        synchronous: SqliteSynchronous,
    ) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("{}.db", unique("idem_bench")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(30));
        let pool = counting::<Sqlite>(connections)
            .connect_with(options)
            .await?;
        idem::migrate(&pool).await?;
        Ok(SqliteDb { pool, path })
    }

    pub async fn close(self) {
        self.pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A schema of its own on the PostgreSQL server, migrated; dropped by `close`.
pub struct PostgresDb {
    pub pool: PgPool,
    pub schema: String,
}

impl PostgresDb {
    pub async fn open(connections: u32) -> anyhow::Result<Self> {
        let schema = unique("idem_bench");
        let sql = format!("CREATE SCHEMA {schema}");
        create::<Postgres>(&postgres_url(), "PostgreSQL", sql).await?;
        let db = PostgresDb {
            pool: Self::pool_in(&schema, connections).await?,
            schema,
        };
        idem::migrate(&db.pool).await?;
        Ok(db)
    }

    pub async fn pool_in(schema: &str, connections: u32) -> anyhow::Result<PgPool> {
        let options: PgConnectOptions = postgres_url().parse()?;
        let options = options.options([("search_path", schema)]);
        Ok(counting(connections).connect_with(options).await?)
    }

    pub async fn close(self) {
        let (what, sql) = (
            format!("schema {}", self.schema),
            format!("DROP SCHEMA {} CASCADE", self.schema),
        );
        drop_and_close(&self.pool, what, sql).await;
    }
}

/// `BenchDb` for a backend's database type, from its inherent `open`, `close` and its tables.
macro_rules! bench_db {
    ($db:ty, $database:ty, $tables:ident) => {
        impl BenchDb for $db {
            type Database = $database;
            fn open(connections: u32) -> impl Future<Output = anyhow::Result<Self>> {
                <$db>::open(connections)
            }
            fn pool(&self) -> &Pool<$database> {
                &self.pool
            }
            fn create_tables(pool: &Pool<$database>) -> impl Future<Output = anyhow::Result<()>> {
                $tables(pool)
            }
            fn close(self) -> impl Future<Output = ()> {
                <$db>::close(self)
            }
        }
    };
}

bench_db!(SqliteDb, Sqlite, create_tables_sqlite);
bench_db!(PostgresDb, Postgres, create_tables_postgres);
#[cfg(feature = "mysql")]
bench_db!(MySqlDb, sqlx::MySql, create_tables_mysql);

/// The business table, the classic pattern's dedupe table (shaped like idem's records), and the
/// one-column table with its hand-written version table (the seed's pattern as users write it).
pub async fn create_tables_sqlite(pool: &SqlitePool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        "CREATE TABLE bench_processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
         processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
         PRIMARY KEY (consumer, message_id)) WITHOUT ROWID",
        "CREATE INDEX bench_processed_at ON bench_processed (processed_at)",
        // The seed's pattern as users write it: one column, no retention index.
        "CREATE TABLE processed_messages (message_id TEXT PRIMARY KEY)",
        // Its version check, by hand: one high-water mark per entity.
        "CREATE TABLE entity_versions (entity_id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1) \
         INSERT INTO bench_accounts (id, balance) SELECT i, 0 FROM n",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

/// The same tables on PostgreSQL.
pub async fn create_tables_postgres(pool: &PgPool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE bench_processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
         processed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (consumer, message_id))",
        "CREATE INDEX bench_processed_at ON bench_processed (processed_at)",
        // The seed's pattern as users write it: one column, no retention index.
        "CREATE TABLE processed_messages (message_id TEXT PRIMARY KEY)",
        // Its version check, by hand: one high-water mark per entity.
        "CREATE TABLE entity_versions (entity_id BIGINT PRIMARY KEY, version BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        "INSERT INTO bench_accounts (id, balance) SELECT i, 0 FROM generate_series(0, $1 - 1) AS i",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(feature = "mysql")]
fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// A database of its own on the MySQL / MariaDB server, migrated; dropped by `close`.
#[cfg(feature = "mysql")]
pub struct MySqlDb {
    pub pool: sqlx::MySqlPool,
    pub database: String,
}

#[cfg(feature = "mysql")]
impl MySqlDb {
    pub async fn open(connections: u32) -> anyhow::Result<Self> {
        let url = mysql_url();
        let database = unique("idem_bench");
        let sql = format!("CREATE DATABASE {database}");
        create::<sqlx::MySql>(&url, "MySQL/MariaDB", sql).await?;
        let options: sqlx::mysql::MySqlConnectOptions = url.parse()?;
        let pool = counting(connections)
            .connect_with(options.database(&database))
            .await?;
        let db = MySqlDb { pool, database };
        idem::migrate(&db.pool).await?;
        Ok(db)
    }

    pub async fn close(self) {
        let what = format!("database {}", self.database);
        let sql = format!("DROP DATABASE {}", self.database);
        drop_and_close(&self.pool, what, sql).await;
    }
}

/// The same tables on MySQL / MariaDB (InnoDB), the dedupe table keyed as idem's records are.
#[cfg(feature = "mysql")]
pub async fn create_tables_mysql(pool: &sqlx::MySqlPool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE = InnoDB",
        "CREATE TABLE bench_processed (consumer VARCHAR(255) NOT NULL, \
         message_id VARCHAR(255) NOT NULL, \
         processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
         PRIMARY KEY (consumer, message_id), INDEX bench_processed_at (processed_at)) ENGINE = InnoDB",
        // The seed's pattern as users write it: one column, no retention index.
        "CREATE TABLE processed_messages (message_id VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB",
        // Its version check, by hand: one high-water mark per entity.
        "CREATE TABLE entity_versions (entity_id BIGINT PRIMARY KEY, version BIGINT NOT NULL) \
         ENGINE = InnoDB",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        // Digits cross-joined, not a recursive CTE (MySQL 8 stops those at 1,000 levels).
        "INSERT INTO bench_accounts (id, balance) \
         SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS i, 0 \
         FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
               UNION ALL SELECT 8 UNION ALL SELECT 9) a, \
              (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
               UNION ALL SELECT 8 UNION ALL SELECT 9) b, \
              (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
               UNION ALL SELECT 8 UNION ALL SELECT 9) c, \
              (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
               UNION ALL SELECT 8 UNION ALL SELECT 9) e, \
              (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
               UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
               UNION ALL SELECT 8 UNION ALL SELECT 9) f \
         HAVING i < ?",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

//! The backends: a SQLite file (WAL, `synchronous=FULL`) and a schema of its own on the PostgreSQL
//! server (`IDEM_POSTGRES_URL`), both migrated and removed at the end; and the bench tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};

use super::round_trips::count_acquire;
use super::workload::ACCOUNTS;

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
        let path = std::env::temp_dir().join(format!("{}.db", unique("idem_bench")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sqlite_synchronous())
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .before_acquire(|_, _| {
                Box::pin(async {
                    count_acquire();
                    Ok(true)
                })
            })
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
        let url = postgres_url();
        let admin = PgPool::connect(&url)
            .await
            .with_context(|| format!("no PostgreSQL at {url}"))?;
        let schema = unique("idem_bench");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await?;
        admin.close().await;
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
        Ok(PgPoolOptions::new()
            .max_connections(connections)
            .before_acquire(|_, _| {
                Box::pin(async {
                    count_acquire();
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?)
    }

    pub async fn close(self) {
        let drop = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema
        )))
        .execute(&self.pool)
        .await;
        if let Err(err) = drop {
            eprintln!("could not drop schema {}: {err}", self.schema);
        }
        self.pool.close().await;
    }
}

/// The business table and the classic pattern's dedupe table (shaped like idem's records).
pub async fn create_tables_sqlite(pool: &SqlitePool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE bench_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        "CREATE TABLE bench_processed (consumer TEXT NOT NULL, message_id TEXT NOT NULL, \
         processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
         PRIMARY KEY (consumer, message_id)) WITHOUT ROWID",
        "CREATE INDEX bench_processed_at ON bench_processed (processed_at)",
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

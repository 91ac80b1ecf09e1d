//! Ready-made backends for idem's own databases: [`Sqlite`] (feature `sqlite`) and [`Postgres`]
//! (feature `postgres`).

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::{Backend, Dialect};

/// A name no other test, run or process uses: `prefix_<pid>_<nanos>_<n>`.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// SQLite: a new file in the temporary directory per rule (WAL, writers wait up to 30 s for
/// the lock, 8 connections), deleted afterwards. Never skips.
#[cfg(feature = "sqlite")]
pub struct Sqlite;

#[cfg(feature = "sqlite")]
impl Backend for Sqlite {
    type Db = sqlx::Sqlite;

    async fn setup() -> Option<sqlx::SqlitePool> {
        use sqlx::sqlite::{
            SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
        };
        let path = std::env::temp_dir().join(format!("{}.db", unique_name("idem_kit")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
        idem::migrate(&pool).await.unwrap();
        Some(pool)
    }

    async fn teardown(pool: sqlx::SqlitePool) {
        let path = pool.connect_options().get_filename().to_path_buf();
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }

    fn dialect() -> Dialect {
        Dialect::sqlite()
    }
}

/// PostgreSQL: the server of `IDEM_POSTGRES_URL` (default
/// `postgres://postgres@127.0.0.1:5432/test`), in a new schema per rule (`idem_t_…`, dropped
/// afterwards; schemas of runs that stopped early are dropped after an hour). Without a server it
/// skips, saying so; with `CI` set it panics. Invoke the suite on it with `absent(...)` (a cfg your
/// build script sets when `IDEM_POSTGRES_URL` is unset) for its rules to show as ignored then.
#[cfg(feature = "postgres")]
pub struct Postgres;

#[cfg(feature = "postgres")]
impl Postgres {
    /// The server: `IDEM_POSTGRES_URL`, default the local one.
    pub fn url() -> String {
        std::env::var("IDEM_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
    }

    /// Drops test schemas older than an hour (by the time in their name), once per process.
    async fn drop_stale_schemas(admin: &sqlx::PgPool) {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, SystemTime, UNIX_EPOCH};
        static DONE: AtomicBool = AtomicBool::new(false);
        if DONE.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(schemas) = sqlx::query_scalar::<_, String>(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'idem\\_t\\_%'",
        )
        .fetch_all(admin)
        .await
        else {
            return;
        };
        let hour_ago = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .saturating_sub(Duration::from_secs(3600))
            .as_nanos();
        for schema in schemas {
            // idem_t_<pid>_<nanos>_<n>
            let born = schema
                .split('_')
                .nth(3)
                .and_then(|n| n.parse::<u128>().ok());
            if born.is_some_and(|born| born < hour_ago) {
                // Another run may drop it at the same time: IF EXISTS, and errors do not matter.
                // The name was read from pg_namespace and matched the test pattern.
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE"
                )))
                .execute(admin)
                .await;
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl Backend for Postgres {
    type Db = sqlx::Postgres;

    async fn setup() -> Option<sqlx::PgPool> {
        use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
        use std::sync::atomic::{AtomicBool, Ordering};
        // Once a rule of this process found no server, the others skip at once.
        static ABSENT: AtomicBool = AtomicBool::new(false);
        let url = Self::url();
        let in_ci = std::env::var_os("CI").is_some();
        if ABSENT.load(Ordering::Relaxed) && !in_ci {
            eprintln!("skipped: no PostgreSQL at {url}; set IDEM_POSTGRES_URL to run this test");
            return None;
        }
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(&url)
            .await;
        let admin = match admin {
            Ok(admin) => admin,
            Err(err) if !in_ci => {
                ABSENT.store(true, Ordering::Relaxed);
                eprintln!(
                    "skipped: no PostgreSQL at {url} ({err}); set IDEM_POSTGRES_URL to run this test"
                );
                return None;
            }
            Err(err) => panic!("CI must run the PostgreSQL tests, but {url} did not answer: {err}"),
        };
        Self::drop_stale_schemas(&admin).await;
        let schema = unique_name("idem_t");
        // The schema name is made of a constant prefix and numbers.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let options: PgConnectOptions = url.parse().unwrap();
        let options = options.options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options)
            .await
            .unwrap();
        idem::migrate(&pool).await.unwrap();
        Some(pool)
    }

    async fn teardown(pool: sqlx::PgPool) {
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&pool)
            .await
            .unwrap();
        // Read back from the server: the name `setup` made.
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }

    fn dialect() -> Dialect {
        Dialect::postgres()
    }
}

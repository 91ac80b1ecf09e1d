//! Real databases for the tests beyond the behaviour suite: a SQLite file at a given path (which
//! child processes can share), a schema of its own on the PostgreSQL server (`idem-testkit`'s
//! backend) or a database of its own on the MariaDB server, the options of another connection to
//! either, and idem's tables read the same way on every backend ([`Stored`]).
#![allow(dead_code)] // each test binary uses a part of this module

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "postgres")]
use idem_testkit::Backend as _;
#[cfg(feature = "postgres")]
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
#[cfg(feature = "postgres")]
use sqlx::PgPool;
use sqlx::SqlitePool;

/// A name no other test, run or process uses: `prefix_<pid>_<nanos>_<n>`.
pub use idem_testkit::backends::unique_name;

/// A path in the temporary directory for a SQLite file of this test process, named
/// `prefix_<pid>_<nanos>_<n>.db`. The file, its `-wal` and its `-shm` are deleted when the
/// process exits, after every test of the binary ran, passed or failed, so that runs leave
/// nothing behind. A child process that opens the file does not delete it.
pub fn temp_db(prefix: &str) -> std::path::PathBuf {
    use std::sync::{Mutex, Once, PoisonError};
    static FILES: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
    static AT_EXIT: Once = Once::new();
    extern "C" fn remove_files() {
        let files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
        for path in files.iter() {
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                let _ = std::fs::remove_file(file);
            }
        }
    }
    // SAFETY: `remove_files` is an `extern "C" fn()` that neither panics nor unwinds.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(remove_files);
    });
    let path = std::env::temp_dir().join(format!("{}.db", unique_name(prefix)));
    FILES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(path.clone());
    path
}

/// A migrated SQLite database in a new file of its own (WAL, writers wait up to 30 s), deleted
/// when the process exits ([`temp_db`]).
pub async fn sqlite() -> SqlitePool {
    sqlite_file(&temp_db("idem_test")).await
}

/// A migrated SQLite database in a new file of its own ([`sqlite`]), with the tables `create`
/// makes.
pub async fn sqlite_with(create: &[&'static str]) -> SqlitePool {
    let pool = sqlite().await;
    for sql in create {
        sqlx::query(*sql).execute(&pool).await.unwrap();
    }
    pool
}

/// The SQLite database in the file at `path` (created if missing; WAL, writers wait up to 30 s
/// for the lock), migrated: for a test and the processes it starts to share one file.
pub async fn sqlite_file(path: &std::path::Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    pool
}

#[cfg(feature = "postgres")]
/// The PostgreSQL server of `IDEM_POSTGRES_URL` (default: the local server,
/// `postgres://postgres@127.0.0.1:5432/test`), in a new schema of its own so runs never see each
/// other's rows, migrated: `idem-testkit`'s backend. `None`, with a line saying why, when no
/// server answers; in CI (`CI` set) that is a failure instead, since CI must run these tests.
pub async fn postgres() -> Option<PgPool> {
    idem_testkit::backends::Postgres::setup().await
}

#[cfg(feature = "postgres")]
/// Runs `test` on a [`postgres`] schema of its own (skipped, as that says, when no server
/// answers), then drops the schema.
pub async fn with_postgres(test: impl AsyncFnOnce(&PgPool)) {
    if let Some(pool) = postgres().await {
        test(&pool).await;
        drop_postgres(pool).await;
    }
}

#[cfg(feature = "postgres")]
/// The server the PostgreSQL tests use: `IDEM_POSTGRES_URL`, default the local server.
pub fn postgres_url() -> String {
    idem_testkit::backends::Postgres::url()
}

#[cfg(feature = "postgres")]
/// Options for a connection of its own to the schema of a [`postgres`] pool (for a second pool
/// with other settings, or a child process), with extra run-time `settings` such as
/// `("statement_timeout", "200ms")`.
pub async fn postgres_options(pool: &PgPool, settings: &[(&str, &str)]) -> PgConnectOptions {
    let schema = Stored(pool).name("SELECT current_schema()").await;
    let options: PgConnectOptions = postgres_url().parse().unwrap();
    let mut all = vec![("search_path", schema.as_str())];
    all.extend_from_slice(settings);
    options.options(all)
}

#[cfg(feature = "postgres")]
/// Drops the schema a [`postgres`] pool was given (its `search_path`).
pub async fn drop_postgres(pool: PgPool) {
    idem_testkit::backends::Postgres::teardown(pool).await;
}

#[cfg(feature = "mysql")]
/// The MySQL/MariaDB server of `IDEM_MYSQL_URL` (default: the local server,
/// `mysql://root@127.0.0.1:3306/test`), in a new database of its own so runs never see each
/// other's rows, migrated. `None`, with a line saying why, when no server answers; in CI (`CI`
/// set) that is a failure instead, since CI must run these tests.
pub async fn mysql() -> Option<sqlx::MySqlPool> {
    mysql_with(None).await
}

#[cfg(feature = "mysql")]
/// As [`mysql`], running `session` (such as `SET SESSION sql_mode = ...`) on every new
/// connection of the pool, before the migration.
pub async fn mysql_with(session: Option<&'static str>) -> Option<sqlx::MySqlPool> {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    let url = mysql_url();
    let admin = answered(
        sqlx::MySqlPool::connect(&url).await,
        "MySQL/MariaDB",
        "IDEM_MYSQL_URL",
        &url,
    )?;
    static STALE_DROPPED: AtomicBool = AtomicBool::new(false);
    let database = Stored(&admin)
        .fresh(
            &STALE_DROPPED,
            "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
             WHERE schema_name LIKE 'idem\\_t\\_%'",
            "CREATE DATABASE {}",
            "DROP DATABASE IF EXISTS {}",
        )
        .await;
    admin.close().await;
    let options: MySqlConnectOptions = url.parse().unwrap();
    let mut pool = MySqlPoolOptions::new().max_connections(20);
    if let Some(session) = session {
        pool = pool.after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(session))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        });
    }
    let pool = pool
        .connect_with(options.database(&database))
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    Some(pool)
}

#[cfg(feature = "mysql")]
/// The server the MySQL tests use: `IDEM_MYSQL_URL`, default the local server.
pub fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

#[cfg(feature = "mysql")]
/// Options for a connection of its own to the database of a [`mysql`] pool.
pub async fn mysql_options(pool: &sqlx::MySqlPool) -> sqlx::mysql::MySqlConnectOptions {
    let database = Stored(pool).name("SELECT DATABASE()").await;
    let options: sqlx::mysql::MySqlConnectOptions = mysql_url().parse().unwrap();
    options.database(&database)
}

#[cfg(feature = "mysql")]
/// Drops the database a [`mysql`] pool was given.
pub async fn drop_mysql(pool: sqlx::MySqlPool) {
    Stored(&pool)
        .drop_own("SELECT DATABASE()", "DROP DATABASE {}")
        .await;
}

#[cfg(feature = "mysql")]
/// Runs `test` on a [`mysql`] database of its own (skipped, as that says, when no server
/// answers), then drops the database.
pub async fn with_mysql(test: impl AsyncFnOnce(&sqlx::MySqlPool)) {
    if let Some(pool) = mysql().await {
        test(&pool).await;
        drop_mysql(pool).await;
    }
}

/// The admin connection to a server the tests need (`what`, at `url`, from `var`), or `None`
/// with a line saying why it is skipped; in CI (`CI` set) a failure instead, since CI must run
/// the tests.
#[cfg(feature = "mysql")]
fn answered<T>(connected: Result<T, sqlx::Error>, what: &str, var: &str, url: &str) -> Option<T> {
    match connected {
        Ok(admin) => Some(admin),
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no {what} at {url} ({err}); set {var} to run this test");
            None
        }
        Err(err) => panic!("CI must run the {what} tests, but {url} did not answer: {err}"),
    }
}

/// What a database holds, read the same way on every backend: `Stored(&pool).records(..)`.
pub struct Stored<'p, DB: sqlx::Database>(pub &'p sqlx::Pool<DB>);

impl<DB: sqlx::Database> Stored<'_, DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q [u8]: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    /// `sql` with MySQL's `?` for its `$n` placeholders (used in order) on MySQL.
    pub fn sql(sql: &str) -> sqlx::AssertSqlSafe<String> {
        let mut out = sql.to_string();
        if DB::NAME == "MySQL" {
            for n in (1..10).rev() {
                out = out.replace(&format!("${n}"), "?");
            }
        }
        sqlx::AssertSqlSafe(out)
    }

    /// The records of `key` in `scope`: 1 once it is recorded, else 0.
    pub async fn records(&self, scope: &str, key: &str) -> i64 {
        let sql = "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND msg_key = $2";
        self.of(sql, scope, key).await.unwrap()
    }

    /// The version `idem_versions` holds for `entity` in `scope`, if any.
    pub async fn version(&self, scope: &str, entity: &str) -> Option<i64> {
        let sql = "SELECT version FROM idem_versions WHERE scope = $1 AND entity = $2";
        self.of(sql, scope, entity).await
    }

    /// The number `sql` reads of a scope and a key (`$1`, `$2`; the key as bytes), if a row.
    async fn of(&self, sql: &str, scope: &str, key: &str) -> Option<i64> {
        sqlx::query_scalar(Self::sql(sql))
            .bind(scope)
            .bind(key.as_bytes())
            .fetch_optional(self.0)
            .await
            .unwrap()
    }

    /// A new schema or database (`create`, `{}` its name) of a name no other test, run or
    /// process uses ([`unique_name`]). First, once per process (`done`), drops those that runs
    /// which stopped before dropping theirs (a failed assertion, a killed process) left: the
    /// names `list` gives that are over an hour old, by the time in their name, each with
    /// `drop`.
    async fn fresh(
        &self,
        done: &AtomicBool,
        list: &'static str,
        create: &str,
        drop: &str,
    ) -> String {
        if !done.swap(true, Ordering::Relaxed) {
            let names = self.names(list).await.unwrap_or_default();
            for name in names.into_iter().filter(|name| is_stale(name)) {
                // Another run may drop it at the same time: IF EXISTS, and errors do not matter.
                let _ = self.run(&drop.replace("{}", &name)).await;
            }
        }
        let name = unique_name("idem_t");
        self.run(&create.replace("{}", &name)).await.unwrap();
        name
    }

    /// Drops the schema or database the pool was given (`which` names it; `{}` in `drop`), and
    /// closes the pool.
    async fn drop_own(&self, which: &'static str, drop: &str) {
        let name = self.name(which).await;
        self.run(&drop.replace("{}", &name)).await.unwrap();
        self.0.close().await;
    }

    /// The texts a query returns, one a row.
    async fn names(&self, sql: &'static str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(sql).fetch_all(self.0).await
    }

    /// The one text a query returns.
    async fn name(&self, sql: &'static str) -> String {
        sqlx::query_scalar(sql).fetch_one(self.0).await.unwrap()
    }

    /// Runs statements of no parameters.
    async fn run(&self, sql: &str) -> Result<(), sqlx::Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        sqlx::raw_sql(sql).execute(self.0).await.map(drop)
    }
}

/// Whether a name made by [`unique_name`] (`idem_t_<pid>_<nanos>_<n>`) is over an hour old: a
/// test schema or database that a stopped run left behind.
fn is_stale(name: &str) -> bool {
    let hour_ago = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .saturating_sub(Duration::from_secs(3600))
        .as_nanos();
    name.split('_')
        .nth(3)
        .and_then(|n| n.parse::<u128>().ok())
        .is_some_and(|born| born < hour_ago)
}

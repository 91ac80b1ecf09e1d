//! Running the built `idem` binary, and fresh databases for it: a new SQLite file, or a new
//! PostgreSQL schema reached through the URL's `options=-csearch_path=...`.
#![allow(dead_code)] // each test binary uses a part of this module

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What a run of the binary printed, and its exit code.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "expected success: {self:#?}");
        &self.stdout
    }

    /// Asserts exit `code`, nothing on stdout, one `error: ` line on stderr, and returns it.
    #[track_caller]
    pub fn fails(&self, code: i32) -> &str {
        assert_eq!(self.code, Some(code), "expected exit {code}: {self:#?}");
        assert_eq!(self.stdout, "", "errors go to stderr only: {self:#?}");
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.lines().count() == 1,
            "one error line: {self:#?}"
        );
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        self.stderr.trim_end()
    }
}

/// Runs `idem` with `args` against the database at `url` (`None`: no `DATABASE_URL`), with
/// stdin not a terminal.
pub fn idem(url: Option<&str>, args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null());
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    let output = command.output().expect("the idem binary runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// A name no other test, run or process uses: `prefix_<pid>_<nanos>_<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// A new SQLite file's URL and path (not created: `idem migrate` or a pool creates it).
pub fn sqlite_url() -> (String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("idem_cli")));
    (format!("sqlite:{}", path.display()), path)
}

/// Deletes a SQLite database file and its WAL companions.
pub fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
}

/// The PostgreSQL server: `IDEM_POSTGRES_URL`, default the local server.
pub fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// `url` with its search_path set to `schema`, as a libpq `options` parameter.
pub fn with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// A pool on the server at `url`, to make and drop databases in. `None`, having said why, when
/// no server answers and `CI` is unset; with `CI` set that is a failure.
async fn server<DB: sqlx::Database>(url: &str, name: &str, var: &str) -> Option<sqlx::Pool<DB>> {
    match sqlx::Pool::<DB>::connect(url).await {
        Ok(admin) => Some(admin),
        Err(err) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no {name} at {url} ({err}); set {var} to run this test");
            None
        }
        Err(err) => panic!("CI must run the {name} tests, but {url} did not answer: {err}"),
    }
}

/// A new schema on the PostgreSQL server, and a pool whose connections use it. `None`, having
/// said why, when no server answers and `CI` is unset; with `CI` set that is a failure.
pub async fn postgres_schema() -> Option<(sqlx::PgPool, String)> {
    let url = postgres_url();
    let admin = server::<sqlx::Postgres>(&url, "PostgreSQL", "IDEM_POSTGRES_URL").await?;
    drop_stale_schemas(&admin).await;
    let schema = unique_name("idem_cli");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let pool = sqlx::PgPool::connect(&with_schema(&url, &schema))
        .await
        .unwrap();
    Some((pool, schema))
}

/// Drops a schema made by [`postgres_schema`].
pub async fn drop_schema(pool: sqlx::PgPool, schema: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// Drops schemas that runs stopped before dropping (a failed assertion, a killed process):
/// those of [`postgres_schema`] older than an hour, by the time in their name.
async fn drop_stale_schemas(admin: &sqlx::PgPool) {
    let Ok(schemas) = sqlx::query_scalar::<_, String>(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'idem\\_cli\\_%'",
    )
    .fetch_all(admin)
    .await
    else {
        return;
    };
    for schema in stale(schemas) {
        // Another run may drop it at the same time: IF EXISTS, and errors do not matter.
        let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(admin).await;
    }
}

/// The MySQL / MariaDB server: `IDEM_MYSQL_URL`, default the local server.
pub fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// `url` naming the database `database` instead of its own (its query string kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A new database on the MySQL / MariaDB server, its URL, and a pool on it. `None`, having
/// said why, when no server answers and `CI` is unset; with `CI` set that is a failure.
pub async fn mysql_database() -> Option<(sqlx::MySqlPool, String)> {
    let url = mysql_url();
    let admin = server::<sqlx::MySql>(&url, "MySQL/MariaDB", "IDEM_MYSQL_URL").await?;
    drop_stale_databases(&admin).await;
    let database = unique_name("idem_cli");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = with_database(&url, &database);
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    Some((pool, url))
}

/// Drops the database of a [`mysql_database`] pool.
pub async fn drop_database(pool: sqlx::MySqlPool) {
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// Drops the databases of [`mysql_database`] that runs stopped before dropping, by the time in
/// their name (over an hour old).
async fn drop_stale_databases(admin: &sqlx::MySqlPool) {
    let Ok(databases) = sqlx::query_scalar::<_, String>(
        "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
         WHERE schema_name LIKE 'idem\\_cli\\_%'",
    )
    .fetch_all(admin)
    .await
    else {
        return;
    };
    for database in stale(databases) {
        let drop = format!("DROP DATABASE IF EXISTS {database}");
        let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(admin).await;
    }
}

/// The names (`idem_cli_<pid>_<nanos>_<n>`) made over an hour ago, by the time in them.
fn stale(names: Vec<String>) -> impl Iterator<Item = String> {
    let hour_ago = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .saturating_sub(3_600_000_000_000);
    names.into_iter().filter(move |name| {
        let born = name.split('_').nth(3).and_then(|n| n.parse::<u128>().ok());
        born.is_some_and(|born| born < hour_ago)
    })
}

//! From a database URL to a pool of the right backend.

use std::str::FromStr;
use std::time::Duration;

use idem::consume::adapter::redact;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection as _, MySqlPool, PgPool, Pool, SqlitePool};

use crate::error::CliError;

/// An open database of one of the backends idem supports.
pub enum Database {
    /// `sqlite:PATH`
    Sqlite(SqlitePool),
    /// `postgres://...` or `postgresql://...`
    Postgres(PgPool),
    /// `mysql://...` or `mariadb://...`
    Mysql(MySqlPool),
}

/// The backend a URL names, from its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

fn backend(url: &str) -> Result<Backend, CliError> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme);
    match scheme.map(str::to_ascii_lowercase).as_deref() {
        Some("sqlite") => Ok(Backend::Sqlite),
        Some("postgres" | "postgresql") => Ok(Backend::Postgres),
        Some("mysql" | "mariadb") => Ok(Backend::Mysql),
        _ => Err(CliError::failure(format!(
            "bad database URL `{}`: use sqlite:PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB",
            redact(url)
        ))),
    }
}

/// Opens the database at `url`, waiting at most `timeout` for it to answer. `create`: a
/// missing SQLite file is created (for `migrate`); otherwise it is an error.
pub async fn connect(url: &str, timeout: Duration, create: bool) -> Result<Database, CliError> {
    let shown = redact(url);
    let bad = |err: sqlx::Error| CliError::failure(format!("bad database URL `{shown}`: {err}"));
    let server = || Failure {
        what: format!("cannot connect to `{shown}`"),
        hint: "check the URL and that the server is running",
    };
    Ok(match backend(url)? {
        Backend::Mysql => {
            let options = MySqlConnectOptions::from_str(url).map_err(bad)?;
            Database::Mysql(open(options, timeout, server()).await?)
        }
        Backend::Sqlite => {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(bad)?
                .create_if_missing(create)
                .busy_timeout(timeout);
            let file = Failure {
                what: format!("cannot open `{shown}`"),
                hint: "check the path (`idem migrate` creates a new database)",
            };
            Database::Sqlite(open(options, timeout, file).await?)
        }
        Backend::Postgres => {
            let options = PgConnectOptions::from_str(url).map_err(bad)?;
            Database::Postgres(open(options, timeout, server()).await?)
        }
    })
}

/// What [`open`] says when the database does not answer, and what to check.
struct Failure {
    what: String,
    hint: &'static str,
}

/// Opens one connection first, so that a failure is reported as itself (a pool would only
/// say that it timed out), within `timeout`; then a small pool (the commands run one statement
/// at a time) that connects when it needs to.
async fn open<DB: sqlx::Database>(
    options: <DB::Connection as sqlx::Connection>::Options,
    timeout: Duration,
    failure: Failure,
) -> Result<Pool<DB>, CliError> {
    let Failure { what, hint } = failure;
    match tokio::time::timeout(timeout, options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
        }
        Ok(Err(err)) => return Err(CliError::failure(format!("{what}: {err}; {hint}"))),
        Err(_) => {
            return Err(CliError::failure(format!(
                "{what}: no answer within {}s; {hint} (--connect-timeout waits longer)",
                timeout.as_secs()
            )))
        }
    }
    Ok(PoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
        .connect_lazy_with(options))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_the_backend() {
        assert_eq!(backend("sqlite:x.db").unwrap(), Backend::Sqlite);
        assert_eq!(backend("sqlite::memory:").unwrap(), Backend::Sqlite);
        assert_eq!(backend("postgres://h/db").unwrap(), Backend::Postgres);
        assert_eq!(backend("postgresql://h/db").unwrap(), Backend::Postgres);
        assert_eq!(backend("mysql://h/db").unwrap(), Backend::Mysql);
        assert_eq!(backend("mariadb://h/db").unwrap(), Backend::Mysql);
        assert!(backend("x.db").is_err());
        assert!(backend("http://h").is_err());
    }
}

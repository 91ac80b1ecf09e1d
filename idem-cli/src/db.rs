//! From a database URL to a pool of the right backend.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, MySqlPool, PgPool, SqlitePool};

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

/// `url` with its password, if any, replaced by `***`, to print.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Opens the database at `url`, waiting at most `timeout` for it to answer. `create`: a
/// missing SQLite file is created (for `migrate`); otherwise it is an error.
pub async fn connect(url: &str, timeout: Duration, create: bool) -> Result<Database, CliError> {
    let shown = redact(url);
    let bad = |err: sqlx::Error| CliError::failure(format!("bad database URL `{shown}`: {err}"));
    match backend(url)? {
        Backend::Mysql => {
            let options = MySqlConnectOptions::from_str(url).map_err(bad)?;
            check(
                options.connect(),
                timeout,
                || format!("cannot connect to `{shown}`"),
                "check the URL and that the server is running",
            )
            .await?;
            Ok(Database::Mysql(pool(timeout).connect_lazy_with(options)))
        }
        Backend::Sqlite => {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(bad)?
                .create_if_missing(create)
                .busy_timeout(timeout);
            check(
                options.connect(),
                timeout,
                || format!("cannot open `{shown}`"),
                "check the path (`idem migrate` creates a new database)",
            )
            .await?;
            Ok(Database::Sqlite(pool(timeout).connect_lazy_with(options)))
        }
        Backend::Postgres => {
            let options = PgConnectOptions::from_str(url).map_err(bad)?;
            check(
                options.connect(),
                timeout,
                || format!("cannot connect to `{shown}`"),
                "check the URL and that the server is running",
            )
            .await?;
            Ok(Database::Postgres(pool(timeout).connect_lazy_with(options)))
        }
    }
}

/// A small pool: the commands run one statement at a time.
fn pool<DB: sqlx::Database>(timeout: Duration) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(2)
        .acquire_timeout(timeout)
}

/// Opens one connection first, so that a failure is reported as itself (a pool would only
/// say that it timed out), within `timeout`.
async fn check<C: sqlx::Connection>(
    connect: impl std::future::Future<Output = Result<C, sqlx::Error>>,
    timeout: Duration,
    what: impl Fn() -> String,
    hint: &str,
) -> Result<(), CliError> {
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(err)) => Err(CliError::failure(format!("{}: {err}; {hint}", what()))),
        Err(_) => Err(CliError::failure(format!(
            "{}: no answer within {}s; {hint} (--connect-timeout waits longer)",
            what(),
            timeout.as_secs()
        ))),
    }
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

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db?x=a@b"), "postgres://h/db?x=a@b");
        assert_eq!(redact("sqlite:a.db"), "sqlite:a.db");
    }
}

//! The commands: connect, check the tables, then one module per command, generic over the
//! backend through [`idem::admin::Admin`].

mod attempts;
mod dead_letters;
mod forget;
mod inspect;
mod outbox;
mod purge;
mod release;
mod stats;

use std::time::Duration;

use idem::admin::{Admin, DeadLetterAdmin, OutboxAdmin};
use idem::key::KeyDisplay;
use sqlx::Pool;

use crate::cli::{Cli, Command};
use crate::db::{self, Database};
use crate::error::CliError;
use crate::output::KeyView;
use crate::when;

/// Runs the command line's command.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    if let Command::Retry { .. } = cli.command {
        errln!("note: `idem retry` is renamed `idem clear-attempts` (`idem::retry` is another thing: it retries transient errors); the old name goes in the next release");
    }
    let url = cli.connect.database_url.as_deref().ok_or_else(|| {
        CliError::usage(
            "no database URL: pass --database-url URL or set DATABASE_URL (sqlite:PATH, postgres://USER@HOST/DB or mysql://USER@HOST/DB)",
        )
    })?;
    // A key the runtime never stores is bad usage, found before connecting.
    let key = match &cli.command {
        Command::Inspect { key, .. }
        | Command::Forget { key, .. }
        | Command::Release { key, .. }
        | Command::ClearAttempts { key, .. }
        | Command::Retry { key, .. } => key.encode()?,
        _ => Vec::new(),
    };
    // So are bad times, groups and selections, and a bad retention.
    let times = match &cli.command {
        Command::DeadLetters(command) => dead_letters::check(command)?,
        _ => dead_letters::Times::default(),
    };
    let retention = match &cli.command {
        Command::Purge {
            dead_letter_retention,
            ..
        } => purge::Retention {
            span: when::duration(dead_letter_retention)
                .map_err(|err| CliError::usage(format!("--dead-letter-retention: {err}")))?,
            text: dead_letter_retention.trim().to_string(),
        },
        _ => purge::Retention {
            span: Duration::ZERO,
            text: String::new(),
        },
    };
    let prepared = Prepared {
        key,
        times,
        retention,
    };
    let timeout = Duration::from_secs(cli.connect.connect_timeout.max(1));
    let migrate = matches!(cli.command, Command::Migrate);
    match db::connect(url, timeout, migrate).await? {
        Database::Sqlite(pool) => on(&pool, cli.command, &prepared).await,
        Database::Postgres(pool) => on(&pool, cli.command, &prepared).await,
        Database::Mysql(pool) => on(&pool, cli.command, &prepared).await,
    }
}

/// What the command line gave, checked before connecting.
struct Prepared {
    /// The command's key, encoded (empty for a command without one).
    key: Vec<u8>,
    /// The times of a `dead-letters` command's filters.
    times: dead_letters::Times,
    /// `purge`'s retention of dead letters.
    retention: purge::Retention,
}

/// Runs `command` on an open database, with what [`run`] checked of it.
async fn on<DB: OutboxAdmin + DeadLetterAdmin>(
    pool: &Pool<DB>,
    command: Command,
    prepared: &Prepared,
) -> Result<(), CliError> {
    let key = prepared.key.as_slice();
    if let Command::Migrate = command {
        idem::migrate(pool).await?;
        outln!("idem's tables are up to date");
        return Ok(());
    }
    if !DB::tables_present(pool).await? {
        return Err(CliError::failure(
            "this database has no idem tables (idem_records, idem_versions): run `idem migrate`, or check --database-url",
        ));
    }
    let result = match command {
        Command::Migrate => Ok(()),
        Command::Stats { scope, json } => stats::run(pool, scope.as_deref(), json).await,
        Command::Inspect { scope, json, .. } => inspect::run(pool, &scope, key, json).await,
        Command::Forget { scope, yes, .. } => forget::run(pool, &scope, key, yes).await,
        Command::Release { scope, .. } => release::run(pool, &scope, key).await,
        Command::Purge { batch, .. } => purge::run(pool, batch, &prepared.retention).await,
        Command::Poisoned { scope, json } => attempts::list(pool, scope.as_deref(), json).await,
        Command::ClearAttempts { scope, .. } | Command::Retry { scope, .. } => {
            attempts::clear(pool, &scope, key).await
        }
        Command::Outbox { destination, json } => {
            outbox::run(pool, destination.as_deref(), json).await
        }
        Command::DeadLetters(command) => dead_letters::run(pool, command, prepared.times).await,
    };
    pool.close().await;
    result
}

/// Fails unless `scope` has records or versions.
async fn known_scope<DB: Admin>(pool: &Pool<DB>, scope: &str) -> Result<(), CliError> {
    if DB::scope_known(pool, scope).await? {
        Ok(())
    } else {
        Err(CliError::failure(format!(
            "unknown scope `{scope}`: it has no records or versions in this database; `idem stats` lists the scopes"
        )))
    }
}

/// The key as messages name it.
fn shown(key: &[u8]) -> String {
    match KeyView::of(key) {
        view @ KeyView::Tuple(_) => view.to_string(),
        KeyView::Plain(_) => KeyDisplay(key).to_string(),
    }
}

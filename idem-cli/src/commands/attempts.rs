//! `idem poisoned [--scope S] [--json]` and `idem clear-attempts SCOPE KEY`: the failures that
//! `max_attempts` handlers counted (`idem_attempts`, migration 2).

use idem::admin::Admin;
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{json, rfc3339, when, FailedJson, PoisonedJson};

/// How many messages `poisoned` lists at most.
const LIST_LIMIT: u64 = 1000;

/// Lists the messages with counted failures, most attempts first. Whether one is poisoned
/// depends on its handler's `max_attempts`, which only the handler knows: the count is shown.
pub async fn list<DB: Admin>(
    pool: &Pool<DB>,
    scope: Option<&str>,
    as_json: bool,
) -> Result<(), CliError> {
    let now = DB::now_ms(pool).await?;
    let rows = DB::attempts(pool, scope, LIST_LIMIT)
        .await
        .map_err(no_attempts_table)?;
    if as_json {
        let out = PoisonedJson {
            now: rfc3339(now),
            complete: (rows.len() as u64) < LIST_LIMIT,
            messages: rows.iter().map(FailedJson::from).collect(),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    if rows.is_empty() {
        outln!("no failed attempts are counted: no message is poisoned");
        return Ok(());
    }
    for row in &rows {
        outln!(
            "{}  {}  {} failed attempts, the last {}{}",
            row.scope,
            super::shown(&row.key),
            row.attempts,
            when(now, row.updated_ms),
            row.last_error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    if rows.len() as u64 == LIST_LIMIT {
        outln!("(the first {LIST_LIMIT}; pass --scope to narrow)");
    }
    Ok(())
}

/// Clears the counted failures of one message, so that its next delivery runs the handler.
pub async fn clear<DB: Admin>(pool: &Pool<DB>, scope: &str, key: &[u8]) -> Result<(), CliError> {
    let shown = super::shown(key);
    if <DB as Admin>::clear_attempts(pool, scope, key)
        .await
        .map_err(no_attempts_table)?
    {
        outln!("cleared the failed attempts of key `{shown}` in scope `{scope}`: its next delivery runs the handler");
        Ok(())
    } else {
        Err(CliError::failure(format!(
            "no failed attempts are counted for key `{shown}` in scope `{scope}`: nothing to clear (`idem poisoned` lists them)"
        )))
    }
}

/// A database migrated before attempt counting has no `idem_attempts` table.
fn no_attempts_table(err: sqlx::Error) -> CliError {
    let missing = matches!(&err, sqlx::Error::Database(db)
        if db.message().contains("idem_attempts") || db.code().as_deref() == Some("42P01"));
    if missing {
        CliError::failure(
            "this database's idem schema predates attempt counting (no idem_attempts table): run `idem migrate`",
        )
    } else {
        err.into()
    }
}

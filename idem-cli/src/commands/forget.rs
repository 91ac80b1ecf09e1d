//! `idem forget SCOPE KEY [--yes]`.

use std::io::{BufRead, IsTerminal, Write};

use idem::admin::{Admin, Deletion};
use sqlx::Pool;

use crate::error::CliError;
use crate::output::when;

/// Deletes the record of a done message, after confirmation, so that it applies again.
pub async fn run<DB: Admin>(
    pool: &Pool<DB>,
    scope: &str,
    key: &[u8],
    yes: bool,
) -> Result<(), CliError> {
    super::known_scope(pool, scope).await?;
    let shown = super::shown(key);
    let now = DB::now_ms(pool).await?;
    let record = DB::record(pool, scope, key).await?;
    let refused = |until: i64| {
        CliError::failure(format!(
            "key `{shown}` in scope `{scope}` is in progress under a lease until {}: `idem release` ends a lease; forget re-opens done messages only",
            when(now, until)
        ))
    };
    match record {
        None => return Err(missing(&shown, scope)),
        Some(r) => {
            if let Some(until) = r.lease_until_ms {
                return Err(refused(until));
            }
        }
    }
    if !yes
        && !confirm(&format!(
            "forget key `{shown}` in scope `{scope}`? Its next delivery will apply again. [y/N] "
        ))?
    {
        return Err(CliError::failure("not confirmed; nothing forgotten"));
    }
    match DB::forget(pool, scope, key).await? {
        Deletion::Deleted => {
            outln!("forgot key `{shown}` in scope `{scope}`: its next delivery applies again");
            Ok(())
        }
        // Changed since it was read: a delivery re-claimed it, or a purge deleted it.
        Deletion::Refused => Err(CliError::failure(format!(
            "key `{shown}` in scope `{scope}` was claimed again meanwhile; nothing forgotten"
        ))),
        Deletion::Missing => Err(missing(&shown, scope)),
    }
}

fn missing(shown: &str, scope: &str) -> CliError {
    CliError::failure(format!(
        "no record of key `{shown}` in scope `{scope}`: nothing to forget (never handled, or purged)"
    ))
}

/// Asks on the terminal; without one, refuses (bad usage: `--yes` is needed).
fn confirm(question: &str) -> Result<bool, CliError> {
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        return Err(CliError::usage(
            "forget needs --yes when not run on a terminal (it re-opens a message to processing)",
        ));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{question}");
    let _ = stderr.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|err| CliError::failure(format!("cannot read the answer: {err}")))?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

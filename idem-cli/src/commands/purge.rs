//! `idem purge [--batch N] [--dead-letter-retention DURATION]`.

use std::io::IsTerminal;
use std::time::Duration;

use idem::admin::DeadLetterAdmin;
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::Pool;

use crate::error::CliError;

/// How long dead letters are kept, as typed (`30d`), and as a duration.
#[derive(Debug, Clone)]
pub struct Retention {
    /// As the operator typed it, to say it back.
    pub text: String,
    /// The duration.
    pub span: Duration,
}

/// Deletes every expired record, `batch` per statement: a progress bar on a terminal, a line
/// per batch on stderr otherwise, and the total on stdout. Then, where the database has dead
/// letters, moves abandoned parked retries to them and purges those past `retention`,
/// reporting each count that is not zero.
pub async fn run<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    batch: u64,
    retention: &Retention,
) -> Result<(), CliError> {
    let expected = DB::count_expired(pool).await?;
    let bar = (std::io::stderr().is_terminal() && std::env::var_os("CI").is_none()).then(|| {
        let bar = ProgressBar::new(expected);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} expired records purged ({eta})")
        {
            bar.set_style(style);
        }
        bar
    });
    let mut total = 0;
    loop {
        let deleted = DB::purge_batch(pool, batch).await?;
        total += deleted;
        match &bar {
            Some(bar) => {
                bar.set_length(expected.max(total));
                bar.set_position(total);
            }
            None if deleted > 0 && expected > batch => {
                errln!("purged {total} of {}", expected.max(total));
            }
            None => {}
        }
        if deleted < batch {
            break;
        }
        tokio::task::yield_now().await;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let s = if total == 1 { "" } else { "s" };
    outln!("purged {total} expired record{s}");
    if DB::dead_letters_present(pool).await? {
        dead_letters(pool, batch, retention).await?;
    }
    Ok(())
}

/// Buries the abandoned parked retries, then purges the dead letters past `retention`, each
/// `batch` rows at a time; says how many of each, when any.
async fn dead_letters<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    batch: u64,
    retention: &Retention,
) -> Result<(), CliError> {
    let mut buried = 0;
    loop {
        let moved = DB::bury_abandoned(pool, retention.span, batch).await?;
        buried += moved;
        if moved < batch {
            break;
        }
        tokio::task::yield_now().await;
    }
    let mut purged = 0;
    loop {
        let deleted = DB::purge_dead_letters(pool, retention.span, batch).await?;
        purged += deleted;
        if deleted < batch {
            break;
        }
        tokio::task::yield_now().await;
    }
    let kept = &retention.text;
    if buried > 0 {
        let (s, were) = if buried == 1 {
            ("y", "was")
        } else {
            ("ies", "were")
        };
        outln!(
            "moved {buried} parked retr{s} to the dead letters (reason `abandoned`): {were} due over {kept} ago and not taken by any consumer"
        );
    }
    if purged > 0 {
        let s = if purged == 1 { "" } else { "s" };
        outln!("purged {purged} dead letter{s} past their retention of {kept}");
    }
    Ok(())
}

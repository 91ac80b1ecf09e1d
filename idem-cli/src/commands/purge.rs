//! `idem purge [--batch N]`.

use std::io::IsTerminal;

use idem::admin::Admin;
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::Pool;

use crate::error::CliError;

/// Deletes every expired record, `batch` per statement: a progress bar on a terminal, a line
/// per batch on stderr otherwise, and the total on stdout.
pub async fn run<DB: Admin>(pool: &Pool<DB>, batch: u64) -> Result<(), CliError> {
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
    Ok(())
}

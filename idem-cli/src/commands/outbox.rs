//! `idem outbox [--destination D] [--json]`: the transactional outbox (`idem_outbox`,
//! migration 3) per destination.

use idem::admin::{DestinationStats, OutboxAdmin};
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{json, rfc3339, when, DestinationJson, OutboxJson};

/// Prints, per destination (or for `destination`), what waits for the relay and since when.
pub async fn run<DB: OutboxAdmin>(
    pool: &Pool<DB>,
    destination: Option<&str>,
    as_json: bool,
) -> Result<(), CliError> {
    if !DB::outbox_present(pool).await? {
        return Err(CliError::failure(
            "this database's idem schema predates the outbox (no idem_outbox table): run `idem migrate`",
        ));
    }
    let now = DB::now_ms(pool).await?;
    let stats = DB::outbox_stats(pool, destination).await?;
    if let (Some(destination), true) = (destination, stats.is_empty()) {
        return Err(CliError::failure(format!(
            "unknown destination `{destination}`: the outbox has no rows for it in this database; `idem outbox` lists the destinations"
        )));
    }
    if as_json {
        let out = OutboxJson {
            now: rfc3339(now),
            destinations: stats.iter().map(|d| DestinationJson::of(d, now)).collect(),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    if stats.is_empty() {
        outln!("the outbox is empty: no message pending or sent");
    }
    for (i, d) in stats.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        show(d, now)?;
    }
    Ok(())
}

/// One destination, for people.
fn show(d: &DestinationStats, now: i64) -> Result<(), CliError> {
    outln!("{}", d.destination);
    outln!("  pending     {}", d.pending);
    if let Some(oldest) = d.oldest_pending_ms {
        outln!("  oldest      {}", when(now, oldest));
    }
    if d.failed > 0 {
        outln!(
            "  failed      {} (up to {} failed publishes{})",
            d.failed,
            d.most_attempts,
            d.last_error
                .as_deref()
                .map(|e| format!("; the last: {e}"))
                .unwrap_or_default()
        );
    }
    outln!(
        "  sent        {} (kept until the relay purges them)",
        d.sent
    );
    Ok(())
}

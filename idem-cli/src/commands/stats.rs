//! `idem stats [--scope S] [--json]`.

use idem::admin::Admin;
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{json, rfc3339, when, ScopeJson, StatsJson};

/// Prints the counts of every scope, or of `scope`.
pub async fn run<DB: Admin>(
    pool: &Pool<DB>,
    scope: Option<&str>,
    as_json: bool,
) -> Result<(), CliError> {
    if let Some(scope) = scope {
        super::known_scope(pool, scope).await?;
    }
    let now = DB::now_ms(pool).await?;
    let stats = DB::stats(pool, scope).await?;
    if as_json {
        let out = StatsJson {
            now: rfc3339(now),
            scopes: stats.iter().map(ScopeJson::from).collect(),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    if stats.is_empty() {
        outln!("no records or versions yet");
    }
    for (i, s) in stats.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        outln!("{}", s.scope);
        outln!(
            "  records     {} ({} in progress, {} lapsed leases, {} expired)",
            s.records,
            s.in_progress,
            s.lapsed_leases,
            s.expired
        );
        if let (Some(oldest), Some(newest)) = (s.oldest_processed_ms, s.newest_processed_ms) {
            outln!("  oldest      {}", when(now, oldest));
            outln!("  newest      {}", when(now, newest));
        }
        outln!("  versions    {}", s.versions);
    }
    Ok(())
}

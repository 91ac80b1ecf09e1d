//! `idem release SCOPE KEY`.

use idem::admin::{Admin, Deletion};
use sqlx::Pool;

use crate::error::CliError;
use crate::output::when;

/// Ends the lease of a message in progress, so that its next delivery runs the handler.
pub async fn run<DB: Admin>(pool: &Pool<DB>, scope: &str, key: &[u8]) -> Result<(), CliError> {
    super::known_scope(pool, scope).await?;
    let shown = super::shown(key);
    let now = DB::now_ms(pool).await?;
    let until = DB::record(pool, scope, key)
        .await?
        .and_then(|r| r.lease_until_ms);
    match DB::release(pool, scope, key).await? {
        Deletion::Deleted => {
            let held = until
                .map(|until| format!("; its lease would have held until {}", when(now, until)))
                .unwrap_or_default();
            outln!(
                "released key `{shown}` in scope `{scope}`: its next delivery runs the handler{held}"
            );
            Ok(())
        }
        Deletion::Refused => Err(CliError::failure(format!(
            "key `{shown}` in scope `{scope}` is done, not in progress: there is no lease to end (`idem forget` re-opens a done message)"
        ))),
        Deletion::Missing => Err(CliError::failure(format!(
            "no record of key `{shown}` in scope `{scope}`: no lease to end (never claimed, released, or purged)"
        ))),
    }
}

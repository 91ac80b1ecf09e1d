//! `idem inspect SCOPE KEY [--json]`.

use idem::admin::Admin;
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{json, rfc3339, when, InspectJson, KeyJson, RecordJson, State, VersionJson};

/// Prints the record of `key` in `scope` and the version row of `key` as an entity.
pub async fn run<DB: Admin>(
    pool: &Pool<DB>,
    scope: &str,
    key: &[u8],
    as_json: bool,
) -> Result<(), CliError> {
    super::known_scope(pool, scope).await?;
    let now = DB::now_ms(pool).await?;
    let record = DB::record(pool, scope, key).await?;
    let version = DB::version(pool, scope, key).await?;
    if record.is_none() && version.is_none() {
        return Err(CliError::failure(format!(
            "no record or version of key `{}` in scope `{scope}`: never handled, or purged",
            super::shown(key)
        )));
    }
    if as_json {
        let out = InspectJson {
            now: rfc3339(now),
            scope: scope.to_string(),
            key: KeyJson::of(key),
            record: record.as_ref().map(|r| RecordJson::of(r, now)),
            version: version.as_ref().map(VersionJson::from),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    outln!("scope       {scope}");
    outln!("key         {}", super::shown(key));
    match &record {
        None => outln!("record      none (the key is only an entity with a version)"),
        Some(r) => {
            let state = match State::of(r, now) {
                State::Done => "done".to_string(),
                State::InProgress => "in progress (a delivery holds the lease)".to_string(),
                State::LeaseLapsed => {
                    "in progress, lease lapsed (the next delivery takes it over)".to_string()
                }
            };
            outln!("record      {state}");
            outln!("processed   {}", when(now, r.processed_ms));
            if let Some(until) = r.lease_until_ms {
                outln!("lease until {}", when(now, until));
            }
            let expired = if r.expires_ms < now {
                ", expired: a purge deletes it"
            } else {
                ""
            };
            outln!("expires     {}{expired}", when(now, r.expires_ms));
        }
    }
    if let Some(v) = &version {
        outln!(
            "version     {}, updated {}",
            v.version,
            when(now, v.updated_ms)
        );
    }
    Ok(())
}

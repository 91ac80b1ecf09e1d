//! Lease mode: the claim commits first, as *in progress* with a lease, so that other consumers
//! see it at once; the body's transaction then marks it done, or the lease is given back.

use sqlx::{Pool, Transaction};

use crate::store::{LeaseClaim, LeaseHold, LeaseRequest, RecordKey, Stamp, Store};

use super::builder::Claim;
use super::decide::{judge, Skip};

/// The lease a lease-mode delivery holds, to complete or release.
pub(crate) struct Lease<DB: Store> {
    pool: Pool<DB>,
    token: i64,
}

/// Takes the lease on `claim`'s message in a statement of its own (committed at once), then
/// opens the body's transaction on `pool`. A message in progress elsewhere is
/// [`Skip::InProgress`]; a done one, [`Skip::Duplicate`]. With `fingerprint`, the fingerprint
/// is kept with the lease at once, so that both are judged by it (another payload is a
/// [`Skip::Conflict`], in progress or done); with `replay`, a done one is replayed.
pub(crate) async fn take<DB: Store>(
    claim: &Claim,
    pool: &Pool<DB>,
) -> Result<Result<(Transaction<'static, DB>, Lease<DB>), Skip>, sqlx::Error> {
    let lease = Lease {
        pool: pool.clone(),
        token: lease_token(),
    };
    let request = LeaseRequest {
        record: claim.record(),
        lease: claim.lease_duration(),
        token: lease.token,
    };
    let mut conn = pool.acquire().await?;
    let found = match DB::claim_lease(&mut conn, request).await? {
        LeaseClaim::Acquired => None,
        LeaseClaim::Done => Some(Skip::Duplicate),
        LeaseClaim::InProgress => Some(Skip::InProgress),
    };
    if let Some(skip) = found {
        if !claim.stamps() {
            return Ok(Err(skip));
        }
        let stamp = DB::load_stamp(&mut conn, claim.stamp_key()).await?;
        return Ok(Err(judge(claim, stamp, skip)));
    }
    let stamped = match claim.fingerprint_bytes() {
        Some(fingerprint) => {
            let stamp = Stamp {
                at: claim.stamp_key(),
                fingerprint: Some(fingerprint),
                result: None,
            };
            DB::save_stamp(&mut conn, stamp).await
        }
        None => Ok(()),
    };
    let begun = match stamped {
        Ok(()) => pool.begin().await,
        Err(err) => Err(err),
    };
    match begun {
        Ok(tx) => Ok(Ok((tx, lease))),
        Err(err) => {
            // Give the lease back, so the redelivery need not wait for it to expire.
            let _ = DB::release_lease(&mut conn, lease.hold(claim.record().id())).await;
            Err(err)
        }
    }
}

impl<DB: Store> Lease<DB> {
    /// What names this lease to the store.
    fn hold<'a>(&self, record: RecordKey<'a>) -> LeaseHold<'a> {
        LeaseHold {
            record,
            token: self.token,
        }
    }

    /// Marks the message done in `tx`, the body's transaction; `false` if another delivery
    /// took the expired lease over.
    pub(crate) async fn complete(
        &self,
        tx: &mut Transaction<'_, DB>,
        record: RecordKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        DB::complete_lease(tx, self.hold(record)).await
    }

    /// Gives the lease up. Best effort: if this fails, the lease expires on its own.
    pub(crate) async fn release(&self, record: RecordKey<'_>) {
        let released = async {
            let mut conn = self.pool.acquire().await?;
            DB::release_lease(&mut conn, self.hold(record)).await
        };
        if let Err(err) = released.await {
            tracing::debug!(error = %err, "releasing a lease failed; it will expire");
        }
    }
}

/// A token that tells this delivery's lease from any other's: unique per process and call.
fn lease_token() -> i64 {
    random_u64() as i64
}

/// 64 bits that differ between calls, processes and machines (not cryptographic).
pub(crate) fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = nanos ^ (u64::from(std::process::id()) << 40) ^ NEXT.fetch_add(1, Ordering::Relaxed);
    // splitmix64: spreads the bits, so tokens of nearby calls and processes differ everywhere.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_differ_between_calls() {
        let tokens: std::collections::HashSet<u64> =
            (0..1000).map(|_| super::random_u64()).collect();
        assert_eq!(tokens.len(), 1000);
    }
}

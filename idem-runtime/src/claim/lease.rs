//! Lease mode: the claim commits first, as *in progress* with a lease, so that other consumers
//! see it at once; the body's transaction then marks it done, or the lease is given back.

use sqlx::{Pool, Transaction};

use crate::store::{LeaseClaim, LeaseHold, LeaseRequest, RecordKey, Stamp, Store};

use super::builder::Claim;
use super::decide::{decide, judge, Decision, Prefetched, Skip};
use super::ops::LeaseOps;

/// The lease a lease-mode delivery holds, to complete or release.
pub(crate) struct Lease<DB: Store> {
    pool: Pool<DB>,
    /// `DB`'s [`Leases`](crate::store::Leases) methods.
    ops: &'static LeaseOps<DB>,
    token: i64,
    /// Key + version (no entity): the version row is the message's record, and the lease row
    /// only serializes the deliveries of the key (its entity); completing deletes it.
    forget: bool,
}

/// Takes the lease on `claim`'s message in a statement of its own (committed at once), then
/// opens the body's transaction on `pool`. A message in progress elsewhere is
/// [`Skip::InProgress`]; a done one, [`Skip::Duplicate`]. With `fingerprint`, the fingerprint
/// is kept with the lease at once, so that both are judged by it (another payload is a
/// [`Skip::Conflict`], in progress or done); with `replay`, a done one is replayed.
///
/// With `version`, the version is then decided in the body's transaction, exactly as in the
/// transactional mode ([`decide`]: the atomic conditional upsert, whose row lock a concurrent
/// delivery of the entity waits on): stale or equal versions give the lease back and do not
/// run; an advanced version commits only with the body's transaction.
pub(crate) async fn take<DB: Store>(
    claim: &Claim<DB>,
    ops: &'static LeaseOps<DB>,
    pool: &Pool<DB>,
) -> Result<Result<(Transaction<'static, DB>, Lease<DB>), Skip>, sqlx::Error> {
    let lease = Lease {
        pool: pool.clone(),
        ops,
        token: lease_token(),
        forget: !claim.needs_record(),
    };
    let request = LeaseRequest {
        record: claim.record(),
        lease: claim.lease_duration(),
        token: lease.token,
    };
    let mut conn = crate::pooled::acquire(pool).await?;
    let found = match (ops.claim_lease)(&mut conn, request).await? {
        LeaseClaim::Acquired => None,
        LeaseClaim::Done => Some(Skip::Duplicate),
        LeaseClaim::InProgress => Some(Skip::InProgress),
    };
    // Key + version: the lease row is the entity's, held by a delivery of any version, so
    // there is no stamp of this message on it to judge by, and none to keep there.
    let stamps = claim.stamp_ops().filter(|_| !lease.forget);
    if let Some(skip) = found {
        let Some(ops) = stamps else {
            return Ok(Err(skip));
        };
        let stamp = (ops.load_stamp)(&mut conn, claim.stamp_key()).await?;
        return Ok(Err(judge(claim, stamp, skip)));
    }
    let stamped = match (claim.fingerprint_bytes(), stamps) {
        // Key + version keeps its stamp on the version row, written with the body's effect.
        (Some(fingerprint), Some(ops)) => {
            let stamp = Stamp {
                at: claim.stamp_key(),
                fingerprint: Some(fingerprint),
                result: None,
            };
            (ops.save_stamp)(&mut conn, stamp).await
        }
        _ => Ok(()),
    };
    // The lease is taken: its connection goes back before the body's is taken, so that a
    // delivery never holds two connections of the pool at once (racing deliveries would
    // otherwise exhaust a small pool, each waiting for a second connection).
    drop(conn);
    let decided = match stamped {
        Ok(()) => match crate::pooled::begin(pool).await {
            Ok(mut tx) => match versions(claim, &mut tx).await {
                Ok(None) => return Ok(Ok((tx, lease))),
                Ok(Some(skip)) => {
                    // Ended before the lease is given back: on SQLite the release would wait
                    // on it.
                    let _ = tx.rollback().await;
                    Ok(skip)
                }
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
    // Skipped or failed: give the lease back, so the redelivery need not wait for it to expire.
    lease.release(claim.record().id()).await;
    decided.map(Err)
}

/// With `version`: decides the version in the body's transaction (`None`: apply). The lease
/// row is the message's record, so only the version is left to advance.
async fn versions<DB: Store>(
    claim: &Claim<DB>,
    tx: &mut Transaction<'static, DB>,
) -> Result<Option<Skip>, sqlx::Error> {
    if claim.version_entry().is_none() {
        return Ok(None);
    }
    let recorded = Prefetched {
        recorded: Some(true),
        ..Prefetched::default()
    };
    Ok(match decide::<DB>(claim, tx, recorded).await? {
        Decision::Apply => None,
        Decision::Skip { skip, .. } => Some(skip),
    })
}

impl<DB: Store> Lease<DB> {
    /// What names this lease to the store.
    fn hold<'a>(&self, record: RecordKey<'a>) -> LeaseHold<'a> {
        LeaseHold {
            record,
            token: self.token,
        }
    }

    /// Marks the message done in `tx`, the body's transaction (key + version: deletes the
    /// lease row, as the advanced version row records the message); `false` if another
    /// delivery took the expired lease over.
    pub(crate) async fn complete(
        &self,
        tx: &mut Transaction<'_, DB>,
        record: RecordKey<'_>,
    ) -> Result<bool, sqlx::Error> {
        if self.forget {
            (self.ops.release_lease)(tx, self.hold(record)).await
        } else {
            (self.ops.complete_lease)(tx, self.hold(record)).await
        }
    }

    /// Gives the lease up. Best effort: if this fails, the lease expires on its own.
    pub(crate) async fn release(&self, record: RecordKey<'_>) {
        let released = async {
            let mut conn = crate::pooled::acquire(&self.pool).await?;
            (self.ops.release_lease)(&mut conn, self.hold(record)).await
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

//! `fingerprint = "..."` on every path (pool, savepoint, batch, lease, key + version): the same
//! key with another payload is `Error::Conflict` and runs nothing; the same payload is a
//! duplicate; two payloads of one key at once: exactly one applies.

use idem::store::{Leases, Stamps};
use idem::Outcome;

use crate::options::{
    conflict, effects, fingerprinted, hex, leased, msg, rows, setup, stored_fingerprint, versioned,
    Runs,
};
use crate::Backend;

/// On a pool: the same payload is a duplicate, another a conflict that names the scope and
/// both fingerprints; the record keeps the first payload's SHA-256.
pub async fn conflict_on_a_pool<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let first = fingerprinted(&k.pool, &msg("k", "a"), &runs, &d).await;
    assert!(first.unwrap().is_applied());
    let again = fingerprinted(&k.pool, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate);
    let (scope, stored, given) = conflict(fingerprinted(&k.pool, &msg("k", "b"), &runs, &d).await);
    assert_eq!(scope, "options::fingerprinted");
    assert_ne!(stored, given);
    let kept = stored_fingerprint(&k, "idem_records").await;
    assert_eq!(kept.len(), 32);
    assert_eq!(hex(&kept), stored);
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    assert_eq!(rows(&k, "idem_records").await, 1);
    k.close().await;
}

/// Inside a caller's transaction (a savepoint): checked against a record of the same
/// transaction and against a committed one.
pub async fn conflict_in_a_savepoint<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let mut tx = k.pool.begin().await.unwrap();
    let first = fingerprinted(&mut tx, &msg("k", "a"), &runs, &d).await;
    assert!(first.unwrap().is_applied());
    conflict(fingerprinted(&mut tx, &msg("k", "b"), &runs, &d).await);
    let again = fingerprinted(&mut tx, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate);
    tx.commit().await.unwrap();
    let mut tx = k.pool.begin().await.unwrap();
    conflict(fingerprinted(&mut tx, &msg("k", "c"), &runs, &d).await);
    tx.commit().await.unwrap();
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// In a batch: a key stored before and a key repeated within the batch are both checked.
pub async fn conflict_in_a_batch<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let old = fingerprinted(&k.pool, &msg("old", "a"), &runs, &d).await;
    assert!(old.unwrap().is_applied());
    let messages = [
        msg("old", "b"),
        msg("old", "a"),
        msg("new", "x"),
        msg("new", "y"),
        msg("new", "x"),
    ];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        fingerprinted(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    let mut results = results.into_iter();
    conflict(results.next().unwrap());
    assert_eq!(results.next().unwrap().unwrap(), Outcome::Duplicate);
    assert!(results.next().unwrap().unwrap().is_applied());
    conflict(results.next().unwrap());
    assert_eq!(results.next().unwrap().unwrap(), Outcome::Duplicate);
    assert_eq!(effects(&k).await, 2);
    assert_eq!(rows(&k, "idem_records").await, 2);
    k.close().await;
}

/// Lease mode: a done message and one in progress (its lease row carries the fingerprint at
/// once) are both checked.
pub async fn conflict_in_lease_mode<B: Backend<Db: Stamps + Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    assert!(leased(&k.pool, &msg("k", "a"), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    conflict(leased(&k.pool, &msg("k", "b"), &runs, &d).await);
    // In progress elsewhere: a lease row with the fingerprint of payload "a".
    k.exec(
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token, fingerprint) \
         SELECT scope, $1, expires_at, expires_at, 7, fingerprint FROM idem_records",
        &[b"busy".as_slice().into()],
    )
    .await;
    conflict(leased(&k.pool, &msg("busy", "b"), &runs, &d).await);
    let busy = leased(&k.pool, &msg("busy", "a"), &runs, &d).await;
    assert_eq!(busy.unwrap(), Outcome::InProgress);
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// Key + version: the fingerprint is kept on the version row; an equal version with another
/// payload is a conflict, an older one stale, a newer one applies.
pub async fn conflict_with_version<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let v = |body: &str, version| msg("k", body).at(version);
    assert!(versioned(&k.pool, &v("a", 2), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    conflict(versioned(&k.pool, &v("b", 2), &runs, &d).await);
    let stale = versioned(&k.pool, &v("b", 1), &runs, &d).await;
    assert_eq!(stale.unwrap(), Outcome::Stale { latest: 2 });
    assert_eq!(stored_fingerprint(&k, "idem_versions").await.len(), 32);
    assert!(versioned(&k.pool, &v("b", 3), &runs, &d)
        .await
        .unwrap()
        .is_applied());
    conflict(versioned(&k.pool, &v("a", 3), &runs, &d).await);
    assert_eq!(runs.get(), 2);
    assert_eq!(effects(&k).await, 2);
    assert_eq!(rows(&k, "idem_records").await, 0);
    k.close().await;
}

/// Two payloads with one key delivered at once, on pools: exactly one applies, the other is a
/// conflict (it waited on the first's row lock, then read its fingerprint).
pub async fn concurrent_payloads_one_applies_one_conflicts<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    for round in 0..5 {
        let id = format!("race{round}");
        let (a, b) = (msg(&id, "a"), msg(&id, "b"));
        let (ra, rb) = tokio::join!(
            fingerprinted(&k.pool, &a, &runs, &d),
            fingerprinted(&k.pool, &b, &runs, &d)
        );
        let applied = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Ok(Outcome::Applied(_))))
            .count();
        let conflicts = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Err(idem::Error::Conflict { .. })))
            .count();
        assert_eq!((applied, conflicts), (1, 1), "{ra:?} {rb:?}");
    }
    assert_eq!(effects(&k).await, 5);
    assert_eq!(rows(&k, "idem_records").await, 5);
    k.close().await;
}

//! Key + version (the key is the entity): a greater version applies, the same one is a
//! duplicate, a lower one is stale; the mode keeps a version per entity, not a record per message.

use idem::Outcome;

use crate::fixtures::{order, records, set_status, setup, status, stored_version};
use crate::Backend;

const SCOPE: &str = "suite::set_status";

/// Delivers order 7's status changes `(version, status, outcome)` in turn, each with its
/// outcome; then the order's row, and the version stored for it, are at `end`.
async fn deliver<B: Backend>(steps: &[(i64, &str, Outcome<()>)], end: (&str, i64)) {
    let (k, _) = crate::__open!(B, setup);
    for (version, name, expected) in steps {
        let msg = status("unused", 7, *version, name);
        let got = set_status(&k.pool, &msg, &k.dialect).await.unwrap();
        assert_eq!(&got, expected, "{msg:?}");
    }
    let row = order(&k, 7).await.unwrap();
    assert_eq!(
        (row.id, row.status.as_str(), row.version),
        (7, end.0, end.1)
    );
    assert_eq!(stored_version(&k, SCOPE, b"7").await, Some(end.1));
    // This mode keeps a version per entity, not a record per message.
    assert_eq!(records(&k, SCOPE).await, 0);
    k.close().await;
}

/// A greater version applies and becomes the entity's version; no record per message is kept.
pub async fn greater_version_applies<B: Backend>() {
    let steps = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (4, "shipped", Outcome::Applied(())),
    ];
    deliver::<B>(&steps, ("shipped", 4)).await;
}

/// The entity's current version again is a duplicate and runs nothing.
pub async fn equal_version_is_duplicate<B: Backend>() {
    let steps = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (2, "paid-again", Outcome::Duplicate),
    ];
    deliver::<B>(&steps, ("paid", 2)).await;
}

/// A version below the entity's is stale (with the latest version) and runs nothing.
pub async fn lower_version_is_stale<B: Backend>() {
    let steps = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (1, "placed", Outcome::Stale { latest: 2 }),
        (4, "shipped", Outcome::Applied(())),
        (3, "packed", Outcome::Stale { latest: 4 }),
    ];
    deliver::<B>(&steps, ("shipped", 4)).await;
}

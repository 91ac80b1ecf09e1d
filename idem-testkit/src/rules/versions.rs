//! Key + version (the key is the entity): a greater version applies, the same one is a
//! duplicate, a lower one is stale; the mode keeps a version per entity, not a record per message.

use idem::Outcome;

use crate::fixtures::{order, records, set_status, setup, status, stored_version};
use crate::Backend;

const SCOPE: &str = "suite::set_status";

/// A greater version applies and becomes the entity's version; no record per message is kept.
pub async fn greater_version_applies<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    for (version, name) in [(1, "placed"), (2, "paid"), (4, "shipped")] {
        let got = set_status(&k.pool, &status("unused", 7, version, name), &d).await;
        assert_eq!(got.unwrap(), Outcome::Applied(()), "version {version}");
    }
    let row = order(&k, 7).await.unwrap();
    assert_eq!(
        (row.id, row.status.as_str(), row.version),
        (7, "shipped", 4)
    );
    assert_eq!(stored_version(&k, SCOPE, b"7").await, Some(4));
    // This mode keeps a version per entity, not a record per message.
    assert_eq!(records(&k, SCOPE).await, 0);
    k.close().await;
}

/// The entity's current version again is a duplicate and runs nothing.
pub async fn equal_version_is_duplicate<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let steps = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (2, "paid-again", Outcome::Duplicate),
    ];
    for (version, name, expected) in steps {
        let got = set_status(&k.pool, &status("unused", 7, version, name), &d).await;
        assert_eq!(got.unwrap(), expected, "version {version}");
    }
    let row = order(&k, 7).await.unwrap();
    assert_eq!((row.status.as_str(), row.version), ("paid", 2));
    assert_eq!(stored_version(&k, SCOPE, b"7").await, Some(2));
    assert_eq!(records(&k, SCOPE).await, 0);
    k.close().await;
}

/// A version below the entity's is stale (with the latest version) and runs nothing.
pub async fn lower_version_is_stale<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let steps = [
        (1, "placed", Outcome::Applied(())),
        (2, "paid", Outcome::Applied(())),
        (1, "placed", Outcome::Stale { latest: 2 }),
        (4, "shipped", Outcome::Applied(())),
        (3, "packed", Outcome::Stale { latest: 4 }),
    ];
    for (version, name, expected) in steps {
        let got = set_status(&k.pool, &status("unused", 7, version, name), &d).await;
        assert_eq!(got.unwrap(), expected, "version {version}");
    }
    let row = order(&k, 7).await.unwrap();
    assert_eq!((row.status.as_str(), row.version), ("shipped", 4));
    assert_eq!(stored_version(&k, SCOPE, b"7").await, Some(4));
    assert_eq!(records(&k, SCOPE).await, 0);
    k.close().await;
}

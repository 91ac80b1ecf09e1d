//! Key + version + entity: a seen key is a duplicate; otherwise a version not above the
//! entity's is stale and leaves no record; entities are ordered independently.

use idem::Outcome;

use crate::fixtures::{on_status_is, order, recorded, records, setup, status, stored_version};
use crate::Backend;

const SCOPE: &str = "suite::on_status";

/// A key already applied is a duplicate, whatever its version.
pub async fn seen_key_is_duplicate<B: Backend>() {
    let (k, _) = crate::__open!(B, setup);
    let steps = [
        (status("e1", 9, 1, "placed"), Outcome::Applied(())),
        (status("e1", 9, 1, "placed"), Outcome::Duplicate),
        (status("e3", 9, 3, "shipped"), Outcome::Applied(())),
        (status("e3", 9, 3, "shipped"), Outcome::Duplicate),
        (status("e1", 9, 1, "placed"), Outcome::Duplicate),
    ];
    for (msg, expected) in steps {
        on_status_is(&k, &msg, expected).await;
    }
    assert_eq!(order(&k, 9).await.unwrap().status, "shipped");
    assert_eq!(records(&k, SCOPE).await, 2);
    assert_eq!(stored_version(&k, SCOPE, b"9").await, Some(3));
    k.close().await;
}

/// A new key whose version is not above the entity's is stale, and its record is not kept.
pub async fn version_not_above_the_entitys_is_stale<B: Backend>() {
    let (k, _) = crate::__open!(B, setup);
    let steps = [
        (status("e1", 9, 1, "placed"), Outcome::Applied(())),
        (
            status("e2", 9, 1, "placed-again"),
            Outcome::Stale { latest: 1 },
        ),
        (status("e3", 9, 3, "shipped"), Outcome::Applied(())),
        (status("e4", 9, 2, "paid"), Outcome::Stale { latest: 3 }),
    ];
    for (msg, expected) in steps {
        on_status_is(&k, &msg, expected).await;
    }
    assert_eq!(order(&k, 9).await.unwrap().status, "shipped");
    assert_eq!(stored_version(&k, SCOPE, b"9").await, Some(3));
    // Stale deliveries leave no record: e2 and e4 were rolled back.
    assert_eq!(records(&k, SCOPE).await, 2);
    assert!(!recorded(&k, SCOPE, "e2").await);
    assert!(!recorded(&k, SCOPE, "e4").await);
    k.close().await;
}

/// Each entity has a version of its own.
pub async fn entities_are_ordered_independently<B: Backend>() {
    let (k, _) = crate::__open!(B, setup);
    for msg in [
        status("e1", 9, 1, "placed"),
        status("e3", 9, 3, "shipped"),
        status("e5", 10, 1, "placed"),
    ] {
        on_status_is(&k, &msg, Outcome::Applied(())).await;
    }
    assert_eq!(order(&k, 10).await.unwrap().version, 1);
    assert_eq!(order(&k, 9).await.unwrap().version, 3);
    assert_eq!(stored_version(&k, SCOPE, b"9").await, Some(3));
    assert_eq!(stored_version(&k, SCOPE, b"10").await, Some(1));
    assert_eq!(records(&k, SCOPE).await, 3);
    k.close().await;
}

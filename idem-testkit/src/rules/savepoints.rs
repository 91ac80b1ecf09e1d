//! Inside a caller's transaction a handler runs in a savepoint: the caller's commit or rollback
//! decides for the handler's effect and record together.

use idem::Outcome;

use crate::fixtures::{
    apply_credit, balance, credit, credit_is, note, recorded, records, rows_in, setup,
};
use crate::Backend;

/// A caller's transaction that rolls back takes the handler's effect and record with it, so the
/// redelivery applies.
pub async fn callers_rollback_leaves_nothing<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let msg = credit("m-sp", "dave", 4);
    let mut tx = k.pool.begin().await.unwrap();
    note::<B::Db>(&mut tx, &d, "caller").await.unwrap();
    assert_eq!(
        apply_credit(&mut tx, &msg, &d).await.unwrap(),
        Outcome::Applied(4)
    );
    tx.rollback().await.unwrap();
    assert_eq!(balance(&k, "dave").await, None);
    assert_eq!(records(&k, "suite::apply_credit").await, 0);
    assert_eq!(rows_in(&k, "audit").await, 0);
    // The redelivery applies, since nothing was recorded.
    credit_is(&k, &msg, Outcome::Applied(4)).await;
    assert_eq!(balance(&k, "dave").await, Some(4));
    k.close().await;
}

/// In a caller's transaction that commits, applied messages survive, a duplicate inside it is
/// skipped, and a failing handler rolls back to its savepoint only.
pub async fn callers_commit_keeps_all_but_the_failed_handler<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let mut tx = k.pool.begin().await.unwrap();
    note::<B::Db>(&mut tx, &d, "caller").await.unwrap();
    // A batch in one transaction: three messages, one of them twice, one failing.
    assert!(apply_credit(&mut tx, &credit("b-1", "erin", 1), &d)
        .await
        .unwrap()
        .is_applied());
    assert!(apply_credit(&mut tx, &credit("b-2", "erin", 2), &d)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        apply_credit(&mut tx, &credit("b-1", "erin", 1), &d)
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    let mut failing = credit("b-3", "erin", 100);
    failing.fail = true;
    assert!(apply_credit(&mut tx, &failing, &d).await.is_err());
    // The failed message rolled back to its savepoint only; the caller's transaction goes on.
    note::<B::Db>(&mut tx, &d, "after").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(balance(&k, "erin").await, Some(3));
    assert_eq!(records(&k, "suite::apply_credit").await, 2);
    assert!(!recorded(&k, "suite::apply_credit", "b-3").await);
    assert_eq!(rows_in(&k, "audit").await, 2);
    k.close().await;
}

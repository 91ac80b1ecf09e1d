//! Key only: the first delivery of a message applies and is recorded with its effect; every
//! later one is a duplicate that runs nothing; a failed or panicking handler leaves nothing.

use idem::{Error, Outcome};

use crate::fixtures::{apply_credit, balance, credit, credit_is, recorded, records, setup};
use crate::Backend;

/// The first delivery of a message applies, and its record commits with its effect.
pub async fn first_delivery_applies<B: Backend>() {
    let (k, _) = crate::__open!(B, setup);
    let msg = credit("m-1", "alice", 10);
    credit_is(&k, &msg, Outcome::Applied(10)).await;
    assert_eq!(balance(&k, "alice").await, Some(10));
    assert_eq!(records(&k, "suite::apply_credit").await, 1);
    assert!(recorded(&k, "suite::apply_credit", "m-1").await);
    k.close().await;
}

/// A second (and third) delivery of a message is a duplicate and runs nothing; another message
/// still applies.
pub async fn second_delivery_is_duplicate<B: Backend>() {
    let (k, _) = crate::__open!(B, setup);
    let msg = credit("m-1", "alice", 10);
    credit_is(&k, &msg, Outcome::Applied(10)).await;
    credit_is(&k, &msg, Outcome::Duplicate).await;
    credit_is(&k, &msg, Outcome::Duplicate).await;
    credit_is(&k, &credit("m-2", "alice", 5), Outcome::Applied(15)).await;
    assert_eq!(balance(&k, "alice").await, Some(15));
    assert_eq!(records(&k, "suite::apply_credit").await, 2);
    k.close().await;
}

/// A handler error rolls back its effect and records nothing, so the redelivery applies (once).
pub async fn handler_error_rolls_back_and_the_redelivery_applies<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let mut msg = credit("m-err", "bob", 7);
    msg.fail = true;
    let err = apply_credit(&k.pool, &msg, &d).await.unwrap_err();
    assert!(
        matches!(err, Error::Handler(sqlx::Error::Protocol(_))),
        "{err:?}"
    );
    assert_eq!(balance(&k, "bob").await, None, "the effect was rolled back");
    assert_eq!(
        records(&k, "suite::apply_credit").await,
        0,
        "nothing recorded"
    );
    msg.fail = false;
    credit_is(&k, &msg, Outcome::Applied(7)).await;
    credit_is(&k, &msg, Outcome::Duplicate).await;
    assert_eq!(balance(&k, "bob").await, Some(7));
    k.close().await;
}

/// A handler panic rolls back its effect and records nothing, so the redelivery applies (once).
pub async fn handler_panic_rolls_back_and_the_redelivery_applies<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let mut msg = credit("m-panic", "carol", 3);
    msg.panic = true;
    let task = {
        let (pool, msg) = (k.pool.clone(), msg.clone());
        tokio::spawn(async move { apply_credit(&pool, &msg, &d).await })
    };
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(balance(&k, "carol").await, None);
    assert_eq!(records(&k, "suite::apply_credit").await, 0);
    msg.panic = false;
    credit_is(&k, &msg, Outcome::Applied(3)).await;
    credit_is(&k, &msg, Outcome::Duplicate).await;
    assert_eq!(balance(&k, "carol").await, Some(3));
    k.close().await;
}

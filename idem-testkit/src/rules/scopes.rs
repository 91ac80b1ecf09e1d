//! Scopes: two handlers of one message each handle it once.

use idem::Outcome;

use crate::fixtures::{apply_credit, balance, credit, credit_is, notify, recorded, rows_in, setup};
use crate::Backend;

/// Two handlers (two scopes) of the same message each apply it once.
pub async fn two_scopes_each_handle_the_message_once<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let msg = credit("m-both", "frank", 2);
    assert!(apply_credit(&k.pool, &msg, &d).await.unwrap().is_applied());
    assert!(notify(&k.pool, &msg, &d).await.unwrap().is_applied());
    assert_eq!(notify(&k.pool, &msg, &d).await.unwrap(), Outcome::Duplicate);
    credit_is(&k, &msg, Outcome::Duplicate).await;
    assert_eq!(balance(&k, "frank").await, Some(2));
    assert_eq!(rows_in(&k, "audit").await, 1);
    assert!(recorded(&k, "suite::notify", "m-both").await);
    assert!(recorded(&k, "suite::apply_credit", "m-both").await);
    k.close().await;
}

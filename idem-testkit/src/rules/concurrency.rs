//! Concurrent deliveries are decided by the database: each message applies exactly once, and
//! racing versions end in the newest state.

use std::sync::Arc;

use idem::Outcome;

use crate::fixtures::{
    apply_credit, balance, credit, on_status, order, records, setup, status, stored_version, Credit,
};
use crate::Backend;

/// Eight workers delivering the same 40 messages at once apply each exactly once.
pub async fn concurrent_deliveries_apply_each_message_exactly_once<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    const WORKERS: usize = 8;
    const MESSAGES: i64 = 40;
    let messages: Arc<Vec<Credit>> = Arc::new(
        (0..MESSAGES)
            .map(|i| credit(&format!("c-{i}"), &format!("acct-{}", i % 4), i + 1))
            .collect(),
    );
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (pool, messages) = (k.pool.clone(), messages.clone());
        tasks.push(tokio::spawn(async move {
            let mut applied = 0;
            // Each worker walks the stream from a different place, so the same message is
            // in flight on several workers at once.
            for i in 0..messages.len() {
                let msg = &messages[(i + worker * 5) % messages.len()];
                match apply_credit(&pool, msg, &d).await {
                    Ok(Outcome::Applied(_)) => applied += 1,
                    Ok(Outcome::Duplicate) => {}
                    other => panic!("worker {worker}, {}: {other:?}", msg.id),
                }
            }
            applied
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += task.await.unwrap();
    }
    assert_eq!(applied, MESSAGES);
    assert_eq!(records(&k, "suite::apply_credit").await, MESSAGES);
    for account in 0..4 {
        let expected: i64 = (0..MESSAGES)
            .filter(|i| i % 4 == account)
            .map(|i| i + 1)
            .sum();
        assert_eq!(
            balance(&k, &format!("acct-{account}")).await,
            Some(expected)
        );
    }
    k.close().await;
}

/// Two versions of an entity racing end in the newer one, whichever arrives first.
pub async fn racing_versions_end_in_the_newest_state<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    const ORDERS: i64 = 12;
    let mut tasks = Vec::new();
    for order_id in 0..ORDERS {
        // Versions 5 and 6 of each order race; the older one is sent first half of the time.
        for (version, name) in [(5, "paid"), (6, "shipped")] {
            let pool = k.pool.clone();
            let msg = status(&format!("ev-{order_id}-{version}"), order_id, version, name);
            tasks.push(tokio::spawn(
                async move { on_status(&pool, &msg, &d).await },
            ));
        }
        if order_id % 2 == 0 {
            let n = tasks.len();
            tasks.swap(n - 1, n - 2);
        }
    }
    for task in tasks {
        let outcome = task.await.unwrap().unwrap();
        assert!(
            matches!(outcome, Outcome::Applied(()) | Outcome::Stale { latest: 6 }),
            "{outcome:?}"
        );
    }
    for order_id in 0..ORDERS {
        let row = order(&k, order_id).await.unwrap();
        assert_eq!(
            (row.status.as_str(), row.version),
            ("shipped", 6),
            "order {order_id}"
        );
        let entity = order_id.to_string();
        assert_eq!(
            stored_version(&k, "suite::on_status", entity.as_bytes()).await,
            Some(6)
        );
    }
    k.close().await;
}

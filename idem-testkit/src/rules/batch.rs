//! `idem::batch`: many messages in one transaction, each decided as if delivered alone, in order.

use std::fmt::Debug;

use idem::{Error, Outcome};

use crate::fixtures::{
    apply_credit, balance, credit, credit_is, notify, on_status, on_status_is, order, recorded,
    records, rows_in, set_status, setup, status, stored_version, Credit, StatusChanged,
};
use crate::{Backend, Kit};

/// `messages` through `handler` in one `idem::batch` on the rule's pool: each one's result.
async fn batch_results<B: Backend, M, T, E>(
    k: &Kit<B>,
    messages: &[M],
    handler: impl AsyncFnMut(&mut idem::Batch<B::Db>, &M) -> Result<Outcome<T>, Error<E>>,
) -> Vec<Result<Outcome<T>, Error<E>>> {
    idem::batch(&k.pool, messages, handler)
        .await
        .expect("the batch's transaction")
}

/// The same, each one's outcome: none may fail.
async fn batch_outcomes<B: Backend, M, T: Debug, E: Debug>(
    k: &Kit<B>,
    messages: &[M],
    handler: impl AsyncFnMut(&mut idem::Batch<B::Db>, &M) -> Result<Outcome<T>, Error<E>>,
) -> Vec<Outcome<T>> {
    let results = batch_results(k, messages, handler).await;
    results.into_iter().map(Result::unwrap).collect()
}

/// A batch applies each new message once, in one transaction; a redelivery inside it and a
/// message applied before it are duplicates.
pub async fn applies_each_message_once_in_one_transaction<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    credit_is(&k, &credit("old", "gina", 100), Outcome::Applied(100)).await;
    let messages = vec![
        credit("n-1", "gina", 1),
        credit("n-2", "gina", 2),
        credit("n-1", "gina", 1),   // a redelivery inside the batch
        credit("old", "gina", 100), // already applied before the batch
        credit("n-3", "hal", 3),
    ];
    // (That a batch's future is Send, so it can be spawned, is checked on a concrete database
    // by this module's unit test: rustc cannot prove it for a generic `DB`.)
    let outcomes =
        batch_outcomes(&k, &messages, async |b, msg| apply_credit(b, msg, &d).await).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(101),
            Outcome::Applied(103),
            Outcome::Duplicate,
            Outcome::Duplicate,
            Outcome::Applied(3)
        ]
    );
    assert_eq!(balance(&k, "gina").await, Some(103));
    assert_eq!(balance(&k, "hal").await, Some(3));
    assert_eq!(records(&k, "suite::apply_credit").await, 4);
    k.close().await;
}

/// A failing message splits the batch: only it is lost, and it applies on redelivery, once.
pub async fn failing_message_splits_the_batch<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let mut messages: Vec<Credit> = (0..10)
        .map(|i| credit(&format!("s-{i}"), "ivan", 1 << i))
        .collect();
    messages[3].fail = true;
    messages[7].fail = true;
    let results = batch_results(&k, &messages, async |b, msg| apply_credit(b, msg, &d).await).await;
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (3 | 7, Err(Error::Handler(_))) => {}
            (3 | 7, other) => panic!("message {i}: {other:?}"),
            (_, Ok(Outcome::Applied(_))) => {}
            (_, other) => panic!("message {i}: {other:?}"),
        }
    }
    let expected: i64 = (0..10).filter(|i| *i != 3 && *i != 7).map(|i| 1 << i).sum();
    assert_eq!(balance(&k, "ivan").await, Some(expected));
    assert_eq!(records(&k, "suite::apply_credit").await, 8);
    assert!(!recorded(&k, "suite::apply_credit", "s-3").await);
    assert!(!recorded(&k, "suite::apply_credit", "s-7").await);
    // The failed ones apply on redelivery, once.
    messages[3].fail = false;
    messages[7].fail = false;
    let again = batch_results(&k, &messages, async |b, msg| apply_credit(b, msg, &d).await).await;
    let applied = again
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Applied(_))))
        .count();
    assert_eq!(applied, 2);
    assert_eq!(balance(&k, "ivan").await, Some(1023));
    assert_eq!(records(&k, "suite::apply_credit").await, 10);
    k.close().await;
}

/// Versions with entities inside a batch: a stale message's record is taken back, a duplicate
/// inside the batch runs nothing.
pub async fn stale_and_duplicate_inside_a_batch_leave_no_trace<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let events = vec![
        status("v-1", 1, 1, "placed"),
        status("v-3", 1, 3, "shipped"),
        status("v-2", 1, 2, "paid"),    // stale inside the batch
        status("v-3", 1, 3, "shipped"), // duplicate inside the batch
        status("w-1", 2, 1, "placed"),
    ];
    let outcomes = batch_outcomes(&k, &events, async |b, msg| on_status(b, msg, &d).await).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Stale { latest: 3 },
            Outcome::Duplicate,
            Outcome::Applied(())
        ]
    );
    assert_eq!(order(&k, 1).await.unwrap().status, "shipped");
    assert_eq!(order(&k, 2).await.unwrap().status, "placed");
    assert_eq!(stored_version(&k, "suite::on_status", b"1").await, Some(3));
    // The stale message's record was taken back.
    assert!(!recorded(&k, "suite::on_status", "v-2").await);
    assert_eq!(records(&k, "suite::on_status").await, 3);
    k.close().await;
}

/// A stale message delivered twice in one batch is stale twice, as delivered one by one: its
/// first copy applies nothing and keeps no record, so the second is not a duplicate of it.
pub async fn a_stale_message_twice_in_a_batch_is_stale_twice<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    on_status_is(&k, &status("t-5", 4, 5, "shipped"), Outcome::Applied(())).await;
    let events = vec![
        status("t-2", 4, 2, "paid"),
        status("t-2", 4, 2, "paid"),
        status("t-6", 4, 6, "delivered"),
        status("t-6", 4, 6, "delivered"),
    ];
    let outcomes = batch_outcomes(&k, &events, async |b, msg| on_status(b, msg, &d).await).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Stale { latest: 5 },
            Outcome::Stale { latest: 5 },
            Outcome::Applied(()),
            Outcome::Duplicate,
        ]
    );
    assert!(!recorded(&k, "suite::on_status", "t-2").await);
    assert!(recorded(&k, "suite::on_status", "t-6").await);
    let row = order(&k, 4).await.unwrap();
    assert_eq!((row.status.as_str(), row.version), ("delivered", 6));
    k.close().await;
}

/// Two handlers of one message in one batch each run once.
pub async fn two_handlers_of_one_message_each_run_once<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let credits = vec![credit("x-1", "jan", 5), credit("x-1", "jan", 5)];
    let outcomes = batch_outcomes(&k, &credits, async |b, msg| {
        let first = apply_credit(&mut *b, msg, &d).await?;
        let second = notify(b, msg, &d).await?;
        Ok(match (first, second) {
            (Outcome::Applied(_), Outcome::Applied(())) => Outcome::Applied(()),
            (Outcome::Duplicate, Outcome::Duplicate) => Outcome::Duplicate,
            other => panic!("{other:?}"),
        })
    })
    .await;
    assert_eq!(outcomes, [Outcome::Applied(()), Outcome::Duplicate]);
    assert_eq!(balance(&k, "jan").await, Some(5));
    assert!(recorded(&k, "suite::notify", "x-1").await);
    assert!(recorded(&k, "suite::apply_credit", "x-1").await);
    assert_eq!(rows_in(&k, "audit").await, 1);
    k.close().await;
}

/// A batch closure that branches on an outcome keeps no record of a handler it did not run.
pub async fn closure_branching_on_an_outcome_loses_nothing<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    // `notify` runs only for messages `apply_credit` did not apply. The first pass sees every
    // `apply_credit` as not applied (it only gathers claims), so it plans `notify` for all; the
    // second pass applies the new ones and never calls `notify` for them. Their planned
    // `notify` records must not stay, or those messages would count as notified without an
    // audit row.
    let messages = vec![
        credit("br-1", "kim", 2),
        credit("br-old", "kim", 1),
        credit("br-2", "kim", 3),
    ];
    credit_is(&k, &messages[1], Outcome::Applied(1)).await;
    let outcomes = batch_outcomes(&k, &messages, async |b, msg| {
        let credited = apply_credit(&mut *b, msg, &d).await?;
        if credited.is_applied() {
            return Ok(Outcome::Applied(()));
        }
        notify(b, msg, &d).await
    })
    .await;
    assert_eq!(
        outcomes,
        [
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Applied(())
        ]
    );
    assert_eq!(balance(&k, "kim").await, Some(6));
    // Only br-old was notified, and the records say exactly that.
    assert_eq!(rows_in(&k, "audit").await, 1);
    assert_eq!(records(&k, "suite::notify").await, 1);
    assert!(recorded(&k, "suite::notify", "br-old").await);
    assert!(!recorded(&k, "suite::notify", "br-1").await);
    k.close().await;
}

/// Versions in a batch are decided as if delivered one after another, in order.
pub async fn versions_decide_as_if_one_after_another<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    let paid = set_status(&k.pool, &status("-", 7, 2, "paid"), &d).await;
    assert_eq!(paid.unwrap(), Outcome::Applied(()));
    let events = vec![
        status("-", 7, 1, "placed"),  // behind the stored 2
        status("-", 7, 3, "packed"),  // applies
        status("-", 7, 3, "packed"),  // equal: a duplicate
        status("-", 8, 1, "placed"),  // a new entity
        status("-", 7, 5, "shipped"), // applies
        status("-", 7, 4, "late"),    // behind the batch's own 5
    ];
    let outcomes = batch_outcomes(&k, &events, async |b, msg| set_status(b, msg, &d).await).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Stale { latest: 2 },
            Outcome::Applied(()),
            Outcome::Duplicate,
            Outcome::Applied(()),
            Outcome::Applied(()),
            Outcome::Stale { latest: 5 },
        ]
    );
    let row = order(&k, 7).await.unwrap();
    assert_eq!((row.status.as_str(), row.version), ("shipped", 5));
    assert_eq!(stored_version(&k, "suite::set_status", b"7").await, Some(5));
    assert_eq!(stored_version(&k, "suite::set_status", b"8").await, Some(1));
    k.close().await;
}

/// Concurrent batches over the same entities end in the newest state, each event applied at
/// most once.
pub async fn concurrent_batches_end_in_the_newest_state<B: Backend>() {
    let (k, d) = crate::__open!(B, setup);
    // Local tasks: rustc cannot prove a generic batch future Send (see above). They still run
    // four transactions at once, each on its own connection.
    let local = tokio::task::LocalSet::new();
    let mut tasks = Vec::new();
    for worker in 0..4_i64 {
        let pool = k.pool.clone();
        tasks.push(local.spawn_local(async move {
            // Every worker sends every version of every order, each in its own order.
            let mut events: Vec<StatusChanged> = (1..=6)
                .flat_map(|version| {
                    (0..5).map(move |order| {
                        status(&format!("c-{order}-{version}"), order, version, "s")
                    })
                })
                .collect();
            events.rotate_left((worker * 7) as usize);
            let mut applied = 0;
            for chunk in events.chunks(10) {
                for result in idem::batch(&pool, chunk, async |b, msg| on_status(b, msg, &d).await)
                    .await
                    .unwrap()
                {
                    match result.unwrap() {
                        Outcome::Applied(()) => applied += 1,
                        Outcome::Duplicate | Outcome::Stale { .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
            }
            applied
        }));
    }
    let applied = local
        .run_until(async {
            let mut applied = 0;
            for task in tasks {
                applied += task.await.unwrap();
            }
            applied
        })
        .await;
    assert!(
        applied >= 5,
        "each order applied at least its newest version"
    );
    for order_id in 0..5 {
        assert_eq!(
            order(&k, order_id).await.unwrap().version,
            6,
            "order {order_id}"
        );
        let entity = order_id.to_string();
        assert_eq!(
            stored_version(&k, "suite::on_status", entity.as_bytes()).await,
            Some(6)
        );
    }
    // Every applied event has its record; no event was applied twice.
    assert_eq!(records(&k, "suite::on_status").await, applied);
    k.close().await;
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use crate::fixtures::{apply_credit, credit, setup};
    use crate::{backends::Sqlite, Kit};

    /// A batch's future is Send: it can be spawned on a multi-threaded runtime.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_future_is_send() {
        let k = Kit::<Sqlite>::open().await.unwrap();
        setup(&k).await;
        static D: crate::Dialect = crate::Dialect::sqlite();
        let pool: sqlx::SqlitePool = k.pool.clone();
        let messages = vec![credit("a", "x", 1), credit("a", "x", 1)];
        let results = tokio::spawn(async move {
            idem::batch(&pool, &messages, async |b, msg| {
                apply_credit(b, msg, &D).await
            })
            .await
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(crate::fixtures::balance(&k, "x").await, Some(1));
        k.close().await;
    }
}

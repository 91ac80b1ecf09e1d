//! `replay = true` on every path (pool, savepoint, batch, lease, key + version): a duplicate
//! returns the first delivery's value, stored as JSON with the record, and runs nothing.

use std::sync::Arc;
use std::time::Duration;

use idem::store::{Attempts, Leases, Stamps};
use idem::Outcome;
use tokio::sync::Notify;

use crate::backend::Ty;
use crate::options::{
    counted, effects, large, leased, msg, replayed, rows, setup, versioned, Msg, Runs,
};
use crate::Backend;

/// On a pool: a duplicate returns the first value, which the record keeps as JSON.
pub async fn replayed_on_a_pool<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let first = replayed(&k.pool, &msg("k", "a"), &runs, &d).await;
    let first = first.unwrap().applied().unwrap();
    assert_eq!(first, "k:a:1");
    let again = replayed(&k.pool, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(first.clone()));
    let json = k
        .rows("SELECT result FROM idem_records", &[], &[Ty::Bytes])
        .await;
    assert_eq!(json[0][0].bytes(), format!("\"{first}\"").into_bytes());
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// A duplicate that comes while the first delivery's transaction is still open waits for it,
/// then replays the value it committed (kept after the body, just before the commit).
pub async fn replayed_after_waiting_for_the_first<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let hold = Arc::new(Notify::new());
    let held = Msg {
        hold: Some(hold.clone()),
        ..msg("w", "a")
    };
    let first = tokio::spawn({
        let (pool, runs) = (k.pool.clone(), runs.clone());
        async move { replayed(&pool, &held, &runs, &d).await }
    });
    while runs.get() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = tokio::spawn({
        let (pool, runs) = (k.pool.clone(), runs.clone());
        async move { replayed(&pool, &msg("w", "a"), &runs, &d).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "the duplicate did not wait for the first"
    );
    hold.notify_one();
    let first = first.await.unwrap().unwrap().applied().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(second, Outcome::Replayed(first));
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// Inside a caller's transaction (a savepoint): a value kept in the same transaction, and one
/// committed before, are both replayed.
pub async fn replayed_in_a_savepoint<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let mut tx = k.pool.begin().await.unwrap();
    let first = replayed(&mut tx, &msg("k", "a"), &runs, &d).await;
    let first = first.unwrap().applied().unwrap();
    let again = replayed(&mut tx, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(first.clone()));
    tx.commit().await.unwrap();
    let mut tx = k.pool.begin().await.unwrap();
    let later = replayed(&mut tx, &msg("k", "a"), &runs, &d).await;
    assert_eq!(later.unwrap(), Outcome::Replayed(first));
    tx.commit().await.unwrap();
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// In a batch: a key stored before and a key repeated within the batch are both replayed.
pub async fn replayed_in_a_batch<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let old = replayed(&k.pool, &msg("old", "a"), &runs, &d).await;
    let old = old.unwrap().applied().unwrap();
    let messages = [msg("old", "a"), msg("new", "b"), msg("new", "b")];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        replayed(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results[0], Outcome::Replayed(old.clone()));
    let new = results[1].clone().applied().unwrap();
    assert_eq!(results[2], Outcome::Replayed(new));
    // A batch of one (a consumer's `batch(1)`) claims its message alone.
    let one = idem::batch(&k.pool, &messages[..1], async |b, m| {
        replayed(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    assert_eq!(
        one.into_iter().next().unwrap().unwrap(),
        Outcome::Replayed(old)
    );
    assert_eq!(effects(&k).await, 2);
    assert_eq!(rows(&k, "idem_records").await, 2);
    k.close().await;
}

/// Lease mode: a done message replays its value.
pub async fn replayed_in_lease_mode<B: Backend<Db: Stamps + Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let first = leased(&k.pool, &msg("k", "a"), &runs, &d).await;
    let first = first.unwrap().applied().unwrap();
    let again = leased(&k.pool, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(first));
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// Key + version: an equal version replays the value kept on the version row; a newer one
/// applies and replaces it.
pub async fn replayed_with_version<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let first = versioned(&k.pool, &msg("k", "a"), &runs, &d).await;
    let first = first.unwrap().applied().unwrap();
    let again = versioned(&k.pool, &msg("k", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(first));
    let second = versioned(&k.pool, &msg("k", "a").at(2), &runs, &d).await;
    let second = second.unwrap().applied().unwrap();
    let again = versioned(&k.pool, &msg("k", "a").at(2), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(second));
    assert_eq!(runs.get(), 2);
    assert_eq!(rows(&k, "idem_records").await, 0);
    k.close().await;
}

/// A batch split around a failing body keeps no value of the rolled-back attempt: the parts
/// around it run again, each writes its own values, and every applied message replays its
/// own value afterwards; the failed one keeps nothing.
pub async fn replayed_after_a_batch_split_around_a_failure<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let messages = [
        msg("s1", "a"),
        msg("s2", "b"),
        msg("s3", "c").failing(),
        msg("s4", "d"),
    ];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        replayed(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    let mut results = results.into_iter();
    let mut applied = Vec::new();
    for _ in 0..2 {
        applied.push(results.next().unwrap().unwrap().applied().unwrap());
    }
    assert!(matches!(
        results.next().unwrap(),
        Err(idem::Error::Handler(_))
    ));
    applied.push(results.next().unwrap().unwrap().applied().unwrap());
    for (m, value) in [&messages[0], &messages[1], &messages[3]]
        .into_iter()
        .zip(applied)
    {
        let again = replayed(&k.pool, m, &runs, &d).await;
        assert_eq!(again.unwrap(), Outcome::Replayed(value), "{}", m.id);
    }
    assert_eq!(rows(&k, "idem_records").await, 3);
    assert_eq!(effects(&k).await, 3);
    k.close().await;
}

/// In a batch beside a handler without stamps (`max_attempts`): each handler's duplicates are
/// judged by their own kind, the replayed ones by the value their first delivery kept.
pub async fn replayed_in_a_batch_beside_a_handler_without_stamps<
    B: Backend<Db: Stamps + Attempts>,
>() {
    let (k, d) = crate::__open!(B, setup);
    let (runs, others) = (Runs::default(), Runs::default());
    let old = replayed(&k.pool, &msg("old", "a"), &runs, &d).await;
    let old = old.unwrap().applied().unwrap();
    assert!(counted(&k.pool, &msg("old", "a"), &others, &d)
        .await
        .unwrap()
        .is_applied());
    let messages = [
        msg("old", "a"),
        msg("new", "b"),
        msg("new", "b"),
        msg("more", "c"),
    ];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        // Both calls before any `?`: the first pass gathers both handlers' claims.
        let value = replayed(&mut *b, m, &runs, &d).await;
        let plain = counted(b, m, &others, &d).await;
        Ok(match (value?, plain?) {
            (Outcome::Replayed(value), Outcome::Duplicate) => Outcome::Replayed(value),
            (Outcome::Applied(value), Outcome::Applied(_)) => Outcome::Applied(value),
            other => panic!("{other:?}"),
        })
    })
    .await
    .unwrap();
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results[0], Outcome::Replayed(old));
    let new = results[1].clone().applied().unwrap();
    assert_eq!(results[2], Outcome::Replayed(new));
    assert!(results[3].is_applied());
    assert_eq!((runs.get(), others.get()), (3, 3));
    k.close().await;
}

/// Key + version in a batch: a repeat of a version the batch applied replays its value (the
/// batch writes the stamps kept so far before it reads one), and an entity advanced twice in
/// the batch keeps the later value for the duplicates after the batch.
pub async fn replayed_with_version_in_a_batch<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let messages = [
        msg("k", "a"),
        msg("k", "a"),
        msg("j", "c"),
        msg("k", "b").at(2),
        msg("k", "b").at(2),
    ];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        versioned(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    let first = results[0].clone().applied().unwrap();
    assert_eq!(results[1], Outcome::Replayed(first));
    assert!(results[2].is_applied());
    let second = results[3].clone().applied().unwrap();
    assert_eq!(results[4], Outcome::Replayed(second.clone()));
    assert_eq!(runs.get(), 3);
    let again = versioned(&k.pool, &msg("k", "b").at(2), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(second));
    let other = versioned(&k.pool, &msg("j", "c"), &runs, &d).await;
    assert_eq!(
        other.unwrap(),
        Outcome::Replayed(results[2].clone().applied().unwrap())
    );
    assert_eq!(runs.get(), 3);
    k.close().await;
}

/// A value over `MAX_REPLAY_LEN` fails the delivery with `Error::Replay` and nothing is
/// written; one at the cap is kept and replayed.
pub async fn over_the_cap_writes_nothing<B: Backend<Db: Stamps>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let max = idem::MAX_REPLAY_LEN;
    match large(&k.pool, &msg("big", "a"), max + 1, &runs, &d).await {
        Err(idem::Error::Replay { scope, problem }) => {
            assert_eq!(scope, "options::large");
            assert!(problem.contains(&format!("{} bytes", max + 1)), "{problem}");
        }
        other => panic!("expected a replay error, got {other:?}"),
    }
    assert_eq!(effects(&k).await, 0);
    assert_eq!(rows(&k, "idem_records").await, 0);
    let value = large(&k.pool, &msg("fits", "a"), max, &runs, &d).await;
    let value = value.unwrap().applied().unwrap();
    let again = large(&k.pool, &msg("fits", "a"), max, &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Replayed(value));
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

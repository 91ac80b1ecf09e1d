//! `max_attempts = N`: the body's failures (`Err`, panic) are counted after its transaction
//! rolled back, in a transaction of their own; at N the message is `Poisoned` without running;
//! a success clears the count. On a pool, in a batch, and in lease mode.

use idem::store::{Attempts, Leases};
use idem::Outcome;

use crate::options::{
    attempts, counted, effects, last_error, leased_counted, msg, rows, setup, Runs, FAILURE,
};
use crate::Backend;

/// Errors and panics are counted although their transactions rolled back (`last_error` keeps
/// the error's text); at the bound the message is poisoned and does not run.
pub async fn counted_across_rollbacks_and_panics<B: Backend<Db: Attempts>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    let failed = counted(&k.pool, &msg("bad", "a").failing(), &runs, &d).await;
    assert!(matches!(failed, Err(idem::Error::Handler(_))), "{failed:?}");
    assert_eq!(attempts(&k, "bad").await, 1);
    assert!(
        last_error(&k, "bad").await.contains(FAILURE),
        "the error's text is kept"
    );
    let panicking = msg("bad", "a").panicking();
    let caught = idem::__private::catch_unwind(counted(&k.pool, &panicking, &runs, &d)).await;
    assert!(caught.is_err(), "the panic is resumed after counting");
    assert_eq!(attempts(&k, "bad").await, 2);
    let last = last_error(&k, "bad").await;
    assert!(last.contains("panicked after its write"), "{last}");
    let failed = counted(&k.pool, &msg("bad", "a").failing(), &runs, &d).await;
    assert!(matches!(failed, Err(idem::Error::Handler(_))));
    assert_eq!(attempts(&k, "bad").await, 3);
    // Poisoned: even a delivery that would succeed does not run.
    let poisoned = counted(&k.pool, &msg("bad", "a"), &runs, &d).await;
    assert_eq!(poisoned.unwrap(), Outcome::Poisoned { attempts: 3 });
    assert_eq!(runs.get(), 3);
    assert_eq!(effects(&k).await, 0, "every failed body rolled back");
    assert_eq!(rows(&k, "idem_records").await, 0);
    k.close().await;
}

/// A success before the bound applies and clears the count, in the transaction of its effect.
pub async fn cleared_by_a_success<B: Backend<Db: Attempts>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    for _ in 0..2 {
        let failed = counted(&k.pool, &msg("flaky", "a").failing(), &runs, &d).await;
        assert!(failed.is_err());
    }
    assert_eq!(attempts(&k, "flaky").await, 2);
    let applied = counted(&k.pool, &msg("flaky", "a"), &runs, &d).await;
    assert!(applied.unwrap().is_applied());
    assert_eq!(rows(&k, "idem_attempts").await, 0);
    let again = counted(&k.pool, &msg("flaky", "a"), &runs, &d).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate);
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

/// In a batch, a failing message is counted once per delivery (the batch runs it alone), and
/// once poisoned it is poisoned in the batch too, while the others apply.
pub async fn counted_in_a_batch<B: Backend<Db: Attempts>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    for round in 0..3 {
        let messages = [msg(&format!("ok{round}"), "a"), msg("bad", "a").failing()];
        let results = idem::batch(&k.pool, &messages, async |b, m| {
            counted(b, m, &runs, &d).await
        })
        .await
        .unwrap();
        assert!(results[0].as_ref().unwrap().is_applied());
        assert!(matches!(results[1], Err(idem::Error::Handler(_))));
        assert_eq!(attempts(&k, "bad").await, round + 1);
    }
    let messages = [msg("ok9", "a"), msg("bad", "a")];
    let results = idem::batch(&k.pool, &messages, async |b, m| {
        counted(b, m, &runs, &d).await
    })
    .await
    .unwrap();
    assert!(results[0].as_ref().unwrap().is_applied());
    assert_eq!(
        results[1].as_ref().unwrap(),
        &Outcome::Poisoned { attempts: 3 }
    );
    assert_eq!(effects(&k).await, 4);
    assert_eq!(rows(&k, "idem_records").await, 4);
    k.close().await;
}

/// Lease mode: a failure is counted and gives the lease back; at the bound the message is
/// poisoned without running, and no lease row stays.
pub async fn counted_in_lease_mode<B: Backend<Db: Attempts + Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let runs = Runs::default();
    for n in 1..=2 {
        let failed = leased_counted(&k.pool, &msg("bad", "a").failing(), &runs, &d).await;
        assert!(matches!(failed, Err(idem::Error::Handler(_))));
        assert_eq!(attempts(&k, "bad").await, n);
        assert_eq!(
            rows(&k, "idem_records").await,
            0,
            "the lease was given back"
        );
    }
    let poisoned = leased_counted(&k.pool, &msg("bad", "a"), &runs, &d).await;
    assert_eq!(poisoned.unwrap(), Outcome::Poisoned { attempts: 2 });
    assert_eq!(runs.get(), 2);
    assert_eq!(rows(&k, "idem_records").await, 0);
    let other = leased_counted(&k.pool, &msg("good", "a"), &runs, &d).await;
    assert!(other.unwrap().is_applied());
    assert_eq!(effects(&k).await, 1);
    k.close().await;
}

//! The operator's queries ([`Admin`], what the `idem` command line runs): counts per scope, one
//! record and one version read back, `forget` and `release` that let the next delivery run,
//! purges of exactly the expired records, and counted failures listed and cleared. Each rule
//! writes through the backend's own [`Store`] methods or real handlers, and checks the admin
//! query against the tables.

use std::time::Duration;

use idem::admin::{Admin, AttemptInfo, Deletion, ScopeStats};
use idem::store::{
    Attempts, FailedAttempt, LeaseClaim, LeaseRequest, Leases, Record, RecordKey, Store,
    VersionEntry,
};
use idem::{idempotent, Outcome, Tx};

use crate::backend::{Kit, KitDb};
use crate::fixtures::{balance, credit, credit_is, note, recorded, records, rows_in, setup};
use crate::{Backend, Dialect};

const HOUR: Duration = Duration::from_secs(3600);

fn record<'a>(scope: &'a str, key: &'a str, retention: Duration) -> Record<'a> {
    Record {
        scope,
        key: key.as_bytes(),
        retention,
        fingerprint: None,
    }
}

/// Inserts a done record of `key`, kept for `retention`.
async fn insert<B: Backend>(k: &Kit<B>, scope: &str, key: &str, retention: Duration) {
    let mut conn = k.conn().await;
    assert!(
        B::Db::insert_record(&mut conn, record(scope, key, retention))
            .await
            .unwrap()
    );
}

/// Takes a lease on `key` for `lease`, as a worker that then died would have left it.
async fn hold<B: Backend>(k: &Kit<B>, scope: &str, key: &str, lease: Duration, retention: Duration)
where
    B::Db: Leases,
{
    let mut conn = k.conn().await;
    let request = LeaseRequest {
        record: record(scope, key, retention),
        lease,
        token: 42,
    };
    assert_eq!(
        B::Db::claim_lease(&mut conn, request).await.unwrap(),
        LeaseClaim::Acquired
    );
}

/// Lets the database's clock pass the times just written (those of a zero duration, and those
/// a backend rounds to the nearest millisecond).
async fn let_time_pass() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// `stats` counts, per scope and sorted by scope, the records, the leases running and lapsed,
/// the expired records and the version rows, with processing times from the database's clock;
/// `scope_known` agrees; one scope can be asked for alone.
pub async fn stats_count_records_leases_expired_and_versions<B: Backend<Db: Admin + Leases>>() {
    let k = crate::__open!(B);
    assert!(B::Db::tables_present(&k.pool).await.unwrap());
    assert!(B::Db::stats(&k.pool, None).await.unwrap().is_empty());
    let before = B::Db::now_ms(&k.pool).await.unwrap();
    for key in ["k1", "k2", "k3"] {
        insert(&k, "admin::a", key, HOUR).await;
    }
    insert(&k, "admin::a", "old", Duration::ZERO).await;
    hold(&k, "admin::b", "held", HOUR, HOUR).await;
    hold(&k, "admin::b", "lapsed", Duration::ZERO, HOUR).await;
    {
        let mut conn = k.conn().await;
        for (entity, version) in [("e1", 1), ("e2", 5)] {
            let entry = VersionEntry {
                scope: "admin::c",
                entity: entity.as_bytes(),
                version,
            };
            B::Db::advance_version(&mut conn, entry).await.unwrap();
        }
    }
    let_time_pass().await;
    let after = B::Db::now_ms(&k.pool).await.unwrap();

    let stats = B::Db::stats(&k.pool, None).await.unwrap();
    let times: Vec<(Option<i64>, Option<i64>)> = stats
        .iter()
        .map(|s| (s.oldest_processed_ms, s.newest_processed_ms))
        .collect();
    for (oldest, newest) in times.iter().take(2) {
        let (oldest, newest) = (oldest.unwrap(), newest.unwrap());
        assert!(
            before <= oldest && oldest <= newest && newest <= after,
            "{stats:?}"
        );
    }
    let counts = |scope: &str, records, in_progress, lapsed_leases, expired, versions| {
        let (oldest_processed_ms, newest_processed_ms) = match scope {
            "admin::a" => times[0],
            "admin::b" => times[1],
            _ => (None, None),
        };
        ScopeStats {
            scope: scope.into(),
            records,
            in_progress,
            lapsed_leases,
            expired,
            oldest_processed_ms,
            newest_processed_ms,
            versions,
        }
    };
    assert_eq!(
        stats,
        [
            counts("admin::a", 4, 0, 0, 1, 0),
            counts("admin::b", 2, 1, 1, 0, 0),
            counts("admin::c", 0, 0, 0, 0, 2),
        ]
    );
    assert_eq!(
        B::Db::stats(&k.pool, Some("admin::b")).await.unwrap(),
        [counts("admin::b", 2, 1, 1, 0, 0)]
    );
    assert!(B::Db::stats(&k.pool, Some("admin::none"))
        .await
        .unwrap()
        .is_empty());
    for (scope, known) in [
        ("admin::a", true),
        ("admin::c", true),
        ("admin::none", false),
    ] {
        assert_eq!(B::Db::scope_known(&k.pool, scope).await.unwrap(), known);
    }
    assert_eq!(records(&k, "admin::a").await, 4);
    k.close().await;
}

/// `record` reads a done record (no lease, kept for its retention) and one in progress (its
/// lease's end); `version` reads an entity's high-water mark; missing ones are `None`.
pub async fn record_and_version_read_back_what_was_written<B: Backend<Db: Admin + Leases>>() {
    let k = crate::__open!(B);
    let before = B::Db::now_ms(&k.pool).await.unwrap();
    insert(&k, "admin::a", "done", HOUR).await;
    hold(&k, "admin::a", "held", 2 * HOUR, HOUR).await;
    {
        let mut conn = k.conn().await;
        let entry = VersionEntry {
            scope: "admin::a",
            entity: b"order-42",
            version: 7,
        };
        B::Db::advance_version(&mut conn, entry).await.unwrap();
    }
    let_time_pass().await;
    let after = B::Db::now_ms(&k.pool).await.unwrap();
    let hour = 3_600_000;

    let done = B::Db::record(&k.pool, "admin::a", b"done")
        .await
        .unwrap()
        .unwrap();
    assert!(!done.in_progress());
    assert!(
        before <= done.processed_ms && done.processed_ms <= after,
        "{done:?}"
    );
    assert!(
        (done.expires_ms - done.processed_ms - hour).abs() <= 1,
        "{done:?}"
    );
    let held = B::Db::record(&k.pool, "admin::a", b"held")
        .await
        .unwrap()
        .unwrap();
    assert!(held.in_progress());
    let until = held.lease_until_ms.unwrap();
    assert!(
        (until - held.processed_ms - 2 * hour).abs() <= 1,
        "{held:?}"
    );
    assert!(B::Db::record(&k.pool, "admin::a", b"none")
        .await
        .unwrap()
        .is_none());
    assert!(B::Db::record(&k.pool, "admin::b", b"done")
        .await
        .unwrap()
        .is_none());

    let version = B::Db::version(&k.pool, "admin::a", b"order-42")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(version.version, 7);
    assert!(
        before <= version.updated_ms && version.updated_ms <= after,
        "{version:?}"
    );
    assert!(B::Db::version(&k.pool, "admin::a", b"order-41")
        .await
        .unwrap()
        .is_none());
    k.close().await;
}

/// `forget` deletes a done record, and the next delivery of the message applies again; a
/// record in progress is refused (and kept), a missing one reported missing.
pub async fn forget_then_a_redelivery_applies<B: Backend<Db: Admin + Leases>>() {
    let (k, _) = crate::__open!(B, setup);
    let msg = credit("m1", "alice", 10);
    credit_is(&k, &msg, Outcome::Applied(10)).await;
    credit_is(&k, &msg, Outcome::Duplicate).await;
    let scope = "suite::apply_credit";
    assert_eq!(
        B::Db::forget(&k.pool, scope, b"m1").await.unwrap(),
        Deletion::Deleted
    );
    assert!(!recorded(&k, scope, "m1").await);
    credit_is(&k, &msg, Outcome::Applied(20)).await;
    assert_eq!(balance(&k, "alice").await, Some(20));
    assert!(recorded(&k, scope, "m1").await);

    assert_eq!(
        B::Db::forget(&k.pool, scope, b"m2").await.unwrap(),
        Deletion::Missing
    );
    hold(&k, scope, "busy", HOUR, HOUR).await;
    assert_eq!(
        B::Db::forget(&k.pool, scope, b"busy").await.unwrap(),
        Deletion::Refused
    );
    assert!(recorded(&k, scope, "busy").await);
    assert_eq!(records(&k, scope).await, 2);
    k.close().await;
}

#[idempotent(key = "id", scope = "admin::lease", mode = "lease", lease = "1h")]
async fn leased<DB: KitDb + Leases>(
    tx: &mut Tx<'_, DB>,
    id: &str,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    note::<DB>(&mut **tx, d, id).await
}

/// `release` ends the lease of a message whose worker died, so the next delivery runs at once;
/// a done record is refused (and kept), a missing one reported missing.
pub async fn release_lets_the_next_delivery_run<B: Backend<Db: Admin + Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    hold(&k, "admin::lease", "stuck", HOUR, HOUR).await;
    assert_eq!(
        leased(&k.pool, "stuck", &d).await.unwrap(),
        Outcome::InProgress
    );
    assert_eq!(
        B::Db::release(&k.pool, "admin::lease", b"stuck")
            .await
            .unwrap(),
        Deletion::Deleted
    );
    assert!(!recorded(&k, "admin::lease", "stuck").await);
    assert_eq!(
        leased(&k.pool, "stuck", &d).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(rows_in(&k, "audit").await, 1);
    let done = B::Db::record(&k.pool, "admin::lease", b"stuck")
        .await
        .unwrap()
        .unwrap();
    assert!(!done.in_progress());

    assert_eq!(
        B::Db::release(&k.pool, "admin::lease", b"stuck")
            .await
            .unwrap(),
        Deletion::Refused
    );
    assert!(recorded(&k, "admin::lease", "stuck").await);
    assert_eq!(
        B::Db::release(&k.pool, "admin::lease", b"none")
            .await
            .unwrap(),
        Deletion::Missing
    );
    assert_eq!(
        leased(&k.pool, "stuck", &d).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(rows_in(&k, "audit").await, 1);
    k.close().await;
}

/// `count_expired` counts the records past retention without a running lease, and
/// `purge_batch` deletes exactly those, at most its limit at a time.
pub async fn purge_batch_removes_exactly_the_expired<B: Backend<Db: Admin + Leases>>() {
    let k = crate::__open!(B);
    for i in 0..5 {
        insert(&k, "admin::old", &format!("old{i}"), Duration::ZERO).await;
    }
    for i in 0..3 {
        insert(&k, "admin::new", &format!("new{i}"), HOUR).await;
    }
    // Past its retention, but its lease still runs: a purge must not take it.
    hold(&k, "admin::old", "leased", HOUR, Duration::ZERO).await;
    let_time_pass().await;
    assert_eq!(B::Db::count_expired(&k.pool).await.unwrap(), 5);
    assert_eq!(B::Db::purge_batch(&k.pool, 2).await.unwrap(), 2);
    assert_eq!(B::Db::count_expired(&k.pool).await.unwrap(), 3);
    assert_eq!(records(&k, "admin::old").await, 4);
    assert_eq!(B::Db::purge_batch(&k.pool, 100).await.unwrap(), 3);
    assert_eq!(B::Db::purge_batch(&k.pool, 100).await.unwrap(), 0);
    assert_eq!(B::Db::count_expired(&k.pool).await.unwrap(), 0);
    assert_eq!(records(&k, "admin::new").await, 3);
    assert_eq!(records(&k, "admin::old").await, 1);
    assert!(recorded(&k, "admin::old", "leased").await);
    k.close().await;
}

/// Fails when told to, after its write; poisoned at the second counted failure.
#[idempotent(key = "id", scope = "admin::flaky", max_attempts = 2)]
async fn flaky<DB: KitDb + Attempts>(
    tx: &mut Tx<'_, DB>,
    id: &str,
    fail: bool,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    note::<DB>(&mut **tx, d, id).await?;
    if fail {
        return Err(sqlx::Error::Protocol(format!("{id} failed")));
    }
    Ok(())
}

/// `attempts` lists the counted failures, most first (then by scope and key), with what the
/// last failure said and when it was counted; `clear_attempts` forgets them, so that a poisoned message's
/// next delivery runs and applies.
pub async fn attempts_list_the_poisoned_and_clear_attempts_reopens_them<
    B: Backend<Db: Admin + Attempts>,
>() {
    let (k, d) = crate::__open!(B, setup);
    let before = B::Db::now_ms(&k.pool).await.unwrap();
    for _ in 0..2 {
        assert!(flaky(&k.pool, "bad", true, &d).await.is_err());
    }
    assert_eq!(
        flaky(&k.pool, "bad", false, &d).await.unwrap(),
        Outcome::Poisoned { attempts: 2 }
    );
    {
        let mut conn = k.conn().await;
        for (scope, key) in [("admin::z", "other"), ("admin::flaky", "meh")] {
            let attempt = FailedAttempt {
                record: RecordKey {
                    scope,
                    key: key.as_bytes(),
                },
                error: "once",
            };
            assert_eq!(B::Db::count_attempt(&mut conn, attempt).await.unwrap(), 1);
        }
    }
    let_time_pass().await;
    let after = B::Db::now_ms(&k.pool).await.unwrap();

    let listed = B::Db::attempts(&k.pool, None, 10).await.unwrap();
    let shape: Vec<(&str, &[u8], u32, Option<&str>)> = listed
        .iter()
        .map(|a: &AttemptInfo| {
            (
                a.scope.as_str(),
                a.key.as_slice(),
                a.attempts,
                a.last_error.as_deref(),
            )
        })
        .collect();
    assert_eq!(shape.len(), 3, "{listed:?}");
    assert_eq!(
        (shape[0].0, shape[0].1, shape[0].2),
        ("admin::flaky", &b"bad"[..], 2)
    );
    // What the runtime keeps of a handler's error (not its message: `E` need not be Display).
    assert!(shape[0].3.is_some_and(|e| !e.is_empty()), "{listed:?}");
    assert_eq!(shape[1], ("admin::flaky", &b"meh"[..], 1, Some("once")));
    assert_eq!(shape[2], ("admin::z", &b"other"[..], 1, Some("once")));
    for a in &listed {
        assert!(before <= a.updated_ms && a.updated_ms <= after, "{a:?}");
    }
    assert_eq!(
        B::Db::attempts(&k.pool, None, 1).await.unwrap(),
        listed[..1]
    );
    assert_eq!(
        B::Db::attempts(&k.pool, Some("admin::z"), 10)
            .await
            .unwrap(),
        listed[2..]
    );

    assert!(
        <B::Db as Admin>::clear_attempts(&k.pool, "admin::flaky", b"bad")
            .await
            .unwrap()
    );
    assert!(
        !<B::Db as Admin>::clear_attempts(&k.pool, "admin::flaky", b"bad")
            .await
            .unwrap()
    );
    assert_eq!(
        B::Db::attempts(&k.pool, None, 10).await.unwrap(),
        listed[1..]
    );
    assert_eq!(
        flaky(&k.pool, "bad", false, &d).await.unwrap(),
        Outcome::Applied(())
    );
    assert!(recorded(&k, "admin::flaky", "bad").await);
    // The two failed deliveries' writes rolled back; the one that applied is kept.
    assert_eq!(rows_in(&k, "audit").await, 1);
    k.close().await;
}

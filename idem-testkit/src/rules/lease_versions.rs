//! Lease mode with `version` (and `entity`): stale and equal versions are refused under the
//! lease, and the version advances only when the lease's body commits, as in the transactional
//! mode.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idem::store::Leases;
use idem::{Outcome, Tx};
use tokio::sync::Notify;

use crate::backend::{exec, Kit, KitDb};
use crate::fixtures::{records, stored_version};
use crate::{Backend, Dialect};

const BY_KEY: &str = "lease_versions::by_key";
const BY_ENTITY: &str = "lease_versions::by_entity";

/// A versioned event about an entity, handled in lease mode.
#[derive(Clone, Default)]
pub struct Event {
    id: String,
    entity: String,
    version: i64,
    fail: bool,
    wait: Option<Arc<Notify>>,
}

fn event(id: &str, entity: &str, version: i64) -> Event {
    Event {
        id: id.into(),
        entity: entity.into(),
        version,
        ..Event::default()
    }
}

/// Calls to the outside world (what lease mode protects): one per body run.
#[derive(Default, Clone)]
pub struct Calls(Arc<AtomicU32>);

impl Calls {
    fn get(&self) -> u32 {
        self.0.load(SeqCst)
    }
}

/// The body both handlers share: calls out, waits or fails if told, then records the version
/// it applied.
async fn body<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Event,
    calls: &Calls,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    calls.0.fetch_add(1, SeqCst);
    if let Some(go) = &msg.wait {
        go.notified().await;
    }
    if msg.fail {
        return Err(sqlx::Error::Protocol("failed after the call".into()));
    }
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO applied (entity, version) VALUES ($1, $2)",
        &[(&msg.entity).into(), msg.version.into()],
    )
    .await
}

crate::options::handlers! {
    body(msg: &Event, calls: &Calls, d: &Dialect) -> Result<(), sqlx::Error>;
    /// Key + version in lease mode: the key is the entity.
    pub by_key<Leases>(
        key = "msg.entity", version = "msg.version", mode = "lease", lease = "10s",
        scope = "lease_versions::by_key"
    );
    /// Key + version + entity in lease mode.
    pub by_entity<Leases>(
        key = "msg.id", version = "msg.version", entity = "msg.entity", mode = "lease",
        lease = "10s", scope = "lease_versions::by_entity"
    );
}

async fn setup<B: Backend>(k: &Kit<B>) {
    k.exec(
        "CREATE TABLE applied (entity TEXT NOT NULL, version BIGINT NOT NULL)",
        &[],
    )
    .await;
}

/// The versions the bodies committed for `entity`, in order.
async fn applied<B: Backend>(k: &Kit<B>, entity: &str) -> Vec<i64> {
    let sql = "SELECT version FROM applied WHERE entity = $1 ORDER BY version";
    let column = k.column(sql, &[entity.into()], crate::Ty::Int).await;
    column.iter().map(crate::Value::int).collect()
}

/// Key + version: a greater version applies, an equal one is a duplicate, a lower one stale;
/// neither runs the body. The version row is the record: no lease row stays behind.
pub async fn key_version_decides_under_the_lease<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let calls = Calls::default();
    let steps = [
        (2, Outcome::Applied(())),
        (2, Outcome::Duplicate),
        (1, Outcome::Stale { latest: 2 }),
        (5, Outcome::Applied(())),
        (3, Outcome::Stale { latest: 5 }),
    ];
    for (version, want) in steps {
        let got = by_key(&k.pool, &event("-", "e1", version), &calls, &d).await;
        assert_eq!(got.unwrap(), want, "version {version}");
    }
    assert_eq!(calls.get(), 2, "only the applied versions ran");
    assert_eq!(applied(&k, "e1").await, [2, 5]);
    assert_eq!(stored_version(&k, BY_KEY, b"e1").await, Some(5));
    assert_eq!(records(&k, BY_KEY).await, 0, "no lease row is left");
    k.close().await;
}

/// Key + version + entity: a seen key is a duplicate; a version not above the entity's is
/// stale and leaves no record (its lease is given back); a greater one applies.
pub async fn entity_version_decides_under_the_lease<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let calls = Calls::default();
    let steps = [
        ("a", 3, Outcome::Applied(())),
        ("a", 3, Outcome::Duplicate),
        ("b", 2, Outcome::Stale { latest: 3 }),
        ("c", 3, Outcome::Stale { latest: 3 }),
        ("d", 4, Outcome::Applied(())),
        ("b", 2, Outcome::Stale { latest: 4 }),
    ];
    for (id, version, want) in steps {
        let got = by_entity(&k.pool, &event(id, "e1", version), &calls, &d).await;
        assert_eq!(got.unwrap(), want, "{id} v{version}");
    }
    assert_eq!(calls.get(), 2);
    assert_eq!(applied(&k, "e1").await, [3, 4]);
    assert_eq!(stored_version(&k, BY_ENTITY, b"e1").await, Some(4));
    let done = k
        .int(
            "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND lease_until IS NULL",
            &[BY_ENTITY.into()],
        )
        .await;
    assert_eq!(
        done, 2,
        "a done record per applied key, none for the stale ones"
    );
    assert_eq!(records(&k, BY_ENTITY).await, 2);
    k.close().await;
}

/// A body that fails advances nothing and gives the lease back: the redelivery applies.
pub async fn failed_body_leaves_the_version<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let calls = Calls::default();
    assert!(by_key(&k.pool, &event("-", "e1", 1), &calls, &d)
        .await
        .unwrap()
        .is_applied());
    let failing = Event {
        fail: true,
        ..event("-", "e1", 2)
    };
    assert!(matches!(
        by_key(&k.pool, &failing, &calls, &d).await,
        Err(idem::Error::Handler(_))
    ));
    let failing = Event {
        fail: true,
        ..event("x", "e1", 2)
    };
    assert!(matches!(
        by_entity(&k.pool, &failing, &calls, &d).await,
        Err(idem::Error::Handler(_))
    ));
    assert_eq!(stored_version(&k, BY_KEY, b"e1").await, Some(1));
    assert_eq!(stored_version(&k, BY_ENTITY, b"e1").await, None);
    assert_eq!(records(&k, BY_KEY).await + records(&k, BY_ENTITY).await, 0);
    let again = by_key(&k.pool, &event("-", "e1", 2), &calls, &d).await;
    assert_eq!(again.unwrap(), Outcome::Applied(()));
    let again = by_entity(&k.pool, &event("x", "e1", 2), &calls, &d).await;
    assert_eq!(again.unwrap(), Outcome::Applied(()));
    assert_eq!(stored_version(&k, BY_KEY, b"e1").await, Some(2));
    assert_eq!(stored_version(&k, BY_ENTITY, b"e1").await, Some(2));
    assert_eq!(calls.get(), 5);
    assert_eq!(applied(&k, "e1").await, [1, 2, 2]);
    k.close().await;
}

/// Key + version: the version advances only when the body commits, and a delivery of another
/// version while the body holds the key's lease runs no second body alongside it: it is
/// `InProgress` (PostgreSQL, MySQL) or, where the body's transaction holds the database's only
/// write lock from its claim on (SQLite), it waits and then applies after the first.
pub async fn version_advances_only_when_the_body_commits<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let calls = Calls::default();
    let go = Arc::new(Notify::new());
    let slow = Event {
        wait: Some(go.clone()),
        ..event("-", "e1", 2)
    };
    let first = {
        let (pool, calls) = (k.pool.clone(), calls.clone());
        tokio::spawn(async move { by_key(&pool, &slow, &calls, &d).await })
    };
    while calls.get() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        stored_version(&k, BY_KEY, b"e1").await,
        None,
        "not before the commit"
    );
    let second = {
        let (pool, calls) = (k.pool.clone(), calls.clone());
        tokio::spawn(async move { by_key(&pool, &event("-", "e1", 3), &calls, &d).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        calls.get(),
        1,
        "no second body while the first holds the lease"
    );
    go.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Applied(()));
    match second.await.unwrap().unwrap() {
        Outcome::InProgress => {
            assert_eq!(stored_version(&k, BY_KEY, b"e1").await, Some(2));
            let later = by_key(&k.pool, &event("-", "e1", 3), &calls, &d).await;
            assert_eq!(later.unwrap(), Outcome::Applied(()));
        }
        Outcome::Applied(()) => {}
        other => panic!("the second delivery: {other:?}"),
    }
    assert_eq!(stored_version(&k, BY_KEY, b"e1").await, Some(3));
    assert_eq!(applied(&k, "e1").await, [2, 3]);
    assert_eq!(calls.get(), 2);
    k.close().await;
}

/// Racing deliveries of many versions of one entity, each retried while `InProgress`: every
/// body that ran committed exactly one applied version, and the entity ends at the newest.
pub async fn racing_versions_end_in_the_newest_state<B: Backend<Db: Leases>>() {
    let (k, d) = crate::__open!(B, setup);
    let calls = Calls::default();
    let mut tasks = Vec::new();
    for version in 1..=8_i64 {
        for entity_mode in [false, true] {
            let (pool, calls) = (k.pool.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let msg = event(&format!("v{version}"), "e1", version);
                    let got = if entity_mode {
                        by_entity(&pool, &msg, &calls, &d).await
                    } else {
                        by_key(&pool, &msg, &calls, &d).await
                    };
                    match got.unwrap() {
                        Outcome::InProgress => tokio::time::sleep(Duration::from_millis(2)).await,
                        outcome => return (entity_mode, version, outcome),
                    }
                }
            }));
        }
    }
    let mut applied_by_mode = [Vec::new(), Vec::new()];
    for task in tasks {
        let (entity_mode, version, outcome) = task.await.unwrap();
        match outcome {
            Outcome::Applied(()) => applied_by_mode[usize::from(entity_mode)].push(version),
            Outcome::Stale { .. } | Outcome::Duplicate => {}
            other => panic!("v{version}: {other:?}"),
        }
    }
    let ran: usize = applied_by_mode.iter().map(Vec::len).sum();
    assert_eq!(calls.get() as usize, ran, "every body that ran applied");
    for (mode, scope) in [(0, BY_KEY), (1, BY_ENTITY)] {
        assert!(
            applied_by_mode[mode].contains(&8),
            "{scope}: the newest applies"
        );
        assert_eq!(stored_version(&k, scope, b"e1").await, Some(8), "{scope}");
    }
    assert_eq!(applied(&k, "e1").await.len(), ran);
    assert_eq!(records(&k, BY_KEY).await, 0);
    assert_eq!(
        records(&k, BY_ENTITY).await,
        applied_by_mode[1].len() as i64
    );
    k.close().await;
}

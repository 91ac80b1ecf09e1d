//! Each [`Store`] method on its own, called directly, so that a new backend's first failure
//! names one method. The rules read idem's tables only through columns every backend has
//! (`scope`, `msg_key`, `lease_until IS NULL`, `entity`, `version`).

use std::time::Duration;

use idem::store::{
    LeaseClaim, LeaseHold, LeaseRequest, Leases, Record, RecordKey, Stamp, StampKey, StampRow,
    Stamps, Store, StoredStamp, VersionCheck, VersionEntry,
};

use crate::fixtures::keys;
use crate::{Backend, Kit};

const HOUR: Duration = Duration::from_secs(3600);

fn record<'a>(scope: &'a str, key: &'a [u8]) -> Record<'a> {
    Record {
        scope,
        key,
        retention: HOUR,
        fingerprint: None,
    }
}

fn entry<'a>(scope: &'a str, entity: &'a [u8], version: i64) -> VersionEntry<'a> {
    VersionEntry {
        scope,
        entity,
        version,
    }
}

fn lease<'a>(scope: &'a str, key: &'a [u8], lease: Duration, token: i64) -> LeaseRequest<'a> {
    LeaseRequest {
        record: Record {
            scope,
            key,
            retention: HOUR,
            fingerprint: None,
        },
        lease,
        token,
    }
}

fn hold<'a>(scope: &'a str, key: &'a [u8], token: i64) -> LeaseHold<'a> {
    LeaseHold {
        record: RecordKey { scope, key },
        token,
    }
}

/// Records of `scope` still in progress (`lease_until` set).
async fn leased<B: Backend>(k: &Kit<B>, scope: &str, key: &[u8]) -> i64 {
    k.int(
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND msg_key = $2 \
         AND lease_until IS NOT NULL",
        &[scope.into(), key.into()],
    )
    .await
}

async fn version<B: Backend>(k: &Kit<B>, scope: &str, entity: &[u8]) -> Option<i64> {
    crate::fixtures::stored_version(k, scope, entity).await
}

/// `insert_record` is true for a new scope and key, false (writing nothing) for one it has.
pub async fn insert_record_is_new_once<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, record("s", b"a"))
        .await
        .unwrap());
    assert!(!B::Db::insert_record(&mut conn, record("s", b"a"))
        .await
        .unwrap());
    assert!(B::Db::insert_record(&mut conn, record("s", b"b"))
        .await
        .unwrap());
    // The same key in another scope is another message.
    assert!(B::Db::insert_record(&mut conn, record("t", b"a"))
        .await
        .unwrap());
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(keys(&k, "t").await, [b"a".to_vec()]);
    k.close().await;
}

/// `insert_records` answers for each record in order; a key given twice is new at most once, at
/// its first place, and a key already stored is not new.
pub async fn insert_records_marks_a_repeated_key_new_once<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, record("s", b"b"))
        .await
        .unwrap());
    let batch = [
        record("s", b"a"),
        record("s", b"b"),
        record("s", b"a"),
        record("s", b"c"),
        record("t", b"a"),
    ];
    let inserted = B::Db::insert_records(&mut conn, &batch).await.unwrap();
    assert_eq!(inserted, [true, false, false, true, true]);
    assert!(B::Db::insert_records(&mut conn, &[])
        .await
        .unwrap()
        .is_empty());
    drop(conn);
    assert_eq!(
        keys(&k, "s").await,
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    assert_eq!(keys(&k, "t").await, [b"a".to_vec()]);

    // One scope and one retention (a batch of one handler, which a backend may claim in a
    // leaner statement): the same answers, and the retention given.
    let mut conn = k.conn().await;
    let one = [record("u", b"x"), record("u", b"y"), record("u", b"x")];
    assert_eq!(
        B::Db::insert_records(&mut conn, &one).await.unwrap(),
        [true, true, false]
    );
    assert_eq!(
        B::Db::insert_records(&mut conn, &one[..2]).await.unwrap(),
        [false, false]
    );
    let expired = |key| Record {
        scope: "v",
        key,
        retention: Duration::ZERO,
        fingerprint: None,
    };
    assert_eq!(
        B::Db::insert_records(&mut conn, &[expired(b"x"), expired(b"y")])
            .await
            .unwrap(),
        [true, true]
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(B::Db::purge_expired(&mut conn, 100).await.unwrap(), 2);
    drop(conn);
    assert_eq!(keys(&k, "u").await, [b"x".to_vec(), b"y".to_vec()]);
    assert!(keys(&k, "v").await.is_empty());
    k.close().await;
}

/// The fingerprint each record of `scope` was written with, by key (`None`: written without).
async fn fingerprints<B: Backend>(k: &Kit<B>, scope: &str) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut rows = Vec::new();
    for key in keys(k, scope).await {
        let with = k
            .rows(
                "SELECT fingerprint FROM idem_records \
                 WHERE scope = $1 AND msg_key = $2 AND fingerprint IS NOT NULL",
                &[scope.into(), key.as_slice().into()],
                &[crate::Ty::Bytes],
            )
            .await;
        rows.push((key, with.first().map(|row| row[0].bytes())));
    }
    rows
}

/// A backend that writes fingerprints with records (`Store::RECORDS_FINGERPRINT`) does so on
/// every insert: one record, a batch (a pair given twice keeps its first fingerprint, a found
/// record its own), and a record with its version. The others write none.
pub async fn inserts_write_the_fingerprint_of_a_new_record<B: Backend<Db: Stamps>>() {
    let k = crate::__open!(B);
    let (a, b): (&'static [u8; 32], &'static [u8; 32]) = (&[1; 32], &[2; 32]);
    let with = |scope, key, fingerprint: &'static [u8; 32]| Record {
        fingerprint: Some(fingerprint),
        ..record(scope, key)
    };
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, with("f", b"one", a))
        .await
        .unwrap());
    let batch = [
        with("f", b"one", b),
        with("f", b"two", a),
        with("f", b"two", b),
        record("f", b"bare"),
        with("g", b"one", b),
    ];
    assert_eq!(
        B::Db::insert_records(&mut conn, &batch).await.unwrap(),
        [false, true, false, true, true]
    );
    let versioned = B::Db::record_and_advance(&mut conn, with("h", b"one", a), entry("h", b"e", 1))
        .await
        .unwrap();
    assert_eq!(versioned, Some(VersionCheck::Advanced));
    drop(conn);
    let written = |f: &[u8; 32]| B::Db::RECORDS_FINGERPRINT.then(|| f.to_vec());
    assert_eq!(
        fingerprints(&k, "f").await,
        [
            (b"bare".to_vec(), None),
            (b"one".to_vec(), written(a)),
            (b"two".to_vec(), written(a)),
        ]
    );
    assert_eq!(fingerprints(&k, "g").await, [(b"one".to_vec(), written(b))]);
    assert_eq!(fingerprints(&k, "h").await, [(b"one".to_vec(), written(a))]);
    k.close().await;
}

/// `insert_record_or_read_stamp` claims as `insert_record` does, and gives a duplicate the stamp
/// its first delivery left: the fingerprint and value saved with the record, or none.
pub async fn insert_record_or_read_stamp_gives_a_duplicate_its_stamp<B: Backend<Db: Stamps>>() {
    let k = crate::__open!(B);
    let (a, b): (&'static [u8; 32], &'static [u8; 32]) = (&[1; 32], &[2; 32]);
    let with = |key, fingerprint: &'static [u8; 32]| Record {
        fingerprint: Some(fingerprint),
        ..record("p", key)
    };
    let mut conn = k.conn().await;
    let first = B::Db::insert_record_or_read_stamp(&mut conn, with(b"one", a)).await;
    assert_eq!(first.unwrap(), None, "a new record");
    let stamp = Stamp {
        at: with(b"one", a).stamp_key(),
        fingerprint: Some(a),
        result: Some(b"[1]"),
    };
    B::Db::save_stamp(&mut conn, stamp).await.unwrap();
    let again = B::Db::insert_record_or_read_stamp(&mut conn, with(b"one", b)).await;
    let stored = StoredStamp {
        fingerprint: Some(a.to_vec()),
        result: Some(b"[1]".to_vec()),
    };
    assert_eq!(
        again.unwrap(),
        Some(Some(stored)),
        "a duplicate and its stamp"
    );
    assert!(B::Db::insert_record(&mut conn, record("p", b"bare"))
        .await
        .unwrap());
    let bare = B::Db::insert_record_or_read_stamp(&mut conn, with(b"bare", a)).await;
    let none = Some(Some(StoredStamp::default()));
    assert_eq!(
        bare.unwrap(),
        none,
        "a duplicate of a record without a stamp"
    );
    drop(conn);
    assert_eq!(keys(&k, "p").await, [b"bare".to_vec(), b"one".to_vec()]);
    k.close().await;
}

/// `insert_records_reading_stamps` claims as `insert_records` does, and gives each record that
/// already was either no stamp (left to `load_stamps`) or the one its first delivery left.
pub async fn insert_records_reading_stamps_claims_and_never_reads_a_wrong_stamp<
    B: Backend<Db: Stamps>,
>() {
    let k = crate::__open!(B);
    let (a, b): (&'static [u8; 32], &'static [u8; 32]) = (&[1; 32], &[2; 32]);
    let with = |key, fingerprint: &'static [u8; 32]| Record {
        fingerprint: Some(fingerprint),
        ..record("p", key)
    };
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, with(b"stamped", a))
        .await
        .unwrap());
    let stamp = Stamp {
        at: with(b"stamped", a).stamp_key(),
        fingerprint: Some(a),
        result: Some(b"[1]"),
    };
    B::Db::save_stamp(&mut conn, stamp).await.unwrap();
    assert!(B::Db::insert_record(&mut conn, record("p", b"bare"))
        .await
        .unwrap());
    let batch = [
        with(b"new", b),
        with(b"stamped", b),
        with(b"bare", a),
        with(b"new", a),
    ];
    let found = B::Db::insert_records_reading_stamps(&mut conn, &batch)
        .await
        .unwrap();
    let new: Vec<bool> = found.iter().map(|f| f.new).collect();
    assert_eq!(new, [true, false, false, false]);
    let stored = StoredStamp {
        fingerprint: Some(a.to_vec()),
        result: Some(b"[1]".to_vec()),
    };
    // The stamp as the insert left its row: a backend that reads none leaves it to load_stamps.
    let fingerprint_only = |f: &[u8; 32]| StoredStamp {
        fingerprint: B::Db::RECORDS_FINGERPRINT.then(|| f.to_vec()),
        result: None,
    };
    for (at, expected) in [
        (0, None),
        (1, Some(stored)),
        (2, Some(StoredStamp::default())),
        (3, Some(fingerprint_only(b))),
    ] {
        let read = found[at].stamp.clone();
        assert!(
            read.is_none() || read == expected,
            "record {at}: read {read:?}, expected none or {expected:?}"
        );
    }
    drop(conn);
    assert_eq!(
        keys(&k, "p").await,
        [b"bare".to_vec(), b"new".to_vec(), b"stamped".to_vec()]
    );
    k.close().await;
}

/// `save_stamps` writes each stamp on its row, records and versions in one call, values and
/// NULLs alike, and leaves every other row as it was.
pub async fn save_stamps_writes_each_stamp_on_its_row<B: Backend<Db: Stamps>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    for key in [&b"a"[..], b"b", b"c", b"untouched"] {
        assert!(B::Db::insert_record(&mut conn, record("w", key))
            .await
            .unwrap());
    }
    for entity in [&b"e"[..], b"f"] {
        let advanced = B::Db::advance_version(&mut conn, entry("w", entity, 1)).await;
        assert_eq!(advanced.unwrap(), VersionCheck::Advanced);
    }
    let at = |row, key| StampKey {
        row,
        scope: "w",
        key,
    };
    let stamp = |row, key, fingerprint, result| Stamp {
        at: at(row, key),
        fingerprint,
        result,
    };
    let (a, b): (&[u8], &[u8]) = (&[1; 32], &[2; 32]);
    let stamps = [
        stamp(StampRow::Record, b"a", Some(a), Some(&b"[1]"[..])),
        stamp(StampRow::Version, b"e", None, Some(b"\"e\"")),
        stamp(StampRow::Record, b"b", None, Some(b"{}")),
        stamp(StampRow::Record, b"c", Some(b), None),
        stamp(StampRow::Version, b"f", Some(a), None),
        // No such row: nothing is written, and no error.
        stamp(StampRow::Record, b"gone", Some(a), None),
    ];
    B::Db::save_stamps(&mut conn, &stamps).await.unwrap();
    let keys = [
        at(StampRow::Record, b"a"),
        at(StampRow::Record, b"b"),
        at(StampRow::Record, b"c"),
        at(StampRow::Record, b"untouched"),
        at(StampRow::Version, b"e"),
        at(StampRow::Version, b"f"),
        at(StampRow::Record, b"gone"),
    ];
    let read = B::Db::load_stamps(&mut conn, &keys).await.unwrap();
    let stored = |fingerprint: Option<&[u8]>, result: Option<&[u8]>| {
        Some(StoredStamp {
            fingerprint: fingerprint.map(<[u8]>::to_vec),
            result: result.map(<[u8]>::to_vec),
        })
    };
    assert_eq!(
        read,
        [
            stored(Some(a), Some(b"[1]")),
            stored(None, Some(b"{}")),
            stored(Some(b), None),
            stored(None, None),
            stored(None, Some(b"\"e\"")),
            stored(Some(a), None),
            None,
        ]
    );
    drop(conn);
    k.close().await;
}

/// `delete_record` removes the record its transaction inserted, and no other.
pub async fn delete_record_removes_only_that_record<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, record("s", b"kept"))
        .await
        .unwrap());
    drop(conn);
    let mut tx = k.pool.begin().await.unwrap();
    assert!(B::Db::insert_record(&mut tx, record("s", b"undone"))
        .await
        .unwrap());
    assert!(B::Db::insert_record(&mut tx, record("t", b"undone"))
        .await
        .unwrap());
    B::Db::delete_record(
        &mut tx,
        RecordKey {
            scope: "s",
            key: b"undone",
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(keys(&k, "s").await, [b"kept".to_vec()]);
    assert_eq!(keys(&k, "t").await, [b"undone".to_vec()]);
    k.close().await;
}

/// `advance_version` stores a new entity's version and raises it for a greater one.
pub async fn advance_version_advances_a_new_entity_and_a_greater_version<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 1)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 3)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    drop(conn);
    assert_eq!(version(&k, "s", b"e").await, Some(3));
    k.close().await;
}

/// `advance_version` with the stored version reports `Equal` and changes nothing.
pub async fn advance_version_reports_equal<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 2)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 2)).await;
    assert_eq!(check.unwrap(), VersionCheck::Equal);
    drop(conn);
    assert_eq!(version(&k, "s", b"e").await, Some(2));
    k.close().await;
}

/// `advance_version` with a lower version reports `Behind` with the stored one and changes
/// nothing; other entities and scopes are independent.
pub async fn advance_version_reports_behind_with_the_latest<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 5)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    let check = B::Db::advance_version(&mut conn, entry("s", b"e", 3)).await;
    assert_eq!(check.unwrap(), VersionCheck::Behind { latest: 5 });
    let check = B::Db::advance_version(&mut conn, entry("s", b"f", 1)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    let check = B::Db::advance_version(&mut conn, entry("t", b"e", 1)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    drop(conn);
    assert_eq!(version(&k, "s", b"e").await, Some(5));
    assert_eq!(version(&k, "s", b"f").await, Some(1));
    assert_eq!(version(&k, "t", b"e").await, Some(1));
    k.close().await;
}

/// `record_and_advance` on a new key records it and advances (or reports) the version.
pub async fn record_and_advance_on_a_new_key_records_and_advances<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let got = B::Db::record_and_advance(&mut conn, record("s", b"m1"), entry("s", b"e", 4)).await;
    assert_eq!(got.unwrap(), Some(VersionCheck::Advanced));
    let got = B::Db::record_and_advance(&mut conn, record("s", b"m2"), entry("s", b"e", 4)).await;
    assert_eq!(got.unwrap(), Some(VersionCheck::Equal));
    let got = B::Db::record_and_advance(&mut conn, record("s", b"m3"), entry("s", b"e", 2)).await;
    assert_eq!(got.unwrap(), Some(VersionCheck::Behind { latest: 4 }));
    drop(conn);
    // Each new key was recorded (the caller rolls back what it does not apply).
    assert_eq!(
        keys(&k, "s").await,
        [b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec()]
    );
    assert_eq!(version(&k, "s", b"e").await, Some(4));
    k.close().await;
}

/// `record_and_advance` on a key already recorded is `None` and leaves the version alone.
pub async fn record_and_advance_on_a_seen_key_is_none_and_leaves_the_version<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, record("s", b"m1"))
        .await
        .unwrap());
    let got = B::Db::record_and_advance(&mut conn, record("s", b"m1"), entry("s", b"e", 7)).await;
    assert_eq!(got.unwrap(), None);
    drop(conn);
    assert_eq!(version(&k, "s", b"e").await, None, "no version written");
    assert_eq!(keys(&k, "s").await, [b"m1".to_vec()]);
    k.close().await;
}

/// `advance_versions` decides every entry as if `advance_version` ran on each, in order.
pub async fn advance_versions_decides_as_if_one_after_another<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let check = B::Db::advance_version(&mut conn, entry("s", b"7", 2)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    let entries = [
        entry("s", b"7", 1), // behind the stored 2
        entry("s", b"7", 3), // advances
        entry("s", b"7", 3), // equal to the batch's own 3
        entry("s", b"8", 1), // a new entity
        entry("s", b"7", 5), // advances
        entry("s", b"7", 4), // behind the batch's own 5
        entry("t", b"7", 1), // another scope
    ];
    let checks = B::Db::advance_versions(&mut conn, &entries).await.unwrap();
    assert_eq!(
        checks,
        [
            VersionCheck::Behind { latest: 2 },
            VersionCheck::Advanced,
            VersionCheck::Equal,
            VersionCheck::Advanced,
            VersionCheck::Advanced,
            VersionCheck::Behind { latest: 5 },
            VersionCheck::Advanced,
        ]
    );
    assert!(B::Db::advance_versions(&mut conn, &[])
        .await
        .unwrap()
        .is_empty());
    drop(conn);
    assert_eq!(version(&k, "s", b"7").await, Some(5));
    assert_eq!(version(&k, "s", b"8").await, Some(1));
    assert_eq!(version(&k, "t", b"7").await, Some(1));
    k.close().await;
}

/// `purge_expired` deletes only expired records, at most `limit` per call.
pub async fn purge_expired_is_bounded_by_its_limit<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let expired: Vec<Vec<u8>> = (0..5).map(|i| format!("old-{i}").into_bytes()).collect();
    for key in &expired {
        let rec = Record {
            scope: "s",
            key,
            retention: Duration::ZERO,
            fingerprint: None,
        };
        assert!(B::Db::insert_record(&mut conn, rec).await.unwrap());
    }
    for key in [b"new-0", b"new-1", b"new-2"] {
        assert!(B::Db::insert_record(&mut conn, record("s", key))
            .await
            .unwrap());
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(B::Db::purge_expired(&mut conn, 2).await.unwrap(), 2);
    assert_eq!(B::Db::purge_expired(&mut conn, 10).await.unwrap(), 3);
    assert_eq!(B::Db::purge_expired(&mut conn, 10).await.unwrap(), 0);
    drop(conn);
    assert_eq!(
        keys(&k, "s").await,
        [b"new-0".to_vec(), b"new-1".to_vec(), b"new-2".to_vec()]
    );
    k.close().await;
}

/// `purge_expired` never deletes a record whose lease is still running, even past its retention.
pub async fn purge_expired_skips_live_leases<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let mut request = lease("s", b"leased", HOUR, 1);
    request.record.retention = Duration::ZERO;
    let claim = B::Db::claim_lease(&mut conn, request).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    let done = Record {
        scope: "s",
        key: b"done",
        retention: Duration::ZERO,
        fingerprint: None,
    };
    assert!(B::Db::insert_record(&mut conn, done).await.unwrap());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(B::Db::purge_expired(&mut conn, 100).await.unwrap(), 1);
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"leased".to_vec()]);
    assert_eq!(leased(&k, "s", b"leased").await, 1);
    k.close().await;
}

/// `purge_versions` deletes only version rows not advanced for `older_than`, at most `limit`.
pub async fn purge_versions_removes_only_old_rows<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    for entity in [b"a", b"b"] {
        let check = B::Db::advance_version(&mut conn, entry("s", entity, 1)).await;
        assert_eq!(check.unwrap(), VersionCheck::Advanced);
    }
    // Wide margins: on a loaded machine, a statement can take hundreds of milliseconds.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let check = B::Db::advance_version(&mut conn, entry("s", b"c", 1)).await;
    assert_eq!(check.unwrap(), VersionCheck::Advanced);
    assert_eq!(
        B::Db::purge_versions(&mut conn, HOUR, 100).await.unwrap(),
        0
    );
    let older = Duration::from_millis(1_000);
    assert_eq!(B::Db::purge_versions(&mut conn, older, 1).await.unwrap(), 1);
    assert_eq!(
        B::Db::purge_versions(&mut conn, older, 100).await.unwrap(),
        1
    );
    drop(conn);
    assert_eq!(version(&k, "s", b"a").await, None);
    assert_eq!(version(&k, "s", b"b").await, None);
    assert_eq!(version(&k, "s", b"c").await, Some(1), "a recent row stays");
    k.close().await;
}

/// `claim_lease` on a new message acquires it, leaving the record in progress.
pub async fn claim_lease_acquires_a_new_message<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 1)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"m".to_vec()]);
    assert_eq!(leased(&k, "s", b"m").await, 1);
    k.close().await;
}

/// `claim_lease` on a message whose lease runs is `InProgress`, and leaves the holder's lease.
pub async fn claim_lease_on_a_held_lease_is_in_progress<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 1)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 2)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::InProgress);
    // The first holder still holds it: its token completes, the other's would not.
    assert!(!B::Db::complete_lease(&mut conn, hold("s", b"m", 2))
        .await
        .unwrap());
    assert!(B::Db::complete_lease(&mut conn, hold("s", b"m", 1))
        .await
        .unwrap());
    drop(conn);
    assert_eq!(leased(&k, "s", b"m").await, 0);
    k.close().await;
}

/// `claim_lease` on a completed message is `Done`, and changes nothing.
pub async fn claim_lease_on_a_done_message_is_done<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 1)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    assert!(B::Db::complete_lease(&mut conn, hold("s", b"m", 1))
        .await
        .unwrap());
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 2)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Done);
    // A record inserted by a plain claim is done too.
    assert!(B::Db::insert_record(&mut conn, record("s", b"plain"))
        .await
        .unwrap());
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"plain", HOUR, 3)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Done);
    drop(conn);
    assert_eq!(leased(&k, "s", b"m").await, 0);
    assert_eq!(leased(&k, "s", b"plain").await, 0);
    k.close().await;
}

/// `claim_lease` takes over an expired lease: the new token holds it, the old one no longer.
pub async fn claim_lease_takes_over_an_expired_lease<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let short = Duration::from_millis(50);
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", short, 1)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 2)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    assert!(!B::Db::complete_lease(&mut conn, hold("s", b"m", 1))
        .await
        .unwrap());
    assert_eq!(
        leased(&k, "s", b"m").await,
        1,
        "still in progress under token 2"
    );
    assert!(B::Db::complete_lease(&mut conn, hold("s", b"m", 2))
        .await
        .unwrap());
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"m".to_vec()]);
    assert_eq!(leased(&k, "s", b"m").await, 0);
    k.close().await;
}

/// `complete_lease` with the holder's token marks the message done, once.
pub async fn complete_lease_with_the_right_token_marks_done<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 7)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    assert!(B::Db::complete_lease(&mut conn, hold("s", b"m", 7))
        .await
        .unwrap());
    assert!(
        !B::Db::complete_lease(&mut conn, hold("s", b"m", 7))
            .await
            .unwrap(),
        "a done message has no lease to complete"
    );
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"m".to_vec()]);
    assert_eq!(leased(&k, "s", b"m").await, 0);
    k.close().await;
}

/// `complete_lease` with another token is false and leaves the message in progress.
pub async fn complete_lease_with_a_wrong_token_changes_nothing<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 7)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    assert!(!B::Db::complete_lease(&mut conn, hold("s", b"m", 8))
        .await
        .unwrap());
    assert!(!B::Db::complete_lease(&mut conn, hold("s", b"other", 7))
        .await
        .unwrap());
    drop(conn);
    assert_eq!(leased(&k, "s", b"m").await, 1);
    k.close().await;
}

/// `release_lease` with the holder's token deletes the in-progress record (so the message can
/// be claimed at once); with another token it changes nothing.
pub async fn release_lease_deletes_the_in_progress_record<B: Backend<Db: Leases>>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 7)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    assert!(!B::Db::release_lease(&mut conn, hold("s", b"m", 8))
        .await
        .unwrap());
    assert_eq!(leased(&k, "s", b"m").await, 1);
    assert!(B::Db::release_lease(&mut conn, hold("s", b"m", 7))
        .await
        .unwrap());
    assert!(keys(&k, "s").await.is_empty(), "released: no record");
    let claim = B::Db::claim_lease(&mut conn, lease("s", b"m", HOUR, 9)).await;
    assert_eq!(claim.unwrap(), LeaseClaim::Acquired);
    // A done message is not released.
    assert!(B::Db::complete_lease(&mut conn, hold("s", b"m", 9))
        .await
        .unwrap());
    assert!(!B::Db::release_lease(&mut conn, hold("s", b"m", 9))
        .await
        .unwrap());
    drop(conn);
    assert_eq!(keys(&k, "s").await, [b"m".to_vec()]);
    k.close().await;
}

/// `migrate` run again (twice) on a migrated database changes nothing and keeps the records.
pub async fn migrate_twice_is_harmless<B: Backend>() {
    let k = crate::__open!(B);
    let mut conn = k.conn().await;
    assert!(B::Db::insert_record(&mut conn, record("s", b"m"))
        .await
        .unwrap());
    drop(conn);
    // Setup migrated: one row per migration the backend has.
    let applied = crate::fixtures::rows_in(&k, "idem_migrations").await;
    assert!(applied >= 1);
    B::Db::migrate(&k.pool).await.unwrap();
    idem::migrate(&k.pool).await.unwrap();
    assert_eq!(
        crate::fixtures::rows_in(&k, "idem_migrations").await,
        applied
    );
    assert_eq!(keys(&k, "s").await, [b"m".to_vec()]);
    let mut conn = k.conn().await;
    assert!(!B::Db::insert_record(&mut conn, record("s", b"m"))
        .await
        .unwrap());
    drop(conn);
    k.close().await;
}

/// `migrate` is safe to run from several tasks at once.
pub async fn migrate_concurrently_is_safe<B: Backend>() {
    let k = crate::__open!(B);
    let applied = crate::fixtures::rows_in(&k, "idem_migrations").await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let pool = k.pool.clone();
            tokio::spawn(async move { idem::migrate(&pool).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    assert_eq!(
        crate::fixtures::rows_in(&k, "idem_migrations").await,
        applied
    );
    k.close().await;
}

/// `is_transient` is false for errors that would happen again: a unique violation, an unknown
/// table, a missing row.
pub async fn is_transient_is_false_for_errors_that_repeat<B: Backend>() {
    let k = crate::__open!(B);
    k.exec("CREATE TABLE kit_unique (id BIGINT PRIMARY KEY)", &[])
        .await;
    k.exec("INSERT INTO kit_unique (id) VALUES (1)", &[]).await;
    let mut conn = k.conn().await;
    let d = k.dialect;
    let unique = crate::exec::<B::Db>(&mut conn, &d, "INSERT INTO kit_unique (id) VALUES (1)", &[])
        .await
        .unwrap_err();
    let unknown = crate::exec::<B::Db>(&mut conn, &d, "SELECT * FROM kit_no_such_table", &[])
        .await
        .unwrap_err();
    drop(conn);
    for err in [&unique, &unknown, &sqlx::Error::RowNotFound] {
        assert!(!B::Db::is_transient(err), "{err}");
        assert!(!idem::store::is_transient(err), "{err}");
    }
    assert_eq!(crate::fixtures::rows_in(&k, "kit_unique").await, 1);
    k.close().await;
}

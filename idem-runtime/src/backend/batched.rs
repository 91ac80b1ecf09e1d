//! The in-memory halves of batched statements: which requested records a multi-row insert
//! returned as new, the stamps a batched read found put back at the keys that asked for them,
//! and versions decided one after another from the rows a batch locked.

use std::time::Duration;

use foldhash::{HashMap, HashSet};

use crate::store::{Record, StampKey, StampRow, StoredStamp, VersionCheck, VersionEntry};

/// Classifies a version that did not advance: equal to the stored one, or behind it.
pub(crate) fn compare(version: i64, latest: i64) -> VersionCheck {
    if version == latest {
        VersionCheck::Equal
    } else {
        VersionCheck::Behind { latest }
    }
}

/// Flags, for each requested record, whether the database returned it as inserted; a pair
/// requested twice is flagged at its first place only.
///
/// A statement inserts each pair at most once and returns only what it inserted: as many rows
/// as were requested means every record was new (and none was requested twice), which is the
/// usual batch, so no set is built for it.
pub(crate) fn mark_inserted(requested: &[Record<'_>], inserted: &[(String, Vec<u8>)]) -> Vec<bool> {
    if inserted.len() == requested.len() {
        return vec![true; requested.len()];
    }
    let mut fresh: HashSet<(&str, &[u8])> = inserted
        .iter()
        .map(|(scope, key)| (scope.as_str(), key.as_slice()))
        .collect();
    requested
        .iter()
        .map(|r| fresh.remove(&(r.scope, r.key)))
        .collect()
}

/// Whether any of `records` has a fingerprint to write. Only then does a claim's insert name
/// the `fingerprint` column: a database not yet migrated to 0002 has none, and handlers without
/// `fingerprint` keep working on it until `idem::migrate` runs.
pub(crate) fn fingerprinted(records: &[Record<'_>]) -> bool {
    records.iter().any(|r| r.fingerprint.is_some())
}

/// The scope and retention every record of a batch shares, if they share one and none has a
/// fingerprint (a batch for one handler without `fingerprint`): its claim can bind them once
/// and read back only the keys.
pub(crate) fn one_scope<'a>(records: &[Record<'a>]) -> Option<(&'a str, Duration)> {
    let first = records.first()?;
    records
        .iter()
        .all(|r| {
            r.scope == first.scope && r.retention == first.retention && r.fingerprint.is_none()
        })
        .then_some((first.scope, first.retention))
}

/// As [`mark_inserted`], for records of one scope, from the keys the database returned.
pub(crate) fn mark_inserted_keys(requested: &[Record<'_>], inserted: &[Vec<u8>]) -> Vec<bool> {
    if inserted.len() == requested.len() {
        return vec![true; requested.len()];
    }
    let mut fresh: HashSet<&[u8]> = inserted.iter().map(Vec::as_slice).collect();
    requested.iter().map(|r| fresh.remove(r.key)).collect()
}

/// The stamps a batched read found, each put at the place of the key that asked for it: no key
/// is copied to look a row up, and no value is copied but for a key asked twice.
pub(crate) struct StampRows<'k> {
    keys: &'k [StampKey<'k>],
    /// The first place of each key.
    places: HashMap<(StampRow, &'k str, &'k [u8]), usize>,
    found: Vec<Option<StoredStamp>>,
}

/// A stamp's columns as read: `(fingerprint, result)`.
pub(crate) type StampColumns = (Option<Vec<u8>>, Option<Vec<u8>>);

/// A row of a batched stamp read: `(scope, key or entity, fingerprint, result)`.
pub(crate) type StampRowOf = (String, Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

impl<'k> StampRows<'k> {
    pub(crate) fn new(keys: &'k [StampKey<'k>]) -> Self {
        let mut places = HashMap::with_capacity_and_hasher(keys.len(), Default::default());
        for (at, k) in keys.iter().enumerate() {
            places.entry((k.row, k.scope, k.key)).or_insert(at);
        }
        StampRows {
            keys,
            places,
            found: vec![None; keys.len()],
        }
    }

    /// Puts the `rows` read from `row`'s table at their keys' places.
    pub(crate) fn add(&mut self, row: StampRow, rows: Vec<StampRowOf>) {
        for (scope, key, fingerprint, result) in rows {
            if let Some(&at) = self.places.get(&(row, scope.as_str(), key.as_slice())) {
                self.found[at] = Some(StoredStamp {
                    fingerprint,
                    result,
                });
            }
        }
    }

    /// The stamp found for each requested key, in order (`None`: no row).
    pub(crate) fn into_stamps(mut self) -> Vec<Option<StoredStamp>> {
        for (at, k) in self.keys.iter().enumerate() {
            let first = self.places[&(k.row, k.scope, k.key)];
            if first != at {
                self.found[at] = self.found[first].clone();
            }
        }
        self.found
    }
}

/// Decides `entries` one after another, in order, from the `stored` versions (`None`: a new
/// entity). Returns each entry's check and the final version of every entity that advanced.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))] // PostgreSQL and MySQL batch versions
pub(crate) fn sequential_checks<'a>(
    stored: &HashMap<(&'a str, &'a [u8]), Option<i64>>,
    entries: &[VersionEntry<'a>],
) -> (Vec<VersionCheck>, Vec<VersionEntry<'a>>) {
    let mut latest = stored.clone();
    // Entities that advanced, in first-advance order (the Vec) without a linear search (the set).
    let mut advanced: Vec<(&'a str, &'a [u8])> = Vec::new();
    let mut seen = HashSet::default();
    let checks = entries
        .iter()
        .map(|e| {
            let current = latest.entry((e.scope, e.entity)).or_insert(None);
            match *current {
                Some(stored) if e.version == stored => VersionCheck::Equal,
                Some(stored) if e.version < stored => VersionCheck::Behind { latest: stored },
                _ => {
                    *current = Some(e.version);
                    if seen.insert((e.scope, e.entity)) {
                        advanced.push((e.scope, e.entity));
                    }
                    VersionCheck::Advanced
                }
            }
        })
        .collect();
    let finals = advanced
        .into_iter()
        .filter_map(|(scope, entity)| {
            latest
                .get(&(scope, entity))
                .copied()
                .flatten()
                .map(|version| VersionEntry {
                    scope,
                    entity,
                    version,
                })
        })
        .collect();
    (checks, finals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_rows_go_to_every_place_that_asked_for_them() {
        let key = |row, key| StampKey {
            row,
            scope: "s",
            key,
        };
        let keys = [
            key(StampRow::Record, &b"a"[..]),
            key(StampRow::Version, b"a"),
            key(StampRow::Record, b"gone"),
            key(StampRow::Record, b"a"),
        ];
        let mut rows = StampRows::new(&keys);
        rows.add(
            StampRow::Record,
            vec![("s".into(), b"a".to_vec(), Some(vec![1]), None)],
        );
        rows.add(
            StampRow::Version,
            vec![
                ("s".into(), b"a".to_vec(), None, Some(b"2".to_vec())),
                // A row nobody asked for is ignored.
                ("t".into(), b"a".to_vec(), None, None),
            ],
        );
        let record = StoredStamp {
            fingerprint: Some(vec![1]),
            result: None,
        };
        let version = StoredStamp {
            fingerprint: None,
            result: Some(b"2".to_vec()),
        };
        assert_eq!(
            rows.into_stamps(),
            [Some(record.clone()), Some(version), None, Some(record)]
        );
    }

    #[test]
    fn inserted_pairs_are_new_once() {
        let record = |scope, key| Record {
            scope,
            key,
            retention: Duration::ZERO,
            fingerprint: None,
        };
        let requested = [
            record("s", &b"a"[..]),
            record("s", b"b"),
            record("s", b"a"),
            record("t", b"a"),
        ];
        let inserted = vec![
            ("s".to_string(), b"a".to_vec()),
            ("t".to_string(), b"a".to_vec()),
        ];
        assert_eq!(
            mark_inserted(&requested, &inserted),
            [true, false, false, true]
        );
        let every = vec![
            ("t".to_string(), b"a".to_vec()),
            ("s".to_string(), b"b".to_vec()),
            ("s".to_string(), b"a".to_vec()),
        ];
        assert_eq!(
            mark_inserted(&[requested[0], requested[1], requested[3]], &every),
            [true, true, true],
            "every pair returned, in any order: all new"
        );
        assert_eq!(
            mark_inserted(&requested[..2], &[]),
            [false, false],
            "none returned"
        );
    }

    #[test]
    fn a_batch_of_one_scope_is_told_apart_and_its_keys_are_new_once() {
        let record = |scope, key, days: u64| Record {
            scope,
            key,
            retention: Duration::from_secs(86_400 * days),
            fingerprint: None,
        };
        let one = [
            record("s", &b"a"[..], 7),
            record("s", b"b", 7),
            record("s", b"a", 7),
        ];
        assert_eq!(
            one_scope(&one),
            Some(("s", Duration::from_secs(86_400 * 7)))
        );
        assert_eq!(one_scope(&[]), None);
        assert_eq!(
            one_scope(&[one[0], record("t", b"c", 7)]),
            None,
            "two scopes"
        );
        assert_eq!(
            one_scope(&[one[0], record("s", b"c", 1)]),
            None,
            "two retentions"
        );
        let fingerprinted = Record {
            fingerprint: Some(&[7; 32]),
            ..record("s", b"c", 7)
        };
        assert_eq!(
            one_scope(&[one[0], fingerprinted]),
            None,
            "a fingerprint to write"
        );
        assert_eq!(
            mark_inserted_keys(&one, &[b"a".to_vec()]),
            [true, false, false],
            "a key given twice is new at its first place only"
        );
        assert_eq!(
            mark_inserted_keys(&one[..2], &[b"b".to_vec(), b"a".to_vec()]),
            [true, true],
            "every key returned, in any order: all new"
        );
        assert_eq!(
            mark_inserted_keys(&one[..2], &[]),
            [false, false],
            "none returned"
        );
    }

    #[test]
    fn batched_versions_decide_as_if_one_after_another() {
        let entry = |entity, version| VersionEntry {
            scope: "s",
            entity,
            version,
        };
        let mut stored = HashMap::default();
        stored.insert(("s", &b"a"[..]), Some(5));
        stored.insert(("s", &b"b"[..]), None);
        let entries = [
            entry(b"a", 4),
            entry(b"a", 6),
            entry(b"a", 6),
            entry(b"b", 1),
            entry(b"a", 5),
            entry(b"c", -3),
        ];
        let (checks, finals) = sequential_checks(&stored, &entries);
        assert_eq!(
            checks,
            [
                VersionCheck::Behind { latest: 5 },
                VersionCheck::Advanced,
                VersionCheck::Equal,
                VersionCheck::Advanced,
                VersionCheck::Behind { latest: 6 },
                VersionCheck::Advanced,
            ]
        );
        assert_eq!(finals, [entry(b"a", 6), entry(b"b", 1), entry(b"c", -3)]);
    }

    #[test]
    fn versions_compare() {
        assert_eq!(compare(3, 3), VersionCheck::Equal);
        assert_eq!(compare(2, 3), VersionCheck::Behind { latest: 3 });
    }
}

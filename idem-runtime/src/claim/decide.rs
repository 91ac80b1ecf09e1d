//! The decision about one delivery, taken inside its transaction through the database's unique
//! constraint and conditional upsert: apply, or skip (duplicate, stale).

use crate::error::Error;
use crate::outcome::Outcome;
use sqlx::Database;

use crate::store::{Store, StoredStamp, VersionCheck};

use super::builder::Claim;

/// Why a delivery does not run.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Its key (or its version, equal to the stored one) was applied before.
    Duplicate,
    /// Its version is behind the stored one.
    Stale {
        /// The stored version.
        latest: i64,
    },
    /// Lease mode: another delivery holds the message's lease.
    InProgress,
    /// `replay = true`: a duplicate, and the first delivery's value as stored (JSON).
    Replay(Vec<u8>),
    /// `fingerprint`: the key was applied (or is in progress) with another payload.
    Conflict {
        /// The stored fingerprint.
        stored: Vec<u8>,
        /// This delivery's.
        given: [u8; 32],
    },
    /// `max_attempts`: the message failed this many times, at least the handler's bound.
    Poisoned {
        /// The failed attempts counted.
        attempts: u32,
    },
}

impl Skip {
    /// The handler's result for a delivery that does not run.
    pub(crate) fn result<T, E>(self, scope: &'static str) -> Result<Outcome<T>, Error<E>> {
        match self {
            Skip::Duplicate => Ok(Outcome::Duplicate),
            Skip::Stale { latest } => Ok(Outcome::Stale { latest }),
            Skip::InProgress => Ok(Outcome::InProgress),
            Skip::Poisoned { attempts } => Ok(Outcome::Poisoned { attempts }),
            // Deserialized by the generated code of a `replay = true` handler (`replayed`).
            Skip::Replay(json) => Err(Error::Stored { scope, json }),
            Skip::Conflict { stored, given } => Err(Error::Conflict {
                scope,
                stored: hex(&stored),
                given: hex(&given),
            }),
        }
    }
}

/// Lowercase hex of a fingerprint.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Judges a duplicate (or, in lease mode, a message in progress) by the stamp its first
/// delivery left: another fingerprint is a conflict; a stored value is replayed. A row without
/// a fingerprint (written before the handler had one) is not a conflict.
pub(crate) fn judge<DB: Database>(
    claim: &Claim<DB>,
    stamp: Option<StoredStamp>,
    otherwise: Skip,
) -> Skip {
    let stamp = stamp.unwrap_or_default();
    if let (Some(given), Some(stored)) = (claim.fingerprint_bytes(), stamp.fingerprint) {
        if stored != given {
            return Skip::Conflict {
                stored,
                given: *given,
            };
        }
    }
    match stamp.result {
        Some(json) if claim.replays() && otherwise == Skip::Duplicate => Skip::Replay(json),
        _ => otherwise,
    }
}

/// What to do with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Apply,
    /// Do not run; `wrote_record` says the message's record was inserted and must be undone.
    Skip {
        skip: Skip,
        wrote_record: bool,
    },
}

/// The writes a batch already made for a claim in one statement for all its messages: whether
/// its record was new, what became of its version, and for a duplicate the stamp its first
/// delivery left. `None` fields are made by [`decide`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prefetched {
    pub recorded: Option<bool>,
    pub checked: Option<VersionCheck>,
    pub stamp: Option<Option<StoredStamp>>,
    /// key + version + entity: a later copy, in its batch, of a message whose first copy turned
    /// out stale. That copy's record is taken back, so this one is not its duplicate: delivered
    /// alone after it, it would be stale again, against the latest version its own check found
    /// in its place (this one), with no record of its own to undo.
    pub stale_copy: Option<i64>,
}

/// Decides `claim` in the transaction of `conn`: writes what it still needs (its record, its
/// version) and reads back whether the message applies. A duplicate of a handler with
/// `fingerprint` or `replay` is then judged by its stamp, on every path (a batch prefetches it).
pub(crate) async fn decide<DB: Store>(
    claim: &Claim<DB>,
    conn: &mut DB::Connection,
    mut done: Prefetched,
) -> Result<Decision, sqlx::Error> {
    let stamps = claim.stamp_ops();
    // A key only with a stamp to judge a duplicate by: the claim reads it where the database
    // can in the same statement.
    if let Some(ops) = stamps {
        if claim.version_entry().is_none() && done.recorded.is_none() {
            let found = (ops.insert_record_or_read_stamp)(conn, claim.record()).await?;
            done.recorded = Some(found.is_none());
            done.stamp = found.or(done.stamp);
        }
    }
    let stamp = done.stamp.take();
    let decision = decide_claim::<DB>(claim, conn, done).await?;
    match (decision, stamps) {
        (
            Decision::Skip {
                skip: Skip::Duplicate,
                wrote_record: false,
            },
            Some(ops),
        ) => {
            let stamp = match stamp {
                Some(stamp) => stamp,
                None => (ops.load_stamp)(conn, claim.stamp_key()).await?,
            };
            Ok(Decision::Skip {
                skip: judge(claim, stamp, Skip::Duplicate),
                wrote_record: false,
            })
        }
        (decision, _) => Ok(decision),
    }
}

/// The decision a batch's prefetched writes already make, with no statement left to send;
/// `None` where [`decide`] would still send one (to write, or to read a stamp). A stamp it
/// judges by is moved out of `done`, not copied (a replayed value can be 64 KiB).
pub(crate) fn settled<DB: Database>(claim: &Claim<DB>, done: &mut Prefetched) -> Option<Decision> {
    let decision = match (claim.version_entry(), claim.needs_record(), done.stale_copy) {
        (None, _, _) => by_record(done.recorded?),
        (Some(_), false, _) => by_version(done.checked?),
        (Some(_), true, Some(latest)) => stale(latest),
        (Some(entry), true, None) => {
            let check = match done.recorded? {
                false => None,
                true => Some(done.checked?),
            };
            by_record_and_version(entry.version, check)
        }
    };
    match decision {
        Decision::Skip {
            skip: Skip::Duplicate,
            wrote_record: false,
        } if claim.stamps() => Some(Decision::Skip {
            skip: judge(claim, done.stamp.take()?, Skip::Duplicate),
            wrote_record: false,
        }),
        decision => Some(decision),
    }
}

/// The decision by the unique record and the version upsert alone.
async fn decide_claim<DB: Store>(
    claim: &Claim<DB>,
    conn: &mut DB::Connection,
    done: Prefetched,
) -> Result<Decision, sqlx::Error> {
    let entry = claim.version_entry();
    Ok(match (entry, claim.needs_record(), done.stale_copy) {
        // key only: the unique record decides.
        (None, _, _) => by_record(match done.recorded {
            Some(inserted) => inserted,
            None => DB::insert_record(conn, claim.record()).await?,
        }),
        // key + version: the key is the entity; equal is a duplicate, lower is stale.
        (Some(entry), false, _) => by_version(match done.checked {
            Some(check) => check,
            None => DB::advance_version(conn, entry).await?,
        }),
        // A copy of a stale message in its batch: decided by the batch's statements.
        (Some(_), true, Some(latest)) => stale(latest),
        // key + version + entity: a seen key is a duplicate; else the version must advance.
        (Some(entry), true, None) => {
            let check = match done.recorded {
                Some(false) => None,
                Some(true) => Some(match done.checked {
                    Some(check) => check,
                    None => DB::advance_version(conn, entry).await?,
                }),
                None => DB::record_and_advance(conn, claim.record(), entry).await?,
            };
            by_record_and_version(entry.version, check)
        }
    })
}

/// Stale against `latest`, with no record to take back.
fn stale(latest: i64) -> Decision {
    Decision::Skip {
        skip: Skip::Stale { latest },
        wrote_record: false,
    }
}

const DUPLICATE: Decision = Decision::Skip {
    skip: Skip::Duplicate,
    wrote_record: false,
};

/// key only: a new record applies, a seen one is a duplicate.
fn by_record(inserted: bool) -> Decision {
    if inserted {
        Decision::Apply
    } else {
        DUPLICATE
    }
}

/// key + version: an advanced version applies, an equal one is a duplicate, a lower one stale.
fn by_version(check: VersionCheck) -> Decision {
    match check {
        VersionCheck::Advanced => Decision::Apply,
        VersionCheck::Equal => DUPLICATE,
        VersionCheck::Behind { latest } => stale(latest),
    }
}

/// key + version + entity: `None` for a seen key (a duplicate); for a new record, an advanced
/// version applies and any other is stale, its new record to be taken back.
fn by_record_and_version(version: i64, check: Option<VersionCheck>) -> Decision {
    let latest = match check {
        None => return DUPLICATE,
        Some(VersionCheck::Advanced) => return Decision::Apply,
        Some(VersionCheck::Equal) => version,
        Some(VersionCheck::Behind { latest }) => latest,
    };
    Decision::Skip {
        skip: Skip::Stale { latest },
        wrote_record: true,
    }
}

// A claim names its database: the tests take SQLite's.
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    type Claim = super::Claim<sqlx::Sqlite>;

    fn prefetched(recorded: Option<bool>, checked: Option<VersionCheck>) -> Prefetched {
        Prefetched {
            recorded,
            checked,
            ..Prefetched::default()
        }
    }

    fn stale(latest: i64, wrote_record: bool) -> Option<Decision> {
        Some(Decision::Skip {
            skip: Skip::Stale { latest },
            wrote_record,
        })
    }

    #[test]
    fn a_key_only_claim_is_settled_by_its_record() {
        let claim = Claim::new("s").key(&"k");
        let settle = |recorded| settled(&claim, &mut prefetched(recorded, None));
        assert_eq!(settle(Some(true)), Some(Decision::Apply));
        assert_eq!(settle(Some(false)), Some(DUPLICATE));
        assert_eq!(settle(None), None, "its record is still to be inserted");
    }

    #[test]
    fn a_versioned_key_is_settled_by_its_version_check() {
        let claim = Claim::new("s").key(&"k").version(&3_i64);
        let settle = |checked| settled(&claim, &mut prefetched(None, checked));
        assert_eq!(settle(Some(VersionCheck::Advanced)), Some(Decision::Apply));
        assert_eq!(settle(Some(VersionCheck::Equal)), Some(DUPLICATE));
        assert_eq!(
            settle(Some(VersionCheck::Behind { latest: 5 })),
            stale(5, false)
        );
        assert_eq!(settle(None), None, "its version is still to be advanced");
    }

    #[test]
    fn an_entity_claim_needs_its_record_then_its_version() {
        let claim = Claim::new("s").key(&"k").entity(&"e").version(&3_i64);
        let settle = |recorded, checked| settled(&claim, &mut prefetched(recorded, checked));
        assert_eq!(settle(Some(false), None), Some(DUPLICATE));
        assert_eq!(settle(None, None), None);
        assert_eq!(
            settle(Some(true), None),
            None,
            "the version is still to be advanced"
        );
        let advanced = Some(VersionCheck::Advanced);
        assert_eq!(settle(Some(true), advanced), Some(Decision::Apply));
        // A new record with a version that did not advance is stale, its record to be undone.
        assert_eq!(
            settle(Some(true), Some(VersionCheck::Equal)),
            stale(3, true)
        );
        let behind = Some(VersionCheck::Behind { latest: 9 });
        assert_eq!(settle(Some(true), behind), stale(9, true));
    }

    #[test]
    fn a_copy_of_a_stale_message_is_stale_with_nothing_to_undo() {
        let claim = Claim::new("s").key(&"k").entity(&"e").version(&3_i64);
        let mut copy = Prefetched {
            recorded: Some(false),
            stale_copy: Some(9),
            ..Prefetched::default()
        };
        assert_eq!(settled(&claim, &mut copy), stale(9, false));
        copy.stale_copy = None;
        assert_eq!(
            settled(&claim, &mut copy),
            Some(DUPLICATE),
            "without it, a copy is a duplicate of its first"
        );
    }

    #[test]
    fn a_duplicate_with_a_stamp_is_settled_only_once_its_stamp_is_read() {
        let claim = Claim::new("s").key(&"k").fingerprint(&"payload");
        let mut done = prefetched(Some(false), None);
        assert_eq!(
            settled(&claim, &mut done),
            None,
            "its stamp is still to be read"
        );
        done.stamp = Some(None);
        assert_eq!(settled(&claim, &mut done), Some(DUPLICATE));
        assert_eq!(done.stamp, None, "the stamp moved into the decision");
        done.stamp = Some(Some(StoredStamp {
            fingerprint: Some(vec![0; 32]),
            result: None,
        }));
        let conflict = settled(&claim, &mut done);
        assert!(
            matches!(
                conflict,
                Some(Decision::Skip {
                    skip: Skip::Conflict { .. },
                    wrote_record: false
                })
            ),
            "{conflict:?}"
        );
        // A new record needs no stamp.
        assert_eq!(
            settled(&claim, &mut prefetched(Some(true), None)),
            Some(Decision::Apply)
        );
    }
}

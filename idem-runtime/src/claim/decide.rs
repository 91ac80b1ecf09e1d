//! The decision about one delivery, taken inside its transaction through the database's unique
//! constraint and conditional upsert: apply, or skip (duplicate, stale).

use crate::error::Error;
use crate::outcome::Outcome;
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
pub(crate) fn judge(claim: &Claim, stamp: Option<StoredStamp>, otherwise: Skip) -> Skip {
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
}

/// Decides `claim` in the transaction of `conn`: writes what it still needs (its record, its
/// version) and reads back whether the message applies. A duplicate of a handler with
/// `fingerprint` or `replay` is then judged by its stamp, on every path (a batch prefetches it).
pub(crate) async fn decide<DB: Store>(
    claim: &Claim,
    conn: &mut DB::Connection,
    mut done: Prefetched,
) -> Result<Decision, sqlx::Error> {
    let stamp = done.stamp.take();
    let decision = decide_claim::<DB>(claim, conn, done).await?;
    match decision {
        Decision::Skip {
            skip: Skip::Duplicate,
            wrote_record: false,
        } if claim.stamps() => {
            let stamp = match stamp {
                Some(stamp) => stamp,
                None => DB::load_stamp(conn, claim.stamp_key()).await?,
            };
            Ok(Decision::Skip {
                skip: judge(claim, stamp, Skip::Duplicate),
                wrote_record: false,
            })
        }
        decision => Ok(decision),
    }
}

/// The decision by the unique record and the version upsert alone.
async fn decide_claim<DB: Store>(
    claim: &Claim,
    conn: &mut DB::Connection,
    done: Prefetched,
) -> Result<Decision, sqlx::Error> {
    let duplicate = Decision::Skip {
        skip: Skip::Duplicate,
        wrote_record: false,
    };
    let entry = claim.version_entry();
    match (entry, claim.needs_record()) {
        // key only: the unique record decides.
        (None, _) => {
            let inserted = match done.recorded {
                Some(inserted) => inserted,
                None => DB::insert_record(conn, claim.record()).await?,
            };
            Ok(if inserted { Decision::Apply } else { duplicate })
        }
        // key + version: the key is the entity; equal is a duplicate, lower is stale.
        (Some(entry), false) => {
            let check = match done.checked {
                Some(check) => check,
                None => DB::advance_version(conn, entry).await?,
            };
            Ok(match check {
                VersionCheck::Advanced => Decision::Apply,
                VersionCheck::Equal => duplicate,
                VersionCheck::Behind { latest } => Decision::Skip {
                    skip: Skip::Stale { latest },
                    wrote_record: false,
                },
            })
        }
        // key + version + entity: a seen key is a duplicate; else the version must advance.
        (Some(entry), true) => {
            let check = match done.recorded {
                Some(false) => None,
                Some(true) => Some(match done.checked {
                    Some(check) => check,
                    None => DB::advance_version(conn, entry).await?,
                }),
                None => DB::record_and_advance(conn, claim.record(), entry).await?,
            };
            let latest = match check {
                None => return Ok(duplicate),
                Some(VersionCheck::Advanced) => return Ok(Decision::Apply),
                Some(VersionCheck::Equal) => entry.version,
                Some(VersionCheck::Behind { latest }) => latest,
            };
            Ok(Decision::Skip {
                skip: Skip::Stale { latest },
                wrote_record: true,
            })
        }
    }
}

//! The decision about one delivery, taken inside its transaction through the database's unique
//! constraint and conditional upsert: apply, or skip (duplicate, stale).

use crate::outcome::Outcome;
use crate::store::{Store, VersionCheck};

use super::builder::Claim;

/// Why a delivery does not run.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Skip {
    pub(crate) fn outcome<T>(self) -> Outcome<T> {
        match self {
            Skip::Duplicate => Outcome::Duplicate,
            Skip::Stale { latest } => Outcome::Stale { latest },
            Skip::InProgress => Outcome::InProgress,
        }
    }
}

/// What to do with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Apply,
    /// Do not run; `wrote_record` says the message's record was inserted and must be undone.
    Skip {
        skip: Skip,
        wrote_record: bool,
    },
}

/// The writes a batch already made for a claim in one statement for all its messages: whether
/// its record was new, and what became of its version. `None` fields are made by [`decide`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Prefetched {
    pub recorded: Option<bool>,
    pub checked: Option<VersionCheck>,
}

/// Decides `claim` in the transaction of `conn`: writes what it still needs (its record, its
/// version) and reads back whether the message applies.
pub(crate) async fn decide<DB: Store>(
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

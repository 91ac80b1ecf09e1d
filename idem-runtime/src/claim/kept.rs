//! Stamps kept for a batch: an applied delivery of a batch leaves its stamp (`fingerprint`,
//! `replay`) with the batch, which writes them all in one call ([`Stamps::save_stamps`]) before
//! it reads a stamp or commits, instead of one statement a message.

use sqlx::Database;

#[cfg(doc)]
use crate::store::Stamps;
use crate::store::{Stamp, StampKey, StampRow};

use super::ops::StampOps;

/// The stamp of an applied, batched delivery, until its batch writes it.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptStamp {
    row: StampRow,
    scope: &'static str,
    key: Vec<u8>,
    fingerprint: Option<[u8; 32]>,
    result: Option<Vec<u8>>,
}

impl KeptStamp {
    pub(crate) fn new(
        row: StampRow,
        scope: &'static str,
        key: &[u8],
        fingerprint: Option<[u8; 32]>,
        result: Option<Vec<u8>>,
    ) -> Self {
        KeptStamp {
            row,
            scope,
            key: key.to_vec(),
            fingerprint,
            result,
        }
    }

    fn stamp(&self) -> Stamp<'_> {
        Stamp {
            at: self.at(),
            fingerprint: self.fingerprint.as_ref().map(<[u8; 32]>::as_slice),
            result: self.result.as_deref(),
        }
    }

    fn at(&self) -> StampKey<'_> {
        StampKey {
            row: self.row,
            scope: self.scope,
            key: &self.key,
        }
    }
}

/// Each row's last stamp, in the order the rows were first stamped: a version row advanced
/// twice in one batch keeps the later delivery's stamp, as one statement after another would.
fn last_per_row(kept: &[KeptStamp]) -> Vec<Stamp<'_>> {
    let mut stamps: Vec<Stamp<'_>> = Vec::with_capacity(kept.len());
    let mut at: foldhash::HashMap<StampKey<'_>, usize> = foldhash::HashMap::default();
    for stamp in kept.iter().map(KeptStamp::stamp) {
        match at.get(&stamp.at) {
            Some(&place) => stamps[place] = stamp,
            None => {
                at.insert(stamp.at, stamps.len());
                stamps.push(stamp);
            }
        }
    }
    stamps
}

/// The stamps a batch's applied deliveries left, until the batch writes them, and where they
/// are written: the table of the first delivery that left one (every stamped claim of a batch
/// on `DB` has the same one), so that stamps are never kept without it.
#[doc(hidden)]
pub struct Kept<DB: Database>(Option<(&'static StampOps<DB>, Vec<KeptStamp>)>);

impl<DB: Database> Default for Kept<DB> {
    fn default() -> Self {
        Kept(None)
    }
}

impl<DB: Database> Kept<DB> {
    /// Keeps `stamp`, to be written with `ops`.
    pub(crate) fn push(&mut self, ops: &'static StampOps<DB>, stamp: KeptStamp) {
        self.0
            .get_or_insert_with(|| (ops, Vec::new()))
            .1
            .push(stamp);
    }

    /// Writes the stamps kept so far in one call, and forgets them.
    pub(crate) async fn write(&mut self, conn: &mut DB::Connection) -> Result<(), sqlx::Error> {
        let Some((ops, kept)) = &mut self.0 else {
            return Ok(());
        };
        if kept.is_empty() {
            return Ok(());
        }
        let stamps = last_per_row(kept);
        (ops.save_stamps)(conn, &stamps).await?;
        drop(stamps);
        kept.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(row: StampRow, key: &[u8], result: &[u8]) -> KeptStamp {
        KeptStamp::new(row, "s", key, Some([7; 32]), Some(result.to_vec()))
    }

    #[test]
    fn a_row_stamped_twice_keeps_its_last_stamp_in_its_first_place() {
        let all = [
            kept(StampRow::Version, b"e", b"1"),
            kept(StampRow::Record, b"e", b"2"),
            kept(StampRow::Version, b"f", b"3"),
            kept(StampRow::Version, b"e", b"4"),
        ];
        let written: Vec<(StampRow, &[u8], &[u8])> = last_per_row(&all)
            .iter()
            .map(|s| (s.at.row, s.at.key, s.result.unwrap_or_default()))
            .collect();
        assert_eq!(
            written,
            [
                (StampRow::Version, &b"e"[..], &b"4"[..]),
                (StampRow::Record, b"e", b"2"),
                (StampRow::Version, b"f", b"3"),
            ]
        );
        assert_eq!(last_per_row(&all)[0].fingerprint, Some(&[7; 32][..]));
    }
}

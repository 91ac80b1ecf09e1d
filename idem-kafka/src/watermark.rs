//! [`Watermarks`]: per partition, the offsets taken and not yet settled, and the contiguous
//! low-watermark below which everything has settled: the only offset that may be committed.

use std::collections::{BTreeMap, HashMap};

/// The offsets of the partitions this consumer owns. A partition's state lives from its
/// assignment to its revocation; each assignment gets a new epoch, so a settlement that comes
/// back after its partition was revoked (and maybe assigned again) is recognised and dropped.
#[derive(Debug, Default)]
pub(crate) struct Watermarks {
    partitions: HashMap<i32, Partition>,
    next_epoch: u64,
}

#[derive(Debug)]
struct Partition {
    epoch: u64,
    /// Taken offsets above the watermark, in order, and whether each has settled.
    taken: BTreeMap<i64, bool>,
    /// The next offset to consume: everything below it (that was taken) has settled.
    position: Option<i64>,
    /// The position last handed out for a commit.
    sent: Option<i64>,
}

/// Which assignment of a partition a delivery belongs to.
pub(crate) type Epoch = u64;

impl Watermarks {
    /// The partition is ours (again): a fresh state with a new epoch.
    pub fn assign(&mut self, partition: i32) {
        self.next_epoch += 1;
        self.partitions.insert(
            partition,
            Partition {
                epoch: self.next_epoch,
                taken: BTreeMap::new(),
                position: None,
                sent: None,
            },
        );
    }

    /// Whether no partition is assigned (none yet, or all revoked).
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// The partition is no longer ours: forget it, and return the position to commit for it
    /// (what has settled so far), if anything settled.
    pub fn revoke(&mut self, partition: i32) -> Option<i64> {
        self.partitions.remove(&partition)?.position
    }

    /// An offset was taken from an assigned partition: it holds the watermark until it
    /// settles. `None` when the partition is not ours (a record fetched before a revoke).
    pub fn take(&mut self, partition: i32, offset: i64) -> Option<Epoch> {
        let state = self.partitions.get_mut(&partition)?;
        state.taken.insert(offset, false);
        Some(state.epoch)
    }

    /// Whether a delivery of `epoch` still belongs to this consumer.
    pub fn is_current(&self, partition: i32, epoch: Epoch) -> bool {
        self.partitions
            .get(&partition)
            .is_some_and(|p| p.epoch == epoch)
    }

    /// An offset settled (its transaction committed, or its dead letter was confirmed): the
    /// watermark moves over every settled offset at the bottom. False when the settlement
    /// belongs to an earlier assignment and was dropped.
    pub fn settle(&mut self, partition: i32, offset: i64, epoch: Epoch) -> bool {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return false;
        };
        if state.epoch != epoch {
            return false;
        }
        match state.taken.get_mut(&offset) {
            Some(done) => *done = true,
            None => return false,
        }
        while let Some(entry) = state.taken.first_entry() {
            if !*entry.get() {
                break;
            }
            let (offset, _) = entry.remove_entry();
            state.position = Some(offset + 1);
        }
        true
    }

    /// How many offsets of the partition are held above its watermark (taken, and not all
    /// below them settled).
    pub fn held(&self, partition: i32) -> usize {
        self.partitions.get(&partition).map_or(0, |p| p.taken.len())
    }

    /// The positions that moved since they were last handed out, marked as handed out.
    pub fn moved(&mut self) -> Vec<(i32, i64)> {
        let mut moved = Vec::new();
        for (partition, state) in &mut self.partitions {
            if let Some(position) = state.position {
                if state.sent != Some(position) {
                    state.sent = Some(position);
                    moved.push((*partition, position));
                }
            }
        }
        moved
    }

    /// Every partition's position (for the last commit, at shutdown).
    pub fn positions(&self) -> Vec<(i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|(partition, state)| Some((*partition, state.position?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(partitions: &[i32]) -> Watermarks {
        let mut w = Watermarks::default();
        for p in partitions {
            w.assign(*p);
        }
        w
    }

    #[test]
    fn the_watermark_stops_at_the_lowest_unsettled_offset() {
        let mut w = assigned(&[0]);
        let epoch = w.take(0, 10).unwrap();
        for offset in 11..15 {
            w.take(0, offset).unwrap();
        }
        // 11..14 settle first: nothing may be committed while 10 is open.
        for offset in 11..15 {
            assert!(w.settle(0, offset, epoch));
        }
        assert_eq!(w.positions(), vec![]);
        assert_eq!(w.held(0), 5);
        assert!(w.settle(0, 10, epoch));
        assert_eq!(w.positions(), vec![(0, 15)]);
        assert_eq!(w.held(0), 0);
    }

    #[test]
    fn gaps_in_the_log_do_not_hold_the_watermark() {
        // Compaction or transaction markers leave offsets that are never delivered.
        let mut w = assigned(&[0]);
        let epoch = w.take(0, 3).unwrap();
        w.take(0, 7).unwrap();
        assert!(w.settle(0, 3, epoch));
        assert_eq!(w.positions(), vec![(0, 4)]);
        assert!(w.settle(0, 7, epoch));
        assert_eq!(w.positions(), vec![(0, 8)]);
    }

    #[test]
    fn partitions_move_independently() {
        let mut w = assigned(&[0, 1]);
        let e0 = w.take(0, 0).unwrap();
        let e1 = w.take(1, 0).unwrap();
        w.take(1, 1).unwrap();
        assert!(w.settle(1, 1, e1));
        assert!(w.settle(0, 0, e0));
        assert_eq!(w.moved(), vec![(0, 1)]);
        assert!(w.settle(1, 0, e1));
        assert_eq!(w.moved(), vec![(1, 2)]);
        // Handed out once: nothing moved since.
        assert_eq!(w.moved(), vec![]);
        let mut all = w.positions();
        all.sort();
        assert_eq!(all, vec![(0, 1), (1, 2)]);
    }

    #[test]
    fn a_revoke_returns_what_settled_and_later_settlements_of_it_are_dropped() {
        let mut w = assigned(&[0]);
        let old = w.take(0, 0).unwrap();
        w.take(0, 1).unwrap();
        assert!(w.settle(0, 0, old));
        assert_eq!(w.revoke(0), Some(1));
        assert!(!w.is_current(0, old));
        // In flight when it was revoked: its result is dropped, not committed.
        assert!(!w.settle(0, 1, old));
        assert_eq!(w.take(0, 1), None);
        // Assigned again (from the committed offset): a new epoch; the old one stays dropped.
        w.assign(0);
        let new = w.take(0, 1).unwrap();
        assert_ne!(new, old);
        assert!(!w.settle(0, 1, old));
        assert_eq!(w.positions(), vec![]);
        assert!(w.settle(0, 1, new));
        assert_eq!(w.positions(), vec![(0, 2)]);
    }

    #[test]
    fn a_revoke_before_anything_settled_commits_nothing_and_unknown_offsets_are_refused() {
        let mut w = assigned(&[2]);
        let epoch = w.take(2, 5).unwrap();
        assert!(!w.settle(2, 6, epoch));
        assert_eq!(w.revoke(2), None);
        assert_eq!(w.revoke(3), None);
    }

    #[test]
    fn random_completion_orders_never_pass_an_unsettled_offset() {
        // A small deterministic shuffle (no dependency): every prefix of the settlement order
        // leaves the watermark exactly at the lowest offset not yet settled.
        let mut w = assigned(&[0]);
        let n = 200_i64;
        let mut epoch = 0;
        for offset in 0..n {
            epoch = w.take(0, offset).unwrap();
        }
        let mut order: Vec<i64> = (0..n).collect();
        let mut seed = 0x2545_f491_u64;
        for i in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        let mut settled = vec![false; n as usize];
        for offset in order {
            assert!(w.settle(0, offset, epoch));
            settled[offset as usize] = true;
            let lowest_open = settled.iter().position(|s| !s).map_or(n, |i| i as i64);
            let expected = (lowest_open > 0).then_some(lowest_open);
            assert_eq!(w.positions().first().map(|p| p.1), expected);
        }
        assert_eq!(w.held(0), 0);
    }
}

//! [`Counts`]: what a consumer's run did, per outcome.

/// How many deliveries a consumer's run settled, per outcome, and what went wrong on the way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Applied now (acked).
    pub applied: u64,
    /// Duplicates (acked): their message was applied before.
    pub duplicate: u64,
    /// Stale versions (acked).
    pub stale: u64,
    /// Duplicates answered with the first delivery's stored value (`replay = true`; acked).
    pub replayed: u64,
    /// Lease held elsewhere (requeued after a delay).
    pub in_progress: u64,
    /// Handler failures, panics and time-outs (requeued with backoff).
    pub failed: u64,
    /// Dead-lettered: undecodable, bad key, poisoned, a conflict, or over `max_deliveries`.
    pub dead_lettered: u64,
    /// Deliveries requeued at shutdown or because the store did not answer in time, and those
    /// dropped unrun because the broker revoked them (a Kafka rebalance).
    pub requeued: u64,
    /// Settlements that did not reach the broker (its redelivery will be a duplicate).
    pub settle_failures: u64,
    /// Times a batch waited for the store to come back (never counted as an attempt).
    pub store_pauses: u64,
    /// Failed deliveries parked in the database for a durable retry (recovery), each acked
    /// once parked; also counted in `failed`.
    pub parked: u64,
    /// Dead letters written to the database (recovery); also counted in `dead_lettered` (or
    /// in `failed`, for a retry whose runs were used up).
    pub dead_letters_stored: u64,
}

impl Counts {
    /// Every delivery that was settled or tried to be.
    pub fn settled(&self) -> u64 {
        self.applied
            + self.duplicate
            + self.stale
            + self.replayed
            + self.in_progress
            + self.failed
            + self.dead_lettered
            + self.requeued
    }

    pub(crate) fn add(&mut self, other: &Counts) {
        self.applied += other.applied;
        self.duplicate += other.duplicate;
        self.stale += other.stale;
        self.replayed += other.replayed;
        self.in_progress += other.in_progress;
        self.failed += other.failed;
        self.dead_lettered += other.dead_lettered;
        self.requeued += other.requeued;
        self.settle_failures += other.settle_failures;
        self.store_pauses += other.store_pauses;
        self.parked += other.parked;
        self.dead_letters_stored += other.dead_letters_stored;
    }
}

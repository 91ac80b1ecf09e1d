//! The consumer's share of the `idem_consumer_in_flight` gauge: what a run took from the
//! broker and has not settled yet, given back when the run ends, however it ends.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Deliveries taken and not yet settled by one consumer's run. Dropped with the consumer that
/// `run` owns, it takes what is left off the gauge: a run whose future is dropped mid-batch
/// (a `select!` that chose another branch, a time-out) leaves the gauge as it found it.
#[derive(Debug, Default)]
pub(crate) struct Flight(AtomicUsize);

impl Flight {
    /// One delivery taken from the stream.
    pub(crate) fn took(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        crate::metrics::consumer_took();
    }

    /// `n` deliveries settled (or given up on): they leave the gauge.
    pub(crate) fn left(&self, n: usize) {
        // Saturating: a miscount must not wrap and take the gauge far below zero on drop.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |taken| {
                Some(taken.saturating_sub(n))
            });
        #[cfg(feature = "metrics")]
        crate::metrics::consumer_left_flight(n);
    }

    /// How many are taken and not settled.
    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A cloned consumer has taken nothing.
impl Clone for Flight {
    fn clone(&self) -> Self {
        Flight::default()
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let left = *self.0.get_mut();
        if left > 0 {
            #[cfg(feature = "metrics")]
            crate::metrics::consumer_left_flight(left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Flight;

    #[test]
    fn counts_what_is_taken_and_not_settled() {
        let flight = Flight::default();
        flight.took();
        flight.took();
        flight.took();
        flight.left(2);
        assert_eq!(flight.outstanding(), 1);
        assert_eq!(flight.clone().outstanding(), 0, "a clone has taken nothing");
        flight.left(1);
        assert_eq!(flight.outstanding(), 0);
        flight.left(1);
        assert_eq!(flight.outstanding(), 0, "never below zero");
    }
}

//! Outbox helpers for tests: a publisher that watches two relays for a partition key published
//! by both at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::outbox::{Message, PublishError, Publisher};

/// A publisher that reports a partition key in two relays' publishes at the same time: it
/// holds each batch's keys while the inner one publishes it (after a short wait that gives the
/// other relay time to publish one of them, if it could). Clones share what they saw.
pub struct Watched<P> {
    inner: Arc<P>,
    in_flight: Arc<Mutex<HashSet<String>>>,
    overlap: Arc<AtomicBool>,
}

impl<P> Clone for Watched<P> {
    fn clone(&self) -> Self {
        Watched {
            inner: self.inner.clone(),
            in_flight: self.in_flight.clone(),
            overlap: self.overlap.clone(),
        }
    }
}

impl<P: Publisher> Watched<P> {
    /// Watches `inner`'s publishes.
    pub fn new(inner: P) -> Self {
        Watched {
            inner: Arc::new(inner),
            in_flight: Arc::default(),
            overlap: Arc::default(),
        }
    }

    /// Whether two publishes ever held one partition key at the same time.
    pub fn overlapped(&self) -> bool {
        self.overlap.load(Ordering::SeqCst)
    }

    fn hold(&self, keys: &HashSet<String>, hold: bool) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            if !hold {
                in_flight.remove(key);
            } else if !in_flight.insert(key.clone()) {
                self.overlap.store(true, Ordering::SeqCst);
            }
        }
    }
}

impl<P: Publisher> Publisher for Watched<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        let keys: HashSet<String> = batch.iter().map(|m| m.partition_key.clone()).collect();
        self.hold(&keys, true);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let result = self.inner.publish(batch).await;
        self.hold(&keys, false);
        result
    }
}

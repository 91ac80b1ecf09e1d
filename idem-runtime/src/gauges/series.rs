//! The gauges' series: each round sets every label set it read, and sets to 0 the label sets
//! of an earlier round that it did not read again (a destination whose backlog was sent, a
//! consumer whose parked retries ran), so that no gauge stays at a value that is gone.

use std::collections::BTreeSet;

use metrics::gauge;

/// A label set: `(name, value)` pairs in the series' order.
pub(super) type Labels = Vec<(&'static str, String)>;

/// One gauge series and the label sets it was last set for.
#[derive(Debug)]
pub(super) struct Series {
    name: &'static str,
    last: BTreeSet<Labels>,
}

impl Series {
    pub(super) fn new(name: &'static str) -> Self {
        Series {
            name,
            last: BTreeSet::new(),
        }
    }

    /// Sets the series to `values`, and every label set of the last round that is not among
    /// them to 0.
    pub(super) fn set(&mut self, values: Vec<(Labels, f64)>) {
        let mut now = BTreeSet::new();
        for (labels, value) in values {
            set_one(self.name, &labels, value);
            now.insert(labels);
        }
        for gone in self.last.difference(&now) {
            set_one(self.name, gone, 0.0);
        }
        self.last = now;
    }
}

fn set_one(name: &'static str, labels: &Labels, value: f64) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(key, value)| metrics::Label::new(*key, value.clone()))
        .collect();
    gauge!(name, labels).set(value);
}

//! What the dashboard's PromQL computes, over the scrapes of one run: gauges summed (or the
//! maximum) by a legend, `rate()` over a window summed by a legend, and `histogram_quantile()`
//! of the buckets' rates, as Prometheus evaluates them at each scrape.

use std::collections::BTreeMap;

use super::prom::{Labels, Scrape};

/// Points of one line: (seconds since the start, value); NaN where there is no value.
pub type Points = Vec<(f64, f64)>;
/// A panel's lines, by legend.
pub type Lines = BTreeMap<String, Points>;

/// How a gauge's series are combined into a line.
#[derive(Debug, Clone, Copy)]
pub enum Agg {
    Sum,
    Max,
}

/// The scrapes of a run, and the window of `rate()` (Grafana's `$__rate_interval`).
pub struct Query<'a> {
    pub scrapes: &'a [Scrape],
    pub window: f64,
}

/// Every series of one metric: its value at each scrape (None where absent).
type Series = BTreeMap<Labels, Vec<Option<f64>>>;

impl Query<'_> {
    fn series(&self, name: &str, keep: &dyn Fn(&Labels) -> bool) -> Series {
        let mut series = Series::new();
        for (i, scrape) in self.scrapes.iter().enumerate() {
            for sample in scrape.samples.iter().filter(|s| s.name == name) {
                if keep(&sample.labels) {
                    series
                        .entry(sample.labels.clone())
                        .or_insert_with(|| vec![None; self.scrapes.len()])[i] = Some(sample.value);
                }
            }
        }
        series
    }

    /// Each series' per-second rate at each scrape: the increase since the earliest scrape of
    /// the window that has it, over the time between them (no value without two samples).
    fn rates(&self, series: Series) -> Series {
        series
            .into_iter()
            .map(|(labels, values)| {
                let rates = (0..values.len())
                    .map(|i| {
                        let now = values[i]?;
                        let t = self.scrapes[i].t;
                        let j = (0..i).find(|&j| {
                            values[j].is_some() && self.scrapes[j].t >= t - self.window - 1e-6
                        })?;
                        let then = values[j]?;
                        Some((now - then).max(0.0) / (t - self.scrapes[j].t))
                    })
                    .collect();
                (labels, rates)
            })
            .collect()
    }

    /// Combines series into lines by `legend`, scrape by scrape.
    fn combine(&self, series: &Series, legend: &dyn Fn(&Labels) -> String, agg: Agg) -> Lines {
        let mut lines = Lines::new();
        for (labels, values) in series {
            let line = lines
                .entry(legend(labels))
                .or_insert_with(|| self.scrapes.iter().map(|s| (s.t, f64::NAN)).collect());
            for (point, value) in line.iter_mut().zip(values) {
                if let Some(v) = value {
                    point.1 = match (agg, point.1.is_nan()) {
                        (_, true) => *v,
                        (Agg::Sum, false) => point.1 + v,
                        (Agg::Max, false) => point.1.max(*v),
                    };
                }
            }
        }
        lines
    }

    /// `sum by (...) (name)` or `max by (...) (name)`, the groups named by `legend`.
    pub fn gauge(
        &self,
        name: &str,
        keep: &dyn Fn(&Labels) -> bool,
        legend: &dyn Fn(&Labels) -> String,
        agg: Agg,
    ) -> Lines {
        self.combine(&self.series(name, keep), legend, agg)
    }

    /// `sum by (...) (rate(name[window]))`, the groups named by `legend`.
    pub fn rate(
        &self,
        name: &str,
        keep: &dyn Fn(&Labels) -> bool,
        legend: &dyn Fn(&Labels) -> String,
    ) -> Lines {
        let rates = self.rates(self.series(name, keep));
        self.combine(&rates, legend, Agg::Sum)
    }

    /// `histogram_quantile(q, sum by (le, ...) (rate(name_bucket[window])))`, the groups named
    /// by `legend` (of the labels other than `le`): linear within the bucket the rank falls in.
    pub fn quantile(
        &self,
        q: f64,
        name: &str,
        keep: &dyn Fn(&Labels) -> bool,
        legend: &dyn Fn(&Labels) -> String,
    ) -> Lines {
        let rates = self.rates(self.series(&format!("{name}_bucket"), keep));
        // By group, by upper bound: the summed rates at each scrape.
        let mut groups: BTreeMap<String, BTreeMap<Bound, Vec<f64>>> = BTreeMap::new();
        for (labels, values) in &rates {
            let Some(le) = labels.get("le").and_then(|le| parse_bound(le)) else {
                continue;
            };
            let sums = groups
                .entry(legend(labels))
                .or_default()
                .entry(Bound(le))
                .or_insert_with(|| vec![0.0; self.scrapes.len()]);
            for (sum, v) in sums.iter_mut().zip(values) {
                *sum += v.unwrap_or(0.0);
            }
        }
        groups
            .into_iter()
            .map(|(legend, buckets)| {
                let points = self
                    .scrapes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let cumulative: Vec<(f64, f64)> =
                            buckets.iter().map(|(le, v)| (le.0, v[i])).collect();
                        (s.t, bucket_quantile(q, &cumulative))
                    })
                    .collect();
                (legend, points)
            })
            .collect()
    }
}

/// A bucket's upper bound, ordered (`+Inf` last).
#[derive(Debug, Clone, Copy)]
struct Bound(f64);

impl PartialEq for Bound {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Bound {}

impl PartialOrd for Bound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" => Some(f64::INFINITY),
        le => le.parse().ok(),
    }
}

/// Prometheus' `bucketQuantile`: `buckets` are (upper bound, cumulative count) in order, the
/// last `+Inf`. NaN when nothing was counted.
fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let Some(&(last_le, total)) = buckets.last() else {
        return f64::NAN;
    };
    if total <= 0.0 || !last_le.is_infinite() || buckets.len() < 2 {
        return f64::NAN;
    }
    let rank = q * total;
    let b = buckets
        .iter()
        .position(|&(_, count)| count >= rank)
        .unwrap_or(buckets.len() - 1);
    if b == buckets.len() - 1 {
        // In the +Inf bucket: the highest finite bound.
        return buckets[buckets.len() - 2].0;
    }
    let (lower, below) = if b == 0 { (0.0, 0.0) } else { buckets[b - 1] };
    let (upper, count) = buckets[b];
    if count - below <= 0.0 {
        return upper;
    }
    lower + (upper - lower) * (rank - below) / (count - below)
}

/// The last value of a line that is a number (Grafana's `lastNotNull`).
pub fn last(points: &Points) -> Option<f64> {
    points.iter().rev().map(|p| p.1).find(|v| v.is_finite())
}

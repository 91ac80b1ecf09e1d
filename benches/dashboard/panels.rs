//! The dashboard's panels (`docs/dashboards/idem.json`): each panel's title, kind, place and
//! unit read from the JSON, and its queries evaluated over the run's scrapes, one function per
//! title. A title this file does not know is an error, so the picture cannot drift from the
//! dashboard.

use std::path::Path;

use anyhow::{anyhow, bail, Context as _};

use super::prom::Labels;
use super::query::{Agg, Lines, Query};

/// What a panel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A section heading.
    Row,
    /// One number (the last value) over a sparkline.
    Stat,
    /// Lines over time.
    TimeSeries,
}

/// A panel of the dashboard, with what its queries gave.
#[derive(Debug)]
pub struct Panel {
    pub title: String,
    pub kind: Kind,
    /// Grafana's grid: 24 columns, rows of one unit.
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
    /// Grafana's unit (`reqps`, `percentunit`, `s`, `short`).
    pub unit: String,
    pub lines: Lines,
}

/// The dashboard's title and panels, each computed from `query`.
pub fn load(json: &Path, query: &Query) -> anyhow::Result<(String, Vec<Panel>)> {
    let text = std::fs::read_to_string(json).with_context(|| format!("{}", json.display()))?;
    let dashboard: serde_json::Value = serde_json::from_str(&text)?;
    let title = dashboard["title"].as_str().unwrap_or("idem").to_string();
    let panels = dashboard["panels"]
        .as_array()
        .ok_or_else(|| anyhow!("{}: no panels", json.display()))?;
    let mut out = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        let kind = match panel["type"].as_str() {
            Some("row") => Kind::Row,
            Some("stat") => Kind::Stat,
            Some("timeseries") => Kind::TimeSeries,
            other => bail!("panel {title:?}: type {other:?} is not drawn"),
        };
        let grid = |k: &str| panel["gridPos"][k].as_u64().unwrap_or(0) as u32;
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or("short")
            .to_string();
        let lines = match kind {
            Kind::Row => Lines::new(),
            _ => compute(&title, query)?,
        };
        out.push(Panel {
            title,
            kind,
            x: grid("x"),
            y: grid("y"),
            w: grid("w"),
            h: grid("h"),
            unit,
            lines,
        });
    }
    Ok((title, out))
}

fn all(_: &Labels) -> bool {
    true
}

fn none(_: &Labels) -> String {
    String::new()
}

fn label<'a>(labels: &'a Labels, name: &str) -> &'a str {
    labels.get(name).map_or("", String::as_str)
}

/// Each panel's queries, as the JSON writes them (`$scope` is All).
fn compute(title: &str, q: &Query) -> anyhow::Result<Lines> {
    const MESSAGES: &str = "idem_messages_total";
    let outcome_in =
        |set: &'static [&'static str]| move |l: &Labels| set.contains(&label(l, "outcome"));
    let by_source = |l: &Labels| {
        format!(
            "{} {} {}",
            label(l, "broker"),
            label(l, "source"),
            label(l, "group")
        )
        .trim()
        .to_string()
    };
    let quantiles = |name: &str, qs: &[(f64, &str)], legend: &dyn Fn(&Labels) -> String| {
        let mut lines = Lines::new();
        for &(quantile, suffix) in qs {
            for (group, points) in q.quantile(quantile, name, &all, legend) {
                lines.insert(format!("{group}{suffix}").trim().to_string(), points);
            }
        }
        lines
    };
    let lines = match title {
        "Applied / s" => q.rate(MESSAGES, &outcome_in(&["applied"]), &none),
        "Duplicates and stale" => {
            let skipped = q.rate(MESSAGES, &outcome_in(&["duplicate", "stale"]), &none);
            let every = q.rate(MESSAGES, &all, &none);
            let mut lines = Lines::new();
            if let (Some(skipped), Some(every)) = (skipped.get(""), every.get("")) {
                let ratio = skipped
                    .iter()
                    .zip(every)
                    .map(|(s, e)| (s.0, s.1 / e.1.max(1e-9)))
                    .collect();
                lines.insert(String::new(), ratio);
            }
            lines
        }
        "Consumer lag" => q.gauge("idem_consumer_lag", &all, &none, Agg::Sum),
        "Oldest outbox message" => q.gauge(
            "idem_outbox_oldest_pending_age_seconds",
            &all,
            &none,
            Agg::Max,
        ),
        "Deliveries by outcome" => q.rate(MESSAGES, &all, &|l| label(l, "outcome").to_string()),
        "Applied, duplicate, stale by scope" => q.rate(
            MESSAGES,
            &outcome_in(&["applied", "duplicate", "stale"]),
            &|l| format!("{} {}", label(l, "scope"), label(l, "outcome")),
        ),
        "Handle time (quantiles)" => {
            let mut lines = quantiles(
                "idem_handle_duration_seconds",
                &[(0.5, "p50"), (0.95, "p95"), (0.99, "p99")],
                &none,
            );
            // The exporter's summaries, where no buckets were set for the metric.
            let summary = q.gauge(
                "idem_handle_duration_seconds",
                &|l| ["0.5", "0.95", "0.99"].contains(&label(l, "quantile")),
                &|l| format!("summary {}", label(l, "quantile")),
                Agg::Max,
            );
            lines.extend(summary);
            lines
        }
        "Claim time p99 by scope" => {
            let mut lines = quantiles("idem_claim_duration_seconds", &[(0.99, "")], &|l| {
                label(l, "scope").to_string()
            });
            lines.extend(q.gauge(
                "idem_claim_duration_seconds",
                &|l| label(l, "quantile") == "0.99",
                &|l| format!("{} (summary)", label(l, "scope")),
                Agg::Max,
            ));
            lines
        }
        "Lag by source" => q.gauge("idem_consumer_lag", &all, &by_source, Agg::Sum),
        "Unacked by source" => q.gauge("idem_consumer_unacked", &all, &by_source, Agg::Sum),
        "Kafka lag by partition" => q.gauge(
            "idem_consumer_lag",
            &|l| label(l, "broker") == "kafka",
            &|l| {
                format!(
                    "{} {} p{}",
                    label(l, "source"),
                    label(l, "group"),
                    label(l, "partition")
                )
            },
            Agg::Sum,
        ),
        "Settled, in flight, store pauses" => {
            let mut lines = q.rate("idem_consumer_settled_total", &all, &|l| {
                format!("settled {}", label(l, "outcome"))
            });
            let named = |lines: Lines, name: &str| -> Vec<_> {
                lines
                    .into_values()
                    .map(|points| (name.to_string(), points))
                    .collect()
            };
            let in_flight = q.gauge("idem_consumer_in_flight", &all, &none, Agg::Sum);
            lines.extend(named(in_flight, "in flight"));
            let failures = q.rate("idem_consumer_settle_failures_total", &all, &none);
            lines.extend(named(failures, "settle failures"));
            let pauses = q.rate("idem_consumer_store_pauses_total", &all, &none);
            lines.extend(named(pauses, "store pauses"));
            lines
        }
        "Outbox pending by destination" => q.gauge(
            "idem_outbox_pending",
            &all,
            &|l| label(l, "destination").to_string(),
            Agg::Sum,
        ),
        "Oldest pending outbox message by destination" => q.gauge(
            "idem_outbox_oldest_pending_age_seconds",
            &all,
            &|l| label(l, "destination").to_string(),
            Agg::Max,
        ),
        "Parked retries by consumer" => q.gauge(
            "idem_parked_retries",
            &all,
            &|l| label(l, "consumer").to_string(),
            Agg::Sum,
        ),
        "Open dead letters by consumer and reason" => q.gauge(
            "idem_dead_letters",
            &all,
            &|l| format!("{} {}", label(l, "consumer"), label(l, "reason")),
            Agg::Sum,
        ),
        "Dead letters stored, parked, replayed" => {
            let mut lines = q.rate("idem_consumer_dead_letters_stored_total", &all, &|l| {
                format!("dead-lettered {}", label(l, "reason"))
            });
            for (name, legend) in [
                ("idem_consumer_parked_total", "parked"),
                ("idem_consumer_retries_taken_total", "retries taken"),
            ] {
                let rate = q.rate(name, &all, &none);
                lines.extend(rate.into_values().map(|p| (legend.to_string(), p)));
            }
            lines.extend(q.rate("idem_dead_letters_replayed_total", &all, &|l| {
                format!("replayed to {}", label(l, "to"))
            }));
            lines
        }
        other => {
            bail!("the dashboard has a panel {other:?} that benches/dashboard does not compute")
        }
    };
    Ok(lines)
}

//! The Prometheus text format, as the exporter renders it, read back into samples: one line
//! per series (`name{label="value",...} value`), counters, gauges and the `_bucket`, `_sum`
//! and `_count` lines of histograms alike; `#` lines (HELP, TYPE) are skipped.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};

/// A series' labels, by name.
pub type Labels = BTreeMap<String, String>;

/// One line of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

/// Every sample of one rendering, and when it was taken (seconds since the run began).
#[derive(Debug, Clone)]
pub struct Scrape {
    pub t: f64,
    pub samples: Vec<Sample>,
}

/// Reads a whole exposition.
pub fn parse(text: &str) -> anyhow::Result<Vec<Sample>> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| parse_line(line).map_err(|err| anyhow!("{err}: {line:?}")))
        .collect()
}

fn parse_line(line: &str) -> anyhow::Result<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or_else(|| anyhow!("no value"))?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    // A value, then an optional timestamp (the exporter writes none).
    let value = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("no value"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse()?,
    };
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// `a="x",b="y"}` and what follows the `}`; values may hold `\"`, `\\` and `\n`.
fn parse_labels(mut body: &str) -> anyhow::Result<(Labels, &str)> {
    let mut labels = Labels::new();
    loop {
        body = body.trim_start_matches([',', ' ']);
        if let Some(after) = body.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = body
            .find('=')
            .ok_or_else(|| anyhow!("a label without '='"))?;
        let key = body[..eq].trim().to_string();
        let Some(quoted) = body[eq + 1..].strip_prefix('"') else {
            bail!("label {key} is not quoted");
        };
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => bail!("label {key} ends in an escape"),
                },
                Some((_, c)) => value.push(c),
                None => bail!("label {key} is not closed"),
            }
        };
        labels.insert(key, value);
        body = &quoted[end + 1..];
    }
}

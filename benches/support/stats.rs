//! Median and min–max spread of per-round figures.

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{lo:.2}–{hi:.2}"),
        _ => "-".into(),
    }
}

/// Min–max with three decimals (ratios near 1).
pub fn spread3(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{lo:.3}–{hi:.3}"),
        _ => "-".into(),
    }
}

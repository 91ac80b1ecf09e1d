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

/// CPU time this process has used so far, user and system, in seconds (all its threads: the
/// client's side of a mode, apart from the server's, which runs in another process).
pub fn process_cpu_secs() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return f64::NAN;
    }
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

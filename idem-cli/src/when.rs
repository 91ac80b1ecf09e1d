//! Durations and times as operators type them: `--dead-letter-retention 30d`, `--since 2h`
//! (two hours before the database's now), `--since 2026-05-01T12:00:00Z`.

use std::time::Duration;

/// How durations are written, for error messages and help texts.
pub const DURATION_HINT: &str =
    "write a number and a unit (ms, s, m, h, d, w), or several: 30d, 2h, 1h30m";

/// How times are written, for error messages and help texts.
pub const TIME_HINT: &str =
    "write an RFC 3339 time (2026-05-01T12:00:00Z, 2026-05-01T14:00:00+02:00, 2026-05-01) or a duration before now (2h, 30m, 7d)";

/// Parses `<number><unit>` segments, units `ms`, `s`, `m`, `h`, `d`, `w`, as the attribute's
/// `retention = "30d"` does: `30d`, `1h30m`. Zero is refused.
pub fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = |why: &str| format!("`{text}` is not a duration: {why}; {DURATION_HINT}");
    if text.is_empty() {
        return Err(format!("an empty duration; {DURATION_HINT}"));
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad("a unit without a number"));
        }
        let number: u128 = rest[..digits].parse().map_err(|_| bad("too long"))?;
        rest = &rest[digits..];
        let letters = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit_ms: u128 = match &rest[..letters] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "" => return Err(bad("a number without a unit")),
            unit => return Err(bad(&format!("unknown unit `{unit}`"))),
        };
        rest = &rest[letters..];
        total = number
            .checked_mul(unit_ms)
            .and_then(|ms| total.checked_add(ms))
            .filter(|ms| *ms <= i64::MAX as u128)
            .ok_or_else(|| bad("too long"))?;
    }
    if total == 0 {
        return Err(bad("it is zero"));
    }
    // At most i64::MAX, checked above.
    Ok(Duration::from_millis(total as u64))
}

/// A time an operator typed: a moment, or a duration before the database's now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// Epoch milliseconds.
    At(i64),
    /// This long before now.
    Ago(Duration),
}

impl Time {
    /// Epoch milliseconds, with `now` the database's clock.
    pub fn resolve(self, now: i64) -> i64 {
        match self {
            Time::At(ms) => ms,
            Time::Ago(span) => {
                now.saturating_sub(i64::try_from(span.as_millis()).unwrap_or(i64::MAX))
            }
        }
    }
}

/// Parses a duration before now (`2h`) or an RFC 3339 time (`2026-05-01T12:00:00Z`, with an
/// offset, or a date alone for its midnight in UTC).
pub fn time(text: &str) -> Result<Time, String> {
    let text = text.trim();
    if text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains('-') {
        return duration(text).map(Time::Ago).map_err(|_| not_a_time(text));
    }
    rfc3339(text).map(Time::At).ok_or_else(|| not_a_time(text))
}

fn not_a_time(text: &str) -> String {
    format!("`{text}` is not a time; {TIME_HINT}")
}

/// An RFC 3339 time (`T` or a space between date and time, any fraction of a second, `Z` or
/// an offset) or a date alone, as epoch milliseconds.
fn rfc3339(text: &str) -> Option<i64> {
    let number = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (date, time) = match text.find(['T', 't', ' ']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mut parts = date.split('-');
    let (year, month, day) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || year.len() != 4 || month.len() != 2 || day.len() != 2 {
        return None;
    }
    let (year, month, day) = (number(year)?, number(month)?, number(day)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let Some(time) = time else {
        return Some(days * 86_400_000);
    };
    // The offset: `Z`, or `+HH:MM` / `-HH:MM` after the seconds.
    let (clock, offset_ms) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (h, m) = offset[1..].split_once(':')?;
        if h.len() != 2 || m.len() != 2 {
            return None;
        }
        let (h, m) = (number(h)?, number(m)?);
        if h > 23 || m > 59 {
            return None;
        }
        (clock, sign * (h * 3_600_000 + m * 60_000))
    };
    let (seconds, fraction) = match clock.split_once('.') {
        Some((seconds, fraction)) => (seconds, Some(fraction)),
        None => (clock, None),
    };
    let mut hms = seconds.split(':');
    let (h, m, s) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() || h.len() != 2 || m.len() != 2 || s.len() != 2 {
        return None;
    }
    let (h, m, s) = (number(h)?, number(m)?, number(s)?);
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let millis = match fraction {
        None => 0,
        Some(fraction) => {
            number(fraction)?;
            // The first three digits, padded: `.5` is 500 ms.
            let mut digits: String = fraction.chars().take(3).collect();
            while digits.len() < 3 {
                digits.push('0');
            }
            number(&digits)?
        }
    };
    let of_day = h * 3_600_000 + m * 60_000 + s.min(59) * 1_000 + millis;
    Some(days * 86_400_000 + of_day - offset_ms)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm, the inverse of
/// [`crate::output::rfc3339`]'s).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::rfc3339 as shown;

    #[test]
    fn durations_are_segments_of_a_number_and_a_unit() {
        assert_eq!(duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration(" 2w "), Ok(Duration::from_secs(14 * 86_400)));
        for (bad, why) in [
            ("", "empty"),
            ("30", "without a unit"),
            ("30 d", "without a unit"),
            ("30y", "unknown unit `y`"),
            ("d30", "a unit without a number"),
            ("0s", "zero"),
            ("99999999999999999999999w", "too long"),
        ] {
            let err = duration(bad).unwrap_err();
            assert!(err.contains(why) && err.contains("1h30m"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn times_are_rfc3339_or_a_duration_ago() {
        assert_eq!(time("2h"), Ok(Time::Ago(Duration::from_secs(7_200))));
        assert_eq!(Time::Ago(Duration::from_secs(2)).resolve(10_000), 8_000);
        assert_eq!(Time::At(5).resolve(10_000), 5);
        let at = |text: &str| match time(text) {
            Ok(Time::At(ms)) => ms,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(at("1970-01-01T00:00:00Z"), 0);
        assert_eq!(
            shown(at("2026-12-03T07:14:58.123Z")),
            "2026-12-03T07:14:58.123Z"
        );
        assert_eq!(
            shown(at("2026-12-03t07:14:58.1z")),
            "2026-12-03T07:14:58.100Z"
        );
        assert_eq!(
            shown(at("2026-12-03 07:14:58Z")),
            "2026-12-03T07:14:58.000Z"
        );
        assert_eq!(
            shown(at("2026-12-03T09:14:58+02:00")),
            "2026-12-03T07:14:58.000Z"
        );
        assert_eq!(
            shown(at("2026-12-03T02:14:58-05:00")),
            "2026-12-03T07:14:58.000Z"
        );
        assert_eq!(shown(at("2000-02-29")), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            shown(at("1969-12-31T23:59:59.999Z")),
            "1969-12-31T23:59:59.999Z"
        );
        for bad in [
            "yesterday",
            "2026-13-01",
            "2026-02-30",
            "2001-02-29",
            "2026-1-01",
            "2026-12-03T07:14:58",
            "2026-12-03T25:00:00Z",
            "2026-12-03T07:14Z",
            "2026-12-03T07:14:58+2:00",
            "2026-12-03T07:14:58.x1Z",
            "2h ago",
            "0s",
        ] {
            let err = time(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}` is not a time")), "{err}");
        }
    }

    #[test]
    fn dates_round_trip_through_the_days_count() {
        for days in [-700_000, -1, 0, 1, 59, 365, 11_016, 20_000, 2_932_896] {
            let text = shown(days * 86_400_000);
            assert_eq!(rfc3339(&text[..10]), Some(days * 86_400_000), "{text}");
        }
    }
}

//! Durations written in the attribute: `retention = "30d"`, `lease = "45s"`, `"1h30m"`.

use std::time::Duration;

/// Parses `<number><unit>` segments, units `ms`, `s`, `m`, `h`, `d`, `w`: `"30d"`, `"1h30m"`.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    const HINT: &str = "write a number and a unit (ms, s, m, h, d, w), e.g. \"30d\" or \"1h30m\"";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration; {HINT}"));
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(format!("`{text}` is not a duration; {HINT}"));
        }
        let number: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}` is too long a duration"))?;
        rest = rest[digits..].trim_start();
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "" => return Err(format!("`{text}` has a number without a unit; {HINT}")),
            unit => return Err(format!("unknown unit `{unit}` in `{text}`; {HINT}")),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(unit_ms)
            .and_then(|ms| total.checked_add(ms))
            .filter(|ms| *ms <= u128::from(u64::MAX))
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
    }
    if total == 0 {
        return Err(format!("`{text}` is zero; a duration must be positive"));
    }
    Ok(Duration::from_millis(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_segments() {
        assert_eq!(parse("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse(" 2w "), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse("45s"), Ok(Duration::from_secs(45)));
    }

    #[test]
    fn bad_literals_say_what_is_wrong() {
        assert!(parse("").unwrap_err().contains("empty duration"));
        assert!(parse("30").unwrap_err().contains("without a unit"));
        assert!(
            parse("30 days").unwrap_err().contains("unknown unit"),
            "{:?}",
            parse("30 days")
        );
        assert!(parse("30y").unwrap_err().contains("unknown unit `y`"));
        assert!(parse("d30").unwrap_err().contains("not a duration"));
        assert!(parse("0s").unwrap_err().contains("zero"));
        assert!(parse("99999999999999999999999w")
            .unwrap_err()
            .contains("too long"));
    }
}

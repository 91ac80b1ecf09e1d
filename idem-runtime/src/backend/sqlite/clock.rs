//! SQLite's clock, read in Rust: the claim's times without SQL date functions.
//!
//! SQLite is embedded, so its `'now'` is this process's wall clock (the VFS reads the system
//! real-time clock): reading that clock here gives the same times. The claim statements bind
//! them instead of evaluating `strftime(…)` and `julianday('now')` for every row, which costs
//! some 3,600 instructions a record (callgrind, `benches/instructions.rs`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::store::millis;

/// Now: Unix epoch milliseconds (what `now_ms!()` computes in SQL) and the same instant as
/// `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')` formats it (the `processed_at` column).
pub(super) fn now() -> (i64, String) {
    let ms = now_ms();
    (ms, iso8601(ms))
}

/// Now: Unix epoch milliseconds, what `now_ms!()` computes in SQL.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// `ms` (Unix epoch milliseconds, UTC) as `YYYY-MM-DDTHH:MM:SS.SSSZ`, written digit by digit
/// (`format!` costs some 2,000 instructions more). Years outside 0000–9999 are clamped.
pub(super) fn iso8601(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let fields = [
        (0, 4, year.clamp(0, 9999)),
        (5, 2, month),
        (8, 2, day),
        (11, 2, day_secs / 3600),
        (14, 2, day_secs % 3600 / 60),
        (17, 2, day_secs % 60),
        (20, 3, ms.rem_euclid(1000)),
    ];
    for (at, width, mut value) in fields {
        for slot in out[at..at + width].iter_mut().rev() {
            // A digit: 0..=9, always fits in a u8.
            *slot = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    out.iter().map(|&b| char::from(b)).collect()
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_sqlite_strftime() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century leap year), 23:59:59.999.
        assert_eq!(iso8601(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(iso8601(951_868_800_000), "2000-03-01T00:00:00.000Z");
        // 2100-03-01: 2100 is not a leap year.
        assert_eq!(iso8601(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(iso8601(1_796_312_821_123), "2026-12-03T15:47:01.123Z");
    }

    #[tokio::test]
    async fn agrees_with_sqlite_on_every_day_of_four_centuries() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        // One instant per 7 days and 13 hours from 1970 to 2370, against SQLite's formatting.
        let step = (7 * 86_400 + 13 * 3600) * 1000 + 321;
        let mut ms = 0i64;
        while ms < 12_622_780_800_000 {
            let sqlite: String =
                sqlx::query_scalar("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', ?1 / 1000, 'unixepoch')")
                    .bind(ms)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            // SQLite formats whole seconds from an integer; compare up to the seconds.
            assert_eq!(&iso8601(ms)[..19], &sqlite[..19], "at {ms} ms");
            ms += step;
        }
    }

    #[tokio::test]
    async fn now_is_sqlites_now() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let before = now().0;
        let sqlite: i64 =
            sqlx::query_scalar("SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)")
                .fetch_one(&pool)
                .await
                .unwrap();
        let (after, iso) = now();
        // julianday is a double: its milliseconds may round down by one.
        assert!(
            before - 1 <= sqlite && sqlite <= after,
            "{before} {sqlite} {after}"
        );
        assert_eq!(iso.len(), "1970-01-01T00:00:00.000Z".len());
    }
}

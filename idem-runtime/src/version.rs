//! Versions: the [`Version`] trait, an `i64` that orders the messages about one entity.

use crate::error::KeyProblem;

/// A monotonically increasing version of an entity: a sequence number or a timestamp.
///
/// Versions are stored as `i64`. Unsigned values above `i64::MAX` are an error, never a wrap;
/// timestamps (features `chrono`, `time`) become microseconds since the Unix epoch.
///
/// ```
/// use idem::Version;
/// assert_eq!(7_u32.to_version(), Ok(7));
/// assert_eq!((-3_i64).to_version(), Ok(-3));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as a message version",
    label = "not an `idem::Version`",
    note = "versions are integers (`i32`, `i64`, `u32`, `u64`, ...) or timestamps (features `chrono`, `time`); implement `idem::Version` for your own type"
)]
pub trait Version {
    /// This version as an `i64`, or why it does not fit.
    fn to_version(&self) -> Result<i64, KeyProblem>;
}

impl<V: Version + ?Sized> Version for &V {
    fn to_version(&self) -> Result<i64, KeyProblem> {
        (**self).to_version()
    }
}

macro_rules! lossless {
    ($($t:ty)*) => {$(
        impl Version for $t {
            fn to_version(&self) -> Result<i64, KeyProblem> {
                Ok(i64::from(*self))
            }
        }
    )*};
}
lossless!(i8 i16 i32 i64 u8 u16 u32);

macro_rules! checked {
    ($($t:ty)*) => {$(
        impl Version for $t {
            fn to_version(&self) -> Result<i64, KeyProblem> {
                i64::try_from(*self).map_err(|_| KeyProblem::OutOfRange(self.to_string()))
            }
        }
    )*};
}
checked!(u64 usize isize i128 u128);

#[cfg(feature = "chrono")]
impl<Tz: chrono::TimeZone> Version for chrono::DateTime<Tz> {
    fn to_version(&self) -> Result<i64, KeyProblem> {
        Ok(self.timestamp_micros())
    }
}

#[cfg(feature = "time")]
impl Version for time::OffsetDateTime {
    fn to_version(&self) -> Result<i64, KeyProblem> {
        i64::try_from(self.unix_timestamp_nanos() / 1000)
            .map_err(|_| KeyProblem::OutOfRange(self.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_fit_or_fail_loudly() {
        assert_eq!(i64::MIN.to_version(), Ok(i64::MIN));
        assert_eq!(u32::MAX.to_version(), Ok(i64::from(u32::MAX)));
        assert_eq!((i64::MAX as u64).to_version(), Ok(i64::MAX));
        assert_eq!(
            (i64::MAX as u64 + 1).to_version(),
            Err(KeyProblem::OutOfRange("9223372036854775808".into()))
        );
    }

    #[cfg(feature = "chrono")]
    #[test]
    fn chrono_timestamps_are_micros() {
        let t = chrono::DateTime::from_timestamp(1, 5_000).unwrap();
        assert_eq!(t.to_version(), Ok(1_000_005));
    }

    #[cfg(feature = "time")]
    #[test]
    fn time_timestamps_are_micros() {
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(2_000_007_000).unwrap();
        assert_eq!(t.to_version(), Ok(2_000_007));
    }
}

//! The lease TTL: one validated type, one default, one conversion per wire unit.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::invalid::Invalid;

/// The shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// The longest TTL accepted (365 days).
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// The lease TTL when none is given: [`LockOptions::default`](crate::LockOptions::default),
/// the `anylock` CLI's `run`, and `anylock::Config` without a `ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A lease time-to-live: a whole number of milliseconds from [`MIN_TTL`] to [`MAX_TTL`].
///
/// Every backend gets its TTL as a `Ttl`, so it is validated once (by [`Ttl::new`], which
/// [`LockOptions::validate`](crate::LockOptions::validate) calls) and converted to each
/// wire unit by exactly one rule:
/// - [`Ttl::new`] rounds **up** to a whole millisecond, so [`as_millis`](Ttl::as_millis)
///   (Redis `PX`, SQLite, GCS metadata) and [`as_micros`](Ttl::as_micros) (PostgreSQL
///   intervals) are exact: the server keeps the lease for exactly [`get`](Ttl::get).
/// - [`as_secs`](Ttl::as_secs) rounds **up** to whole seconds (etcd leases): the server keeps
///   the lease at least as long as the holder believes it has it, never less.
///
/// ```
/// use std::time::Duration;
/// use lockcore::Ttl;
/// let ttl = Ttl::new(Duration::from_micros(1_500_001))?;
/// assert_eq!(ttl.as_millis(), 1_501);
/// assert_eq!(ttl.as_secs(), 2);
/// assert_eq!("90s".parse::<Ttl>()?, Ttl::new(Duration::from_secs(90))?);
/// assert!(Ttl::new(Duration::from_millis(1)).is_err());
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// Validates `ttl` and rounds it up to a whole millisecond.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when `ttl` is outside
    /// [`MIN_TTL`]..=[`MAX_TTL`], naming the range.
    pub fn new(ttl: Duration) -> Result<Self, Invalid> {
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(Invalid::new(format!(
                "TTL {} is outside the accepted range {} to {} days",
                show(ttl),
                show(MIN_TTL),
                MAX_TTL.as_secs() / 86_400
            )));
        }
        let millis = ttl.as_nanos().div_ceil(1_000_000);
        Ok(Self(Duration::from_millis(
            u64::try_from(millis).unwrap_or(u64::MAX),
        )))
    }

    /// The TTL as a duration (a whole number of milliseconds).
    pub fn get(self) -> Duration {
        self.0
    }

    /// Whole milliseconds (exact): Redis `PX`, SQLite, GCS metadata.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whole microseconds (exact): PostgreSQL intervals.
    pub fn as_micros(self) -> i64 {
        i64::try_from(self.0.as_micros()).unwrap_or(i64::MAX)
    }

    /// Whole seconds, rounded up (at least 1): etcd lease TTLs.
    pub fn as_secs(self) -> i64 {
        let secs = self.0.as_millis().div_ceil(1_000);
        i64::try_from(secs).unwrap_or(i64::MAX)
    }
}

fn show(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(duration)
}

impl Default for Ttl {
    fn default() -> Self {
        Self(DEFAULT_TTL)
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = Invalid;

    fn try_from(ttl: Duration) -> Result<Self, Invalid> {
        Self::new(ttl)
    }
}

impl From<Ttl> for Duration {
    fn from(ttl: Ttl) -> Self {
        ttl.0
    }
}

impl FromStr for Ttl {
    type Err = Invalid;

    /// Reads a TTL as people write them (`30s`, `5m`, `90`): [`parse_duration`](crate::parse_duration),
    /// then [`Ttl::new`].
    fn from_str(text: &str) -> Result<Self, Invalid> {
        Self::new(crate::duration::parse_duration(text)?)
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", show(self.0))
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttl({})", show(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn the_range_is_inclusive_and_out_of_range_names_it() {
        assert_eq!(Ttl::new(MIN_TTL).expect("min").get(), MIN_TTL);
        assert_eq!(Ttl::new(MAX_TTL).expect("max").get(), MAX_TTL);
        for bad in [
            Duration::ZERO,
            MIN_TTL - Duration::from_nanos(1),
            MAX_TTL + Duration::from_nanos(1),
        ] {
            let err = Ttl::new(bad).expect_err("out of range");
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains("10ms to 365 days"), "{err}");
        }
    }

    #[test]
    fn rounds_up_to_whole_milliseconds_and_seconds() {
        let ttl = Ttl::new(Duration::from_nanos(10_000_001)).expect("valid");
        assert_eq!(ttl.get(), Duration::from_millis(11));
        assert_eq!(
            (ttl.as_millis(), ttl.as_micros(), ttl.as_secs()),
            (11, 11_000, 1)
        );
        let ttl = Ttl::new(Duration::from_secs(30)).expect("valid");
        assert_eq!((ttl.as_millis(), ttl.as_secs()), (30_000, 30));
        let ttl = Ttl::new(Duration::from_millis(30_001)).expect("valid");
        assert_eq!(ttl.as_secs(), 31);
        let max = Ttl::new(MAX_TTL).expect("max");
        assert_eq!(max.as_secs(), 365 * 24 * 3600);
    }

    #[test]
    fn parses_and_displays_like_people_write_it() {
        assert_eq!(
            Ttl::from_str("1m30s").expect("ok").get(),
            Duration::from_secs(90)
        );
        assert_eq!(
            Ttl::from_str("2.5").expect("ok").get(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            Ttl::from_str("5ms").expect_err("short").kind(),
            ErrorKind::InvalidInput
        );
        assert!(Ttl::from_str("soon").is_err());
        assert_eq!(Ttl::default().to_string(), "30s");
        assert_eq!(format!("{:?}", Ttl::default()), "Ttl(30s)");
        assert_eq!(Ttl::default().get(), DEFAULT_TTL);
    }
}

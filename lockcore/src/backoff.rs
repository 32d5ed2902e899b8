//! Bounded exponential backoff with jitter, and the small seedable RNG behind the jitter.
//!
//! Lai ("A robust distributed locking algorithm based on Google Cloud Storage") lists
//! unbounded backoff and synchronized retries among the classic failures of naive locks; this
//! module is the one place both are prevented.

use std::time::Duration;

use crate::error::Error;

/// How much randomness is applied to each backoff delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in `[0, delay]` ("full jitter"): spreads contenders the most.
    Full,
    /// Uniform in `[delay/2, delay]`.
    Equal,
    /// No randomness (for tests and single-contender setups).
    None,
}

/// Exponential backoff: `min(cap, base × 2^attempt)`, then jittered.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

/// The largest accepted backoff cap.
pub const MAX_BACKOFF_CAP: Duration = Duration::from_secs(3600);

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(20), Duration::from_secs(1))
    }
}

impl Backoff {
    /// Backoff from `base`, doubling up to `cap`, with full jitter.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            jitter: Jitter::Full,
        }
    }

    /// Sets the jitter.
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The first delay before jitter.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The jitter.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The delay before retry number `attempt` (0-based), given a uniform `unit` in `[0, 1)`.
    /// Never exceeds the cap.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        let ceiling = self.base.saturating_mul(factor).min(self.cap);
        // NaN counts as 0; `scale` keeps float rounding near `Duration::MAX` from panicking.
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        match self.jitter {
            Jitter::Full => scale(ceiling, unit),
            Jitter::Equal => ceiling / 2 + scale(ceiling / 2, unit),
            Jitter::None => ceiling,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when the base is zero,
    /// the base exceeds the cap, or the cap exceeds [`MAX_BACKOFF_CAP`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.base.is_zero() {
            return Err(Error::invalid_input(
                "backoff base must be greater than zero",
            ));
        }
        if self.base > self.cap {
            return Err(Error::invalid_input(format!(
                "backoff base {:?} exceeds its cap {:?}",
                self.base, self.cap
            )));
        }
        if self.cap > MAX_BACKOFF_CAP {
            return Err(Error::invalid_input(format!(
                "backoff cap {:?} exceeds the limit {MAX_BACKOFF_CAP:?}",
                self.cap
            )));
        }
        Ok(())
    }
}

/// `duration × unit` for `unit` in `[0, 1]`, never more than `duration`.
fn scale(duration: Duration, unit: f64) -> Duration {
    Duration::try_from_secs_f64(duration.as_secs_f64() * unit)
        .unwrap_or(duration)
        .min(duration)
}

/// SplitMix64: a tiny, fast, seedable generator for jitter (not for secrets).
#[derive(Debug, Clone)]
pub(crate) struct JitterRng(u64);

impl JitterRng {
    pub(crate) fn seeded(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn from_entropy() -> Self {
        Self(rand::random())
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_generator_is_splitmix64() {
        // The reference implementation's first outputs for seed 0.
        let mut rng = JitterRng::seeded(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn a_base_equal_to_its_cap_is_valid_and_both_read_back() {
        let backoff = Backoff::new(ms(50), ms(50));
        assert!(backoff.validate().is_ok());
        assert_eq!((backoff.base(), backoff.cap()), (ms(50), ms(50)));
        assert!(Backoff::new(ms(51), ms(50)).validate().is_err());
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let b = Backoff::new(ms(10), ms(300)).with_jitter(Jitter::None);
        let delays: Vec<_> = (0..8).map(|a| b.delay(a, 0.5)).collect();
        assert_eq!(
            delays,
            [
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(300),
                ms(300),
                ms(300)
            ]
        );
        assert_eq!(b.delay(u32::MAX, 0.9), ms(300), "huge attempts saturate");
    }

    #[test]
    fn full_jitter_spans_zero_to_ceiling() {
        let b = Backoff::new(ms(100), ms(1000));
        assert_eq!(b.delay(2, 0.0), Duration::ZERO);
        assert_eq!(b.delay(2, 0.5), ms(200));
        assert!(b.delay(2, 0.999_999) <= ms(400));
        assert!(b.delay(2, 7.0) <= ms(400), "out-of-range units are clamped");
    }

    #[test]
    fn equal_jitter_keeps_at_least_half() {
        let b = Backoff::new(ms(100), ms(1000)).with_jitter(Jitter::Equal);
        assert_eq!(b.delay(1, 0.0), ms(100));
        assert_eq!(b.delay(1, 1.0), ms(200));
    }

    #[test]
    fn rng_is_uniform_enough_and_reproducible() {
        let mut a = JitterRng::seeded(42);
        let mut b = JitterRng::seeded(42);
        let xs: Vec<f64> = (0..10_000).map(|_| a.next_unit()).collect();
        let ys: Vec<f64> = (0..10_000).map(|_| b.next_unit()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        let low = xs.iter().filter(|x| **x < 0.1).count();
        assert!((800..1200).contains(&low), "{low} below 0.1");
    }

    #[test]
    fn validation_messages() {
        assert!(Backoff::new(Duration::ZERO, ms(1)).validate().is_err());
        let err = Backoff::new(ms(2), ms(1))
            .validate()
            .expect_err("base > cap");
        assert!(err.to_string().contains("exceeds its cap"));
        assert!(
            Backoff::new(ms(1), MAX_BACKOFF_CAP + ms(1))
                .validate()
                .is_err()
        );
        Backoff::new(ms(1), MAX_BACKOFF_CAP)
            .validate()
            .expect("a cap at the limit is valid");
        Backoff::default().validate().expect("default valid");
    }
}

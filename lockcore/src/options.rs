//! Lock options: TTL, refresh cadence, failure limit, drift, waiting and backoff.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::Error;
use crate::note::Note;
use crate::ttl::{DEFAULT_TTL, MAX_TTL, Ttl};

/// The largest accepted value for the maximum number of consecutive refresh failures.
pub const MAX_REFRESH_FAILURES: u32 = 100;

/// The default margin: how much sooner than the server's expiry (beyond 1 % of the TTL for
/// clock-rate drift) a lease counts as lost locally, so that the timers that stop the
/// holder fire before the next holder can enter even when they fire late. About twice the
/// latest wake measured on a 2-core machine with 8 processes spinning (14.5 ms on the async
/// runtime, 7.6 ms on `anylock run`'s watchdog thread; `anylock-cli`'s `kill_lateness`
/// example measures it). A TTL under 120 ms gets a quarter of its TTL instead: such short
/// leases keep less slack than late timers may need on a loaded machine.
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(30);

/// How long [`Locker::acquire`](crate::Locker::acquire) waits for a held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// One attempt; a held lock is an [`ErrorKind::Held`](crate::ErrorKind::Held) error.
    TryOnce,
    /// Retry until the lock is ours or this much time has passed, then fail with
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    Timeout(Duration),
    /// Retry until the lock is ours.
    Forever,
}

/// Options for one acquisition and the lease it produces.
///
/// Defaults (Lai's GCS locking post, scaled to the TTL): TTL 30 s ([`DEFAULT_TTL`]),
/// refresh every TTL/8, Lost after 3 consecutive refresh failures, drift allowance
/// TTL×1% + [`DEFAULT_MARGIN`] (30 ms), wait forever, backoff from 20 ms doubling up to 1 s with full jitter,
/// each backend call bounded by the TTL.
///
/// ```
/// use std::time::Duration;
/// use lockcore::{LockOptions, WaitMode};
/// let options = LockOptions::new(Duration::from_secs(30))
///     .with_wait(WaitMode::Timeout(Duration::from_secs(5)));
/// options.validate()?;
/// assert_eq!(options.refresh_interval(), Duration::from_millis(3750));
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LockOptions {
    ttl: Duration,
    refresh_interval: Option<Duration>,
    max_refresh_failures: u32,
    drift: Option<Duration>,
    margin: Option<Duration>,
    wait: WaitMode,
    backoff: Backoff,
    attempt_timeout: Option<Duration>,
    note: Option<Note>,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new(DEFAULT_TTL)
    }
}

impl LockOptions {
    /// Options with `ttl` and every other setting at its default.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            refresh_interval: None,
            max_refresh_failures: 3,
            drift: None,
            margin: None,
            wait: WaitMode::Forever,
            backoff: Backoff::default(),
            attempt_timeout: None,
            note: None,
        }
    }

    /// Sets the lease TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the refresh interval (default TTL/8).
    pub fn with_refresh_interval(mut self, interval: Duration) -> Self {
        self.refresh_interval = Some(interval);
        self
    }

    /// Sets how many consecutive transient refresh failures turn the lease Lost (default 3).
    pub fn with_max_refresh_failures(mut self, failures: u32) -> Self {
        self.max_refresh_failures = failures;
        self
    }

    /// Sets the whole drift allowance subtracted from local validity (default TTL×1% +
    /// the margin); TTL×1% + the margin still holds where it is larger, and a drift below
    /// the default is refused by [`validate`](Self::validate).
    pub fn with_drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// Sets the margin added to TTL×1% in the drift allowance (default [`DEFAULT_MARGIN`]):
    /// raise it where the holder's timers may fire later than that (a loaded machine), so
    /// that it stops before the server can let the next holder in. A margin below the
    /// default is refused by [`validate`](Self::validate).
    pub fn with_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Sets the wait mode (default [`WaitMode::Forever`]).
    pub fn with_wait(mut self, wait: WaitMode) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the backoff between attempts while waiting.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long the acquire loop and the refresher wait for one backend call (default: the
    /// TTL for acquire, the refresh interval for refresh); at most [`MAX_TTL`].
    ///
    /// A refresh that has not answered by then counts as a failed refresh. An acquire
    /// attempt that has not answered is *not* raced by a second one (it could retake the
    /// second one's grant): `TryOnce` returns [`ErrorKind::OutcomeUnknown`](crate::ErrorKind::OutcomeUnknown)
    /// at this timeout, and a waiting acquire keeps waiting for that attempt's outcome, up
    /// to its deadline. Backends bound their own calls (see [`LockBackend`](crate::LockBackend)).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Stores `note` with every grant made with these options, for people: `inspect`,
    /// `list` and `anylock status` show it (a CI run URL, a host and job).
    pub fn with_note(mut self, note: Note) -> Self {
        self.note = Some(note);
        self
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The refresh interval (explicit or TTL/8).
    pub fn refresh_interval(&self) -> Duration {
        self.refresh_interval.unwrap_or(self.ttl / 8)
    }

    /// The maximum number of consecutive transient refresh failures.
    pub fn max_refresh_failures(&self) -> u32 {
        self.max_refresh_failures
    }

    /// The drift allowance: TTL×1% (the Redlock page, "Distributed Locks with Valkey")
    /// plus the margin (explicit, or [`DEFAULT_MARGIN`] but at most a quarter of the TTL),
    /// or an explicit drift where that is larger (neither setting lowers the other).
    pub fn drift(&self) -> Duration {
        let margin = self.margin.unwrap_or_else(|| self.default_margin());
        let derived = self.ttl / 100 + margin;
        self.drift.map_or(derived, |drift| drift.max(derived))
    }

    fn default_margin(&self) -> Duration {
        DEFAULT_MARGIN.min(self.ttl / 4)
    }

    /// The wait mode.
    pub fn wait(&self) -> WaitMode {
        self.wait
    }

    /// The backoff.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The note stored with each grant, if any.
    pub fn note(&self) -> Option<&Note> {
        self.note.as_ref()
    }

    /// The bound on one acquire call.
    pub fn acquire_timeout(&self) -> Duration {
        self.attempt_timeout.unwrap_or(self.ttl)
    }

    /// The bound on one refresh call.
    pub fn refresh_timeout(&self) -> Duration {
        self.attempt_timeout
            .unwrap_or(self.refresh_interval())
            .min(self.refresh_interval())
    }

    /// Checks every setting and their combinations.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the offending
    /// setting, when the TTL is outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`], the refresh interval is
    /// zero, the failure limit is 0 or above [`MAX_REFRESH_FAILURES`], refresh interval ×
    /// failure limit exceeds half the TTL (the lease must turn Lost well before it expires,
    /// Lai's GCS locking post), the drift is half the TTL or more, or the backoff is invalid.
    pub fn validate(&self) -> Result<(), Error> {
        self.lease_ttl()?;
        self.validate_refresh()?;
        if let Some(margin) = self.margin.filter(|m| *m < self.default_margin()) {
            return Err(Error::invalid_input(format!(
                "margin {margin:?} is below the default {:?}: it may only be raised",
                self.default_margin()
            )));
        }
        let least = self.ttl / 100 + self.default_margin();
        if let Some(drift) = self.drift.filter(|d| *d < least) {
            return Err(Error::invalid_input(format!(
                "drift allowance {drift:?} is below the default {least:?} (1% of the TTL \
                 plus the margin): it may only be raised"
            )));
        }
        let drift = self.drift();
        if drift >= self.ttl / 2 {
            return Err(Error::invalid_input(format!(
                "drift allowance {drift:?} (1% of the TTL plus the margin) must be less than \
                 half the TTL ({:?}); use a smaller margin or a longer TTL",
                self.ttl
            )));
        }
        if self.attempt_timeout == Some(Duration::ZERO) {
            return Err(Error::invalid_input(
                "attempt timeout must be greater than zero",
            ));
        }
        if self.attempt_timeout.is_some_and(|t| t > MAX_TTL) {
            return Err(Error::invalid_input(format!(
                "attempt timeout must be at most {MAX_TTL:?}"
            )));
        }
        if let WaitMode::Timeout(wait) = self.wait
            && wait > MAX_TTL
        {
            return Err(Error::invalid_input(format!(
                "wait timeout must be at most {MAX_TTL:?}; use WaitMode::Forever to wait without a limit"
            )));
        }
        self.backoff.validate()
    }

    /// The TTL as a validated [`Ttl`], the form backends receive it in.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when the TTL is outside
    /// [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`].
    pub fn lease_ttl(&self) -> Result<Ttl, Error> {
        Ok(Ttl::new(self.ttl)?)
    }

    fn validate_refresh(&self) -> Result<(), Error> {
        let interval = self.refresh_interval();
        let failures = self.max_refresh_failures;
        if interval.is_zero() {
            return Err(Error::invalid_input(
                "refresh interval must be greater than zero",
            ));
        }
        if failures == 0 || failures > MAX_REFRESH_FAILURES {
            return Err(Error::invalid_input(format!(
                "max refresh failures must be 1 to {MAX_REFRESH_FAILURES}, got {failures}"
            )));
        }
        let budget = interval.saturating_mul(failures);
        if budget > self.ttl / 2 {
            return Err(Error::invalid_input(format!(
                "refresh interval {interval:?} x {failures} failures = {budget:?} does not fit \
                 in half the TTL ({:?}): the lease could expire before the refresher gives up; \
                 shorten the interval, allow fewer failures or lengthen the TTL",
                self.ttl / 2
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_follow_seed_000() {
        let o = LockOptions::new(Duration::from_secs(300));
        o.validate().expect("defaults are valid");
        assert_eq!(o.refresh_interval(), ms(37_500));
        assert_eq!(o.max_refresh_failures(), 3);
        assert_eq!(o.drift(), ms(3_030));
        assert_eq!(
            LockOptions::new(ms(40)).drift(),
            Duration::from_micros(10_400)
        );
        assert_eq!(
            LockOptions::new(ms(1000)).with_margin(ms(100)).drift(),
            ms(110)
        );
        assert_eq!(o.wait(), WaitMode::Forever);
        assert_eq!(o.acquire_timeout(), Duration::from_secs(300));
        assert_eq!(o.refresh_timeout(), ms(37_500));
        LockOptions::default().validate().expect("default is valid");
    }

    #[test]
    fn rejects_invalid_combinations_with_actionable_messages() {
        let ttl = Duration::from_secs(8);
        let cases = [
            (LockOptions::new(ms(1)), "outside the accepted range"),
            (
                LockOptions::new(MAX_TTL + ms(1)),
                "outside the accepted range",
            ),
            (
                LockOptions::new(ttl).with_refresh_interval(Duration::ZERO),
                "greater than zero",
            ),
            (
                LockOptions::new(ttl).with_max_refresh_failures(0),
                "1 to 100",
            ),
            (
                LockOptions::new(ttl).with_max_refresh_failures(101),
                "1 to 100",
            ),
            (
                LockOptions::new(ttl).with_refresh_interval(ms(1500)),
                "does not fit in half the TTL",
            ),
            (
                LockOptions::new(ttl).with_drift(ms(4000)),
                "less than half the TTL",
            ),
            (
                LockOptions::new(ttl).with_margin(ms(29)),
                "below the default",
            ),
            (
                LockOptions::new(ttl).with_drift(ms(100)),
                "below the default",
            ),
            (
                LockOptions::new(ttl).with_attempt_timeout(Duration::ZERO),
                "attempt timeout",
            ),
        ];
        for (options, expected) in cases {
            let err = options.validate().expect_err(expected);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn budget_boundary_is_inclusive() {
        let ttl = Duration::from_secs(6);
        let ok = LockOptions::new(ttl).with_refresh_interval(ms(1000));
        ok.validate().expect("3 x 1 s fits in 3 s");
        let bad = LockOptions::new(ttl).with_refresh_interval(ms(1001));
        assert!(bad.validate().is_err());
    }

    /// Every limit is inclusive: the default margin and drift set explicitly, an attempt
    /// timeout and a wait of exactly `MAX_TTL` are all valid; `with_ttl` sets the TTL.
    #[test]
    fn settings_at_their_limits_are_valid() {
        let base = LockOptions::new(Duration::from_secs(10));
        let margin = base.drift() - Duration::from_millis(100);
        for options in [
            base.clone().with_margin(margin),
            base.clone().with_drift(base.drift()),
            base.clone().with_attempt_timeout(MAX_TTL),
            base.clone().with_wait(WaitMode::Timeout(MAX_TTL)),
            (base
                .clone()
                .with_refresh_interval(Duration::from_millis(50)))
            .with_max_refresh_failures(MAX_REFRESH_FAILURES),
        ] {
            assert!(options.validate().is_ok(), "{options:?}");
        }
        let longer = base.with_ttl(Duration::from_secs(20));
        assert_eq!(longer.ttl(), Duration::from_secs(20));
        assert_eq!(longer.refresh_interval(), Duration::from_millis(2500));
    }

    /// An explicit drift and a raised margin: the larger allowance holds, whatever the
    /// order they were set in.
    #[test]
    fn a_drift_never_lowers_a_raised_margin_nor_the_reverse() {
        let ttl = LockOptions::new(Duration::from_secs(10));
        let margin = Duration::from_millis(500);
        let small = Duration::from_millis(200);
        let large = Duration::from_secs(2);
        let derived = Duration::from_millis(600);
        for options in [
            ttl.clone().with_margin(margin).with_drift(small),
            ttl.clone().with_drift(small).with_margin(margin),
        ] {
            assert_eq!(options.drift(), derived, "{options:?}");
        }
        let options = ttl.with_margin(margin).with_drift(large);
        assert_eq!(options.drift(), large);
    }

    #[test]
    fn refresh_timeout_never_exceeds_interval() {
        let o =
            LockOptions::new(Duration::from_secs(8)).with_attempt_timeout(Duration::from_secs(5));
        assert_eq!(o.refresh_timeout(), Duration::from_secs(1));
        assert_eq!(o.acquire_timeout(), Duration::from_secs(5));
    }
}

//! [`Clock`]: the clock a held lease's validity and refresh schedule follow.
//!
//! It is the runtime's clock (`tokio::time::Instant`, so tests on tokio's paused clock stay
//! exact) plus the time the machine has spent suspended since the clock was made, which the
//! runtime's clock does not count (`CLOCK_MONOTONIC` stops during a suspend; lock servers'
//! clocks do not). On Linux the suspend is read from `CLOCK_BOOTTIME`; see `suspend.rs`.
//! Sleeps on it wake at least every [`RESUME_CHECK`] to re-read it, so a deadline that
//! passed while the machine slept is seen within that long after it resumes.
//!
//! [`Clock::adjustable`] gives a clock that a [`ClockControl`] can jump forwards or
//! backwards, to replay a client-side clock fault (Kleppmann, "How to do distributed
//! locking", "Making the lock safe with fencing": a clock that jumps lets a holder believe
//! its lease is still valid). Nothing in production needs to adjust it; the reliability
//! harness does.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::suspend::{self, Suspended};

/// The longest a sleep on a [`Clock`] goes without re-reading it: after a machine resumes
/// from a suspend, a deadline that passed meanwhile is seen within this long (the runtime's
/// timers do not count the suspend, so nothing fires sooner).
pub const RESUME_CHECK: Duration = Duration::from_millis(100);

/// The clock a [`Locker`](crate::Locker)'s guards use for lease validity and refresh
/// timing. Cheap to clone; clones share one offset and one suspend reading.
///
/// It counts the time the machine is suspended (on Linux, `CLOCK_BOOTTIME`; elsewhere the
/// wall clock where it ran further than the monotonic clock), as the lock server's clock
/// does: after a resume, a lease that ran out during the suspend reads as lost at once
/// ([`LockGuard::is_held`](crate::LockGuard::is_held)), and within [`RESUME_CHECK`] its
/// guard's [`lost`](crate::LockGuard::lost) fires.
///
/// A backward jump makes the guard believe its lease is valid for longer than the server
/// does, and schedules its refreshes later: exactly the unsafe case fencing tokens exist
/// for. A forward jump makes the guard give up early, which is safe.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lockcore::{Clock, LockOptions, Locker, MemoryBackend};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockcore::Error> {
/// let (clock, control) = Clock::adjustable();
/// let locker = Locker::new(Arc::new(MemoryBackend::new()))
///     .with_options(LockOptions::new(Duration::from_secs(10)))
///     .with_clock(clock);
/// let guard = locker.acquire("job").await?;
/// control.jump_forward(Duration::from_secs(60)); // past the validity: the guard lets go
/// guard.lost().await;
/// assert!(!guard.is_held());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Clock {
    skew: Option<Arc<Skew>>,
    suspended: Arc<Suspended>,
}

/// Jumps an adjustable [`Clock`]. Every clone of that clock sees the jump at once, and
/// timers already waiting on it are re-armed.
#[derive(Clone)]
pub struct ClockControl {
    skew: Arc<Skew>,
}

struct Skew {
    /// Signed offset from the runtime's clock, in nanoseconds.
    offset: Mutex<i128>,
    changed: Notify,
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl Clock {
    /// The runtime's monotonic clock plus the time suspended from now on (the default).
    pub fn system() -> Self {
        Self {
            skew: None,
            suspended: Suspended::new(),
        }
    }

    /// A clock that starts equal to [`system`](Self::system)'s and moves otherwise only
    /// when `ClockControl` jumps it.
    pub fn adjustable() -> (Self, ClockControl) {
        let skew = Arc::new(Skew {
            offset: Mutex::new(0),
            changed: Notify::new(),
        });
        let control = ClockControl {
            skew: Arc::clone(&skew),
        };
        let clock = Self {
            skew: Some(skew),
            suspended: Suspended::new(),
        };
        (clock, control)
    }

    /// A system clock whose suspends a test makes (see [`suspend::FakeSuspend`]).
    #[cfg(test)]
    pub(crate) fn with_fake_suspend() -> (Self, suspend::FakeSuspend) {
        let (suspended, control) = Suspended::fake();
        (
            Self {
                skew: None,
                suspended,
            },
            control,
        )
    }

    /// What this clock counts a suspend with, for people: `"CLOCK_BOOTTIME (counts
    /// suspend)"` on Linux.
    pub fn suspend_source(&self) -> &'static str {
        suspend::SOURCE
    }

    /// The current time on this clock.
    pub fn now(&self) -> Instant {
        shift(Instant::now(), self.offset())
    }

    /// This clock's offset from the runtime's, in nanoseconds: the jumps plus the time
    /// suspended.
    fn offset(&self) -> i128 {
        let suspended = i128::try_from(self.suspended.get().as_nanos()).unwrap_or(i128::MAX);
        let skew = self.skew.as_ref().map_or(0, |skew| skew.offset());
        skew.saturating_add(suspended)
    }

    /// Sleeps until this clock reads `deadline` or later, following jumps made while it
    /// sleeps and, within [`RESUME_CHECK`], a suspend of the machine.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn sleep_until(&self, deadline: Instant) {
        let never = Notify::new();
        let changed = self.skew.as_ref().map_or(&never, |skew| &skew.changed);
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        loop {
            let jumped = changed.notified();
            tokio::pin!(jumped);
            jumped.as_mut().enable();
            let now = Instant::now();
            let Some(left) = deadline.checked_duration_since(shift(now, self.offset())) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            sleep.as_mut().reset(now + left.min(RESUME_CHECK));
            tokio::select! {
                () = &mut sleep => {}
                () = &mut jumped => {}
            }
        }
    }
}

impl ClockControl {
    /// Moves the clock forwards by `by`.
    pub fn jump_forward(&self, by: Duration) {
        self.skew
            .add(i128::try_from(by.as_nanos()).unwrap_or(i128::MAX));
    }

    /// Moves the clock backwards by `by`, as a stalled or stepped-back clock would.
    pub fn jump_back(&self, by: Duration) {
        self.skew
            .add(-i128::try_from(by.as_nanos()).unwrap_or(i128::MAX));
    }

    /// The clock's total offset from the runtime's clock (negative when behind).
    pub fn offset_nanos(&self) -> i128 {
        self.skew.offset()
    }
}

impl Skew {
    fn offset(&self) -> i128 {
        *self.offset.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, delta: i128) {
        {
            let mut offset = self.offset.lock().unwrap_or_else(PoisonError::into_inner);
            *offset = offset.saturating_add(delta);
        }
        self.changed.notify_waiters();
    }
}

/// `at` moved by `nanos` (at most about 584 years either way, which `Instant` holds).
fn shift(at: Instant, nanos: i128) -> Instant {
    let magnitude = Duration::from_nanos(u64::try_from(nanos.unsigned_abs()).unwrap_or(u64::MAX));
    let moved = if nanos >= 0 {
        at.checked_add(magnitude)
    } else {
        at.checked_sub(magnitude)
    };
    moved.unwrap_or(at)
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suspended = self.suspended.get();
        match &self.skew {
            None => write!(f, "Clock::system(suspended {suspended:?})"),
            Some(skew) => write!(
                f,
                "Clock::adjustable(offset {} ns, suspended {suspended:?})",
                skew.offset()
            ),
        }
    }
}

impl fmt::Debug for ClockControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClockControl(offset {} ns)", self.skew.offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_the_runtime_clock() {
        crate::tests::bounded(system_clock_is_the_runtime_clock_body);
    }

    async fn system_clock_is_the_runtime_clock_body() {
        let clock = Clock::system();
        let before = Instant::now();
        clock.sleep_until(before + Duration::from_secs(5)).await;
        assert_eq!(clock.now(), before + Duration::from_secs(5));
    }

    #[test]
    fn jumps_move_now_both_ways() {
        crate::tests::bounded(jumps_move_now_both_ways_body);
    }

    async fn jumps_move_now_both_ways_body() {
        let (clock, control) = Clock::adjustable();
        let base = Instant::now();
        control.jump_forward(Duration::from_secs(3));
        assert_eq!(clock.now(), base + Duration::from_secs(3));
        control.jump_back(Duration::from_secs(5));
        assert_eq!(clock.now() + Duration::from_secs(2), base);
        assert_eq!(control.offset_nanos(), -2_000_000_000);
    }

    #[test]
    fn a_forward_jump_wakes_a_sleeper_early() {
        crate::tests::bounded(a_forward_jump_wakes_a_sleeper_early_body);
    }

    async fn a_forward_jump_wakes_a_sleeper_early_body() {
        let (clock, control) = Clock::adjustable();
        let start = Instant::now();
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(start + Duration::from_secs(100)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        control.jump_forward(Duration::from_secs(99));
        sleeper.await.unwrap();
        assert_eq!(Instant::now(), start + Duration::from_secs(1));
    }

    #[test]
    fn a_backward_jump_makes_a_sleeper_wait_longer() {
        crate::tests::bounded(a_backward_jump_makes_a_sleeper_wait_longer_body);
    }

    async fn a_backward_jump_makes_a_sleeper_wait_longer_body() {
        let (clock, control) = Clock::adjustable();
        let start = Instant::now();
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(start + Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        control.jump_back(Duration::from_secs(20));
        sleeper.await.unwrap();
        assert_eq!(Instant::now(), start + Duration::from_secs(30));
    }

    #[test]
    fn a_clock_debugs_its_kind_offset_and_suspended_time() {
        let system = format!("{:?}", Clock::system());
        assert!(system.starts_with("Clock::system(suspended "), "{system}");
        let (clock, control) = Clock::adjustable();
        control.jump_back(Duration::from_secs(2));
        let clock = format!("{clock:?}");
        assert!(
            clock.starts_with("Clock::adjustable(offset -2000000000 ns, suspended "),
            "{clock}"
        );
        assert_eq!(
            format!("{control:?}"),
            "ClockControl(offset -2000000000 ns)"
        );
    }

    #[test]
    fn shifting_never_panics() {
        let at = Instant::now();
        assert!(shift(at, -i128::from(u64::MAX)) <= at);
        assert!(shift(at, i128::MAX) >= at);
    }
}

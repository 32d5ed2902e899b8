//! The pure parts of grouped refreshes: the grid guards' refreshes snap to, and the checks
//! on a batch's answers.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::types::Lease;

/// `err` as the result of each of `n` leases.
pub(crate) fn failed(err: Error, n: usize) -> Vec<Result<Lease>> {
    err.copies(n).into_iter().map(Err).collect()
}

/// The last multiple of `step` after `origin` that is not after `due`; `due` when the grid
/// does not reach it (a step under a millisecond, or `due` before the origin).
pub(crate) fn snap(origin: Instant, due: Instant, step: Duration) -> Instant {
    let step_ns = step.as_nanos();
    if step < Duration::from_millis(1) || due < origin {
        return due;
    }
    let since = (due - origin).as_nanos();
    let back = since % step_ns;
    // `back < step`, which fits a `Duration`.
    due - Duration::from_nanos(u64::try_from(back).unwrap_or(0))
}

/// `refreshed` when it answers for `asked` (same lock, same owner): a backend that mixed up
/// its answers must not hand one guard another's lease.
pub(crate) fn same_grant(asked: &Lease, refreshed: Lease) -> Result<Lease> {
    if refreshed.name() == asked.name() && refreshed.owner() == asked.owner() {
        return Ok(refreshed);
    }
    Err(Error::new(
        ErrorKind::OutcomeUnknown,
        format!(
            "the backend answered the refresh of lock {:?} with a lease of lock {:?}",
            asked.name().as_str(),
            refreshed.name().as_str()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of exactly a millisecond is a grid; below that, and before the origin, `due`
    /// stands.
    #[test]
    fn snaps_back_to_the_grid_from_a_millisecond_step() {
        let origin = Instant::now();
        let ms = Duration::from_millis;
        let due = origin + Duration::from_micros(2500);
        assert_eq!(snap(origin, due, ms(1)), origin + ms(2));
        assert_eq!(snap(origin, origin + ms(25), ms(10)), origin + ms(20));
        assert_eq!(snap(origin, due, Duration::from_micros(999)), due);
        assert_eq!(snap(origin + ms(5), origin, ms(1)), origin);
    }
}

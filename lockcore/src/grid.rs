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

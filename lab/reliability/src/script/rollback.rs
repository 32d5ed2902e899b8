//! `redis-snapshot-rollback` (issue #14): Redis goes back in time while the lock is in
//! use. A snapshot is taken at a grant, more grants follow, then a holder checks its lease
//! and Redis is killed and restarts from the older snapshot: every key, the fence counter
//! included, is back where it was at the snapshot. Tokens must not repeat, and a fenced
//! register must accept no stale write.

use tokio::time::sleep;

use super::moment::{begun, trigger};
use crate::backends::Workload;
use crate::group::Group;
use crate::servers::Lane;

/// Snapshot-and-rollback rounds per cell: each is cheap (a few sections), and every round
/// is another chance for a repeated token.
const ROUNDS: usize = 3;
/// Grants between the snapshot and the crash: the tokens a rollback would hand out again.
const GRANTS_AFTER_SNAPSHOT: usize = 2;

/// Runs the rounds, triggered by `group`'s events; returns what was done.
///
/// # Errors
/// When a triggering moment never came or Redis did not come back.
pub(super) async fn snapshot_rollback(
    lane: &mut Lane,
    group: &Group,
    w: Workload,
) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    for round in 1..=ROUNDS {
        begun(group, w).await?;
        lane.snapshot_redis().await?;
        if let Err(e) = after_snapshot(group, w).await {
            // Later cells on this lane must restart empty, not from this snapshot.
            lane.discard_redis_snapshot()?;
            return Err(e);
        }
        let restart = lane.restart_redis_from_snapshot().await?;
        notes.push(format!(
            "round {round}: snapshot, {GRANTS_AFTER_SNAPSHOT} grants, {restart}"
        ));
        sleep(w.ttl * 2).await;
    }
    Ok(notes)
}

/// More grants, then a holder that just checked its lease: the moment to roll back.
async fn after_snapshot(group: &Group, w: Workload) -> Result<(), String> {
    for _ in 0..GRANTS_AFTER_SNAPSHOT {
        begun(group, w).await?;
    }
    trigger(group, w, &[]).await.map(drop)
}

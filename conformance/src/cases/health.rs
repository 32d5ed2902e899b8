//! Lease health: unexpected state and unreachable servers.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Health, Identity, LockBackend, LockGuard, LockOptions, Locker, LostReason};
use tokio::time::{Instant, timeout};

use super::{fresh, millis};
use crate::harness::Harness;
use crate::report::Report;

/// Options for health cases: the harness TTL (at least 2 s, so an interval is ≥ 250 ms).
fn options(h: &dyn Harness) -> LockOptions {
    LockOptions::new(h.timing().ttl.max(Duration::from_secs(2)))
}

async fn hold(backend: Arc<dyn LockBackend>, options: &LockOptions, case: &str) -> LockGuard {
    let locker = Locker::new(backend).with_options(options.clone());
    locker.acquire(fresh(case)).await.expect("free name")
}

/// A lock deleted by an operator turns its guard Lost (not owner) within about one refresh
/// interval, and the refresher does not re-create it.
///
/// Checks: `refresh` contract, "fails with Lost when deleted; never re-creates". Guards
/// against the "unexpected releases" of Lai's GCS locking post going unnoticed while the
/// job runs on.
pub async fn deleted_lock_turns_the_guard_lost(h: &dyn Harness) -> Report {
    let options = options(h);
    let interval = options.refresh_interval();
    let guard = hold(h.backend(), &options, "deleted").await;
    let start = Instant::now();
    h.admin_delete(guard.name()).await;
    let reason = timeout(interval + h.timing().slack, guard.lost())
        .await
        .expect("still not Lost one refresh interval after the delete");
    let took = start.elapsed();
    assert!(
        matches!(reason, LostReason::NotOwner(_)),
        "lost for the wrong reason: {reason}"
    );
    tokio::time::sleep(interval).await;
    let holder = h.backend().inspect(guard.name()).await.expect("inspect");
    assert!(holder.is_none(), "the deleted lock was re-created");
    Report::new().metric("detect_ms", millis(took))
}

/// A lock overwritten by another owner turns its guard Lost (not owner) within about one
/// refresh interval, and the guard does not delete the new owner's lock.
///
/// Checks: `refresh` and `release` compare ownership. Guards against Lai's
/// "ownership changes": continuing, or worse releasing the thief's lock, after a steal.
pub async fn stolen_lock_turns_the_guard_lost(h: &dyn Harness) -> Report {
    let options = options(h);
    let interval = options.refresh_interval();
    let guard = hold(h.backend(), &options, "stolen").await;
    let thief = Identity::unique();
    let start = Instant::now();
    h.admin_steal(guard.name(), &thief, Duration::from_secs(60))
        .await;
    let reason = timeout(interval + h.timing().slack, guard.lost())
        .await
        .expect("still not Lost one refresh interval after the steal");
    let took = start.elapsed();
    assert!(
        matches!(reason, LostReason::NotOwner(_)),
        "lost for the wrong reason: {reason}"
    );
    let name = guard.name().clone();
    let _ = guard.release().await;
    let holder = h
        .backend()
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("thief holds it");
    assert_eq!(
        holder.owner(),
        &thief,
        "the old holder removed the thief's lock"
    );
    h.admin_delete(&name).await;
    Report::new().metric("detect_ms", millis(took))
}

/// Records every health change of `guard` with its time.
fn record(guard: &LockGuard) -> tokio::task::JoinHandle<Vec<(Instant, Health)>> {
    let mut rx = guard.health();
    tokio::spawn(async move {
        let mut seen = vec![(Instant::now(), rx.borrow_and_update().clone())];
        while rx.changed().await.is_ok() {
            let health = rx.borrow_and_update().clone();
            let done = health.is_terminal();
            seen.push((Instant::now(), health));
            if done {
                break;
            }
        }
        seen
    })
}

/// With the server unreachable (a partition: calls hang), the guard goes Degraded, then
/// Lost before the TTL ends, and never reports a live state past its validity.
///
/// Checks: the refresher's failure limit and validity deadline over this backend's client
/// timeouts. Guards against Lai's "network problems" case: a holder that keeps working
/// after its lease expired on the server because its refreshes hang.
pub async fn unreachable_backend_degrades_then_loses(h: &dyn Harness) -> Report {
    let cut = h
        .cuttable()
        .await
        .expect("the harness provides no outage hook (Harness::cuttable)");
    let options = options(h);
    let ttl = options.ttl();
    let guard = hold(cut.backend.clone(), &options, "unreachable").await;
    tokio::time::sleep(options.refresh_interval() * 3 / 2).await;
    let history = record(&guard);
    let cut_at = Instant::now();
    cut.outage.cut();
    let watched = timeout(ttl + h.timing().slack, guard.lost()).await;
    cut.outage.restore();
    let reason = watched.expect("the guard never turned Lost during the outage");
    let history = history.await.expect("recorder");
    let (lost_at, _) = *history.last().expect("history");
    assert!(
        lost_at - cut_at < ttl,
        "Lost only {:?} after the cut; TTL {ttl:?}",
        lost_at - cut_at
    );
    let degraded = history
        .iter()
        .any(|(_, h)| matches!(h, Health::Degraded { .. }));
    assert!(
        degraded,
        "never Degraded before Lost ({reason}): {history:?}"
    );
    assert_eq!(guard.remaining_validity(), Duration::ZERO);
    assert!(!guard.is_held());
    Report::new().metric("lost_after_cut_ms", millis(lost_at - cut_at))
}

/// A short outage (about one refresh interval) degrades the guard, and it returns to
/// Healthy once the server is reachable again.
///
/// Checks: a success resets the failure count (Lai's GCS locking post: retry transient
/// failures). Guards against clients that never reconnect after a blip and lose every lock.
pub async fn unreachable_backend_recovers(h: &dyn Harness) -> Report {
    let cut = h
        .cuttable()
        .await
        .expect("the harness provides no outage hook (Harness::cuttable)");
    let options = options(h);
    let interval = options.refresh_interval();
    let guard = hold(cut.backend.clone(), &options, "recovers").await;
    tokio::time::sleep(interval * 3 / 2).await;
    let mut rx = guard.health();
    cut.outage.cut();
    let degraded = timeout(
        interval * 3,
        rx.wait_for(|h| matches!(h, Health::Degraded { .. })),
    )
    .await
    .map(|r| r.map(|h| h.clone()));
    cut.outage.restore();
    let degraded = degraded
        .expect("never Degraded during the outage")
        .expect("refresher alive");
    assert!(degraded.is_held(), "{degraded}");
    let restored = Instant::now();
    let healthy = timeout(
        interval * 3 + h.timing().slack,
        rx.wait_for(|h| !matches!(h, Health::Degraded { .. })),
    )
    .await
    .expect("still Degraded long after the outage ended")
    .expect("refresher alive")
    .clone();
    assert_eq!(healthy, Health::Healthy, "did not recover");
    let took = restored.elapsed();
    guard.release().await.expect("release");
    Report::new().metric("recovery_ms", millis(took))
}

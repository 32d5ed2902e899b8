//! The conformance cases: `pub async fn(&dyn Harness) -> Report`, each documenting the
//! contract bullet it checks and the real-world failure it guards against. A case fails by
//! panicking (an assertion); [`run_case`](crate::run_case) records and re-raises it.

mod basic;
mod claims;
mod election;
mod exclusion;
mod expiry;
mod health;
mod listing;
mod semaphore;
mod semaphore_more;

use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    Acquire, AcquireRequest, Identity, Lease, LockBackend, LockGuard, LockName, LockOptions,
    Locker, Result, Ttl, WaitMode,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::harness::Harness;

pub use basic::{
    acquire_release_reacquire, bad_names_and_options_are_rejected, canary_conditional_create,
    inspect_shows_the_holder, many_names_held_at_once,
};
pub use claims::{durability_claim, fifo_claim, notification_claim, same_identity_instant_retake};
pub use election::{
    a_crashed_leader_is_replaced_within_ttl, observers_see_each_term,
    one_leader_at_a_time_and_terms_rise,
};
pub use exclusion::{
    dropped_acquire_leaves_nothing_held, handoff_latency, mutual_exclusion_under_contention,
    waiting_acquire_gets_the_lock_after_release, waiting_acquire_times_out,
};
pub use expiry::{
    expiry_frees_a_crashed_holder, fence_tokens_strictly_increase,
    refresh_keeps_the_lease_beyond_its_ttl, refresh_many_answers_each_lease,
    stale_lease_cannot_refresh, stale_lease_cannot_release,
};
pub use health::{
    deleted_lock_turns_the_guard_lost, stolen_lock_turns_the_guard_lost,
    unreachable_backend_degrades_then_loses, unreachable_backend_recovers,
};
pub use listing::{list_shows_held_locks, note_is_stored_with_the_grant};
pub use semaphore::{
    expired_permits_free_their_places, mixed_permit_limits_are_refused, permits_admit_at_most_n,
    permits_never_exceed_n_under_contention, released_permit_frees_its_place,
    same_owner_retakes_its_permit, stale_permit_cannot_release_or_refresh,
};
pub use semaphore_more::{
    a_permit_and_the_lock_of_its_name_are_apart, permit_waiter_gets_a_released_place,
    refresh_keeps_a_permit_beyond_its_ttl, refresh_many_mixes_locks_and_permits,
};

/// `d` as a [`Ttl`]; the cases only use valid ones.
pub(crate) fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("a TTL in range")
}

/// A fresh random lock name for `case`, so runs and cases never collide.
pub(crate) fn fresh(case: &str) -> LockName {
    let random: u64 = rand::random();
    LockName::new(format!("conformance-{case}-{random:016x}")).expect("valid generated name")
}

/// One direct backend attempt that must succeed.
pub(crate) async fn grant(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    ttl: Duration,
) -> Lease {
    let request = AcquireRequest::new(name.clone(), owner.clone(), self::ttl(ttl));
    match backend.acquire(&request).await.expect("acquire call") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{name} unexpectedly held by {}", holder.owner()),
    }
}

/// A locker over `backend` with `ttl` and a bounded wait.
pub(crate) fn locker(backend: Arc<dyn LockBackend>, ttl: Duration, wait: Duration) -> Locker {
    Locker::new(backend).with_options(LockOptions::new(ttl).with_wait(WaitMode::Timeout(wait)))
}

/// Takes a fresh name for `case` with `ttl`; the name must be free.
pub(crate) async fn hold(h: &dyn Harness, case: &str, ttl: Duration) -> (LockName, LockGuard) {
    let name = fresh(case);
    let guard = locker(h.backend(), ttl, Duration::ZERO)
        .acquire(&name)
        .await
        .expect("a fresh name is free");
    (name, guard)
}

/// The identity holding `name`, per `inspect`.
pub(crate) async fn holder_of(h: &dyn Harness, name: &LockName) -> Option<Identity> {
    let holder = h.backend().inspect(name).await.expect("inspect");
    holder.map(|info| info.owner().clone())
}

/// Starts `locker.acquire(name)` in a task that reports when it got the lock.
pub(crate) fn spawn_acquire(
    locker: Locker,
    name: &LockName,
) -> JoinHandle<Result<(Instant, LockGuard)>> {
    let name = name.clone();
    tokio::spawn(async move { locker.acquire(&name).await.map(|g| (Instant::now(), g)) })
}

/// Polls `check` every 10 ms until it is true or `limit` passes; returns the time taken.
pub(crate) async fn eventually<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Milliseconds as a float, for metrics.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `q` quantile (0..=1) of `samples` (sorted in place).
pub(crate) fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let index = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[index.min(samples.len() - 1)]
}

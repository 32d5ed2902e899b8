//! Mutual exclusion, waiting, handoff and cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{ErrorKind, Fencing, LockOptions, Locker, WaitMode};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{eventually, fresh, hold, locker, millis, quantile, spawn_acquire};
use crate::harness::Harness;
use crate::report::Report;

const TASKS: usize = 8;
const ROUNDS: usize = 50;

/// 8 tasks × 50 rounds on one name: an in-test register records overlapping holders;
/// there must be none, and fence tokens must rise in grant order where claimed.
///
/// Checks: `acquire` mutual exclusion under real contention. Guards against check-then-set
/// races (two contenders both seeing the name free) and releases that free a newer grant.
pub async fn mutual_exclusion_under_contention(h: &dyn Harness) -> Report {
    let name = fresh("contention");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::Forever);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locker = Locker::new(h.backend()).with_options(options.clone());
        let (name, inside, overlaps, tokens) = (
            name.clone(),
            inside.clone(),
            overlaps.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locker.acquire(&name).await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokens.lock().await.push(guard.fence_token());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender task");
    }
    let took = start.elapsed();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "overlapping holders");
    let tokens = tokens.lock().await;
    assert_eq!(tokens.len(), TASKS * ROUNDS);
    if h.backend().guarantees().fencing == Fencing::Monotonic {
        let tokens: Vec<_> = tokens.iter().map(|t| t.expect("fencing claimed")).collect();
        let bad = tokens.windows(2).position(|w| w[1] <= w[0]);
        assert!(bad.is_none(), "fence token went backwards at grant {bad:?}");
    }
    Report::new()
        .metric("grants", (TASKS * ROUNDS) as f64)
        .metric(
            "grants_per_second",
            (TASKS * ROUNDS) as f64 / took.as_secs_f64(),
        )
}

/// A waiting acquire is still waiting while the lock is held, and gets it after release.
///
/// Checks: the acquire loop's wait mode over this backend's `Held` replies. Guards against
/// waiters that give up early or never notice the release.
pub async fn waiting_acquire_gets_the_lock_after_release(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(30);
    let (name, holder) = hold(h, "wait", ttl).await;
    let task = spawn_acquire(locker(h.backend(), ttl, Duration::from_secs(60)), &name);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the waiter got a held lock");
    holder.release().await.expect("release");
    let (_, guard) = task.await.expect("join").expect("the waiter gets the lock");
    guard.release().await.expect("release");
    Report::new()
}

/// A waiting acquire returns a Timeout error, naming the holder, when the deadline passes.
///
/// Checks: deadline handling. Guards against waits that overrun their deadline (a CI job
/// that hangs instead of failing) or return the wrong error.
pub async fn waiting_acquire_times_out(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(30);
    let (name, holder) = hold(h, "timeout", ttl).await;
    let wait = Duration::from_millis(500);
    let start = Instant::now();
    let err = locker(h.backend(), ttl, wait)
        .acquire(&name)
        .await
        .expect_err("held");
    let waited = start.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        waited >= wait,
        "gave up after {waited:?}, before the deadline"
    );
    assert!(
        waited <= wait + h.timing().slack,
        "gave up {waited:?} after a {wait:?} deadline"
    );
    if let Some(seen) = err.holder() {
        assert_eq!(seen.owner(), holder.lease().owner());
    }
    holder.release().await.expect("release");
    Report::new().metric("overrun_ms", millis(waited - wait))
}

/// Dropping acquire futures at random points leaves nothing held: any grant made after the
/// caller left is released at once (the TTL is 60 s, so expiry cannot explain it).
///
/// Checks: the acquire loop's cancel safety over this backend. Guards against
/// `select!`/timeout users leaking locks until their TTL (the "stuck locks" of Lai's GCS
/// locking post).
pub async fn dropped_acquire_leaves_nothing_held(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(60);
    let slack = h.timing().slack;
    for round in 0..20u64 {
        let name = fresh("dropped");
        let l = locker(h.backend(), ttl, Duration::from_secs(60));
        let task = tokio::spawn({
            let name = name.clone();
            async move { l.acquire(&name).await }
        });
        tokio::time::sleep(Duration::from_micros(round * 250)).await;
        task.abort();
        let _ = task.await;
        let backend = h.backend();
        let freed = eventually(slack * 2, || async {
            backend.inspect(&name).await.expect("inspect").is_none()
        })
        .await;
        assert!(
            freed.is_some(),
            "round {round}: a dropped acquire left {name} held"
        );
    }
    Report::new()
}

/// Handoff latency: release → the next waiter holds the lock (20 samples). Reported, not
/// asserted; the notification claim has its own case.
///
/// Guards against nothing by itself: it is the number users compare across backends.
pub async fn handoff_latency(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(30);
    let mut samples = Vec::new();
    for _ in 0..20 {
        let (name, holder) = hold(h, "handoff", ttl).await;
        let task = spawn_acquire(locker(h.backend(), ttl, Duration::from_secs(60)), &name);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        holder.release().await.expect("release");
        let (got, guard) = task.await.expect("join").expect("waiter acquires");
        samples.push(got - released);
        guard.release().await.expect("release");
    }
    let p50 = quantile(&mut samples, 0.5);
    let p95 = quantile(&mut samples, 0.95);
    let max = quantile(&mut samples, 1.0);
    Report::new()
        .metric("handoff_p50_ms", millis(p50))
        .metric("handoff_p95_ms", millis(p95))
        .metric("handoff_max_ms", millis(max))
}

//! Issue #20: the lease arithmetic pinned exactly, on the paused clock, so a one-line
//! mistake in the validity, health or release logic fails a test. Each test names the
//! mistake it catches.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Rig, ms, until};
use crate::testing::{Fault, FaultyBackend, Op};
use crate::{
    Acquire, AcquireRequest, ErrorKind, Guarantees, Health, HolderInfo, Lease, LockBackend,
    LockName, LockOptions, Locker, LostReason, MemoryBackend, Result, WaitMode,
};

/// TTL 8 s: refresh every 1 s, drift 110 ms (1 % + the 30 ms margin).
fn options() -> LockOptions {
    LockOptions::new(ms(8000))
}

/// Reports every granted or refreshed lease with the TTL `ttl` instead of the real one,
/// and counts release calls (the memory backend's compare-and-delete would hide a release
/// of a stolen lease).
#[derive(Debug)]
struct Reporting {
    inner: FaultyBackend,
    ttl: Mutex<Option<Duration>>,
}

impl Reporting {
    fn new(inner: FaultyBackend, ttl: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            ttl: Mutex::new(ttl),
        })
    }

    fn report(&self, lease: Lease) -> Lease {
        match *self.ttl.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(ttl) => lease.with_ttl(crate::Ttl::new(ttl).expect("valid")),
            None => lease,
        }
    }
}

#[async_trait]
impl LockBackend for Reporting {
    fn backend_name(&self) -> &str {
        "reporting"
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        Ok(match self.inner.acquire(request).await? {
            Acquire::Acquired(lease) => Acquire::Acquired(self.report(lease)),
            held => held,
        })
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await.map(|l| self.report(l))
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
}

fn reporting_rig(ttl: Option<Duration>) -> (Rig, Arc<Reporting>, Locker) {
    let rig = Rig::new(options());
    let backend = Reporting::new(rig.faulty.clone(), ttl);
    let locker = Locker::new(backend.clone()).with_options(options());
    (rig, backend, locker)
}

#[test]
fn validity_after_a_slow_refresh_counts_from_when_it_was_sent_minus_drift() {
    crate::tests::bounded(
        validity_after_a_slow_refresh_counts_from_when_it_was_sent_minus_drift_body,
    );
}

async fn validity_after_a_slow_refresh_counts_from_when_it_was_sent_minus_drift_body() {
    let rig = Rig::new(options());
    let guard = rig.locker.acquire("job").await.expect("free");
    // The first refresh is sent at 1 s and answered at 1.3 s.
    rig.faulty.script(Op::Refresh, [Fault::Delay(ms(300))]);
    tokio::time::sleep(ms(1301)).await;
    assert_eq!(rig.faulty.calls(Op::Refresh), 1);
    let drift = options().drift();
    // Deadline = 1 s (sent) + 8 s - drift; now is 1.301 s.
    assert_eq!(guard.remaining_validity(), ms(8000 - 301) - drift);
}

#[test]
fn a_backend_reporting_a_longer_ttl_never_extends_validity() {
    crate::tests::bounded(a_backend_reporting_a_longer_ttl_never_extends_validity_body);
}

async fn a_backend_reporting_a_longer_ttl_never_extends_validity_body() {
    let (_rig, _backend, locker) = reporting_rig(Some(ms(60_000)));
    let guard = locker.acquire("job").await.expect("free");
    let drift = options().drift();
    assert_eq!(
        guard.remaining_validity(),
        ms(8000) - drift,
        "after acquire"
    );
    tokio::time::sleep(ms(1001)).await; // past the first refresh, answered at once
    assert_eq!(
        guard.remaining_validity(),
        ms(8000 - 1) - drift,
        "after refresh"
    );
}

#[test]
fn a_backend_reporting_a_shorter_ttl_shortens_validity() {
    crate::tests::bounded(a_backend_reporting_a_shorter_ttl_shortens_validity_body);
}

async fn a_backend_reporting_a_shorter_ttl_shortens_validity_body() {
    let (_rig, backend, locker) = reporting_rig(Some(ms(5000)));
    let guard = locker.acquire("job").await.expect("free");
    let drift = options().drift();
    assert_eq!(
        guard.remaining_validity(),
        ms(5000) - drift,
        "after acquire"
    );
    *backend.ttl.lock().expect("lock") = Some(ms(4000));
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(
        guard.remaining_validity(),
        ms(4000) - drift,
        "after refresh"
    );
}

#[test]
fn a_grant_shorter_than_the_refresh_interval_is_lost_at_its_deadline_not_at_the_refresh() {
    crate::tests::bounded(
        a_grant_shorter_than_the_refresh_interval_is_lost_at_its_deadline_not_at_the_refresh_body,
    );
}

async fn a_grant_shorter_than_the_refresh_interval_is_lost_at_its_deadline_not_at_the_refresh_body()
{
    // Refresh every 1 s, but the backend grants 300 ms; refreshes all fail.
    let (rig, _backend, locker) = reporting_rig(Some(ms(300)));
    rig.faulty
        .set(Op::Refresh, Fault::Fail(ErrorKind::Unavailable));
    let start = Instant::now();
    let guard = locker.acquire("job").await.expect("free");
    let token = guard.cancellation_token();
    let (at, health) = until(&guard, |h| !h.is_held()).await;
    let deadline = ms(300) - options().drift();
    assert_eq!(health, Health::Lost(LostReason::ValidityExpired));
    assert_eq!(at - start, deadline, "Lost fired at the validity deadline");
    assert!(token.is_cancelled(), "the cancellation token fired with it");
    assert_eq!(rig.faulty.calls(Op::Refresh), 0, "no refresh was due yet");
}

#[test]
fn a_grant_with_exactly_zero_validity_left_is_released_not_kept() {
    crate::tests::bounded(a_grant_with_exactly_zero_validity_left_is_released_not_kept_body);
}

async fn a_grant_with_exactly_zero_validity_left_is_released_not_kept_body() {
    let opts = options().with_attempt_timeout(ms(60_000));
    let rig = Rig::new(opts.clone());
    // The reply takes exactly TTL - drift: the grant arrives at its deadline.
    let exact = ms(8000) - opts.drift();
    rig.faulty.script(Op::Acquire, [Fault::Delay(exact)]);
    let guard = rig.locker.acquire("job").await.expect("second attempt");
    assert_eq!(
        rig.faulty.calls(Op::Acquire),
        2,
        "the first grant was not kept"
    );
    assert_eq!(rig.faulty.calls(Op::Release), 1, "and it was released");
    assert_eq!(guard.fence_token().map(|t| t.get()), Some(2));
}

#[test]
fn a_stolen_lease_is_never_released_by_its_former_holder() {
    crate::tests::bounded(a_stolen_lease_is_never_released_by_its_former_holder_body);
}

async fn a_stolen_lease_is_never_released_by_its_former_holder_body() {
    let rig = Rig::new(options());
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty.set(Op::Refresh, Fault::Fail(ErrorKind::Lost));
    let (_, health) = until(&guard, |h| !h.is_held()).await;
    assert!(
        matches!(health, Health::Lost(LostReason::NotOwner(_))),
        "{health:?}"
    );
    let err = guard.release().await.expect_err("lost before release");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert!(
        err.to_string().contains("no longer the owner"),
        "the reason is named: {err}"
    );
    tokio::time::sleep(ms(100)).await;
    assert_eq!(rig.faulty.calls(Op::Release), 0, "no release call was made");
}

#[test]
fn a_dropped_guard_of_a_stolen_lease_makes_no_release_call() {
    crate::tests::bounded(a_dropped_guard_of_a_stolen_lease_makes_no_release_call_body);
}

async fn a_dropped_guard_of_a_stolen_lease_makes_no_release_call_body() {
    let rig = Rig::new(options());
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty.set(Op::Refresh, Fault::Fail(ErrorKind::Lost));
    until(&guard, |h| !h.is_held()).await;
    drop(guard);
    tokio::time::sleep(ms(100)).await;
    assert_eq!(rig.faulty.calls(Op::Release), 0, "no release call was made");
}

#[test]
fn try_acquire_reports_an_outage_as_an_error_not_as_held() {
    crate::tests::bounded(try_acquire_reports_an_outage_as_an_error_not_as_held_body);
}

async fn try_acquire_reports_an_outage_as_an_error_not_as_held_body() {
    let rig = Rig::new(options());
    rig.faulty
        .set(Op::Acquire, Fault::Fail(ErrorKind::Unavailable));
    let err = rig.locker.try_acquire("job").await.expect_err("an outage");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(rig.faulty.calls(Op::Acquire), 1, "one try, no retry");
}

#[test]
fn a_waiter_without_a_deadline_never_gives_up_on_a_slow_later_attempt() {
    crate::tests::bounded(a_waiter_without_a_deadline_never_gives_up_on_a_slow_later_attempt_body);
}

async fn a_waiter_without_a_deadline_never_gives_up_on_a_slow_later_attempt_body() {
    let opts = options().with_attempt_timeout(ms(500));
    let rig = Rig::new(opts.clone());
    let holder = rig.rival().acquire("job").await.expect("free");
    // Held once, then every attempt takes four attempt timeouts to answer.
    rig.faulty.script(Op::Acquire, [Fault::Pass]);
    rig.faulty.set(Op::Acquire, Fault::Delay(ms(2000)));
    let locker = rig.locker.clone();
    let waiter = tokio::spawn(async move { locker.acquire_with("job", &opts).await });
    tokio::time::sleep(ms(3000)).await;
    holder.release().await.expect("release");
    let guard = waiter
        .await
        .expect("join")
        .expect("acquired, never gave up");
    assert!(guard.is_held());
}

#[test]
fn a_waiter_with_a_deadline_gives_up_at_the_deadline_on_a_slow_later_attempt() {
    crate::tests::bounded(
        a_waiter_with_a_deadline_gives_up_at_the_deadline_on_a_slow_later_attempt_body,
    );
}

async fn a_waiter_with_a_deadline_gives_up_at_the_deadline_on_a_slow_later_attempt_body() {
    let opts = options()
        .with_attempt_timeout(ms(500))
        .with_wait(WaitMode::Timeout(ms(1200)));
    let rig = Rig::new(opts.clone());
    let _holder = rig.rival().acquire("job").await.expect("free");
    rig.faulty.script(Op::Acquire, [Fault::Pass]);
    rig.faulty.set(Op::Acquire, Fault::Delay(ms(5000)));
    let start = Instant::now();
    let err = rig
        .locker
        .acquire_with("job", &opts)
        .await
        .expect_err("held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(start.elapsed(), ms(1200), "at the deadline, not before");
}

#[test]
fn inspect_names_the_holder_and_refuses_a_bad_name() {
    crate::tests::bounded(inspect_names_the_holder_and_refuses_a_bad_name_body);
}

async fn inspect_names_the_holder_and_refuses_a_bad_name_body() {
    let locker = Locker::new(Arc::new(MemoryBackend::new())).with_options(options());
    assert!(locker.inspect("job").await.expect("ok").is_none());
    let guard = locker.acquire("job").await.expect("free");
    let holder = locker.inspect("job").await.expect("ok").expect("held");
    assert_eq!(holder.owner(), guard.lease().owner());
    assert_eq!(holder.token(), guard.fence_token());
    let err = locker.inspect("").await.expect_err("empty name");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[test]
fn timeouts_too_large_for_the_clock_are_refused_not_a_panic() {
    crate::tests::bounded(timeouts_too_large_for_the_clock_are_refused_not_a_panic_body);
}

async fn timeouts_too_large_for_the_clock_are_refused_not_a_panic_body() {
    let locker = Locker::new(Arc::new(MemoryBackend::new()));
    for options in [
        options().with_attempt_timeout(Duration::MAX),
        options().with_wait(WaitMode::Timeout(Duration::MAX)),
    ] {
        let err = locker
            .acquire_with("job", &options)
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}

#[test]
fn a_try_whose_grant_arrives_with_no_validity_left_gives_up() {
    crate::tests::bounded(a_try_whose_grant_arrives_with_no_validity_left_gives_up_body);
}

async fn a_try_whose_grant_arrives_with_no_validity_left_gives_up_body() {
    let opts = options().with_attempt_timeout(ms(60_000));
    let rig = Rig::new(opts);
    rig.faulty.set(Op::Acquire, Fault::Delay(ms(8000)));
    let err = rig
        .locker
        .try_acquire("job")
        .await
        .expect_err("no validity");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(rig.faulty.calls(Op::Acquire), 1, "one try, not a loop");
}

#[test]
fn a_guard_debugs_its_name_token_health_and_validity_and_the_locker_its_options() {
    crate::tests::bounded(
        a_guard_debugs_its_name_token_health_and_validity_and_the_locker_its_options_body,
    );
}

async fn a_guard_debugs_its_name_token_health_and_validity_and_the_locker_its_options_body() {
    let locker = Locker::new(Arc::new(MemoryBackend::new())).with_options(options());
    assert_eq!(locker.options().ttl(), ms(8000));
    let guard = locker.acquire("job").await.expect("free");
    let shown = format!("{guard:?}");
    for part in ["\"job\"", "FenceToken(1)", "Healthy", "remaining_validity"] {
        assert!(shown.contains(part), "{part} missing from {shown}");
    }
}

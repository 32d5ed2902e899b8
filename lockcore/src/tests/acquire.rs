//! The acquire loop: waiting, notification, backoff bounds, deadlines, retries, cancel safety.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Rig, ms};
use crate::testing::{Fault, Op};
use crate::{
    Acquire, AcquireRequest, Backoff, ErrorKind, Guarantees, HolderInfo, Identity, Jitter, Lease,
    LockBackend, LockName, LockOptions, Locker, MemoryBackend, Result, WaitMode,
};

fn options(ttl_ms: u64) -> LockOptions {
    LockOptions::new(ms(ttl_ms))
}

#[test]
fn try_acquire_reports_the_holder() {
    crate::tests::bounded(try_acquire_reports_the_holder_body);
}

async fn try_acquire_reports_the_holder_body() {
    let rig = Rig::new(options(1000));
    let guard = rig.locker.acquire("job").await.expect("free lock");
    assert!(rig.rival().try_acquire("job").await.expect("ok").is_none());
    let held = options(1000).with_wait(WaitMode::TryOnce);
    let err = rig
        .rival()
        .acquire_with("job", &held)
        .await
        .expect_err("held");
    assert_eq!(err.kind(), ErrorKind::Held);
    let holder = err.holder().expect("holder attached");
    assert_eq!(holder.owner(), guard.lease().owner());
    assert!(
        err.to_string()
            .contains("memory: lock \"job\": lock held by another owner: held by")
    );
    assert!(err.to_string().contains("expires in"), "{err}");
}

#[test]
fn a_release_notification_wakes_the_waiter_at_once() {
    crate::tests::bounded(a_release_notification_wakes_the_waiter_at_once_body);
}

async fn a_release_notification_wakes_the_waiter_at_once_body() {
    let rig = Rig::new(options(10_000));
    let guard = rig.locker.acquire("job").await.expect("free");
    // Backoff so long that only the notification can explain a prompt handoff.
    let slow =
        options(10_000).with_backoff(Backoff::new(ms(5000), ms(5000)).with_jitter(Jitter::None));
    let rival = rig.rival();
    let waiter = tokio::spawn(async move {
        let g = rival.acquire_with("job", &slow).await.expect("acquired");
        (Instant::now(), g)
    });
    tokio::time::sleep(ms(300)).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let (got, _g) = waiter.await.expect("join");
    assert!(got - released < ms(5), "handoff took {:?}", got - released);
}

#[test]
fn a_polling_waiter_never_sleeps_past_the_holders_remaining_ttl() {
    crate::tests::bounded(a_polling_waiter_never_sleeps_past_the_holders_remaining_ttl_body);
}

async fn a_polling_waiter_never_sleeps_past_the_holders_remaining_ttl_body() {
    let rig = Rig::new(options(500));
    rig.faulty.disable_notifications();
    // A crashed holder: acquired straight from the backend, never refreshed or released.
    let crashed = AcquireRequest::new(
        LockName::new("job").expect("ok"),
        Identity::unique(),
        crate::Ttl::new(ms(500)).expect("valid"),
    );
    rig.memory.acquire(&crashed).await.expect("ok");
    let start = Instant::now();
    let slow =
        options(500).with_backoff(Backoff::new(ms(10_000), ms(60_000)).with_jitter(Jitter::None));
    let _g = rig
        .locker
        .acquire_with("job", &slow)
        .await
        .expect("acquired after expiry");
    let waited = start.elapsed();
    assert!(waited >= ms(500) && waited <= ms(502), "waited {waited:?}");
}

/// Records when each acquire attempt reached the backend.
#[derive(Debug)]
struct Recorder {
    inner: MemoryBackend,
    at: Mutex<Vec<Instant>>,
    /// A backend limit, as a store with a per-object write rate would have.
    min_refresh: Duration,
}

#[async_trait]
impl LockBackend for Recorder {
    fn backend_name(&self) -> &str {
        "recorder"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.at.lock().expect("lock").push(Instant::now());
        self.inner.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    fn check_options(&self, options: &LockOptions) -> Result<()> {
        if options.refresh_interval() < self.min_refresh {
            return Err(crate::Error::invalid_input(
                "refresh interval below the store's limit",
            ));
        }
        Ok(())
    }
}

async fn attempt_gaps(backoff: Backoff, wait: Duration) -> Vec<Duration> {
    let memory = MemoryBackend::new();
    let hold = Locker::new(Arc::new(memory.clone())).with_options(options(3_600_000));
    let _holder = hold.acquire("job").await.expect("free");
    let recorder = Arc::new(Recorder {
        inner: memory,
        at: Mutex::default(),
        min_refresh: Duration::ZERO,
    });
    let waiter = Locker::new(recorder.clone()).with_jitter_seed(11);
    let opts = options(3_600_000)
        .with_backoff(backoff)
        .with_wait(WaitMode::Timeout(wait));
    let err = waiter
        .acquire_with("job", &opts)
        .await
        .expect_err("never free");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let at = recorder.at.lock().expect("lock").clone();
    at.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    crate::tests::bounded(backoff_doubles_up_to_its_cap_body);
}

async fn backoff_doubles_up_to_its_cap_body() {
    let backoff = Backoff::new(ms(100), ms(800)).with_jitter(Jitter::None);
    let gaps = attempt_gaps(backoff, ms(4500)).await;
    let expected = [100, 200, 400, 800, 800, 800, 800];
    assert_eq!(gaps[..7], expected.map(ms), "{gaps:?}");
}

#[test]
fn full_jitter_stays_within_the_exponential_ceiling_and_varies() {
    crate::tests::bounded(full_jitter_stays_within_the_exponential_ceiling_and_varies_body);
}

async fn full_jitter_stays_within_the_exponential_ceiling_and_varies_body() {
    let backoff = Backoff::new(ms(100), ms(800));
    let gaps = attempt_gaps(backoff, ms(60_000)).await;
    assert!(gaps.len() > 40, "{} attempts", gaps.len());
    for (i, gap) in gaps.iter().enumerate() {
        let ceiling = ms(100 * 2u64.pow(i.min(3) as u32)).min(ms(800));
        assert!(
            *gap <= ceiling.max(ms(1)),
            "gap {i} = {gap:?} > {ceiling:?}"
        );
    }
    let capped = &gaps[4..];
    let (min, max) = (
        capped.iter().min().expect("some"),
        capped.iter().max().expect("some"),
    );
    assert!(
        *max - *min > ms(400),
        "jitter spread too small: {min:?}..{max:?}"
    );
}

#[test]
fn the_deadline_ends_the_wait_with_the_holder() {
    crate::tests::bounded(the_deadline_ends_the_wait_with_the_holder_body);
}

async fn the_deadline_ends_the_wait_with_the_holder_body() {
    let rig = Rig::new(options(60_000));
    let guard = rig.locker.acquire("job").await.expect("free");
    let start = Instant::now();
    let opts = options(60_000).with_wait(WaitMode::Timeout(ms(1500)));
    let err = rig
        .rival()
        .acquire_with("job", &opts)
        .await
        .expect_err("times out");
    let waited = start.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(
        waited >= ms(1500) && waited <= ms(1501),
        "waited {waited:?}"
    );
    assert_eq!(
        err.holder().map(HolderInfo::owner),
        Some(guard.lease().owner())
    );
}

#[test]
fn the_deadline_cuts_a_later_attempt_in_flight() {
    crate::tests::bounded(the_deadline_cuts_a_later_attempt_in_flight_body);
}

async fn the_deadline_cuts_a_later_attempt_in_flight_body() {
    let rig = Rig::new(options(60_000));
    let _holder = rig.rival().acquire("job").await.expect("free");
    rig.faulty.script(Op::Acquire, [Fault::Pass]);
    rig.faulty.set(Op::Acquire, Fault::Hang);
    let start = Instant::now();
    let opts = options(60_000).with_wait(WaitMode::Timeout(ms(700)));
    let err = rig
        .locker
        .acquire_with("job", &opts)
        .await
        .expect_err("hangs");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(start.elapsed(), ms(700));
    assert_eq!(rig.faulty.calls(Op::Acquire), 2, "held once, then hung");
    // Ended by the wait, as any wait that runs out: it names the holder last seen.
    assert!(err.holder().is_some(), "{err}");
    assert!(
        err.message().starts_with("gave up after 700ms; held by "),
        "{err}"
    );
}

#[test]
fn the_first_attempt_completes_even_with_a_zero_wait() {
    crate::tests::bounded(the_first_attempt_completes_even_with_a_zero_wait_body);
}

async fn the_first_attempt_completes_even_with_a_zero_wait_body() {
    let rig = Rig::new(options(60_000));
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(300))]);
    let opts = options(60_000).with_wait(WaitMode::Timeout(Duration::ZERO));
    let start = Instant::now();
    let guard = rig
        .locker
        .acquire_with("job", &opts)
        .await
        .expect("one real try");
    assert_eq!(start.elapsed(), ms(300));
    let err = rig
        .rival()
        .acquire_with("job", &opts)
        .await
        .expect_err("held");
    assert_eq!(
        err.kind(),
        ErrorKind::Timeout,
        "a zero wait on a held lock times out"
    );
    drop(guard);
}

#[test]
fn a_hung_first_attempt_is_bounded_by_the_attempt_timeout() {
    crate::tests::bounded(a_hung_first_attempt_is_bounded_by_the_attempt_timeout_body);
}

async fn a_hung_first_attempt_is_bounded_by_the_attempt_timeout_body() {
    let rig = Rig::new(options(60_000).with_attempt_timeout(ms(2000)));
    rig.faulty.script(Op::Acquire, [Fault::Hang]);
    let opts = options(60_000)
        .with_attempt_timeout(ms(2000))
        .with_wait(WaitMode::Timeout(ms(500)));
    let start = Instant::now();
    let err = rig
        .locker
        .acquire_with("job", &opts)
        .await
        .expect_err("timed out");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(start.elapsed(), ms(2000));
}

#[test]
fn transient_errors_are_retried_while_waiting_only() {
    crate::tests::bounded(transient_errors_are_retried_while_waiting_only_body);
}

async fn transient_errors_are_retried_while_waiting_only_body() {
    let rig = Rig::new(options(1000));
    rig.faulty
        .script(Op::Acquire, [Fault::Fail(ErrorKind::Unavailable); 3]);
    let _g = rig
        .locker
        .acquire("job")
        .await
        .expect("fourth attempt wins");
    assert_eq!(rig.faulty.calls(Op::Acquire), 4);

    let rig = Rig::new(options(1000).with_wait(WaitMode::TryOnce));
    rig.faulty
        .script(Op::Acquire, [Fault::Fail(ErrorKind::Unavailable)]);
    let err = rig
        .locker
        .acquire("job")
        .await
        .expect_err("try-once reports it");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(rig.faulty.calls(Op::Acquire), 1);
}

#[test]
fn permanent_errors_are_not_retried() {
    crate::tests::bounded(permanent_errors_are_not_retried_body);
}

async fn permanent_errors_are_not_retried_body() {
    let rig = Rig::new(options(1000));
    rig.faulty
        .set(Op::Acquire, Fault::Fail(ErrorKind::PermissionDenied));
    let err = rig.locker.acquire("job").await.expect_err("denied");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert_eq!(rig.faulty.calls(Op::Acquire), 1);
}

/// A backend's own option limits (`check_options`) stop the acquisition before any attempt.
#[test]
fn options_outside_the_backends_limits_never_reach_it() {
    crate::tests::bounded(options_outside_the_backends_limits_never_reach_it_body);
}

async fn options_outside_the_backends_limits_never_reach_it_body() {
    let recorder = Arc::new(Recorder {
        inner: MemoryBackend::new(),
        at: Mutex::default(),
        min_refresh: ms(1000),
    });
    let locker = Locker::new(recorder.clone());
    let err = locker
        .acquire_with("job", &options(3000))
        .await
        .expect_err("refresh every 375 ms is below the limit");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("store's limit"), "{err}");
    assert!(recorder.at.lock().expect("lock").is_empty());
    let guard = locker
        .acquire_with("job", &options(8000))
        .await
        .expect("1 s refresh fits");
    assert_eq!(recorder.at.lock().expect("lock").len(), 1);
    guard.release().await.expect("released");
}

#[test]
fn bad_input_never_reaches_the_backend() {
    crate::tests::bounded(bad_input_never_reaches_the_backend_body);
}

async fn bad_input_never_reaches_the_backend_body() {
    let rig = Rig::new(options(1000));
    for name in ["", "a\u{0}b"] {
        let err = rig.locker.acquire(name).await.expect_err("bad name");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
    let bad = options(1000).with_refresh_interval(ms(400));
    let err = rig
        .locker
        .acquire_with("job", &bad)
        .await
        .expect_err("bad options");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.to_string()
            .starts_with("memory: lock \"job\": invalid input"),
        "{err}"
    );
    assert_eq!(rig.faulty.calls(Op::Acquire), 0);
}

#[test]
fn a_lost_reply_is_recognised_by_the_same_owner() {
    crate::tests::bounded(a_lost_reply_is_recognised_by_the_same_owner_body);
}

async fn a_lost_reply_is_recognised_by_the_same_owner_body() {
    let rig = Rig::new(options(60_000));
    let locker = rig.locker.clone().with_identity(Identity::unique());
    rig.faulty.script(Op::Acquire, [Fault::LoseReply]);
    let guard = locker
        .acquire("job")
        .await
        .expect("retake of our own write");
    assert_eq!(rig.faulty.calls(Op::Acquire), 2);
    assert_eq!(guard.fence_token().map(|t| t.get()), Some(2));
}

#[test]
fn dropping_an_acquire_in_flight_leaves_nothing_held() {
    crate::tests::bounded(dropping_an_acquire_in_flight_leaves_nothing_held_body);
}

async fn dropping_an_acquire_in_flight_leaves_nothing_held_body() {
    let rig = Rig::new(options(60_000));
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(100))]);
    let dropped = tokio::time::timeout(ms(50), rig.locker.acquire("job")).await;
    assert!(dropped.is_err(), "the acquire was cancelled");
    tokio::time::sleep(ms(100)).await;
    assert_eq!(
        rig.faulty.calls(Op::Release),
        1,
        "the late grant was released"
    );
    assert!(
        rig.memory
            .inspect(&LockName::new("job").expect("ok"))
            .await
            .expect("ok")
            .is_none()
    );
    assert!(rig.rival().try_acquire("job").await.expect("ok").is_some());
}

#[test]
fn a_grant_that_arrives_with_no_validity_left_is_released_and_retried() {
    crate::tests::bounded(a_grant_that_arrives_with_no_validity_left_is_released_and_retried_body);
}

async fn a_grant_that_arrives_with_no_validity_left_is_released_and_retried_body() {
    let opts = options(1000).with_attempt_timeout(ms(5000));
    let rig = Rig::new(opts);
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(1000))]);
    let start = Instant::now();
    let guard = rig.locker.acquire("job").await.expect("second attempt");
    assert_eq!(rig.faulty.calls(Op::Acquire), 2);
    assert_eq!(rig.faulty.calls(Op::Release), 1);
    assert!(start.elapsed() >= ms(1000));
    assert_eq!(guard.fence_token().map(|t| t.get()), Some(2));
}

#[test]
fn each_acquisition_gets_its_own_identity_by_default() {
    crate::tests::bounded(each_acquisition_gets_its_own_identity_by_default_body);
}

async fn each_acquisition_gets_its_own_identity_by_default_body() {
    let rig = Rig::new(options(1000));
    let _a = rig.locker.acquire("job").await.expect("free");
    assert!(
        rig.locker.try_acquire("job").await.expect("ok").is_none(),
        "two tasks sharing a locker must not retake each other's lock"
    );
}

/// Aborts a task from inside the backend's acquire, after the grant is made but before
/// the attempt returns it: the caller is dropped at the next yield with the grant in
/// flight, so the attempt must finish elsewhere and release it.
#[derive(Debug)]
struct AbortsCaller {
    inner: MemoryBackend,
    caller: Mutex<Option<tokio::task::AbortHandle>>,
}

#[async_trait]
impl LockBackend for AbortsCaller {
    fn backend_name(&self) -> &str {
        "aborts-caller"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let outcome = self.inner.acquire(request).await;
        let caller = self.caller.lock().expect("lock").take();
        if let Some(caller) = caller {
            caller.abort();
            // The attempt runs in the caller's task: the abort lands at this yield.
            tokio::task::yield_now().await;
        }
        outcome
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
}

#[test]
fn a_grant_delivered_to_a_cancelled_caller_is_released() {
    crate::tests::bounded(a_grant_delivered_to_a_cancelled_caller_is_released_body);
}

async fn a_grant_delivered_to_a_cancelled_caller_is_released_body() {
    let memory = MemoryBackend::new();
    let backend = Arc::new(AbortsCaller {
        inner: memory.clone(),
        caller: Mutex::default(),
    });
    let locker = Locker::new(backend.clone()).with_options(options(60_000));
    let caller = tokio::spawn(async move { locker.acquire("job").await.map(drop) });
    *backend.caller.lock().expect("lock") = Some(caller.abort_handle());
    assert!(caller.await.expect_err("aborted").is_cancelled());
    tokio::time::sleep(ms(10)).await;
    let name = LockName::new("job").expect("ok");
    assert!(
        memory.inspect(&name).await.expect("ok").is_none(),
        "the grant leaked"
    );
}

#[test]
fn held_and_timeout_errors_name_the_holders_note() {
    crate::tests::bounded(held_and_timeout_errors_name_the_holders_note_body);
}

async fn held_and_timeout_errors_name_the_holders_note_body() {
    let rig = Rig::new(options(1000));
    let note = crate::Note::new("deploy by run 41").expect("note");
    let with_note = options(1000).with_note(note.clone());
    let _guard = rig
        .locker
        .acquire_with("job", &with_note)
        .await
        .expect("free");
    let once = options(1000).with_wait(WaitMode::TryOnce);
    let err = rig
        .rival()
        .acquire_with("job", &once)
        .await
        .expect_err("held");
    assert_eq!(err.holder().and_then(|h| h.note()), Some(&note));
    assert!(err.to_string().contains("(deploy by run 41)"), "{err}");
    let brief = options(1000).with_wait(WaitMode::Timeout(Duration::from_millis(50)));
    let err = rig
        .rival()
        .acquire_with("job", &brief)
        .await
        .expect_err("timeout");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.to_string().contains("(deploy by run 41)"), "{err}");
}

//! Basic cases: the precondition canary, the acquire/release cycle, inspect, bad input,
//! and many names at once.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use lockcore::{Acquire, AcquireRequest, ErrorKind, Identity, LockOptions, Locker, WaitMode};

use super::{fresh, hold, holder_of, locker};
use crate::harness::Harness;
use crate::report::Report;

/// Two simultaneous conditional creates on a fresh name: exactly one wins (20 rounds).
///
/// Checks: `acquire` contract, "Acquired only if no other owner held an unexpired lease".
/// Guards against servers and emulators that ignore preconditions (fake-gcs-server ignores
/// several; object_store had to skip its GCS precondition tests because of it): every
/// other case is meaningless if this one fails, so it runs first.
pub async fn canary_conditional_create(h: &dyn Harness) -> Report {
    let backend = h.backend();
    let ttl = super::ttl(Duration::from_secs(30));
    for round in 0..20 {
        let name = fresh("canary");
        let a = AcquireRequest::new(name.clone(), Identity::unique(), ttl);
        let b = AcquireRequest::new(name.clone(), Identity::unique(), ttl);
        let (ra, rb) = tokio::join!(backend.acquire(&a), backend.acquire(&b));
        let winners: Vec<_> = [ra.expect("acquire a"), rb.expect("acquire b")]
            .into_iter()
            .filter_map(|r| match r {
                Acquire::Acquired(lease) => Some(lease),
                Acquire::Held(_) => None,
            })
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} of 2 simultaneous conditional creates won",
            winners.len()
        );
        backend.release(&winners[0]).await.expect("release");
    }
    Report::new()
}

/// Try-acquire, release, re-acquire; holding one name does not block another.
///
/// Checks: `acquire` (Held for a second owner), `release` (frees the name), independence of
/// names. Guards against keys that collide across names (a missing separator or hash tag).
pub async fn acquire_release_reacquire(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(30);
    let a = locker(h.backend(), ttl, Duration::ZERO);
    let b = locker(h.backend(), ttl, Duration::ZERO);
    let (one, two) = (fresh("cycle"), fresh("cycle"));
    let g1 = a.try_acquire(&one).await.expect("call").expect("free name");
    assert!(
        b.try_acquire(&one).await.expect("call").is_none(),
        "second owner got a held lock"
    );
    let g2 = b
        .try_acquire(&two)
        .await
        .expect("call")
        .expect("another name is independent");
    g1.release().await.expect("release");
    assert!(
        h.backend().inspect(&one).await.expect("inspect").is_none(),
        "released name still held"
    );
    let g3 = b
        .try_acquire(&one)
        .await
        .expect("call")
        .expect("free after release");
    g3.release().await.expect("release");
    g2.release().await.expect("release");
    Report::new()
}

/// `inspect` shows the holder's identity (and token and remaining TTL where known), and
/// nothing after release.
///
/// Checks: `inspect` contract. Guards against the operator question "who holds the deploy
/// lock?" going unanswered (the "stuck locks" of Lai's GCS locking post are diagnosed this
/// way).
pub async fn inspect_shows_the_holder(h: &dyn Harness) -> Report {
    let ttl = Duration::from_secs(30);
    let (name, guard) = hold(h, "inspect", ttl).await;
    let holder = h
        .backend()
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(
        holder.owner(),
        guard.lease().owner(),
        "inspect names another owner"
    );
    if let (Some(seen), Some(ours)) = (holder.token(), guard.fence_token()) {
        assert_eq!(seen, ours, "inspect shows another grant's token");
    }
    if let Some(left) = holder.expires_in() {
        assert!(
            left <= ttl + Duration::from_secs(1),
            "remaining TTL {left:?} exceeds the TTL"
        );
    }
    guard.release().await.expect("release");
    assert_eq!(holder_of(h, &name).await, None, "still held after release");
    Report::new()
}

/// Bad names and options get typed `InvalidInput` errors and hold nothing.
///
/// Checks: lockcore's validation and the backend's own naming rules. Guards against bad
/// input reaching the server (SQL or key injection) or being retried forever.
pub async fn bad_names_and_options_are_rejected(h: &dyn Harness) -> Report {
    let l = locker(h.backend(), Duration::from_secs(30), Duration::ZERO);
    let mut names: Vec<String> = vec!["".into(), "a\nb".into(), "nul\0".into(), "x".repeat(600)];
    names.extend(h.invalid_names());
    for name in &names {
        let err = l.acquire(name).await.expect_err("bad name accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name:?}: {err}");
    }
    let name = fresh("bad-options");
    let bad = [
        LockOptions::new(Duration::ZERO),
        LockOptions::new(Duration::from_secs(8)).with_refresh_interval(Duration::from_secs(2)),
        LockOptions::new(Duration::from_secs(8)).with_max_refresh_failures(0),
    ];
    for options in bad {
        let err = l
            .acquire_with(&name, &options)
            .await
            .expect_err("bad options accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
    assert!(
        h.backend().inspect(&name).await.expect("inspect").is_none(),
        "bad input held a lock"
    );
    Report::new().metric("invalid_names_checked", names.len() as f64)
}

/// Many names held at once by one process stay independent (default 1000).
///
/// Checks: per-name isolation at scale and one refresher per guard. Guards against shared
/// state between names (one lock's release freeing another) and per-process limits.
pub async fn many_names_held_at_once(h: &dyn Harness) -> Report {
    let count = h.timing().many_names;
    let options = LockOptions::new(Duration::from_secs(60)).with_wait(WaitMode::TryOnce);
    let ours = Locker::new(h.backend()).with_options(options.clone());
    let names: Vec<_> = (0..count).map(|_| fresh("many")).collect();
    let start = tokio::time::Instant::now();
    let guards: Vec<_> = stream::iter(names.iter().cloned())
        .map(|name| {
            let ours = ours.clone();
            async move { ours.acquire(&name).await.expect("free name") }
        })
        .buffered(32)
        .collect()
        .await;
    let took = start.elapsed();
    let rival = Locker::new(h.backend()).with_options(options);
    for index in (0..count).step_by((count / 20).max(1)) {
        let taken = rival.try_acquire(&names[index]).await.expect("call");
        assert!(
            taken.is_none(),
            "name {index} of {count} was free while held"
        );
    }
    let guards = Arc::new(guards);
    for guard in guards.iter().step_by((count / 20).max(1)) {
        assert!(guard.is_held(), "{} lost: {}", guard.name(), guard.state());
    }
    drop(guards);
    Report::new()
        .metric("names", count as f64)
        .metric("acquire_all_ms", super::millis(took))
}

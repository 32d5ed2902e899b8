//! GCS-specific behaviour against the in-process test server: API cost, the server clock,
//! transient faults, recovery from a lost refresh reply, naming rules and redaction.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backend_gcs::{GcsBackend, GcsConfig};
use common::Gcs;
use gcs_test_server::{ClockOffset, Fault};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Health, Identity, Lease, LockBackend, LockName,
    LockOptions, Locker,
};
use serde_json::json;

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

async fn take(backend: &GcsBackend, lock: &str, owner: &Identity, ttl: Duration) -> Acquire {
    let request = AcquireRequest::new(
        name(lock),
        owner.clone(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    backend.acquire(&request).await.expect("acquire")
}

async fn grant(backend: &GcsBackend, lock: &str, ttl: Duration) -> Lease {
    match take(backend, lock, &Identity::unique(), ttl).await {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {holder:?}"),
    }
}

/// Issue 7: an uncontended lock cycle costs exactly two API calls.
#[tokio::test]
async fn an_uncontended_cycle_is_two_api_calls() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    gcs.server.clear_requests();
    let lease = grant(&backend, "cycle", Duration::from_secs(30)).await;
    backend.release(&lease).await.expect("release");
    let calls: Vec<_> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| r.method)
        .collect();
    assert_eq!(calls, ["POST", "DELETE"]);
    assert!(
        gcs.raw_get("cycle").await.is_none(),
        "release left the object"
    );
}

/// The wire calls carry GCS's preconditions as query parameters.
#[tokio::test]
async fn writes_carry_their_preconditions() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "pre", Duration::from_secs(30)).await;
    let lease = backend.refresh(&lease).await.expect("refresh");
    backend.release(&lease).await.expect("release");
    let requests = gcs.server.requests();
    let query = |method: &str| {
        let r = requests.iter().find(|r| r.method == method).expect(method);
        r.query.clone().unwrap_or_default()
    };
    assert!(query("POST").contains("ifGenerationMatch=0"));
    for method in ["PATCH", "DELETE"] {
        let q = query(method);
        assert!(q.contains("ifGenerationMatch="), "{method}: {q}");
        assert!(q.contains("ifMetagenerationMatch="), "{method}: {q}");
    }
    let object = gcs.raw_get("pre").await;
    assert!(object.is_none());
}

/// Server clock 1 h behind the client: another holder's fresh lock stays held, although a
/// client-clock check (Vault, the Ruby gem) would call it an hour stale and steal it.
#[tokio::test]
async fn a_fresh_lock_is_held_whatever_the_client_clock_says() {
    let gcs = Gcs::start().await;
    gcs.server
        .set_clock_offset(ClockOffset::Behind(Duration::from_secs(3600)));
    let backend = gcs.backend().await;
    let holder = grant(&backend, "skew", Duration::from_secs(5)).await;
    match take(
        &backend,
        "skew",
        &Identity::unique(),
        Duration::from_secs(5),
    )
    .await
    {
        Acquire::Held(info) => {
            assert_eq!(info.owner(), holder.owner());
            let left = info.expires_in().expect("time left");
            // Judged on the server's clock: nearly the whole TTL left (the client's clock,
            // an hour ahead of the server's, would say none).
            assert!(
                left >= Duration::from_secs(3) && left <= Duration::from_secs(5),
                "{left:?}"
            );
        }
        Acquire::Acquired(_) => panic!("stole a fresh lock on the client's clock"),
    }
    let inspected = backend.inspect(&name("skew")).await.expect("inspect");
    assert_eq!(
        inspected.map(|i| i.owner().clone()),
        Some(holder.owner().clone())
    );
}

/// A lock whose `updated` + TTL has passed on the server's clock is taken over, although
/// the client's clock says it is still fresh; the new grant fences higher.
#[tokio::test]
async fn a_lock_stale_on_the_server_clock_is_taken_over() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let old = grant(&backend, "stale", Duration::from_secs(60)).await;
    gcs.server
        .set_clock_offset(ClockOffset::Ahead(Duration::from_secs(3600)));
    assert_eq!(
        backend.inspect(&name("stale")).await.expect("inspect"),
        None
    );
    let new = grant(&backend, "stale", Duration::from_secs(60)).await;
    assert!(new.token() > old.token());
    assert!(
        backend
            .refresh(&old)
            .await
            .is_err_and(|e| e.kind() == ErrorKind::Lost)
    );
}

/// As in Lai's GCS locking post: a lock of the same identity is deleted and retaken at once,
/// with a new token.
#[tokio::test]
async fn the_same_identity_retakes_at_once() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let owner = Identity::unique();
    let Acquire::Acquired(first) = take(&backend, "retake", &owner, Duration::from_secs(60)).await
    else {
        panic!("held")
    };
    let Acquire::Acquired(second) = take(&backend, "retake", &owner, Duration::from_secs(60)).await
    else {
        panic!("same identity not retaken")
    };
    assert!(second.token() > first.token());
}

/// A refresh whose reply was lost moved the metageneration; the next refresh recognises
/// the object as still its own and adopts it.
#[tokio::test]
async fn a_refresh_after_a_lost_reply_recovers() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "lost-reply", Duration::from_secs(30)).await;
    gcs.raw_patch("lost-reply", json!({"expires": "later"}))
        .await;
    let refreshed = backend.refresh(&lease).await.expect("recognised as ours");
    assert_ne!(refreshed.grant(), lease.grant());
    backend.refresh(&refreshed).await.expect("refresh again");
}

/// When the object's lease lapses on the server's clock: `updated + ttl_ms`. `updated` is
/// written truncated to the millisecond, so the write happened up to 1 ms after it says.
async fn server_expiry(gcs: &Gcs, lock: &str) -> SystemTime {
    let object = gcs.raw_get(lock).await.expect("object");
    let updated = object["updated"].as_str().expect("updated");
    let ttl_ms: u64 = object["metadata"]["ttl_ms"]
        .as_str()
        .and_then(|ms| ms.parse().ok())
        .expect("ttl_ms");
    humantime::parse_rfc3339(updated).expect("updated is RFC 3339")
        + Duration::from_millis(ttl_ms + 1)
}

/// Issue #14 item 6: a refresh PATCH applied but its reply was lost; the next refresh
/// recovers. The TTL it reports, counted from when it was sent (as lockcore counts it),
/// must not pass the server's expiry: adopting the earlier PATCH's grant without extending
/// it overstated the lease by the time since that PATCH.
#[tokio::test]
async fn a_recovered_refresh_never_reports_more_than_the_server_grants() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "lost-ttl", Duration::from_secs(30)).await;
    gcs.server.inject(Fault::LoseReplies { count: 1 });
    let lost = backend
        .refresh(&lease)
        .await
        .expect_err("the reply was lost");
    assert_eq!(lost.kind(), ErrorKind::OutcomeUnknown, "{lost}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = SystemTime::now();
    let refreshed = backend.refresh(&lease).await.expect("recognised as ours");
    let expiry = server_expiry(&gcs, "lost-ttl").await;
    let claimed = sent + refreshed.ttl().get();
    assert!(
        claimed <= expiry,
        "the lease claims {:?} past the server's expiry",
        claimed.duration_since(expiry).unwrap_or_default()
    );
    backend.refresh(&refreshed).await.expect("refresh again");
}

/// The same end to end: a guard whose refresh reply was lost never reads more remaining
/// validity than the server object still has, right after the refresh that recovers.
#[tokio::test]
async fn a_guard_after_a_lost_refresh_reply_never_outlives_the_server_lease() {
    let gcs = Gcs::start().await;
    let options = LockOptions::new(Duration::from_secs(8))
        .with_refresh_interval(Duration::from_millis(1500))
        .with_max_refresh_failures(2);
    let locker = Locker::new(Arc::new(gcs.backend().await)).with_options(options);
    let guard = locker.acquire("lost-guard").await.expect("acquire");
    gcs.server.clear_requests();
    gcs.server.inject(Fault::LoseReplies { count: 1 });
    let recovered = |log: &[gcs_test_server::RequestRecord]| {
        let first_412 = log
            .iter()
            .position(|r| r.method == "PATCH" && r.status == 412);
        first_412.is_some_and(|at| log[at..].iter().any(|r| r.method == "GET"))
    };
    let deadline = Instant::now() + Duration::from_secs(6);
    while !recovered(&gcs.server.requests()) {
        assert!(Instant::now() < deadline, "{:?}", gcs.server.requests());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let believed = SystemTime::now() + guard.remaining_validity();
    let expiry = server_expiry(&gcs, "lost-guard").await;
    assert!(
        believed <= expiry,
        "the guard believes in {:?} past the server's expiry",
        believed.duration_since(expiry).unwrap_or_default()
    );
    guard.release().await.expect("release");
}

/// Issue #14 (Low): after a refresh whose reply was lost, the lease still names the old
/// metageneration; release must still remove our own object, not leave it until its TTL.
#[tokio::test]
async fn release_after_a_lost_refresh_reply_removes_the_lock() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "lost-release", Duration::from_secs(30)).await;
    gcs.server.inject(Fault::LoseReplies { count: 1 });
    let lost = backend
        .refresh(&lease)
        .await
        .expect_err("the reply was lost");
    assert_eq!(lost.kind(), ErrorKind::OutcomeUnknown, "{lost}");
    backend.release(&lease).await.expect("release");
    assert!(
        gcs.raw_get("lost-release").await.is_none(),
        "release left our own lock in place until its TTL"
    );
}

/// Release after a lost refresh reply still never deletes someone else's lock: a holder
/// that took over (a new generation) keeps it.
#[tokio::test]
async fn release_after_a_lost_reply_spares_a_new_holder() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "lost-spare", Duration::from_secs(30)).await;
    gcs.server.inject(Fault::LoseReplies { count: 1 });
    backend
        .refresh(&lease)
        .await
        .expect_err("the reply was lost");
    let other = Identity::unique();
    gcs.raw_put("lost-spare", &other, Duration::from_secs(30))
        .await;
    backend.release(&lease).await.expect("release");
    let object = gcs
        .raw_get("lost-spare")
        .await
        .expect("the new holder's lock");
    assert_eq!(object["metadata"]["identity"], other.as_str());
}

/// An operator changed the owner in place (same generation): the refresh must not write
/// our identity back over it.
#[tokio::test]
async fn a_refresh_never_overwrites_a_changed_owner() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "intruder", Duration::from_secs(30)).await;
    gcs.raw_patch("intruder", json!({"identity": "intruder"}))
        .await;
    let err = backend
        .refresh(&lease)
        .await
        .expect_err("refreshed a changed lock");
    assert_eq!(err.kind(), ErrorKind::Lost);
    let object = gcs.raw_get("intruder").await.expect("object");
    assert_eq!(object["metadata"]["identity"], "intruder");
}

/// 503 bursts are transient: the guard degrades, then recovers.
#[tokio::test]
async fn server_errors_degrade_then_recover() {
    let gcs = Gcs::start().await;
    let options = LockOptions::new(Duration::from_secs(4))
        .with_refresh_interval(Duration::from_millis(200))
        .with_max_refresh_failures(10);
    let locker = Locker::new(Arc::new(gcs.backend().await)).with_options(options);
    let guard = locker.acquire("burst").await.expect("acquire");
    let mut health = guard.health();
    gcs.server.inject(Fault::ServerErrors { count: 2 });
    let wait = Duration::from_secs(5);
    tokio::time::timeout(
        wait,
        health.wait_for(|h| matches!(h, Health::Degraded { .. })),
    )
    .await
    .expect("never degraded")
    .expect("health");
    tokio::time::timeout(wait, health.wait_for(|h| *h == Health::Healthy))
        .await
        .expect("never recovered")
        .expect("health");
    guard.release().await.expect("release");
}

/// 429 (GCS's per-object mutation limit) on refresh is temporary, not Lost.
#[tokio::test]
async fn rate_limited_refresh_is_temporary() {
    let gcs = Gcs::start().await;
    gcs.server.inject(Fault::gcs_rate_limit());
    let backend = gcs.backend().await;
    let lease = grant(&backend, "rate", Duration::from_secs(30)).await;
    let err = backend.refresh(&lease).await.expect_err("429 expected");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_temporary());
    gcs.server.clear_faults();
    backend
        .refresh(&lease)
        .await
        .expect("refresh after the limit");
}

/// Names GCS rejects fail with InvalidInput before any request is sent.
#[tokio::test]
async fn bad_object_names_are_invalid_input() {
    let gcs = Gcs::start().await;
    let config = GcsConfig::new(&gcs.bucket)
        .and_then(|c| c.with_endpoint(&gcs.server.url()))
        .expect("config");
    let backend = GcsBackend::connect(config).await.expect("backend");
    gcs.server.clear_requests();
    for bad in [".", "..", ".well-known/acme-challenge/token"] {
        let request = AcquireRequest::new(
            name(bad),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
        );
        let err = backend.acquire(&request).await.expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
    }
    assert!(
        gcs.server.requests().is_empty(),
        "a bad name reached the server"
    );
}

/// The access token never shows in Debug, Display or errors.
#[tokio::test]
async fn the_token_is_redacted() {
    let gcs = Gcs::start().await;
    let config = GcsConfig::new(&gcs.bucket)
        .and_then(|c| c.with_endpoint(&gcs.server.url()))
        .expect("config")
        .with_access_token("ya29.s3cr3t-token");
    let backend = GcsBackend::connect(config.clone()).await.expect("backend");
    gcs.server.inject(Fault::ServerErrors { count: 1 });
    let err = backend.inspect(&name("x")).await.expect_err("503");
    for text in [
        format!("{config:?}"),
        config.to_string(),
        format!("{backend:?}"),
        format!("{err:?}"),
        err.to_string(),
    ] {
        assert!(!text.contains("s3cr3t"), "token leaked: {text}");
    }
}

/// `server_time` reports the server's clock, not the client's.
#[tokio::test]
async fn server_time_is_the_servers_clock() {
    let gcs = Gcs::start().await;
    gcs.server
        .set_clock_offset(ClockOffset::Ahead(Duration::from_secs(3600)));
    let server = gcs
        .backend()
        .await
        .server_time()
        .await
        .expect("call")
        .expect("Date");
    let ahead = server
        .duration_since(std::time::SystemTime::now())
        .expect("ahead");
    assert!(ahead > Duration::from_secs(3590), "{ahead:?}");
}

/// `break_lock` removes another holder's lock and turns its refresh Lost.
#[tokio::test]
async fn break_lock_removes_the_holder() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "break", Duration::from_secs(30)).await;
    let broken = backend.break_lock(&name("break")).await.expect("break");
    assert_eq!(
        broken.map(|h| h.owner().clone()),
        Some(lease.owner().clone())
    );
    assert_eq!(
        backend.break_lock(&name("break")).await.expect("again"),
        None
    );
    let err = backend
        .refresh(&lease)
        .await
        .expect_err("refresh after break");
    assert_eq!(err.kind(), ErrorKind::Lost);
}

/// A backend like the test's, with `max_requests` and `timeout`.
async fn bounded_backend(gcs: &Gcs, max_requests: usize, timeout: Duration) -> GcsBackend {
    let config = gcs
        .backend()
        .await
        .config()
        .clone()
        .with_max_requests(max_requests)
        .expect("valid")
        .with_timeout(timeout);
    GcsBackend::connect(config).await.expect("backend")
}

/// Issue 16: a `Locker` whose 10,000 leases fell due together opened ~9,500 connections
/// at once (one per refresh in flight) and spent twice the CPU. `max_requests` bounds
/// the requests in flight: 40 calls at once, 4 slots, the server never sees more than 4.
#[tokio::test]
async fn requests_in_flight_never_exceed_max_requests() {
    let gcs = Gcs::start().await;
    let backend = bounded_backend(&gcs, 4, Duration::from_secs(5)).await;
    gcs.server.inject(Fault::Delay(Duration::from_millis(50)));
    gcs.server.clear_requests();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..40 {
        let backend = backend.clone();
        calls.spawn(async move { backend.inspect(&name(&format!("slot-{i}"))).await });
    }
    while let Some(outcome) = calls.join_next().await {
        assert_eq!(outcome.expect("no panic").expect("inspect"), None);
    }
    assert_eq!(gcs.server.requests().len(), 40);
    // Exactly 4: the calls did overlap, so an unbounded client would show 40 here.
    assert_eq!(gcs.server.most_in_flight(), 4);
}

/// An operation keeps its turn until it ends: with one slot, an acquire of a held lock
/// (insert → 412, then GET) sends both requests before a call that queued behind its
/// first one sends anything. Turns taken per request would put the inspect's GET between
/// the acquire's two.
#[tokio::test]
async fn an_operation_keeps_its_turn_until_it_ends() {
    let gcs = Gcs::start().await;
    let backend = bounded_backend(&gcs, 1, Duration::from_secs(5)).await;
    grant(&backend, "busy", Duration::from_secs(30)).await;
    gcs.server.inject(Fault::Delay(Duration::from_millis(200)));
    gcs.server.clear_requests();
    let contender = backend.clone();
    let acquire = tokio::spawn(async move {
        take(
            &contender,
            "busy",
            &Identity::unique(),
            Duration::from_secs(30),
        )
        .await
    });
    // Queued while the acquire's insert is at the server.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let inspect = backend.inspect(&name("other")).await.expect("inspect");
    assert_eq!(inspect, None);
    assert!(matches!(acquire.await.expect("no panic"), Acquire::Held(_)));
    let calls: Vec<_> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path.ends_with("other")))
        .collect();
    let expected = [("POST", false), ("GET", false), ("GET", true)];
    let expected: Vec<_> = expected.map(|(m, o)| (m.to_owned(), o)).into();
    assert_eq!(calls, expected);
}

/// A call dropped while its request is at the server gives its slot back: with one slot,
/// the next call goes through at once.
#[tokio::test]
async fn a_call_dropped_mid_request_gives_its_slot_back() {
    let gcs = Gcs::start().await;
    let backend = bounded_backend(&gcs, 1, Duration::from_secs(2)).await;
    gcs.server.inject(Fault::Delay(Duration::from_millis(500)));
    let dropped = backend.clone();
    let call = tokio::spawn(async move { dropped.inspect(&name("dropped")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    gcs.server.clear_faults();
    assert_eq!(
        backend.inspect(&name("next")).await.expect("a free slot"),
        None
    );
}

/// A call that waits for a slot longer than the request timeout fails as `Unavailable`,
/// saying what to raise, and sends nothing. One slot, 1 s per request, 1.5 s timeout: the
/// third call's turn would come at 2 s.
#[tokio::test]
async fn a_call_that_waits_too_long_for_a_slot_sends_nothing() {
    let gcs = Gcs::start().await;
    let backend = bounded_backend(&gcs, 1, Duration::from_millis(1_500)).await;
    gcs.server.inject(Fault::Delay(Duration::from_secs(1)));
    gcs.server.clear_requests();
    let mut calls = Vec::new();
    for i in 0..3 {
        let backend = backend.clone();
        calls.push(tokio::spawn(async move {
            backend.inspect(&name(&format!("queued-{i}"))).await
        }));
        // Queued in this order (the slots are first come, first served).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.expect("no panic"));
    }
    assert_eq!(outcomes[0].as_ref().expect("first"), &None);
    assert_eq!(outcomes[1].as_ref().expect("second"), &None);
    let err = outcomes[2].as_ref().expect_err("no slot in time");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("max_requests"), "{err}");
    assert!(err.to_string().contains("nothing was sent"), "{err}");
    assert_eq!(
        gcs.server.requests().len(),
        2,
        "the third call sent nothing"
    );
}

#[test]
fn max_requests_is_read_from_the_url_and_checked() {
    let config = GcsConfig::from_url("gs://locks?max_requests=8").expect("valid");
    assert_eq!(config.max_requests(), 8);
    let default = GcsConfig::from_url("gs://locks").expect("valid");
    assert_eq!(default.max_requests(), backend_gcs::DEFAULT_MAX_REQUESTS);
    for bad in ["0", "-1", "10001", "many", ""] {
        let err =
            GcsConfig::from_url(&format!("gs://locks?max_requests={bad}")).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
        assert!(err.to_string().contains("max_requests"), "{bad}: {err}");
    }
}

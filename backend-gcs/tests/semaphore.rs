//! Semaphore permits against the in-process test server, for what the shared conformance
//! cases cannot see: the objects on the server (slot objects apart from the lock's), separate backend instances contending, the server's clock, races and lost
//! replies at a chosen request (through [`Relay`]), and planted objects.

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backend_gcs::GcsBackend;
use common::Gcs;
use gcs_test_server::ClockOffset;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, HolderInfo, Identity, Lease, LockBackend, LockName,
    LockOptions, Locker, Permits, WaitMode,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LONG: Duration = Duration::from_secs(30);

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

fn request(sem: &str, owner: &Identity, n: u32, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        name(sem),
        owner.clone(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    )
    .with_permits(Permits::new(n).expect("count"))
}

async fn attempt(backend: &GcsBackend, sem: &str, owner: &Identity, n: u32) -> Acquire {
    backend
        .acquire_permit(&request(sem, owner, n, LONG))
        .await
        .expect("permit attempt")
}

async fn permit(backend: &GcsBackend, sem: &str, owner: &Identity, n: u32) -> Lease {
    match attempt(backend, sem, owner, n).await {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{sem}: full, first to expire {}", holder.owner()),
    }
}

fn held(outcome: Acquire) -> HolderInfo {
    match outcome {
        Acquire::Held(holder) => holder,
        Acquire::Acquired(lease) => panic!("granted {}", lease.grant()),
    }
}

fn owners(holders: &[HolderInfo]) -> Vec<Identity> {
    holders.iter().map(|h| h.owner().clone()).collect()
}

/// The slot object name (after the bucket prefix) of slot `index` of `sem`.
fn slot(sem: &str, index: u32) -> String {
    format!("{sem}\tpermit-{index}")
}

/// The slot index and generation a permit lease's grant (`slot:generation:meta`) names.
fn slot_of(lease: &Lease) -> (u32, u64) {
    let parts: Vec<u64> = lease
        .grant()
        .split(':')
        .filter_map(|p| p.parse().ok())
        .collect();
    assert_eq!(
        parts.len(),
        3,
        "a permit grant is slot:generation:metageneration, not {}",
        lease.grant()
    );
    (u32::try_from(parts[0]).expect("slot"), parts[1])
}

fn generation(resource: &Value) -> u64 {
    resource["generation"]
        .as_str()
        .and_then(|g| g.parse().ok())
        .expect("generation")
}

/// Every object name (after the bucket prefix) under `prefix`, straight from the server.
async fn raw_names(gcs: &Gcs, prefix: &str) -> Vec<String> {
    let under = format!("{}{prefix}", gcs.prefix);
    let under = percent_encoding::utf8_percent_encode(&under, percent_encoding::NON_ALPHANUMERIC);
    let url = format!(
        "{}/storage/v1/b/{}/o?prefix={under}&maxResults=1000",
        gcs.url, gcs.bucket
    );
    let page: Value = reqwest::Client::new()
        .get(url)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("JSON");
    let items = page["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter_map(|i| i["name"].as_str())
        .filter_map(|n| n.strip_prefix(&gcs.prefix).map(str::to_owned))
        .collect()
}

/// The slot objects of `sem` on the server (names after the bucket prefix).
async fn raw_slots(gcs: &Gcs, sem: &str) -> Vec<String> {
    let mut names = raw_names(gcs, &format!("{sem}\tpermit-")).await;
    names.retain(|n| !n.ends_with("permit-fence"));
    names
}

/// Issue 18: a semaphore `x` and a lock `x` (or a lock named like a slot with any other
/// separator) never exclude each other, and the permit never touches the lock's object.
#[tokio::test]
async fn a_lock_and_a_semaphore_of_one_name_are_independent() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let locker = Locker::new(Arc::new(backend.clone())).with_options(LockOptions::new(LONG));
    let lock = locker.acquire("x").await.expect("lock x");
    let lock_object = gcs.raw_get("x").await.expect("the lock object");
    // Names a slot would have with a `/`, `.`, `:`, `-` or space instead of the TAB.
    let lookalikes = [
        "x/permit-0",
        "x.permit-0",
        "x:permit-0",
        "x-permit-0",
        "x permit-0",
    ];
    let mut others = Vec::new();
    for lookalike in lookalikes {
        others.push(locker.acquire(lookalike).await.expect("a lookalike lock"));
    }
    let (a, b) = (Identity::unique(), Identity::unique());
    let first = permit(&backend, "x", &a, 1).await;
    assert_eq!(
        held(attempt(&backend, "x", &b, 1).await).owner(),
        &a,
        "the semaphore of 1 is full: the lock does not count, the permit does"
    );
    let rival = Locker::new(Arc::new(backend.clone()))
        .with_options(LockOptions::new(LONG).with_wait(WaitMode::TryOnce));
    assert!(rival.try_acquire("x").await.expect("answer").is_none());
    assert_eq!(
        gcs.raw_get("x").await.expect("lock object"),
        lock_object,
        "the permit touched the lock's object"
    );
    let holder = backend.inspect(&name("x")).await.expect("inspect");
    assert_eq!(holder.expect("lock held").owner(), lock.lease().owner());
    assert_eq!(
        owners(&backend.inspect_permits(&name("x")).await.expect("permits")),
        std::slice::from_ref(&a)
    );
    let listed = backend.list("").await.expect("list");
    let listed: Vec<&str> = listed.iter().map(|l| l.name().as_str()).collect();
    assert_eq!(
        listed.len(),
        1 + lookalikes.len(),
        "list shows locks only: {listed:?}"
    );
    // Breaking or releasing the lock leaves the permit, and the other way round.
    backend.break_lock(&name("x")).await.expect("break");
    assert_eq!(
        owners(&backend.inspect_permits(&name("x")).await.expect("permits")),
        std::slice::from_ref(&a)
    );
    let again = locker.acquire("x").await.expect("lock x again");
    backend.release(&first).await.expect("release the permit");
    assert!(
        gcs.raw_get("x").await.is_some(),
        "the permit's release deleted the lock"
    );
    assert_eq!(
        backend
            .inspect(&name("x"))
            .await
            .expect("inspect")
            .map(|h| h.owner().clone()),
        Some(again.lease().owner().clone())
    );
    again.release().await.expect("release");
    for other in others {
        other.release().await.expect("release");
    }
    drop(lock);
}

/// Six backend instances (each its own HTTP client and connections) take and give back
/// permits of a semaphore of 2: never more than 2 holders at once, 2 reached, tokens all
/// distinct, and no slot object of an index of 2 or more ever on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_backends_never_exceed_n() {
    const N: u32 = 2;
    let gcs = Arc::new(Gcs::start().await);
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (gcs, done) = (gcs.clone(), done.clone());
        tokio::spawn(async move {
            let mut indices = std::collections::BTreeSet::new();
            while !done.load(Ordering::SeqCst) {
                for object in raw_slots(&gcs, "pool").await {
                    if let Some(i) = object.strip_prefix("pool\tpermit-") {
                        indices.insert(i.to_owned());
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            indices
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let backend = gcs.backend().await;
        let options = LockOptions::new(LONG).with_wait(WaitMode::Forever);
        let locker = Locker::new(Arc::new(backend)).with_options(options);
        let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = locker.acquire_permit("pool", N).await.expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let token = guard.fence_token().expect("fenced");
                tokens
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(token);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender");
    }
    done.store(true, Ordering::SeqCst);
    let indices = watcher.await.expect("watcher");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= N as usize, "{most} holders of a semaphore of {N}");
    assert_eq!(most, N as usize, "never {N} holders at once");
    let tokens = tokens
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let distinct: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(distinct.len(), 60, "a token was handed out twice");
    assert!(
        indices.iter().all(|i| i == "0" || i == "1"),
        "slot indices seen: {indices:?}"
    );
    assert!(
        raw_slots(&gcs, "pool").await.is_empty(),
        "every release deleted its slot"
    );
}

/// A holder that crashed (never refreshed nor released) loses its place once its slot is
/// stale by the server's clock: with the server 1 h ahead a 30 s permit is taken over at
/// once, and the crashed lease's refresh is `Lost` and its release frees nothing. With
/// the server 1 h behind, a fresh permit stays held (the client's clock would call it
/// stale).
#[tokio::test]
async fn a_crashed_holders_permit_is_taken_over_by_the_servers_clock() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let (a, b) = (Identity::unique(), Identity::unique());
    let crashed = permit(&backend, "crash", &a, 1).await;
    let holder = held(attempt(&backend, "crash", &b, 1).await);
    assert_eq!(holder.owner(), &a);
    assert!(holder.expires_in().is_some_and(|left| left <= LONG));
    gcs.server
        .set_clock_offset(ClockOffset::Ahead(Duration::from_secs(3600)));
    let taken = permit(&backend, "crash", &b, 1).await;
    assert!(
        taken.token() > crashed.token(),
        "a takeover gets a greater token"
    );
    let err = backend.refresh(&crashed).await.expect_err("taken over");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    backend
        .release(&crashed)
        .await
        .expect("a stale release is Ok");
    assert_eq!(
        owners(
            &backend
                .inspect_permits(&name("crash"))
                .await
                .expect("permits")
        ),
        std::slice::from_ref(&b)
    );
    backend.release(&taken).await.expect("release");

    gcs.server
        .set_clock_offset(ClockOffset::Behind(Duration::from_secs(3600)));
    let fresh = permit(&backend, "behind", &a, 1).await;
    assert_eq!(held(attempt(&backend, "behind", &b, 1).await).owner(), &a);
    backend.release(&fresh).await.expect("release");
}

/// A race lost at the slot's conditional write: another contender takes the slot between
/// our list and our write. The attempt answers `Held` naming the winner and writes no
/// permit (only the token it drew is skipped); the winner's slot is untouched. And an
/// attempt on a full semaphore sends one request (the list) and writes nothing.
#[tokio::test]
async fn a_lost_race_answers_held_and_writes_no_permit() {
    let gcs = Gcs::start().await;
    let rival = Arc::new(gcs.backend().await);
    let winner = Identity::unique();
    let won: Arc<Mutex<Option<Lease>>> = Arc::default();
    let hook: Hook = {
        let (rival, winner, won) = (rival.clone(), winner.clone(), won.clone());
        let fired = Arc::new(AtomicBool::new(false));
        Arc::new(move |call: Call| {
            let (rival, winner, won, fired) =
                (rival.clone(), winner.clone(), won.clone(), fired.clone());
            Box::pin(async move {
                if call.is_insert_of("permit-0") && !fired.swap(true, Ordering::SeqCst) {
                    let lease = permit(&rival, "race", &winner, 1).await;
                    *won.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
                }
                Act::Forward
            })
        })
    };
    let relay = Relay::start(&gcs.url, hook).await;
    let ours = gcs.backend_at(&relay.url()).await;
    let loser = Identity::unique();
    let holder = held(attempt(&ours, "race", &loser, 1).await);
    assert_eq!(holder.owner(), &winner, "Held names the winner");
    let lease = won
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .expect("the rival moved in between");
    let object = gcs
        .raw_get(&slot("race", 0))
        .await
        .expect("the winner's slot");
    assert_eq!(
        generation(&object),
        slot_of(&lease).1,
        "the loser wrote the slot"
    );
    assert_eq!(object["metadata"]["identity"], winner.as_str());
    assert_eq!(
        owners(&ours.inspect_permits(&name("race")).await.expect("permits")),
        std::slice::from_ref(&winner)
    );

    gcs.server.clear_requests();
    let third = held(attempt(&ours, "race", &Identity::unique(), 1).await);
    assert_eq!(third.owner(), &winner);
    let calls: Vec<(String, u16)> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        calls,
        [("GET".to_owned(), 200)],
        "a full semaphore costs one list"
    );
    rival.release(&lease).await.expect("release");
}

/// Two first attempts with different limits that both list the empty semaphore before
/// either writes never both keep a permit. The relay holds our slot write (N = 3) while a
/// rival (N = 2) lists, writes and checks; then ours lands. On the same slot ours loses
/// the race (`Held`); on another slot ours must find the rival's limit after its write,
/// take its permit back and refuse (`InvalidInput`). Without the check after the write
/// both were granted (a 2-limit and a 3-limit holder at once: the caveat docs/gcs.md had).
#[tokio::test]
async fn racing_first_attempts_with_different_limits_never_both_hold() {
    let gcs = Gcs::start().await;
    let rival = Arc::new(gcs.backend().await);
    let rivals: Arc<Mutex<Vec<Lease>>> = Arc::default();
    let round = Arc::new(Mutex::new(String::new()));
    let hook: Hook = {
        let (rival, rivals, round) = (rival.clone(), rivals.clone(), round.clone());
        Arc::new(move |call: Call| {
            let (rival, rivals, round) = (rival.clone(), rivals.clone(), round.clone());
            Box::pin(async move {
                if call.is_insert_of("permit-") {
                    let sem = round.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    let lease = permit(&rival, &sem, &Identity::unique(), 2).await;
                    rivals
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(lease);
                }
                Act::Forward
            })
        })
    };
    let relay = Relay::start(&gcs.url, hook).await;
    let ours = gcs.backend_at(&relay.url()).await;
    let mut refused = 0;
    for i in 0..12 {
        let sem = format!("mixed-{i}");
        round
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone_from(&sem);
        let me = Identity::unique();
        match ours.acquire_permit(&request(&sem, &me, 3, LONG)).await {
            Ok(Acquire::Acquired(lease)) => {
                panic!(
                    "{sem}: a 3-limit permit granted beside a 2-limit one ({})",
                    lease.grant()
                )
            }
            Ok(Acquire::Held(holder)) => assert_ne!(holder.owner(), &me),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
                assert!(err.to_string().contains("same limit"), "{err}");
                refused += 1;
            }
        }
        let holders = ours.inspect_permits(&name(&sem)).await.expect("permits");
        assert_eq!(holders.len(), 1, "{sem}: only the rival holds: {holders:?}");
        assert_ne!(holders[0].owner(), &me, "{sem}: our permit was left behind");
    }
    assert!(
        refused > 0,
        "never on different slots in 12 rounds: the check was not reached"
    );
    let leases = std::mem::take(&mut *rivals.lock().unwrap_or_else(PoisonError::into_inner));
    for lease in leases {
        rival.release(&lease).await.expect("release");
    }
}

/// An owner whose live permit sits beside a permit of another limit (its earlier attempt
/// could not finish the check after its write) gets the refusal and its permit goes: a
/// refused attempt leaves nothing held.
#[tokio::test]
async fn a_refusal_for_mixed_limits_takes_the_owners_own_permit_back() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let me = Identity::unique();
    let mine = permit(&backend, "both", &me, 2).await;
    let (index, _) = slot_of(&mine);
    let other = json!({"identity": "someone", "ttl_ms": "30000", "permits": "3"});
    gcs.raw_put_metadata(&slot("both", 2), other).await;
    let err = backend
        .acquire_permit(&request("both", &me, 2, LONG))
        .await
        .expect_err("mixed limits");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(
        gcs.raw_get(&slot("both", index)).await.is_none(),
        "the refused owner's permit was left behind"
    );
    let err = backend.refresh(&mine).await.expect_err("taken back");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
}

/// A refusal leaves alone a permit of the owner's identity taken with another limit:
/// another process sharing the identity (`Locker::with_identity`) whose limit may be the
/// right one keeps its permit, as on every other backend (the review's reproduction: the
/// misconfigured process deleted the correct holder's permit).
#[tokio::test]
async fn a_refusal_leaves_a_permit_of_our_identity_with_another_limit() {
    let gcs = Gcs::start().await;
    let (first, second) = (gcs.backend().await, gcs.backend().await);
    let shared = Identity::named("svc").expect("identity");
    let kept = permit(&first, "shared", &shared, 2).await;
    let err = second
        .acquire_permit(&request("shared", &shared, 3, LONG))
        .await
        .expect_err("mixed limits");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let (index, _) = slot_of(&kept);
    assert!(gcs.raw_get(&slot("shared", index)).await.is_some());
    let kept = first.refresh(&kept).await.expect("the first permit lives");
    first.release(&kept).await.expect("release");
}

/// The check after the slot write cannot be made (its list's reply is lost): the slot
/// written is deleted and the attempt answers `Unavailable`, so a try-once leaves nothing
/// held for a TTL by an identity nobody will use again (the review's reproduction).
#[tokio::test]
async fn a_check_that_cannot_be_made_takes_the_permit_back() {
    let gcs = Gcs::start().await;
    let lists = Arc::new(AtomicUsize::new(0));
    let hook: Hook = {
        let lists = lists.clone();
        Arc::new(move |call: Call| {
            let lists = lists.clone();
            Box::pin(async move {
                if call.method == "GET" && lists.fetch_add(1, Ordering::SeqCst) == 1 {
                    Act::LoseReply
                } else {
                    Act::Forward
                }
            })
        })
    };
    let relay = Relay::start(&gcs.url, hook).await;
    let ours = gcs.backend_at(&relay.url()).await;
    let err = ours
        .acquire_permit(&request("unchecked", &Identity::unique(), 2, LONG))
        .await
        .expect_err("the check failed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("deleted"), "{err}");
    assert_eq!(lists.load(Ordering::SeqCst), 2, "the list and the check");
    assert!(
        raw_slots(&gcs, "unchecked").await.is_empty(),
        "the unchecked permit was left behind"
    );
}

/// The slot's create lands but its reply is lost (`OutcomeUnknown`); the owner's retry
/// finds its own permit and retakes it (new grant, greater token) instead of taking a
/// second place.
#[tokio::test]
async fn a_lost_reply_after_the_create_landed_is_recognised_as_ours() {
    let gcs = Gcs::start().await;
    let lost = Arc::new(AtomicBool::new(false));
    let hook: Hook = {
        let lost = lost.clone();
        Arc::new(move |call: Call| {
            let lost = lost.clone();
            Box::pin(async move {
                if call.is_insert_of("permit-") && !lost.swap(true, Ordering::SeqCst) {
                    Act::LoseReply
                } else {
                    Act::Forward
                }
            })
        })
    };
    let relay = Relay::start(&gcs.url, hook).await;
    let backend = gcs.backend_at(&relay.url()).await;
    let owner = Identity::unique();
    let err = backend
        .acquire_permit(&request("lossy", &owner, 2, LONG))
        .await
        .expect_err("the reply was lost");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let landed = raw_slots(&gcs, "lossy").await;
    assert_eq!(landed.len(), 1, "the create landed: {landed:?}");
    let first = gcs.raw_get(&landed[0]).await.expect("slot");
    assert_eq!(first["metadata"]["identity"], owner.as_str());
    let retry = permit(&backend, "lossy", &owner, 2).await;
    assert_eq!(
        slot("lossy", slot_of(&retry).0),
        landed[0],
        "the retry retook its own slot"
    );
    assert!(slot_of(&retry).1 > generation(&first), "a new grant");
    let token = generation(&first);
    assert!(
        retry.token().expect("token").get() > token,
        "a greater token"
    );
    assert_eq!(
        owners(
            &backend
                .inspect_permits(&name("lossy"))
                .await
                .expect("permits")
        ),
        std::slice::from_ref(&owner),
        "one permit per owner"
    );
    assert_eq!(raw_slots(&gcs, "lossy").await.len(), 1);
    backend.release(&retry).await.expect("release");
}

/// An object planted at a slot's name without what a permit needs is a `Protocol` error
/// for acquire and inspect alike (through the `Locker` too), never a panic or a guess;
/// objects under the semaphore's prefix with names this version never writes are left
/// alone.
#[tokio::test]
async fn a_planted_slot_with_garbage_metadata_is_a_typed_error() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let good = json!({"identity": "someone", "ttl_ms": "30000", "permits": "2"});
    let cases = [
        (
            "ttl_ms",
            json!({"identity": "someone", "ttl_ms": "soon", "permits": "2"}),
        ),
        ("identity", json!({"ttl_ms": "30000", "permits": "2"})),
        (
            "permits",
            json!({"identity": "someone", "ttl_ms": "30000", "permits": "lots"}),
        ),
        (
            "permits",
            json!({"identity": "someone", "ttl_ms": "30000", "permits": "0"}),
        ),
        ("identity", json!({})),
    ];
    for (i, (field, metadata)) in cases.into_iter().enumerate() {
        let sem = format!("planted-{i}");
        gcs.raw_put_metadata(&slot(&sem, 1), metadata).await;
        let err = backend
            .acquire_permit(&request(&sem, &Identity::unique(), 2, LONG))
            .await
            .expect_err("a slot anylock did not write");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{sem}: {err}");
        assert!(err.to_string().contains(field), "{sem}: {err}");
        let err = backend
            .inspect_permits(&name(&sem))
            .await
            .expect_err("inspect");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{sem}: {err}");
        let locker = Locker::new(Arc::new(backend.clone())).with_options(LockOptions::new(LONG));
        let err = locker
            .try_acquire_permit(&sem, 2)
            .await
            .expect_err("locker");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{sem}: {err}");
    }
    // Names this version never writes under the semaphore's prefix are not slots.
    for odd in ["odd\tpermit-01", "odd\tpermit-x", "odd\tnotes"] {
        gcs.raw_put_metadata(odd, json!({})).await;
    }
    gcs.raw_put_metadata(&slot("odd", 0), good).await;
    let lease = permit(&backend, "odd", &Identity::unique(), 2).await;
    assert_eq!(slot_of(&lease).0, 1, "slot 0 is someone's");
    assert_eq!(
        backend
            .inspect_permits(&name("odd"))
            .await
            .expect("inspect")
            .len(),
        2
    );
    backend.release(&lease).await.expect("release");
}

/// The token is the slot object's generation, as a lock's is its object's: it rises
/// across releases (every slot gone, a slot object created anew), retakes and other slots,
/// and a grant that lands after another's release always has the higher token (what a
/// semaphore of one needs to fence like a lock).
#[tokio::test]
async fn permit_tokens_are_slot_generations_and_rise() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let owner = Identity::unique();
    let first = permit(&backend, "fenced", &owner, 1).await;
    let stored = gcs.raw_get(&slot("fenced", 0)).await.expect("slot");
    assert_eq!(Some(generation(&stored)), first.token().map(|t| t.get()));
    backend.release(&first).await.expect("release");
    assert!(raw_slots(&gcs, "fenced").await.is_empty(), "no slot left");
    let second = permit(&backend, "fenced", &Identity::unique(), 1).await;
    assert!(second.token() > first.token(), "after a release");
    backend.release(&second).await.expect("release");
    let third = permit(&backend, "fenced", &owner, 1).await;
    let retake = permit(&backend, "fenced", &owner, 1).await;
    assert!(third.token() > second.token(), "a new slot object");
    assert!(retake.token() > third.token(), "a retake");
    backend.release(&retake).await.expect("release");
}

/// One `refresh_many` of a lock's and two permits' leases (one batch request): each is
/// refreshed on its own object; a permit whose slot was taken over is `Lost` alone.
#[tokio::test]
async fn a_batch_mixes_locks_and_permits() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let ttl = lockcore::Ttl::new(LONG).expect("ttl");
    let lock_request = AcquireRequest::new(name("mix"), Identity::unique(), ttl);
    let Acquire::Acquired(lock) = backend.acquire(&lock_request).await.expect("lock") else {
        panic!("free lock");
    };
    let p = permit(&backend, "mix", &Identity::unique(), 2).await;
    let q = permit(&backend, "mix", &Identity::unique(), 2).await;
    gcs.server.clear_requests();
    let refreshed = backend
        .refresh_many(&[lock.clone(), p.clone(), q.clone()])
        .await;
    let refreshed: Vec<Lease> = refreshed
        .into_iter()
        .map(|r| r.expect("refreshed"))
        .collect();
    let methods: Vec<String> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| r.method)
        .collect();
    assert_eq!(
        methods.iter().filter(|m| *m == "POST").count(),
        1,
        "{methods:?}"
    );
    for (before, after) in [&lock, &p, &q].into_iter().zip(&refreshed) {
        assert_ne!(before.grant(), after.grant(), "a new metageneration");
        assert_eq!(before.permits(), after.permits());
        assert_eq!(before.token(), after.token());
    }
    assert_eq!(slot_of(&refreshed[1]).0, slot_of(&p).0, "the same slot");
    let q_slot = slot("mix", slot_of(&q).0);
    let stored = gcs.raw_get(&q_slot).await.expect("slot");
    assert_eq!(
        Some(generation(&stored)),
        q.token().map(|t| t.get()),
        "the token is the slot's generation"
    );
    assert_eq!(
        stored["metadata"]["permits"], "2",
        "the PATCH keeps the limit"
    );
    gcs.raw_put_metadata(
        &q_slot,
        json!({"identity": "thief", "ttl_ms": "30000", "permits": "2"}),
    )
    .await;
    let again = backend.refresh_many(&refreshed).await;
    let kinds: Vec<_> = again
        .iter()
        .map(|r| r.as_ref().err().map(lockcore::Error::kind))
        .collect();
    assert_eq!(kinds, [None, None, Some(ErrorKind::Lost)]);
    for lease in again.into_iter().flatten() {
        backend.release(&lease).await.expect("release");
    }
    assert!(gcs.raw_get(&slot("mix", slot_of(&p).0)).await.is_none());
    assert!(gcs.raw_get("mix").await.is_none());
}

/// What a permit costs in API calls: an uncontended cycle is 4 (list, slot insert, the
/// list that checks no other limit was written meanwhile, delete), as a lock's is 2
/// (insert, delete) plus the two lists; a refresh 1 PATCH.
#[tokio::test]
async fn an_uncontended_permit_cycle_is_four_api_calls() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    gcs.server.clear_requests();
    let lease = permit(&backend, "cost", &Identity::unique(), 3).await;
    let lease = backend.refresh(&lease).await.expect("refresh");
    backend.release(&lease).await.expect("release");
    let calls: Vec<(String, String)> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.query.unwrap_or_default()))
        .collect();
    let methods: Vec<&str> = calls.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        methods,
        ["GET", "POST", "GET", "PATCH", "DELETE"],
        "{calls:?}"
    );
    assert!(calls[1].1.contains("ifGenerationMatch=0"), "{}", calls[1].1);
    assert_eq!(calls[0].1, calls[2].1, "the check lists the same prefix");
    for refresh_or_delete in &calls[3..] {
        assert!(
            refresh_or_delete.1.contains("ifMetagenerationMatch="),
            "{}",
            refresh_or_delete.1
        );
    }
}

/// A semaphore of one fences like a lock: a rival that takes and releases the place while
/// our slot write is on its way (the relay runs it at that moment) holds an earlier grant,
/// so ours must carry the higher token. With tokens drawn from a counter object before the
/// slot write (this crate's first design) ours carried the lower one (the second review's
/// reproduction).
#[tokio::test]
async fn a_grant_after_a_rivals_release_has_the_higher_token() {
    let gcs = Gcs::start().await;
    let rival = Arc::new(gcs.backend().await);
    let rival_token: Arc<Mutex<Option<u64>>> = Arc::default();
    let hook: Hook = {
        let (rival, rival_token) = (rival.clone(), rival_token.clone());
        let fired = Arc::new(AtomicBool::new(false));
        Arc::new(move |call: Call| {
            let (rival, rival_token, fired) = (rival.clone(), rival_token.clone(), fired.clone());
            Box::pin(async move {
                if call.is_insert_of("permit-0") && !fired.swap(true, Ordering::SeqCst) {
                    let lease = permit(&rival, "back", &Identity::unique(), 1).await;
                    let token = lease.token().expect("token").get();
                    *rival_token.lock().expect("lock") = Some(token);
                    rival.release(&lease).await.expect("release");
                }
                Act::Forward
            })
        })
    };
    let relay = Relay::start(&gcs.url, hook).await;
    let ours = gcs.backend_at(&relay.url()).await;
    let lease = permit(&ours, "back", &Identity::unique(), 1).await;
    let theirs = rival_token.lock().expect("lock").expect("the rival ran");
    let mine = lease.token().expect("token").get();
    assert!(
        mine > theirs,
        "token went backwards: the later grant {mine} < the earlier {theirs}"
    );
}

// ---- Relay: an HTTP/1.1 hop in front of the test server that acts at chosen requests.

/// One request as the relay saw it.
struct Call {
    method: String,
    body: String,
}

impl Call {
    /// A multipart insert of an object whose name contains `part` followed by anything
    /// but more of the name (`permit-0` is slot 0; `permit-` any slot, never the fence).
    fn is_insert_of(&self, part: &str) -> bool {
        self.method == "POST" && self.body.contains(part) && !self.body.contains("permit-fence")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Forward it and relay the reply.
    Forward,
    /// Forward it (the server applies it), then close the connection instead of
    /// relaying the reply: a reply lost on the way back.
    LoseReply,
}

type Hook = Arc<dyn Fn(Call) -> Pin<Box<dyn Future<Output = Act> + Send>> + Send + Sync>;

struct Relay {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    async fn start(upstream: &str, hook: Hook) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let upstream = upstream.to_owned();
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(relay(stream, upstream.clone(), hook.clone(), http.clone()));
            }
        });
        Self { addr, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn relay(mut stream: TcpStream, upstream: String, hook: Hook, http: reqwest::Client) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next().unwrap_or_default().split(' ');
        let method = request_line.next().unwrap_or_default().to_owned();
        let target = request_line.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        let mut length = 0;
        for line in lines {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim().to_owned(), value.trim().to_owned());
            if key.eq_ignore_ascii_case("content-length") {
                length = value.parse().unwrap_or(0);
            } else if !key.eq_ignore_ascii_case("host") && !key.eq_ignore_ascii_case("connection") {
                headers.push((key, value));
            }
        }
        let start = head_end + 4;
        while buf.len() < start + length {
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        }
        let body = buf[start..start + length].to_vec();
        buf.drain(..start + length);
        let call = Call {
            method: method.clone(),
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        let act = hook(call).await;
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut forward = http
            .request(method, format!("{upstream}{target}"))
            .body(body);
        for (key, value) in headers {
            forward = forward.header(key, value);
        }
        let Ok(reply) = forward.send().await else {
            return;
        };
        let status = reply.status();
        let reply_headers = reply.headers().clone();
        let Ok(reply_body) = reply.bytes().await else {
            return;
        };
        if act == Act::LoseReply {
            return; // the connection closes without a reply
        }
        let mut out = format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("?")
        );
        for (key, value) in &reply_headers {
            let skip = ["content-length", "transfer-encoding", "connection"];
            if !skip.contains(&key.as_str()) {
                out.push_str(&format!(
                    "{key}: {}\r\n",
                    value.to_str().unwrap_or_default()
                ));
            }
        }
        out.push_str(&format!("content-length: {}\r\n\r\n", reply_body.len()));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&reply_body);
        if stream.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// Reads what the stream has into `buf`; `false` at its end.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

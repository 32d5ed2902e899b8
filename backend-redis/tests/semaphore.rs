//! `RedisBackend`'s semaphores (issue 18), beyond the shared conformance cases: a permit
//! and the lock of one name share no key, counter or exclusion; separate backends (separate
//! connections) never admit more than N holders; permit tokens survive a lost counter as
//! the lock's do; planted keys are typed errors that write nothing; a batch mixing lock and
//! permit leases refreshes each by its own script in one pipeline (also after
//! `SCRIPT FLUSH`); a release wakes waiters only when it removed a permit; the keys expire
//! with their longest permit; one `EVALSHA` per operation.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use futures_util::StreamExt;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, FenceToken, Identity, Lease, LockBackend, LockName, Note,
    Permits, Ttl,
};
use redis::aio::MultiplexedConnection;

const LONG: Duration = Duration::from_secs(30);

async fn backend_on(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(prefix);
    RedisBackend::connect(config).await.expect("connect")
}

fn ttl(d: Duration) -> Ttl {
    Ttl::new(d).expect("valid TTL")
}

fn permit_request(name: &LockName, owner: &Identity, n: u32, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), owner.clone(), ttl(lease))
        .with_permits(Permits::new(n).expect("valid count"))
}

fn lock_request(name: &LockName, owner: &Identity, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(name.clone(), owner.clone(), ttl(lease))
}

async fn permit(backend: &RedisBackend, name: &LockName, n: u32, lease: Duration) -> Lease {
    let request = permit_request(name, &Identity::unique(), n, lease);
    match backend
        .acquire_permit(&request)
        .await
        .expect("acquire_permit")
    {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{name}: full, first to expire {}", holder.owner()),
    }
}

fn token(lease: &Lease) -> u64 {
    lease.token().map(FenceToken::get).expect("a fenced grant")
}

async fn cmd<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

async fn counter(conn: &mut MultiplexedConnection, key: &str) -> Option<u64> {
    let raw: Option<String> = cmd(conn, &["GET", key]).await;
    raw.map(|raw| raw.parse().expect("an integer counter"))
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    cmd(conn, &["PTTL", key]).await
}

async fn score(conn: &mut MultiplexedConnection, key: &str, member: &str) -> Option<f64> {
    cmd(conn, &["ZSCORE", key, member]).await
}

/// The shared server, a fresh prefix on it, and an admin connection.
async fn shared(what: &str) -> Option<(String, String, MultiplexedConnection)> {
    let url = common::redis_url()?;
    let admin = common::admin(&url).await;
    Some((url, common::random_prefix(what), admin))
}

/// The lock `x` and the semaphore `x` exclude nothing of each other and touch nothing of
/// each other: neither's grant, release or retake changes the other's keys, and each fence
/// counter moves only with its own grants. Guards against a permit script that shares the
/// lock's keys or counter (a lock `jobs` would then block, or be freed by, the semaphore
/// `jobs`, and the lock's tokens would jump with every permit).
#[tokio::test]
async fn a_lock_and_a_semaphore_of_one_name_are_independent() {
    let Some((url, prefix, mut admin)) = shared("sem-apart").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("x");
    let (locks, sems) = (backend.keys(&name), backend.permit_keys(&name));

    let lock = common::take(&backend, &lock_request(&name, &Identity::unique(), LONG)).await;
    let lock_value: Option<String> = cmd(&mut admin, &["GET", locks.lock()]).await;
    let lock_fence = counter(&mut admin, locks.fence()).await;
    assert_eq!(counter(&mut admin, sems.fence()).await, None);

    // A semaphore of 1 is free although the lock of the same name is held.
    let first = permit(&backend, &name, 1, LONG).await;
    let other = permit_request(&name, &Identity::unique(), 1, LONG);
    match backend.acquire_permit(&other).await.expect("call") {
        Acquire::Held(holder) => assert_eq!(holder.owner(), first.owner()),
        Acquire::Acquired(_) => panic!("a second permit of 1"),
    }
    let permit_fence = counter(&mut admin, sems.fence()).await;
    assert_eq!(
        permit_fence,
        Some(token(&first)),
        "the permit has its counter"
    );
    assert_eq!(counter(&mut admin, locks.fence()).await, lock_fence);
    let now_value: Option<String> = cmd(&mut admin, &["GET", locks.lock()]).await;
    assert_eq!(now_value, lock_value, "the permit changed the lock key");

    // The lock is still held by its holder; a rival of the lock is refused.
    let rival = lock_request(&name, &Identity::unique(), LONG);
    assert!(matches!(
        backend.acquire(&rival).await,
        Ok(Acquire::Held(_))
    ));
    let holder = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.owner(), lock.owner());
    let permits = backend
        .inspect_permits(&name)
        .await
        .expect("inspect_permits");
    assert_eq!(permits.len(), 1);
    assert_eq!(permits[0].owner(), first.owner());

    // Releasing the lock leaves the permit; a new lock grant leaves the permit counter.
    backend.release(&lock).await.expect("release lock");
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        1
    );
    let again = common::take(&backend, &lock_request(&name, &Identity::unique(), LONG)).await;
    assert_eq!(counter(&mut admin, sems.fence()).await, permit_fence);
    // Releasing the permit leaves the lock.
    backend.release(&first).await.expect("release permit");
    let holder = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.owner(), again.owner());
    assert!(
        backend
            .inspect_permits(&name)
            .await
            .expect("inspect")
            .is_empty()
    );
    backend.release(&again).await.expect("release");
}

const BACKENDS: usize = 6;
const ROUNDS: usize = 25;
const LIMIT: u32 = 2;

/// Six `RedisBackend`s, each with its own connection, contend for a semaphore of 2 with
/// single attempts (no `Locker` in between): an in-test register of holders never passes 2
/// and reaches 2, and every grant's token is distinct. Guards against a grant decided on
/// the client (a count read, then a write) or a count that is off by one: only the
/// server's one script sees every connection's permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_backends_never_admit_more_than_n() {
    let Some((url, prefix, _admin)) = shared("sem-contend").await else {
        return;
    };
    let name = common::fresh_name("contended");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..BACKENDS {
        let backend = backend_on(&url, &prefix).await;
        let (name, inside, most) = (name.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            let owner = Identity::unique();
            let mut granted = 0;
            while granted < ROUNDS {
                let request = permit_request(&name, &owner, LIMIT, LONG);
                let lease = match backend.acquire_permit(&request).await.expect("call") {
                    Acquire::Acquired(lease) => lease,
                    Acquire::Held(_) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                };
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.push(token(&lease));
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                backend.release(&lease).await.expect("release");
                granted += 1;
            }
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.extend(task.await.expect("contender"));
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT as usize,
        "{most} holders of a semaphore of {LIMIT}"
    );
    assert_eq!(most, LIMIT as usize, "never {LIMIT} at once: a mutex?");
    let distinct: std::collections::HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        BACKENDS * ROUNDS,
        "a token handed out twice"
    );
}

/// The semaphore's counter follows the lock's rule: a deleted counter (a restart without
/// persistence) restarts at the server clock, above every earlier token; a counter ahead
/// of the clock is continued by 1; one at 2^53 − 1 is refused, put back, and nothing is
/// granted. Guards against permit tokens counted from the stored counter alone, which
/// repeat after the counter is lost.
#[tokio::test]
async fn permit_tokens_keep_rising_when_the_counter_is_lost() {
    let Some((url, prefix, mut admin)) = shared("sem-fence").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("fenced");
    let fence = backend.permit_keys(&name).fence().to_owned();
    let first = permit(&backend, &name, 5, LONG).await;
    let second = permit(&backend, &name, 5, LONG).await;
    assert!(token(&second) > token(&first));
    assert_eq!(
        pttl(&mut admin, &fence).await,
        -1,
        "the counter never expires"
    );

    common::raw_del(&mut admin, &fence).await;
    let third = permit(&backend, &name, 5, LONG).await;
    assert!(
        token(&third) > token(&second),
        "{} after a lost counter, {} before",
        token(&third),
        token(&second)
    );

    let ahead = token(&third) + 1_000_000_000_000;
    cmd::<()>(&mut admin, &["SET", &fence, &ahead.to_string()]).await;
    let fourth = permit(&backend, &name, 5, LONG).await;
    assert_eq!(
        token(&fourth),
        ahead + 1,
        "a counter ahead of the clock goes on"
    );

    let huge = "9007199254740991";
    cmd::<()>(&mut admin, &["SET", &fence, huge]).await;
    let request = permit_request(&name, &Identity::unique(), 5, LONG);
    let err = backend
        .acquire_permit(&request)
        .await
        .expect_err("a counter at 2^53 - 1");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert_eq!(
        counter(&mut admin, &fence).await,
        Some(9_007_199_254_740_991)
    );
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        4
    );
    for lease in [first, second, third, fourth] {
        backend.release(&lease).await.expect("release");
    }
}

/// Keys of the wrong type at the permit set, the record hash or the counter (an operator's
/// `SET`, another program) make every operation a typed error (`Protocol`), never a panic,
/// a `Held` or a `Lost`; and an acquire that meets one writes nothing (the counter is not
/// bumped). Guards against a script that writes before it reads the keys it checks.
#[tokio::test]
async fn planted_keys_of_the_wrong_type_are_typed_errors_that_write_nothing() {
    let Some((url, prefix, mut admin)) = shared("sem-planted").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;

    // A string at the permit set: acquire, refresh, release and inspect all fail.
    let name = common::fresh_name("planted-set");
    let keys = backend.permit_keys(&name);
    let lease = permit(&backend, &name, 2, LONG).await;
    let before = counter(&mut admin, keys.fence()).await;
    common::raw_del(&mut admin, keys.permits()).await;
    cmd::<()>(&mut admin, &["SET", keys.permits(), "not a sorted set"]).await;
    let request = permit_request(&name, &Identity::unique(), 2, LONG);
    let err = backend.acquire_permit(&request).await.expect_err("acquire");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert_eq!(
        counter(&mut admin, keys.fence()).await,
        before,
        "counter bumped"
    );
    for err in [
        backend.refresh(&lease).await.expect_err("refresh"),
        backend
            .refresh_many(std::slice::from_ref(&lease))
            .await
            .remove(0)
            .expect_err("batch"),
        backend.release(&lease).await.expect_err("release"),
        backend.inspect_permits(&name).await.expect_err("inspect"),
    ] {
        assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    }

    // A string at the record hash.
    let name = common::fresh_name("planted-info");
    let keys = backend.permit_keys(&name);
    cmd::<()>(&mut admin, &["SET", keys.info(), "not a hash"]).await;
    let request = permit_request(&name, &Identity::unique(), 2, LONG);
    let err = backend.acquire_permit(&request).await.expect_err("acquire");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert_eq!(
        counter(&mut admin, keys.fence()).await,
        None,
        "counter written"
    );
    assert!(!common::exists(&mut admin, keys.permits()).await);

    // A hash at the counter.
    let name = common::fresh_name("planted-fence");
    let keys = backend.permit_keys(&name);
    cmd::<()>(&mut admin, &["HSET", keys.fence(), "f", "v"]).await;
    let request = permit_request(&name, &Identity::unique(), 2, LONG);
    let err = backend.acquire_permit(&request).await.expect_err("acquire");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(!common::exists(&mut admin, keys.permits()).await, "granted");
    assert!(!common::exists(&mut admin, keys.info()).await, "recorded");
}

/// Values this crate did not write are shown, not trusted: a foreign member in the permit
/// set counts as a holder (`Held` names it, `inspect_permits` lists it), and a garbled
/// record neither refuses a limit nor breaks a grant.
#[tokio::test]
async fn foreign_members_and_garbled_records_are_shown_not_trusted() {
    let Some((url, prefix, mut admin)) = shared("sem-foreign").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("foreign");
    let keys = backend.permit_keys(&name);
    let far = (std::time::SystemTime::now() + LONG)
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        .to_string();
    cmd::<()>(&mut admin, &["ZADD", keys.permits(), &far, "somebody"]).await;
    cmd::<()>(&mut admin, &["HSET", keys.info(), "g:somebody", "garbage"]).await;
    let request = permit_request(&name, &Identity::unique(), 1, LONG);
    match backend.acquire_permit(&request).await.expect("call") {
        Acquire::Held(holder) => {
            assert!(holder.owner().as_str().contains("foreign"), "{holder:?}");
            assert!(holder.expires_in().is_some_and(|left| left <= LONG));
        }
        Acquire::Acquired(_) => panic!("a foreign member is a holder"),
    }
    let lease = permit(&backend, &name, 2, LONG).await;
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].owner(), lease.owner(), "ours first, foreign last");
    backend.release(&lease).await.expect("release");
}

/// A note is stored with its permit: `Held` and `inspect_permits` show it, and a retake
/// without a note drops it (as a lock's retake does). Guards against notes lost on the way
/// to the record, or left behind for a newer grant.
#[tokio::test]
async fn notes_are_stored_with_each_permit() {
    let Some((url, prefix, _admin)) = shared("sem-note").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("noted");
    let owner = Identity::unique();
    let note = Note::new("nightly render 7").expect("valid note");
    let noted = permit_request(&name, &owner, 1, LONG).with_note(Some(note.clone()));
    let first = match backend.acquire_permit(&noted).await.expect("call") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {}", holder.owner()),
    };
    let rival = permit_request(&name, &Identity::unique(), 1, LONG);
    match backend.acquire_permit(&rival).await.expect("call") {
        Acquire::Held(holder) => assert_eq!(holder.note(), Some(&note)),
        Acquire::Acquired(_) => panic!("a second permit of 1"),
    }
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed[0].note(), Some(&note));
    assert_eq!(listed[0].token(), first.token());
    let plain = permit_request(&name, &owner, 1, LONG);
    let again = match backend.acquire_permit(&plain).await.expect("call") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {}", holder.owner()),
    };
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].note(), None, "the retake kept the old note");
    backend.release(&again).await.expect("release");
}

/// One `refresh_many` of locks and permits, interleaved: each lease gets what its own
/// `refresh` returns (live ones extended on the server, released and replaced ones `Lost`
/// and not re-created), through one pipeline; after `SCRIPT FLUSH` both scripts are loaded
/// again and the same batch still refreshes. Guards against permit leases sent to the lock
/// script (they would all be `Lost`), and a `NOSCRIPT` retry that loads only one script.
#[tokio::test]
async fn a_batch_of_locks_and_permits_refreshes_each_by_its_kind() {
    let Some((url, prefix, mut admin)) = shared("sem-batch").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let (a, b) = (common::fresh_name("a"), common::fresh_name("b"));
    let me = Identity::unique();
    let lock = common::take(&backend, &lock_request(&a, &me, LONG)).await;
    let live = permit(&backend, &a, 3, LONG).await;
    let released = permit(&backend, &a, 3, LONG).await;
    backend.release(&released).await.expect("release");
    let gone_lock = common::take(&backend, &lock_request(&b, &me, LONG)).await;
    backend.release(&gone_lock).await.expect("release");
    let owner = Identity::unique();
    let replaced = match backend
        .acquire_permit(&permit_request(&b, &owner, 1, LONG))
        .await
    {
        Ok(Acquire::Acquired(lease)) => lease,
        other => panic!("{other:?}"),
    };
    let retaken = match backend
        .acquire_permit(&permit_request(&b, &owner, 1, LONG))
        .await
    {
        Ok(Acquire::Acquired(lease)) => lease,
        other => panic!("{other:?}"),
    };
    let (locks, sems_a, sems_b) = (
        backend.keys(&a),
        backend.permit_keys(&a),
        backend.permit_keys(&b),
    );
    let batch = [
        lock.clone(),
        live.clone(),
        released.clone(),
        gone_lock.clone(),
        replaced.clone(),
        retaken.clone(),
        live.clone(),
    ];
    let expect = ["ok", "ok", "lost", "lost", "lost", "ok", "ok"];
    for round in ["plain", "after SCRIPT FLUSH"] {
        if round != "plain" {
            cmd::<()>(&mut admin, &["SCRIPT", "FLUSH"]).await;
        }
        common::raw_set(
            &mut admin,
            locks.lock(),
            lock.grant(),
            Duration::from_secs(5),
        )
        .await;
        let before = score(&mut admin, sems_a.permits(), live.grant())
            .await
            .expect("live");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let results = backend.refresh_many(&batch).await;
        let got: Vec<&str> = results
            .iter()
            .map(|r| match r {
                Ok(_) => "ok",
                Err(e) if e.kind() == ErrorKind::Lost => "lost",
                Err(e) => panic!("{round}: {e}"),
            })
            .collect();
        assert_eq!(got, expect, "{round}");
        assert!(
            pttl(&mut admin, locks.lock()).await > 5_000,
            "{round}: lock not extended"
        );
        let after = score(&mut admin, sems_a.permits(), live.grant())
            .await
            .expect("live");
        assert!(
            after > before,
            "{round}: permit not extended ({before} -> {after})"
        );
        assert_eq!(
            score(&mut admin, sems_a.permits(), released.grant()).await,
            None
        );
        assert_eq!(
            score(&mut admin, sems_b.permits(), replaced.grant()).await,
            None
        );
        assert!(
            !common::exists(&mut admin, backend.keys(&b).lock()).await,
            "{round}"
        );
    }
    for lease in [lock, live, retaken] {
        backend.release(&lease).await.expect("release");
    }
}

/// A permit's release publishes on the lock's release channel, so `subscribe(name)` wakes
/// (a waiter for the lock wakes spuriously, which is allowed); a stale release, which
/// removes nothing, publishes nothing. Guards against waiters that only wake by polling,
/// and releases that wake everyone without freeing anything.
#[tokio::test]
async fn a_permit_release_wakes_subscribers_only_when_it_frees_a_place() {
    let Some((url, prefix, _admin)) = shared("sem-wake").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("wake");
    let lease = permit(&backend, &name, 1, LONG).await;
    let mut events = backend
        .subscribe(&name)
        .await
        .expect("subscribe")
        .expect("events");
    backend.release(&lease).await.expect("release");
    tokio::time::timeout(Duration::from_secs(2), events.next())
        .await
        .expect("no wake-up within 2 s")
        .expect("the stream ended");
    backend
        .release(&lease)
        .await
        .expect("a stale release is Ok");
    let quiet = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(
        quiet.is_err(),
        "a release that freed nothing woke the waiters"
    );
}

/// The permit set and the record hash expire with their longest-lived permit (so an
/// abandoned semaphore leaves no keys behind), follow it when a refresh moves it, and are
/// deleted with the last release; the counter never expires. Guards against keys that
/// live for ever and against keys that expire under a live permit.
#[tokio::test]
async fn the_keys_expire_with_their_longest_permit_but_the_counter_stays() {
    let Some((url, prefix, mut admin)) = shared("sem-expiry").await else {
        return;
    };
    let backend = backend_on(&url, &prefix).await;
    let name = common::fresh_name("expiry");
    let keys = backend.permit_keys(&name);
    let short = permit(&backend, &name, 3, Duration::from_secs(5)).await;
    for key in [keys.permits(), keys.info()] {
        let left = pttl(&mut admin, key).await;
        assert!((1..=5_000).contains(&left), "{key}: PTTL {left}");
    }
    let long = permit(&backend, &name, 3, LONG).await;
    for key in [keys.permits(), keys.info()] {
        let left = pttl(&mut admin, key).await;
        assert!((25_000..=30_000).contains(&left), "{key}: PTTL {left}");
    }
    // The short permit's refresh does not shorten the keys below the long permit.
    backend.refresh(&short).await.expect("refresh");
    assert!(pttl(&mut admin, keys.permits()).await > 25_000);
    // Releasing the long one brings the keys down to the short one's expiry.
    backend.release(&long).await.expect("release");
    for key in [keys.permits(), keys.info()] {
        let left = pttl(&mut admin, key).await;
        assert!((1..=5_000).contains(&left), "{key}: PTTL {left}");
    }
    backend.release(&short).await.expect("release");
    assert!(!common::exists(&mut admin, keys.permits()).await);
    assert!(!common::exists(&mut admin, keys.info()).await);
    assert_eq!(
        pttl(&mut admin, keys.fence()).await,
        -1,
        "the counter stays"
    );
}

/// Each permit operation is one `EVALSHA` on the server (counted on a private server by
/// `INFO commandstats`), a batch of N leases N `EVALSHA`s, whatever they mix.
#[tokio::test]
async fn each_permit_operation_is_one_script_call() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), &common::random_prefix("sem-calls")).await;
    let stats = &mut common::admin(&server.url()).await;
    let name = common::fresh_name("calls");
    let warm = permit(&backend, &name, 2, LONG).await;
    backend.release(&warm).await.expect("release");
    let evalsha = |n| common::calls(&[("evalsha", n)]);
    let scripted = |before, after| {
        let mut calls = common::calls_between(&before, &after);
        calls.retain(|name, _| name == "evalsha");
        calls
    };

    let before = common::command_calls(stats).await;
    let lease = permit(&backend, &name, 2, LONG).await;
    assert_eq!(
        scripted(before, common::command_calls(stats).await),
        evalsha(1),
        "acquire"
    );
    let before = common::command_calls(stats).await;
    backend.refresh(&lease).await.expect("refresh");
    assert_eq!(
        scripted(before, common::command_calls(stats).await),
        evalsha(1),
        "refresh"
    );
    let lock = common::take(&backend, &lock_request(&name, &Identity::unique(), LONG)).await;
    let before = common::command_calls(stats).await;
    let results = backend
        .refresh_many(&[lease.clone(), lock.clone(), lease.clone()])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(
        scripted(before, common::command_calls(stats).await),
        evalsha(3),
        "batch"
    );
    let before = common::command_calls(stats).await;
    backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(
        scripted(before, common::command_calls(stats).await),
        evalsha(1),
        "inspect"
    );
    let before = common::command_calls(stats).await;
    backend.release(&lease).await.expect("release");
    assert_eq!(
        scripted(before, common::command_calls(stats).await),
        evalsha(1),
        "release"
    );
    backend.release(&lock).await.expect("release");
}

/// Redlock says why it grants no permits, and refuses them: a count kept on independent
/// nodes has no single point where it is decided. Guards against a descriptor that claims
/// semaphores (or gives no reason) while the backend cannot keep the bound.
#[tokio::test]
async fn redlock_refuses_permits_and_says_why() {
    match backend_redis::redlock_guarantees().semaphores {
        lockcore::Semaphores::Unsupported(why) => {
            assert!(why.contains("majorit") && why.contains("N = 2"), "{why}");
        }
        lockcore::Semaphores::Supported => panic!("Redlock claims semaphores"),
    }
    assert_eq!(
        backend_redis::guarantees().semaphores,
        lockcore::Semaphores::Supported
    );
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    let config = backend_redis::RedlockConfig::from_node_urls(&urls)
        .expect("valid URLs")
        .with_prefix(common::random_prefix("sem-redlock"));
    let backend = backend_redis::RedlockBackend::connect(config)
        .await
        .expect("connect");
    let name = common::fresh_name("redlock");
    let request = permit_request(&name, &Identity::unique(), 2, LONG);
    let err = backend.acquire_permit(&request).await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = backend.inspect_permits(&name).await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

//! Semaphore permits on etcd, beyond the shared conformance cases: a semaphore's slot keys
//! live apart from the lock of the same name (and from `etcdctl lock`'s keys), separate
//! backends never admit more than N, a revoked or expired lease frees its slot, fence
//! tokens rise through releases, expiry and retakes, a permit moved off its session ends
//! by its own TTL, a batch mixes locks and permits, garbage in a slot is a typed error,
//! and the RPCs per operation are what `docs/etcd.md` says.

mod common;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use backend_etcd::EtcdBackend;
use futures_util::StreamExt;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, LockOptions,
    Locker, Permits, Result, Ttl, WaitMode,
};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

const LONG: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

fn request(
    name: &LockName,
    owner: &Identity,
    permits: Option<u32>,
    ttl: Duration,
) -> AcquireRequest {
    let request = AcquireRequest::new(name.clone(), owner.clone(), Ttl::new(ttl).expect("TTL"));
    match permits {
        Some(n) => request.with_permits(Permits::new(n).expect("count")),
        None => request,
    }
}

/// One permit attempt of `owner`.
async fn attempt(
    b: &EtcdBackend,
    s: &LockName,
    owner: &Identity,
    n: u32,
    ttl: Duration,
) -> Result<Acquire> {
    b.acquire_permit(&request(s, owner, Some(n), ttl)).await
}

/// A permit attempt that must be granted.
async fn granted(b: &EtcdBackend, s: &LockName, owner: &Identity, n: u32, ttl: Duration) -> Lease {
    match attempt(b, s, owner, n, ttl).await.expect("permit call") {
        Acquire::Acquired(lease) => {
            assert_eq!(lease.permits().map(Permits::get), Some(n));
            lease
        }
        Acquire::Held(holder) => panic!("{s}: full, first to end {}", holder.owner()),
    }
}

fn token(lease: &Lease) -> u64 {
    lease.token().expect("a fence token").get()
}

/// The keys under `prefix`, as etcd has them.
async fn keys(
    raw: &mut common::raw::Raw,
    prefix: &str,
) -> Vec<anylock_etcd_proto::mvccpb::KeyValue> {
    common::keys_under(raw, prefix).await
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// `etcdctl lock <lock> -- sleep 60`, killed when dropped; `None` without etcdctl.
fn etcdctl_lock(endpoints: &[String], lock: &str) -> Option<Child> {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["lock", lock, "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()
}

/// Waits until `prefix` holds `n` keys.
async fn until_keys(raw: &mut common::raw::Raw, prefix: &str, n: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if keys(raw, prefix).await.len() == n {
            return true;
        }
        sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The lock `x` and the semaphore `x` neither exclude nor see each other: each has its own
/// keys (the slot under `P%sem/x/`, nothing added under `P x/`), inspect and
/// inspect_permits report only their own, a release of one leaves the other, and `list`
/// shows no permit as a lock. A permit release wakes `subscribe(x)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_are_independent() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-apart");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let x = name("x");
    let (locker, permit_owner, rival) =
        (Identity::unique(), Identity::unique(), Identity::unique());
    let Acquire::Acquired(lock) = backend
        .acquire(&request(&x, &locker, None, LONG))
        .await
        .expect("lock")
    else {
        panic!("the lock x is free");
    };
    let permit = granted(&backend, &x, &permit_owner, 1, LONG).await;
    let (lock_prefix, sem_prefix) = (backend.lock_prefix(&x), backend.semaphore_prefix(&x));
    assert_eq!(sem_prefix, format!("{prefix}%sem/x/"));
    let lock_keys = keys(&mut raw, &lock_prefix).await;
    assert_eq!(
        lock_keys.len(),
        1,
        "the permit added a key to the lock's range"
    );
    let slots = keys(&mut raw, &sem_prefix).await;
    assert_eq!(slots.len(), 1);
    assert_eq!(text(&slots[0].key), format!("{sem_prefix}1/0"));
    assert_eq!(
        slots[0].mod_revision,
        i64::try_from(token(&permit)).expect("revision")
    );
    // Full on each side, held by its own holder.
    match attempt(&backend, &x, &rival, 1, LONG).await.expect("call") {
        Acquire::Held(holder) => assert_eq!(holder.owner(), &permit_owner),
        Acquire::Acquired(_) => panic!("a second permit of 1"),
    }
    match backend
        .acquire(&request(&x, &rival, None, LONG))
        .await
        .expect("call")
    {
        Acquire::Held(holder) => assert_eq!(holder.owner(), &locker),
        Acquire::Acquired(_) => panic!("a second holder of the lock"),
    }
    let holder = backend.inspect(&x).await.expect("inspect").expect("held");
    assert_eq!(holder.owner(), &locker);
    let permits = backend.inspect_permits(&x).await.expect("inspect_permits");
    assert_eq!(permits.len(), 1);
    assert_eq!(permits[0].owner(), &permit_owner);
    assert_eq!(permits[0].token().map(|t| t.get()), Some(token(&permit)));
    let listed = backend.list("").await.expect("list");
    assert_eq!(listed.len(), 1, "a permit listed as a lock: {listed:?}");
    // A permit's release wakes a subscriber of the name, and leaves the lock alone.
    let mut events = backend
        .subscribe(&x)
        .await
        .expect("subscribe")
        .expect("a stream");
    backend.release(&permit).await.expect("release");
    timeout(Duration::from_secs(5), events.next())
        .await
        .expect("no wake-up after a permit's release")
        .expect("the stream ended");
    backend
        .refresh(&lock)
        .await
        .expect("the lock outlives the permit's release");
    assert_eq!(keys(&mut raw, &lock_prefix).await.len(), 1);
    assert!(
        backend
            .inspect_permits(&x)
            .await
            .expect("inspect")
            .is_empty()
    );
    // And the other way round.
    let again = granted(&backend, &x, &rival, 1, LONG).await;
    backend.release(&lock).await.expect("release");
    assert!(keys(&mut raw, &lock_prefix).await.is_empty());
    backend
        .refresh(&again)
        .await
        .expect("the permit outlives the lock's release");
    assert!(backend.inspect(&x).await.expect("inspect").is_none());
    backend.release(&again).await.expect("release");
    assert!(keys(&mut raw, &sem_prefix).await.is_empty());
}

/// `etcdctl lock P+x` (a holder) and an `etcdctl lock P+y` waiting behind anylock's lock
/// `y` put keys in the locks' ranges; neither counts as a permit of the semaphore of the
/// same name, and permits do not stop either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_keys_are_no_permits() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-etcdctl");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let (x, y) = (name("x"), name("y"));
    let Some(_holder) = etcdctl_lock(&endpoints, backend.lock_prefix(&x).trim_end_matches('/'))
    else {
        eprintln!("no etcdctl: skipped");
        return;
    };
    assert!(
        until_keys(
            &mut raw,
            &backend.lock_prefix(&x),
            1,
            Duration::from_secs(10)
        )
        .await,
        "etcdctl never took the lock"
    );
    let Acquire::Acquired(lock_y) = backend
        .acquire(&request(&y, &Identity::unique(), None, LONG))
        .await
        .expect("lock")
    else {
        panic!("y is free");
    };
    let _waiter = etcdctl_lock(&endpoints, backend.lock_prefix(&y).trim_end_matches('/'));
    assert!(
        until_keys(
            &mut raw,
            &backend.lock_prefix(&y),
            2,
            Duration::from_secs(10)
        )
        .await,
        "etcdctl never queued behind our lock"
    );
    for s in [&x, &y] {
        let owner = Identity::unique();
        let permit = granted(&backend, s, &owner, 1, LONG).await;
        let listed = backend.inspect_permits(s).await.expect("inspect_permits");
        assert_eq!(listed.len(), 1, "{s}: {listed:?}");
        assert_eq!(listed[0].owner(), &owner);
        backend.release(&permit).await.expect("release");
    }
    // etcdctl still holds x; the queue behind y is intact.
    let holder = backend.inspect(&x).await.expect("inspect").expect("held");
    assert!(
        holder.owner().as_str().starts_with("etcd-lease/"),
        "{}",
        holder.owner()
    );
    assert_eq!(keys(&mut raw, &backend.lock_prefix(&y)).await.len(), 2);
    backend.release(&lock_y).await.expect("release");
}

/// 4 backends (separate connections and sessions), 3 tasks each, waiting for a permit of
/// 3 and holding it briefly: never more than 3 holders (an in-test register, and a raw
/// count of slot keys sampled throughout), and 3 reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_backends_never_exceed_the_limit() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    const LIMIT: u32 = 3;
    const ROUNDS: usize = 12;
    let prefix = common::random_prefix("semaphore-contention");
    let s = name("pool");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut sem_prefix = String::new();
    for _ in 0..4 {
        let backend = Arc::new(common::backend(&endpoints, &prefix).await);
        sem_prefix = backend.semaphore_prefix(&s);
        for _ in 0..3 {
            let options =
                LockOptions::new(LONG).with_wait(WaitMode::Timeout(Duration::from_secs(60)));
            let locker = Locker::new(backend.clone()).with_options(options);
            let (s, inside, most, tokens) =
                (s.clone(), inside.clone(), most.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locker.acquire_permit(&s, LIMIT).await.expect("permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens
                        .lock()
                        .await
                        .push(guard.fence_token().expect("token").get());
                    sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, mut raw) = (done.clone(), common::raw(&endpoints).await);
        tokio::spawn(async move {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(keys(&mut raw, &sem_prefix).await.len());
                sleep(Duration::from_millis(5)).await;
            }
            most
        })
    };
    for task in tasks {
        task.await.expect("contender");
    }
    done.store(true, Ordering::SeqCst);
    let most_keys = sampler.await.expect("sampler");
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT as usize,
        "{most} holders of a semaphore of {LIMIT}"
    );
    assert_eq!(most, LIMIT as usize, "never {LIMIT} holders at once");
    assert!(most_keys <= LIMIT as usize, "{most_keys} slot keys at once");
    let tokens = tokens.lock().await;
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), tokens.len(), "a token handed out twice");
}

/// A permit whose session lease is revoked (`etcdctl lease revoke`) loses its slot at once:
/// another backend gets the only permit, the old grant's refresh is `Lost`, its release
/// frees nothing, and its backend's next permit comes on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_frees_its_permit() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-revoke");
    let (a, b) = (
        common::backend(&endpoints, &prefix).await,
        common::backend(&endpoints, &prefix).await,
    );
    let mut raw = common::raw(&endpoints).await;
    let s = name("one");
    let sem = a.semaphore_prefix(&s);
    let first = granted(&a, &s, &Identity::unique(), 1, LONG).await;
    let slot = keys(&mut raw, &sem).await.pop().expect("a slot");
    assert_ne!(slot.lease, 0, "a slot without a lease never expires");
    raw.lease_revoke(slot.lease).await.expect("revoke");
    assert!(
        keys(&mut raw, &sem).await.is_empty(),
        "the revoke left the slot"
    );
    let other = Identity::unique();
    let second = granted(&b, &s, &other, 1, LONG).await;
    assert!(token(&second) > token(&first));
    let err = a.refresh(&first).await.expect_err("a revoked permit");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    a.release(&first).await.expect("a stale release is Ok");
    let listed = b.inspect_permits(&s).await.expect("inspect");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].owner(), &other);
    let next = granted(&a, &name("another"), &Identity::unique(), 1, LONG).await;
    let next_slot = keys(&mut raw, &a.semaphore_prefix(&name("another")))
        .await
        .pop()
        .expect("slot");
    assert_ne!(
        next_slot.lease, slot.lease,
        "a grant on the revoked session"
    );
    a.release(&next).await.expect("release");
    b.release(&second).await.expect("release");
}

/// Tokens (slot mod revisions) rise across a release, an expiry (a backend whose 2 s
/// session nothing keeps alive) and a same-owner retake, whichever slot each grant uses,
/// and each equals its slot's mod revision in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_release_expiry_and_retake() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-tokens");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let s = name("t");
    let sem = backend.semaphore_prefix(&s);
    let mut seen = Vec::new();
    let first = granted(&backend, &s, &Identity::unique(), 2, LONG).await;
    seen.push(token(&first));
    backend.release(&first).await.expect("release");
    let kept_owner = Identity::unique();
    let kept = granted(&backend, &s, &kept_owner, 2, LONG).await;
    seen.push(token(&kept));
    {
        let short = common::backend(&endpoints, &prefix).await;
        let dying = granted(&short, &s, &Identity::unique(), 2, Duration::from_secs(2)).await;
        seen.push(token(&dying));
    }
    assert!(
        until_keys(&mut raw, &sem, 1, Duration::from_secs(8)).await,
        "the expired permit's slot stayed"
    );
    let owner = Identity::unique();
    let fresh = granted(&backend, &s, &owner, 2, LONG).await;
    seen.push(token(&fresh));
    let retaken = granted(&backend, &s, &owner, 2, LONG).await;
    seen.push(token(&retaken));
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "tokens: {seen:?}");
    let slots = keys(&mut raw, &sem).await;
    assert_eq!(slots.len(), 2, "the retake took a second slot");
    let revisions: HashSet<u64> = slots
        .iter()
        .map(|kv| u64::try_from(kv.mod_revision).expect("rev"))
        .collect();
    assert_eq!(revisions, HashSet::from([token(&kept), token(&retaken)]));
    let err = backend
        .refresh(&fresh)
        .await
        .expect_err("the retaken grant");
    assert_eq!(err.kind(), ErrorKind::Lost);
    backend.release(&fresh).await.expect("stale release");
    assert_eq!(
        keys(&mut raw, &sem).await.len(),
        2,
        "a stale release freed the retake"
    );
}

/// Garbage under a semaphore's range (a value that is not anylock's, a key that is not a
/// slot) is a permanent `Protocol` error naming the key for acquire, a waiting acquire and
/// inspect_permits, never a panic or a wait; a well-formed slot of another limit is the
/// limit conflict; a permit lease with a foreign grant is `InvalidInput`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_a_slot_is_a_typed_error() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-garbage");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let mut raw = common::raw(&endpoints).await;
    let g = name("g");
    let sem = backend.semaphore_prefix(&g);
    let planted = [
        (format!("{sem}2/0"), "not-json-q7".to_owned()),
        (format!("{sem}2/0"), String::new()),
        (format!("{sem}2/x"), r#"{"owner":"planted"}"#.to_owned()),
        (format!("{sem}2/2"), r#"{"owner":"planted"}"#.to_owned()),
    ];
    for (key, value) in planted {
        raw.put(key.clone(), value.clone(), 0).await.expect("plant");
        let err = attempt(&backend, &g, &Identity::unique(), 2, LONG)
            .await
            .expect_err("garbage");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{key}: {err}");
        assert!(!err.is_temporary(), "{err}");
        assert!(err.to_string().contains(&key), "{err}");
        if !value.is_empty() {
            assert!(
                !err.to_string().contains(&value),
                "the value is shown: {err}"
            );
        }
        let err = backend.inspect_permits(&g).await.expect_err("garbage");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
        let locker = Locker::new(backend.clone()).with_options(
            LockOptions::new(LONG).with_wait(WaitMode::Timeout(Duration::from_secs(20))),
        );
        let started = Instant::now();
        let err = locker.acquire_permit(&g, 2).await.expect_err("garbage");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited on garbage"
        );
        raw.delete(key).await.expect("delete");
    }
    raw.put(format!("{sem}3/0"), r#"{"owner":"planted"}"#, 0)
        .await
        .expect("plant");
    let err = attempt(&backend, &g, &Identity::unique(), 2, LONG)
        .await
        .expect_err("conflict");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(
        err.to_string().contains('3') && err.to_string().contains('2'),
        "{err}"
    );
    raw.delete(format!("{sem}3/0")).await.expect("delete");
    let lease = granted(&backend, &g, &Identity::unique(), 2, LONG).await;
    for foreign in ["1f:42:2:s", "1f:42", "nonsense"] {
        let odd = lease.clone().with_grant(foreign);
        let err = backend.refresh(&odd).await.expect_err("a foreign grant");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{foreign}: {err}");
    }
    backend.release(&lease).await.expect("release");
}

/// `detach` moves a permit's slot off its session to a lease of its own (same fence token):
/// while a lock guard keeps the session alive, the permit still ends by its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_permit_ends_by_its_own_ttl() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-detach");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let mut raw = common::raw(&endpoints).await;
    let ttl = Duration::from_secs(3);
    let locker = Locker::new(backend.clone()).with_options(LockOptions::new(ttl));
    let keeper = locker.acquire("keeper").await.expect("lock");
    let s = name("left");
    let guard = locker.acquire_permit(&s, 1).await.expect("permit");
    let sem = backend.semaphore_prefix(&s);
    let session = keys(&mut raw, &backend.lock_prefix(&name("keeper"))).await[0].lease;
    assert_eq!(
        keys(&mut raw, &sem).await[0].lease,
        session,
        "the permit is on the session"
    );
    let granted_token = guard.fence_token();
    let left = guard.detach().await.expect("detach");
    let detached = Instant::now();
    assert_eq!(left.token(), granted_token);
    let slot = keys(&mut raw, &sem).await.pop().expect("still held");
    assert_ne!(slot.lease, session, "the slot is still on the session");
    let rival = Locker::new(backend.clone())
        .with_options(LockOptions::new(ttl).with_wait(WaitMode::TryOnce));
    assert!(
        rival
            .try_acquire_permit(&s, 1)
            .await
            .expect("call")
            .is_none()
    );
    assert!(
        until_keys(&mut raw, &sem, 0, ttl + Duration::from_secs(3)).await,
        "the detached permit outlived its TTL"
    );
    assert!(
        detached.elapsed() + Duration::from_secs(1) >= ttl,
        "freed after {:?}",
        detached.elapsed()
    );
    assert!(keeper.is_held(), "{}", keeper.state());
    let next = rival
        .try_acquire_permit(&s, 1)
        .await
        .expect("call")
        .expect("free again");
    next.release().await.expect("release");
    keeper.release().await.expect("release");
}

/// One `refresh_many` mixing a lock and permits of one name: the lock, a live permit and a
/// retaken one are extended; the grant a retake replaced (same slot key, same create
/// revision) and a released permit are `Lost`; nothing is re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixes_locks_and_permits() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-batch");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let x = name("x");
    let Acquire::Acquired(lock) = backend
        .acquire(&request(&x, &Identity::unique(), None, LONG))
        .await
        .expect("lock")
    else {
        panic!("free");
    };
    let a = Identity::unique();
    let replaced = granted(&backend, &x, &a, 3, LONG).await;
    let retaken = granted(&backend, &x, &a, 3, LONG).await;
    let live = granted(&backend, &x, &Identity::unique(), 3, LONG).await;
    let released = granted(&backend, &x, &Identity::unique(), 3, LONG).await;
    backend.release(&released).await.expect("release");
    let batch = [lock, replaced, retaken, live, released];
    let results = backend.refresh_many(&batch).await;
    let kinds: Vec<Option<ErrorKind>> = results
        .iter()
        .map(|r| r.as_ref().err().map(lockcore::Error::kind))
        .collect();
    assert_eq!(
        kinds,
        [
            None,
            Some(ErrorKind::Lost),
            None,
            None,
            Some(ErrorKind::Lost)
        ]
    );
    for (lease, batched) in batch.iter().zip(&results) {
        let single = backend.refresh(lease).await;
        assert_eq!(single.is_ok(), batched.is_ok(), "{}", lease.grant());
    }
    assert_eq!(keys(&mut raw, &backend.semaphore_prefix(&x)).await.len(), 2);
    assert_eq!(keys(&mut raw, &backend.lock_prefix(&x)).await.len(), 1);
}

/// The RPCs per operation, as the backend counts them: a permit on a free semaphore is a
/// Range and a Txn (plus the session's LeaseGrant the first time), a retake the same, a
/// full semaphore a Range and one LeaseTimeToLive per holder lease, a conflict the Range
/// alone, a release one Txn, inspect_permits a Range and a LeaseTimeToLive per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_per_permit_operation() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("semaphore-rpcs");
    let backend = common::backend(&endpoints, &prefix).await;
    let s = name("counted");
    let counted = |before: u64| backend.rpcs_sent() - before;
    let before = backend.rpcs_sent();
    let a = Identity::unique();
    let first = granted(&backend, &s, &a, 2, LONG).await;
    assert_eq!(counted(before), 3, "LeaseGrant + Range + Txn");
    let before = backend.rpcs_sent();
    let second = granted(&backend, &s, &Identity::unique(), 2, LONG).await;
    assert_eq!(counted(before), 2, "Range + Txn");
    let before = backend.rpcs_sent();
    let first = {
        let again = granted(&backend, &s, &a, 2, LONG).await;
        assert!(token(&again) > token(&first));
        again
    };
    assert_eq!(counted(before), 2, "a retake: Range + Txn");
    let before = backend.rpcs_sent();
    let full = attempt(&backend, &s, &Identity::unique(), 2, LONG)
        .await
        .expect("call");
    let Acquire::Held(holder) = full else {
        panic!("a third permit of 2");
    };
    assert!(
        holder.expires_in().is_some_and(|left| left <= LONG),
        "{holder:?}"
    );
    assert_eq!(
        counted(before),
        2,
        "full: Range + LeaseTimeToLive of the one session"
    );
    let before = backend.rpcs_sent();
    let err = attempt(&backend, &s, &Identity::unique(), 5, LONG)
        .await
        .expect_err("conflict");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(counted(before), 1, "a conflict: the Range alone");
    let before = backend.rpcs_sent();
    assert_eq!(backend.inspect_permits(&s).await.expect("inspect").len(), 2);
    assert_eq!(
        counted(before),
        2,
        "inspect: Range + LeaseTimeToLive of the one session"
    );
    let before = backend.rpcs_sent();
    backend.release(&first).await.expect("release");
    assert_eq!(counted(before), 1, "release: one Txn");
    backend.release(&second).await.expect("release");
}

/// The least-privilege role (readwrite on exactly the key prefix, on the secure server)
/// runs every permit operation, a waiting acquire woken by the two-range watch included:
/// the semaphores' keys stay inside the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_role_runs_permits() {
    let (Some(dir), Some(port), Some(user), Some(password)) = (
        test_kit::env::require("ANYLOCK_TEST_SECURE_DIR", "secure etcd"),
        test_kit::env::require("ANYLOCK_TEST_ETCD_TLS_PORT", "secure etcd"),
        test_kit::env::require("ANYLOCK_TEST_SECURE_USER", "secure etcd"),
        test_kit::env::require("ANYLOCK_TEST_SECURE_PASSWORD", "secure etcd"),
    ) else {
        return;
    };
    let file = |f: &str| std::path::Path::new(&dir).join(f).display().to_string();
    let prefix = common::random_prefix("secure").replace("anylock-test/", "anylock/");
    let url = format!(
        "etcds://{user}:{password}@127.0.0.1:{}/{prefix}?ca={}&cert={}&key={}",
        port.trim(),
        file("ca.pem"),
        file("client.pem"),
        file("client-key.pem")
    );
    let backend = Arc::new(EtcdBackend::from_url(&url).await.expect("connect"));
    let s = name("secured");
    let holder = Locker::new(backend.clone()).with_options(LockOptions::new(LONG));
    let guard = holder.acquire_permit(&s, 1).await.expect("permit");
    assert_eq!(backend.inspect_permits(&s).await.expect("inspect").len(), 1);
    // A backoff of 10 s and more: a waiter woken within 3 s was woken by the watch.
    let slow = lockcore::Backoff::new(Duration::from_secs(10), Duration::from_secs(20))
        .with_jitter(lockcore::Jitter::None);
    let waiter = Locker::new(backend.clone()).with_options(
        LockOptions::new(LONG)
            .with_wait(WaitMode::Timeout(Duration::from_secs(25)))
            .with_backoff(slow),
    );
    let task = tokio::spawn({
        let s = s.clone();
        async move { waiter.acquire_permit(&s, 1).await }
    });
    sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "a second permit of 1");
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = task.await.expect("waiter").expect("the released permit");
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "no wake-up: {:?}",
        released.elapsed()
    );
    next.release().await.expect("release");
}

/// A semaphore of 10,000 permits with 5,000 live ones, each with a 512-byte note and a
/// long owner (about 5 MB of slots, above gRPC's default 4 MiB reply limit): an attempt reads them all and
/// is granted, and inspect_permits lists every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_semaphore_is_read_whole() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    const HELD: u32 = 5000;
    let prefix = common::random_prefix("semaphore-large");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let s = name("wide");
    let sem = backend.semaphore_prefix(&s);
    let lease = raw.lease_grant(120).await.expect("lease");
    let note = "n".repeat(lockcore::MAX_NOTE_LEN);
    let pad = "o".repeat(400);
    let puts = futures_util::stream::iter(0..HELD).map(|i| {
        let mut raw = raw.clone();
        let key = format!("{sem}10000/{i}");
        let value = format!(r#"{{"owner":"planted-{i}-{pad}","note":"{note}"}}"#);
        async move { raw.put(key, value, lease).await.expect("plant") }
    });
    puts.buffer_unordered(32).collect::<Vec<_>>().await;
    let lease_of_ours = granted(&backend, &s, &Identity::unique(), 10_000, LONG).await;
    let listed = backend.inspect_permits(&s).await.expect("inspect_permits");
    assert_eq!(listed.len(), HELD as usize + 1);
    let noted = listed
        .iter()
        .filter(|h| h.note().is_some_and(|n| n.as_str() == note));
    assert_eq!(noted.count(), HELD as usize);
    backend.release(&lease_of_ours).await.expect("release");
    raw.lease_revoke(lease).await.expect("revoke");
}

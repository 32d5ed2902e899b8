//! etcd-specific behaviour: the key layout shared with etcd's own mutex, create-revision
//! fencing, try-once leaving nothing behind, name escaping, refresh checking the key and
//! not only the lease, and the RPC cost of each operation (counted twice: by the backend
//! and by etcd's own gRPC metrics on a private server).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Locker,
};
use test_kit::proxy::{Fault, FaultProxy};
use test_kit::servers::Etcd;

const LONG: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn grant(backend: &EtcdBackend, lock: &LockName, owner: &Identity) -> Lease {
    let request = AcquireRequest::new(
        lock.clone(),
        owner.clone(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    );
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} unexpectedly held by {}", holder.owner()),
    }
}

async fn attempt(backend: &EtcdBackend, lock: &LockName, owner: &Identity) -> Acquire {
    let request = AcquireRequest::new(
        lock.clone(),
        owner.clone(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    );
    backend.acquire(&request).await.expect("acquire")
}

/// The lock key is `prefix + name + "/" + <lease id hex>`, bound to that lease, holding
/// the owner as JSON, and the fence token is its create revision.
#[tokio::test]
async fn key_layout_matches_etcds_own_mutex() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("layout");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let owner = Identity::unique();
    let lease = grant(&backend, &name("deploy"), &owner).await;
    let keys = common::keys_under(&mut raw, &format!("{prefix}deploy/")).await;
    assert_eq!(keys.len(), 1, "one key per holder");
    let key = &keys[0];
    let expected = format!("{prefix}deploy/{:x}", key.lease);
    assert_eq!(std::str::from_utf8(&key.key).expect("utf-8"), expected);
    assert!(key.lease != 0, "the key is bound to a lease");
    let value: serde_json::Value = serde_json::from_slice(&key.value).expect("JSON value");
    assert_eq!(value["owner"], owner.as_str());
    let token = lease.token().expect("token").get();
    assert_eq!(i64::try_from(token).expect("fits"), key.create_revision);
    assert_eq!(
        backend.lock_prefix(&name("deploy")),
        format!("{prefix}deploy/")
    );
    backend.release(&lease).await.expect("release");
    assert!(
        common::keys_under(&mut raw, &prefix).await.is_empty(),
        "release left a key"
    );
}

/// Fence tokens are create revisions: strictly increasing over grants by different owners,
/// by the same owner (retake), and equal to what etcd reports for the key.
#[tokio::test]
async fn fence_tokens_are_create_revisions_and_increase() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("fence");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("fenced");
    let mut last = 0;
    for round in 0..20 {
        let owner = Identity::unique();
        let mut lease = grant(&backend, &lock, &owner).await;
        if round % 5 == 0 {
            lease = grant(&backend, &lock, &owner).await;
        }
        let token = lease.token().expect("token").get();
        let keys = common::keys_under(&mut raw, &format!("{prefix}fenced/")).await;
        assert_eq!(keys.len(), 1, "round {round}: {keys:?}");
        assert_eq!(keys[0].create_revision, i64::try_from(token).expect("fits"));
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        backend.release(&lease).await.expect("release");
    }
}

/// A try-once attempt on a held lock reports the holder and creates no key at all.
#[tokio::test]
async fn held_attempts_leave_no_key_behind() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("held");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("busy");
    let holder = Identity::unique();
    let lease = grant(&backend, &lock, &holder).await;
    for _ in 0..5 {
        match attempt(&backend, &lock, &Identity::unique()).await {
            Acquire::Held(info) => {
                assert_eq!(info.owner(), &holder);
                assert_eq!(info.token(), lease.token());
                let left = info.expires_in().expect("remaining TTL");
                assert!(
                    left <= LONG && left >= LONG - Duration::from_secs(5),
                    "{left:?}"
                );
                assert!(info.acquired_at().is_some());
            }
            Acquire::Acquired(_) => panic!("a held lock was granted"),
        }
    }
    let keys = common::keys_under(&mut raw, &prefix).await;
    assert_eq!(keys.len(), 1, "held attempts left keys: {keys:?}");
    backend.release(&lease).await.expect("release");
}

/// Names containing `/` are escaped, so `team` and `team/ci` are independent locks whose
/// key ranges do not overlap.
#[tokio::test]
async fn names_with_slashes_are_escaped_and_independent() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("names");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let (parent, child) = (name("team"), name("team/ci"));
    let (a, b) = (Identity::unique(), Identity::unique());
    let child_lease = grant(&backend, &child, &b).await;
    let parent_lease = grant(&backend, &parent, &a).await;
    let parent_keys = common::keys_under(&mut raw, &format!("{prefix}team/")).await;
    assert_eq!(
        parent_keys.len(),
        1,
        "team's range holds another lock's key"
    );
    let child_keys = common::keys_under(&mut raw, &format!("{prefix}team%2Fci/")).await;
    assert_eq!(child_keys.len(), 1);
    let seen = backend
        .inspect(&parent)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(seen.owner(), &a);
    let seen = backend
        .inspect(&child)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(seen.owner(), &b);
    backend.release(&parent_lease).await.expect("release");
    backend.release(&child_lease).await.expect("release");
}

/// The backend leaves backend and lock out of its errors; through a `Locker` they are
/// filled in: here a Range to a member that stopped answering (our request timeout).
#[tokio::test]
async fn errors_through_a_locker_name_the_backend_and_the_lock() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let host = endpoints[0].trim_start_matches("http://");
    let mut addresses = tokio::net::lookup_host(host).await.expect("resolve");
    let proxy = FaultProxy::start(addresses.next().expect("an address"))
        .await
        .expect("proxy");
    let config = EtcdConfig::new([proxy.local_addr().to_string()])
        .expect("endpoint")
        .with_prefix(&common::random_prefix("context"))
        .with_request_timeout(Duration::from_millis(300));
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let locker = Locker::new(Arc::new(backend));
    assert!(locker.inspect("job").await.expect("inspect").is_none());
    proxy.set_fault(Fault::Blackhole);
    let err = locker.inspect("job").await.expect_err("no answer");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(err.backend(), Some("etcd"), "{err}");
    assert_eq!(err.lock().map(LockName::as_str), Some("job"), "{err}");
    assert!(err.message().starts_with("Range: "), "{err}");
    proxy.set_fault(Fault::Pass);
}

/// An operator deleting the key while the lease lives makes refresh fail with Lost, and so
/// does an expired (here: revoked) lease. Neither re-creates the key.
#[tokio::test]
async fn refresh_checks_the_key_as_well_as_the_lease() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("refresh");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("job");
    let lease = grant(&backend, &lock, &Identity::unique()).await;
    backend.refresh(&lease).await.expect("healthy refresh");
    let key = common::keys_under(&mut raw, &prefix).await.remove(0);
    raw.delete(key.key.clone()).await.expect("operator delete");
    let err = backend
        .refresh(&lease)
        .await
        .expect_err("refresh after delete");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let ttl = raw.lease_time_to_live(key.lease).await.expect("ttl");
    assert!(ttl > 0, "the lease itself is alive; only the key is gone");
    backend.release(&lease).await.expect("release");

    let lease = grant(&backend, &lock, &Identity::unique()).await;
    let key = common::keys_under(&mut raw, &prefix).await.remove(0);
    raw.lease_revoke(key.lease).await.expect("revoke");
    let err = backend
        .refresh(&lease)
        .await
        .expect_err("refresh after expiry");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(
        common::keys_under(&mut raw, &prefix).await.is_empty(),
        "re-created"
    );
    backend
        .release(&lease)
        .await
        .expect("releasing a gone lease is fine");
}

/// Issue #14 item 5: etcd reports a lease's TTL in whole seconds, rounded down, so a holder
/// with under a second left reads 0. Reported as 0 s left, it made waiters poll every
/// millisecond until etcd deleted the key; it has up to a second left, so say so.
#[tokio::test]
async fn a_holder_under_a_second_from_expiry_does_not_report_zero() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("ttl-zero");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let session = raw.lease_grant(2).await.expect("grant");
    let granted = tokio::time::Instant::now();
    let key = format!("{prefix}dying/{session:x}");
    raw.put(key.as_str(), "", session).await.expect("put");
    tokio::time::sleep_until(granted + Duration::from_millis(1300)).await;
    let Acquire::Held(holder) = attempt(&backend, &name("dying"), &Identity::unique()).await else {
        panic!("acquired a lock whose lease has about 0.6 s left");
    };
    assert_eq!(holder.expires_in(), Some(Duration::from_secs(1)));
    let shown = backend.inspect(&name("dying")).await.expect("inspect");
    let shown = shown.expect("inspect calls a lock with about 0.5 s left free");
    assert_eq!(shown.expires_in(), Some(Duration::from_secs(1)));
}

/// A key written the way `etcdctl lock` and Go's `concurrency.Mutex` write it (empty value,
/// bound to the client's session lease) owns the lock for anylock too, and is shown by its
/// lease id.
#[tokio::test]
async fn a_go_style_key_holds_the_lock() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("gokey");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("shared");
    let session = raw.lease_grant(30).await.expect("grant");
    let key = format!("{prefix}shared/{session:x}");
    let put = raw.put(key.as_str(), "", session).await.expect("put");
    let revision = put.header.expect("header").revision;
    let holder = backend
        .inspect(&lock)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.owner().as_str(), format!("etcd-lease/{session:x}"));
    assert_eq!(
        holder.token().map(|t| t.get()),
        u64::try_from(revision).ok()
    );
    match attempt(&backend, &lock, &Identity::unique()).await {
        Acquire::Held(info) => assert_eq!(info.owner(), holder.owner()),
        Acquire::Acquired(_) => panic!("granted while a Go client holds it"),
    }
    raw.lease_revoke(session).await.expect("revoke");
    let lease = grant(&backend, &lock, &Identity::unique()).await;
    assert!(lease.token().expect("token").get() > u64::try_from(revision).expect("fits"));
    backend.release(&lease).await.expect("release");
}

/// Same-owner retake with a Go waiter queued behind the abandoned key: the abandoned key
/// is deleted (the waiter, first in line, now owns the lock) and the retake reports Held.
#[tokio::test]
async fn retake_hands_over_to_a_queued_go_waiter() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("retake");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("queued");
    let me = Identity::unique();
    let abandoned = grant(&backend, &lock, &me).await;
    let session = raw.lease_grant(30).await.expect("grant");
    let waiter = format!("{prefix}queued/{session:x}");
    raw.put(waiter.as_str(), "", session).await.expect("put");
    match attempt(&backend, &lock, &me).await {
        Acquire::Held(info) => assert_eq!(info.owner().as_str(), format!("etcd-lease/{session:x}")),
        Acquire::Acquired(_) => panic!("the retake jumped ahead of a queued waiter"),
    }
    let keys = common::keys_under(&mut raw, &prefix).await;
    let keys: Vec<_> = keys
        .iter()
        .map(|kv| std::str::from_utf8(&kv.key).expect("utf-8").to_owned())
        .collect();
    assert_eq!(
        keys,
        [waiter],
        "the abandoned key should be gone, and no new key made"
    );
    let err = backend
        .refresh(&abandoned)
        .await
        .expect_err("abandoned grant");
    assert_eq!(err.kind(), ErrorKind::Lost);
    raw.lease_revoke(session).await.expect("revoke");
    backend.release(&abandoned).await.expect("release");
}

/// `break_lock` removes whoever holds the lock (an anylock or a Go holder), reports who it
/// was, turns an anylock holder Lost, and the next grant gets a greater token.
#[tokio::test]
async fn break_lock_removes_the_holder() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("break");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let lock = name("stuck");
    assert!(
        backend.break_lock(&lock).await.expect("break").is_none(),
        "free lock"
    );
    let owner = Identity::unique();
    let lease = grant(&backend, &lock, &owner).await;
    let broken = backend
        .break_lock(&lock)
        .await
        .expect("break")
        .expect("held");
    assert_eq!(broken.owner(), &owner);
    assert_eq!(broken.token(), lease.token());
    assert_eq!(
        backend.refresh(&lease).await.expect_err("broken").kind(),
        ErrorKind::Lost
    );
    let session = raw.lease_grant(30).await.expect("grant");
    let key = format!("{prefix}stuck/{session:x}");
    raw.put(key.as_str(), "", session).await.expect("put");
    let broken = backend
        .break_lock(&lock)
        .await
        .expect("break")
        .expect("held");
    assert_eq!(broken.owner().as_str(), format!("etcd-lease/{session:x}"));
    assert!(common::keys_under(&mut raw, &prefix).await.is_empty());
    let next = grant(&backend, &lock, &Identity::unique()).await;
    assert!(next.token() > lease.token());
    backend.release(&next).await.expect("release");
    backend.release(&lease).await.expect("release");
    raw.lease_revoke(session).await.expect("revoke");
}

/// gRPC calls started per method, from etcd's Prometheus metrics.
async fn grpc_started(port: u16) -> BTreeMap<String, u64> {
    common::grpc_metric(port, "grpc_server_started_total").await
}

fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    common::metric_diff(before, after)
}

fn calls(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(m, n)| ((*m).to_owned(), *n)).collect()
}

/// Counts the RPCs of each operation twice: the backend's own counter, and etcd's
/// `grpc_server_started_total` on a private single-member server nobody else uses.
/// The first acquire grants the session lease (LeaseGrant + Txn); after that an
/// uncontended acquire + release is 2 RPCs, both Txns (the two Raft writes etcd's own
/// Lock RPC with a shared lease makes), and a held attempt makes no lease.
#[tokio::test]
async fn rpc_counts_per_operation() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let cluster = Etcd::start(&[(27595, 27695)], false).await;
    let backend = common::backend(&cluster.endpoints(), "count/").await;
    let port = 27595;
    let lock = name("counted");
    // Warm the connection up so connection set-up is not counted.
    backend.inspect(&lock).await.expect("inspect");
    let step = async || (grpc_started(port).await, backend.rpcs_sent());
    let (m0, r0) = step().await;
    let lease = grant(&backend, &lock, &Identity::unique()).await;
    let (m1, r1) = step().await;
    assert_eq!(diff(&m0, &m1), calls(&[("LeaseGrant", 1), ("Txn", 1)]));
    assert_eq!(r1 - r0, 2);
    // The first refresh opens the shared keep-alive stream; the key is read by a Txn.
    backend.refresh(&lease).await.expect("refresh");
    let (m2, r2) = step().await;
    assert_eq!(diff(&m1, &m2), calls(&[("LeaseKeepAlive", 1), ("Txn", 1)]));
    assert_eq!(r2 - r1, 2);
    let held = attempt(&backend, &lock, &Identity::unique()).await;
    assert!(matches!(held, Acquire::Held(_)));
    let (m3, r3) = step().await;
    let expected = [("Txn", 1), ("LeaseTimeToLive", 1)];
    assert_eq!(diff(&m2, &m3), calls(&expected));
    assert_eq!(r3 - r2, 2);
    backend.release(&lease).await.expect("release");
    let (m4, r4) = step().await;
    assert_eq!(diff(&m3, &m4), calls(&[("Txn", 1)]));
    assert_eq!(r4 - r3, 1);
    let watch = backend.subscribe(&lock).await.expect("subscribe");
    let (m5, r5) = step().await;
    assert_eq!(diff(&m4, &m5), calls(&[("Watch", 1)]));
    assert_eq!(r5 - r4, 1);
    drop(watch);
    // A second lock cycle on the same session: no lease granted or revoked.
    let again = grant(&backend, &lock, &Identity::unique()).await;
    backend.release(&again).await.expect("release");
    let (m6, r6) = step().await;
    assert_eq!(diff(&m5, &m6), calls(&[("Txn", 2)]));
    assert_eq!(r6 - r5, 2);
    let mut raw = common::raw(&cluster.endpoints()).await;
    let leases = raw.lease_count().await.expect("leases");
    assert_eq!(
        leases, 1,
        "one session lease, and no lease per release or held attempt"
    );
    assert!(common::keys_under(&mut raw, "count/").await.is_empty());
    println!("uncontended acquire + release: {} RPCs", r6 - r5);
}

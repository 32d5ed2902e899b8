//! Refreshing many leases at once (`refresh_many`): per-lease results in order, the same
//! as one `refresh` each, in a bounded number of RPCs (counted by etcd's own metrics on a
//! private server), and the shared pool of keep-alive streams coming back after the
//! connection is cut.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Note, Ttl,
};
use test_kit::proxy::{Fault, FaultProxy};
use test_kit::servers::Etcd;

const TTL: Duration = Duration::from_secs(30);

/// How many keep-alive streams a backend keeps (`STREAMS` in `src/keepalive.rs`).
const STREAMS: u64 = 8;

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

async fn take(backend: &EtcdBackend, lock: &str, owner: &Identity, note: Option<&str>) -> Lease {
    take_for(backend, lock, owner, note, TTL).await
}

/// As [`take`] with a TTL of `ttl`: the backend's locks of one TTL share one session
/// lease, so locks that must each have an etcd lease of their own get distinct TTLs.
async fn take_for(
    backend: &EtcdBackend,
    lock: &str,
    owner: &Identity,
    note: Option<&str>,
    ttl: Duration,
) -> Lease {
    let request = AcquireRequest::new(name(lock), owner.clone(), Ttl::new(ttl).expect("TTL"))
        .with_note(note.map(|n| Note::new(n).expect("note")));
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} unexpectedly held by {}", holder.owner()),
    }
}

/// The etcd lease id in a lease's grant (`"<lease hex>:<revision>"`).
fn lease_id(lease: &Lease) -> i64 {
    let hex = lease.grant().split_once(':').expect("etcd grant").0;
    i64::from_str_radix(hex, 16).expect("hex lease id")
}

fn kinds(results: &[lockcore::Result<Lease>]) -> Vec<Result<(), ErrorKind>> {
    results
        .iter()
        .map(|r| r.as_ref().map(drop).map_err(lockcore::Error::kind))
        .collect()
}

/// One batch mixing every case, in order: a live lease (its TTL on the server is
/// extended), one released before the batch (Lost, its key not re-created), a stale
/// grant (broken: its lease lives, its key is gone) whose name a rival now holds (Lost,
/// the rival untouched), one revoked on the
/// server (Lost), one carrying a note, and one lock twice (its stale grant after a
/// same-owner retake, and the retake; the live lease twice as well). Each result is what
/// a single `refresh` of that lease says.
#[tokio::test]
async fn a_batch_reports_each_lease_alone_and_in_order() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("batch");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let me = Identity::unique();

    let live = take(&backend, "live", &me, None).await;
    let released = take(&backend, "released", &me, None).await;
    backend.release(&released).await.expect("release");
    // Broken by an operator (its lease lives on), then taken by a rival.
    let stale = take(&backend, "contested", &me, None).await;
    backend.break_lock(&name("contested")).await.expect("break");
    let rival = take(&backend, "contested", &Identity::unique(), None).await;
    // A TTL of its own, so its own session lease: revoking the session of the others
    // would lose every lock on it (`tests/session.rs`).
    let revoked = take_for(&backend, "revoked", &me, None, TTL + Duration::from_secs(1)).await;
    raw.lease_revoke(lease_id(&revoked)).await.expect("revoke");
    let noted = take(&backend, "noted", &me, Some("deploy #7")).await;
    let before_retake = take(&backend, "twice", &me, None).await;
    let retaken = take(&backend, "twice", &me, None).await;
    assert!(
        retaken.token() > before_retake.token(),
        "a retake is a new grant"
    );
    let rival_key = common::keys_under(&mut raw, &format!("{prefix}contested/")).await;

    // Let the live lease's TTL run down, so the batch's keep-alive shows.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let left_before = raw.lease_time_to_live(lease_id(&live)).await.expect("ttl");
    assert!(left_before <= 28, "TTL {left_before} s has not run down");

    let batch = [
        live.clone(),
        released.clone(),
        stale.clone(),
        revoked.clone(),
        noted.clone(),
        before_retake.clone(),
        retaken.clone(),
        live.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    use ErrorKind::Lost;
    assert_eq!(
        kinds(&results),
        vec![
            Ok(()),
            Err(Lost),
            Err(Lost),
            Err(Lost),
            Ok(()),
            Err(Lost),
            Ok(()),
            Ok(())
        ]
    );
    for (result, lease) in results.iter().zip(&batch) {
        if let Ok(refreshed) = result {
            assert_eq!(
                refreshed.grant(),
                lease.grant(),
                "the same grant comes back"
            );
        }
    }
    let left_after = raw.lease_time_to_live(lease_id(&live)).await.expect("ttl");
    assert!(
        left_after >= 29,
        "the live lease was not kept alive: {left_after} s"
    );

    // Nothing re-created, the rival untouched.
    for gone in ["released", "revoked"] {
        let keys = common::keys_under(&mut raw, &format!("{prefix}{gone}/")).await;
        assert!(keys.is_empty(), "{gone}: a key came back: {keys:?}");
    }
    let rival_now = common::keys_under(&mut raw, &format!("{prefix}contested/")).await;
    assert_eq!(rival_now, rival_key, "the rival's key changed");
    backend
        .refresh(&rival)
        .await
        .expect("the rival still holds");

    // Each result is what one refresh of that lease says.
    for (lease, batched) in batch.iter().zip(kinds(&results)) {
        let single = backend.refresh(lease).await.map(drop).map_err(|e| e.kind());
        assert_eq!(single, batched, "{}", lease.grant());
    }
    assert_eq!(kinds(&backend.refresh_many(&[]).await), vec![]);
    for lease in [live, noted, retaken, rival, stale] {
        backend.release(&lease).await.expect("release");
    }
}

fn calls(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(m, n)| ((*m).to_owned(), *n)).collect()
}

/// What etcd counted: calls started per method, and keep-alive requests received.
async fn etcd_counts(port: u16) -> (BTreeMap<String, u64>, u64) {
    let started = common::grpc_metric(port, "grpc_server_started_total").await;
    let received = common::grpc_metric(port, "grpc_server_msg_received_total").await;
    let keep_alives = received.get("LeaseKeepAlive").copied().unwrap_or(0);
    (started, keep_alives)
}

/// A batch of 200 leases on 200 etcd leases (200 TTLs, so 200 session leases) costs one
/// keep-alive request each on the pool's streams, opened once for the backend's life
/// (200 leases use all 8), and one Txn per 128 leases: 2 RPCs for the batch (10 when it
/// opens the streams), not the 400 of 200 refreshes. Single refreshes reuse the streams.
/// 200 locks on one session cost one keep-alive request and the same 2 Txns. Counted by
/// etcd's metrics on a private single-member server nobody else uses.
#[tokio::test]
async fn a_batch_of_200_costs_the_pools_streams_and_a_txn_per_128_leases() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let port = 27596;
    let cluster = Etcd::start(&[(port, 27696)], false).await;
    let backend = common::backend(&cluster.endpoints(), "batch/").await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for i in 0..200 {
        let ttl = TTL + Duration::from_secs(i);
        leases.push(take_for(&backend, &format!("lock-{i}"), &me, None, ttl).await);
    }
    assert!(backend.refresh_batch_limit() >= 200);

    let (m0, k0) = etcd_counts(port).await;
    let r0 = backend.rpcs_sent();
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", kinds(&results));
    let (m1, k1) = etcd_counts(port).await;
    let r1 = backend.rpcs_sent();
    assert_eq!(
        common::metric_diff(&m0, &m1),
        calls(&[("LeaseKeepAlive", STREAMS), ("Txn", 2)]),
        "the first batch opens the keep-alive streams"
    );
    assert_eq!(k1 - k0, 200, "one keep-alive request per lease");
    assert_eq!(r1 - r0, STREAMS + 2);

    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", kinds(&results));
    let (m2, k2) = etcd_counts(port).await;
    assert_eq!(common::metric_diff(&m1, &m2), calls(&[("Txn", 2)]));
    assert_eq!(k2 - k1, 200);
    assert_eq!(backend.rpcs_sent() - r1, 2);

    for lease in &leases[..3] {
        backend.refresh(lease).await.expect("refresh");
    }
    let (m3, k3) = etcd_counts(port).await;
    assert_eq!(
        common::metric_diff(&m2, &m3),
        calls(&[("Txn", 3)]),
        "single refreshes share the streams"
    );
    assert_eq!(k3 - k2, 3);
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }

    // 200 locks of one TTL: one session lease, kept alive once per batch.
    let mut shared = Vec::new();
    for i in 0..200 {
        shared.push(take(&backend, &format!("shared-{i}"), &me, None).await);
    }
    let (m4, k4) = etcd_counts(port).await;
    let results = backend.refresh_many(&shared).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", kinds(&results));
    let (m5, k5) = etcd_counts(port).await;
    assert_eq!(common::metric_diff(&m4, &m5), calls(&[("Txn", 2)]));
    assert_eq!(k5 - k4, 1, "one keep-alive request for the shared session");
    for lease in &shared {
        backend.release(lease).await.expect("release");
    }
}

/// The pool's keep-alive streams die with their connection: refreshes then fail with a
/// temporary error (never Lost), and once the member is reachable again every stream of
/// the pool is opened anew: a batch of leases spread over all of them is refreshed (each
/// lease's TTL extended on the server), and the next batch opens no stream.
#[tokio::test]
async fn every_keep_alive_stream_recovers_after_the_connection_is_cut() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let host = endpoints[0].trim_start_matches("http://");
    let upstream = tokio::net::lookup_host(host)
        .await
        .expect("resolve")
        .next()
        .expect("an address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let config = EtcdConfig::new([proxy.local_addr().to_string()])
        .expect("endpoint")
        .with_prefix(&common::random_prefix("recover"))
        .with_request_timeout(Duration::from_secs(1));
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let raw = common::raw(&endpoints).await;
    let me = Identity::unique();
    // 100 etcd leases (100 TTLs, so 100 sessions): every stream of the pool carries some
    // (as the count test shows for 200; 100 leave a slot empty with odds of about 1 in
    // 10^5).
    let mut leases = Vec::new();
    for i in 0..100 {
        let ttl = TTL + Duration::from_secs(i);
        leases.push(take_for(&backend, &format!("job-{i}"), &me, None, ttl).await);
    }
    let r0 = backend.rpcs_sent();
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", kinds(&results));
    assert_eq!(
        backend.rpcs_sent() - r0,
        STREAMS + 1,
        "the batch opens every stream of the pool, and one Txn"
    );

    proxy.set_fault(Fault::Reset);
    for result in backend.refresh_many(&leases).await {
        let err = result.expect_err("no connection");
        assert!(err.is_temporary(), "{err}");
        assert_ne!(err.kind(), ErrorKind::Lost, "{err}");
    }
    proxy.set_fault(Fault::Pass);

    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut recovered = false;
    for _ in 0..50 {
        let results = backend.refresh_many(&leases).await;
        if results.iter().all(Result::is_ok) {
            recovered = true;
            break;
        }
        for result in results {
            if let Err(err) = result {
                assert!(err.is_temporary(), "{err}");
                assert_ne!(err.kind(), ErrorKind::Lost, "{err}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "refreshes never came back");
    // All at once: read one after another, the last are read over a second after the
    // refresh on a loaded machine, and etcd's whole-second TTL has dropped by 2 by then.
    let reads = leases.iter().map(|lease| {
        let mut raw = raw.clone();
        async move { raw.lease_time_to_live(lease_id(lease)).await.expect("ttl") }
    });
    let lefts = futures_util::future::join_all(reads).await;
    for (lease, left) in leases.iter().zip(lefts) {
        let full = i64::try_from(lease.ttl().get().as_secs()).expect("TTL");
        assert!(
            left >= full - 1,
            "{}: the new streams did not keep the lease alive: {left} s",
            lease.grant()
        );
    }
    let r1 = backend.rpcs_sent();
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", kinds(&results));
    assert_eq!(
        backend.rpcs_sent() - r1,
        1,
        "every stream of the pool was open again: only the Txn"
    );
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

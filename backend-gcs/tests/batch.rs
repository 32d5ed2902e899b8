//! Batched refresh (`refresh_many`) over GCS's batch endpoint, against the in-process test
//! server: one HTTP request per 100 leases, each lease answered as a lone refresh would be,
//! a lost batch reply recovered lease by lease, and an endpoint without batches served by
//! lone refreshes.

mod common;

use std::time::Duration;

use backend_gcs::GcsBackend;
use common::Gcs;
use gcs_test_server::Fault;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, LockOptions,
    Locker, Ttl,
};

async fn grant(backend: &GcsBackend, lock: &str) -> Lease {
    let request = AcquireRequest::new(
        LockName::new(lock).expect("name"),
        Identity::unique(),
        Ttl::new(Duration::from_secs(30)).expect("ttl"),
    );
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} held by {holder:?}"),
    }
}

async fn grants(backend: &GcsBackend, count: usize) -> Vec<Lease> {
    let mut leases = Vec::new();
    for i in 0..count {
        leases.push(grant(backend, &format!("lock-{i}")).await);
    }
    leases
}

/// The metageneration the server holds for `lock`.
async fn metageneration(gcs: &Gcs, lock: &str) -> String {
    let resource = gcs.raw_get(lock).await.expect("object exists");
    resource["metageneration"]
        .as_str()
        .expect("string")
        .to_owned()
}

fn methods(gcs: &Gcs) -> Vec<String> {
    gcs.server
        .requests()
        .into_iter()
        .map(|r| r.method)
        .collect()
}

fn kinds(results: &[lockcore::Result<Lease>]) -> Vec<Option<ErrorKind>> {
    results
        .iter()
        .map(|r| r.as_ref().err().map(lockcore::Error::kind))
        .collect()
}

#[tokio::test]
async fn one_http_request_carries_up_to_100_refreshes() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    assert_eq!(backend.refresh_batch_limit(), 100);
    let leases = grants(&backend, 250).await;
    gcs.server.clear_requests();
    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), 250);
    for (lease, result) in leases.iter().zip(&results) {
        let refreshed = result.as_ref().expect("refreshed");
        assert_eq!(refreshed.name(), lease.name());
        assert_eq!(refreshed.token(), lease.token());
        assert_ne!(refreshed.grant(), lease.grant(), "the metageneration moved");
    }
    let batches = gcs
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST");
    assert_eq!(batches.count(), 3, "100 + 100 + 50");
    assert_eq!(methods(&gcs).len(), 253, "250 PATCHes inside 3 batches");
    assert_eq!(metageneration(&gcs, "lock-249").await, "2");
    // The refreshed leases are the current grants: they refresh and release.
    let again = backend
        .refresh_many(&[results[0].as_ref().expect("ok").clone()])
        .await;
    backend
        .release(again[0].as_ref().expect("ok"))
        .await
        .expect("release");
    assert!(gcs.raw_get("lock-0").await.is_none());
}

#[tokio::test]
async fn each_lease_gets_what_a_lone_refresh_would() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 4).await;
    gcs.raw_delete("lock-1").await; // an operator deleted it
    let thief = Identity::unique();
    gcs.raw_delete("lock-2").await;
    gcs.raw_put("lock-2", &thief, Duration::from_secs(30)).await; // someone else's now
    // An unconditional PATCH by someone else moved lock-3's metageneration: the batch's
    // call gets 412, and the recovery (same generation, ours, fresh) extends it.
    gcs.raw_patch("lock-3", serde_json::json!({ "other": "x" }))
        .await;
    let results = backend.refresh_many(&leases).await;
    assert_eq!(
        kinds(&results),
        vec![None, Some(ErrorKind::Lost), Some(ErrorKind::Lost), None]
    );
    assert_eq!(metageneration(&gcs, "lock-3").await, "3");
    for (lease, batched) in leases[1..3].iter().zip(&results[1..3]) {
        let lone = backend.refresh(lease).await;
        assert_eq!(
            lone.as_ref().err().map(lockcore::Error::kind),
            batched.as_ref().err().map(lockcore::Error::kind)
        );
    }
    assert!(gcs.raw_get("lock-1").await.is_none(), "never re-created");
}

#[tokio::test]
async fn a_server_error_on_one_call_fails_that_lease_alone() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 3).await;
    gcs.server.inject(Fault::ServerErrors { count: 1 });
    let results = backend.refresh_many(&leases).await;
    assert_eq!(
        kinds(&results),
        vec![Some(ErrorKind::Unavailable), None, None]
    );
    assert!(
        results[0]
            .as_ref()
            .err()
            .is_some_and(lockcore::Error::is_temporary)
    );
    assert_eq!(
        metageneration(&gcs, "lock-0").await,
        "1",
        "the failed call changed nothing"
    );
}

/// The batch's PATCHes all applied, its reply lost: every lease is OutcomeUnknown (never
/// Lost), and the next refresh of the old leases gets 412 on each call and recovers each
/// one, as a lone refresh recovers its own lost reply.
#[tokio::test]
async fn a_lost_batch_reply_is_recovered_lease_by_lease() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 5).await;
    gcs.server.inject(Fault::LoseReplies { count: 1 });
    let lost = backend.refresh_many(&leases).await;
    assert!(
        kinds(&lost)
            .iter()
            .all(|k| *k == Some(ErrorKind::OutcomeUnknown)),
        "{:?}",
        kinds(&lost)
    );
    assert_eq!(
        metageneration(&gcs, "lock-4").await,
        "2",
        "the calls applied"
    );
    let results = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&results), vec![None; 5]);
    for (i, result) in results.iter().enumerate() {
        let current = metageneration(&gcs, &format!("lock-{i}")).await;
        assert_eq!(
            current, "3",
            "extended once more under the current metageneration"
        );
        assert!(result.as_ref().expect("ok").grant().ends_with(":3"));
    }
}

/// An endpoint without the batch endpoint (older emulators) answers it 404: that must
/// never read as "the lock object was deleted". The leases go as lone refreshes, and so
/// do later ones.
#[tokio::test]
async fn an_endpoint_without_batches_gets_lone_refreshes() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 3).await;
    gcs.server.inject(Fault::NoBatches);
    gcs.server.clear_requests();
    let results = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&results), vec![None; 3]);
    assert_eq!(methods(&gcs), ["POST", "PATCH", "PATCH", "PATCH"]);
    assert_eq!(gcs.server.requests()[0].status, 404);
    assert_eq!(
        backend.refresh_batch_limit(),
        100,
        "a Locker reads it once: refresh_many itself sends the leases alone"
    );
    gcs.server.clear_requests();
    let refreshed: Vec<Lease> = results.into_iter().map(|r| r.expect("ok")).collect();
    let again = backend.refresh_many(&refreshed).await;
    assert_eq!(kinds(&again), vec![None; 3]);
    assert_eq!(
        methods(&gcs),
        ["PATCH", "PATCH", "PATCH"],
        "no batch tried again"
    );
}

/// Through a `Locker`, the guards' refreshes share batch requests.
#[tokio::test]
async fn a_lockers_guards_refresh_in_batches() {
    let gcs = Gcs::start().await;
    let backend = std::sync::Arc::new(gcs.backend().await);
    let options =
        LockOptions::new(Duration::from_secs(8)).with_refresh_interval(Duration::from_secs(1));
    let locker = Locker::new(backend).with_options(options);
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(locker.acquire(&format!("held-{i}")).await.expect("acquire"));
    }
    gcs.server.clear_requests();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let requests = gcs.server.requests();
    let batches = requests.iter().filter(|r| r.method == "POST").count();
    let patches = requests.iter().filter(|r| r.method == "PATCH").count();
    assert!(
        patches >= 40,
        "20 guards refreshed at least twice in 3.5 s: {patches}"
    );
    assert!(
        batches >= 1 && batches * 5 <= patches,
        "{batches} batch requests for {patches} refreshes: guards were not batched"
    );
    for guard in guards {
        let health = guard.health().borrow().clone();
        assert_eq!(health, lockcore::Health::Healthy);
        guard.release().await.expect("release");
    }
}

/// The batch request refused as a whole (503 before any call ran): every lease gets the
/// temporary error a lone PATCH answered 503 gets, nothing changed on the server.
#[tokio::test]
async fn a_refused_batch_request_fails_each_lease_temporarily_and_changes_nothing() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 3).await;
    gcs.server.inject(Fault::BatchErrors {
        count: 1,
        status: 503,
    });
    let results = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&results), vec![Some(ErrorKind::Unavailable); 3]);
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().err().is_some_and(lockcore::Error::is_temporary))
    );
    assert_eq!(metageneration(&gcs, "lock-2").await, "1", "no call ran");
    let again = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&again), vec![None; 3]);
}

/// A batch reply cut short (every call applied; the multipart body ends mid-answer, with
/// no close delimiter): no lease is reported refreshed or lost on a reply it cannot trust,
/// each is `OutcomeUnknown`, and the next refresh recovers each from its 412.
#[tokio::test]
async fn a_cut_batch_reply_is_unknown_for_each_lease_and_recovered_next_time() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 6).await;
    gcs.server.inject(Fault::CutBatchReplies { count: 1 });
    let cut = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&cut), vec![Some(ErrorKind::OutcomeUnknown); 6]);
    assert_eq!(
        metageneration(&gcs, "lock-5").await,
        "2",
        "the calls applied"
    );
    let results = backend.refresh_many(&leases).await;
    assert_eq!(kinds(&results), vec![None; 6]);
    for i in 0..6 {
        assert_eq!(metageneration(&gcs, &format!("lock-{i}")).await, "3");
    }
}

/// A batch the server or a proxy will not take (413 for its size, 400 for its envelope)
/// was refused before any call ran: that is no verdict on any lease, which go alone and
/// are refreshed. (Mapped like a lone PATCH's 413 or 400, every lease would end: both are
/// permanent errors.)
#[tokio::test]
async fn a_batch_refused_for_its_form_sends_the_leases_alone() {
    for status in [413, 400] {
        let gcs = Gcs::start().await;
        let backend = gcs.backend().await;
        let leases = grants(&backend, 3).await;
        gcs.server.inject(Fault::BatchErrors { count: 1, status });
        gcs.server.clear_requests();
        let results = backend.refresh_many(&leases).await;
        assert_eq!(kinds(&results), vec![None; 3], "{status}");
        assert_eq!(
            methods(&gcs),
            ["POST", "PATCH", "PATCH", "PATCH"],
            "{status}"
        );
    }
}

/// More than 100 leases: the batch requests go out at once (each under its own turn).
#[tokio::test]
async fn batch_requests_for_more_than_100_leases_go_out_at_once() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let leases = grants(&backend, 250).await;
    gcs.server.inject(Fault::Delay(Duration::from_millis(300)));
    gcs.server.clear_requests();
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(
        gcs.server.most_in_flight(),
        3,
        "the three batch requests overlapped"
    );
}

//! The canary and basic lock cycles against fake-gcs-server, an implementation we did not
//! write, to cross-check the backend's wire format (issue 7). fake-gcs-server ignores
//! preconditions on PATCH and DELETE and never bumps metageneration (docs/gcs-test-server.md),
//! so only cases that need create-if-absent and plain reads and writes run here; the full
//! suite runs against `gcs-test-server` (tests/conformance.rs).
//!
//! Needs `ANYLOCK_TEST_FAKE_GCS_URL` (`scripts/servers start`): a failure in CI, skipped
//! with one line elsewhere.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use backend_gcs::GcsBackend;
use common::Bucket;
use conformance::{Cuttable, Harness, Timing};
use lockcore::{
    Acquire, AcquireRequest, Identity, LockBackend, LockName, LockOptions, Locker, Note,
};

struct FakeGcsHarness {
    objects: Bucket,
    backend: GcsBackend,
    timing: Timing,
}

/// A fresh bucket on fake-gcs-server, or `None` (skip) outside CI without it.
async fn harness() -> Option<FakeGcsHarness> {
    let url = test_kit::env::require("ANYLOCK_TEST_FAKE_GCS_URL", "fake-gcs-server")?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let bucket = format!("anylock-fake-{nanos}");
    // Building a backend first installs the rustls provider a plain reqwest client needs.
    drop(
        GcsBackend::from_url(&format!("gs://{bucket}/?endpoint={url}"))
            .await
            .expect("backend"),
    );
    let created = reqwest::Client::new()
        .post(format!("{url}/storage/v1/b"))
        .json(&serde_json::json!({ "name": bucket }))
        .send()
        .await
        .expect("create the bucket on fake-gcs-server");
    assert!(
        created.status().is_success(),
        "create bucket: {}",
        created.status()
    );
    let objects = Bucket::new(&url, &bucket, "locks/");
    let backend = objects.backend().await;
    Some(FakeGcsHarness {
        objects,
        backend,
        timing: Timing::default(),
    })
}

/// The expiry timing `tests/conformance.rs` gives the backend: `Date` has one-second
/// resolution and staleness allows one more second, so a lapsed lock is taken over (and
/// leaves listings) up to 2 s after its TTL.
fn server_clock_timing() -> Timing {
    Timing::default()
        .with_ttl(Duration::from_secs(3))
        .with_slack(Duration::from_secs(3))
        .with_expiry_resolution(Duration::from_secs(1))
}

#[async_trait]
impl Harness for FakeGcsHarness {
    fn label(&self) -> &str {
        "gcs-on-fake-gcs-server"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
    }

    fn timing(&self) -> Timing {
        self.timing.clone()
    }

    async fn admin_delete(&self, name: &LockName) {
        self.objects.raw_delete(name.as_str()).await;
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        self.objects.raw_put(name.as_str(), owner, ttl).await;
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        None
    }
}

/// Two simultaneous create-if-absent inserts, 20 times: exactly one wins each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_conditional_create() {
    let Some(h) = harness().await else { return };
    conformance::run_case(
        &h,
        "canary_conditional_create",
        conformance::cases::canary_conditional_create,
    )
    .await;
}

/// Try-acquire, release, re-acquire, with a second name held meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_reacquire() {
    let Some(h) = harness().await else { return };
    conformance::run_case(
        &h,
        "acquire_release_reacquire",
        conformance::cases::acquire_release_reacquire,
    )
    .await;
}

/// The holder as another process sees it: owner, fence token, time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder() {
    let Some(h) = harness().await else { return };
    conformance::run_case(
        &h,
        "inspect_shows_the_holder",
        conformance::cases::inspect_shows_the_holder,
    )
    .await;
}

/// A whole cycle through the Locker: acquire, a contender told who holds it, release
/// (object gone), and a re-acquire with a higher fence token. A refresh is refused, safely:
/// fake-gcs-server's PATCH reply has no `metageneration` (a known deviation from GCS), and
/// the backend will not guess the precondition for the next write, so a guard refreshing
/// on fake-gcs-server turns Lost at its first refresh rather than trusting a bad reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cycle_through_the_locker() {
    let Some(h) = harness().await else { return };
    let options = LockOptions::new(Duration::from_secs(30));
    let locker = Locker::new(h.backend()).with_options(options.clone());
    let guard = locker.acquire("cycle").await.expect("free");
    let first = guard.fence_token().expect("generation");
    let rival = Locker::new(h.backend()).with_options(options);
    assert!(
        rival.try_acquire("cycle").await.expect("answer").is_none(),
        "held"
    );
    let refused = h
        .backend
        .refresh(&guard.lease())
        .await
        .expect_err("no metageneration");
    assert_eq!(refused.kind(), lockcore::ErrorKind::Protocol, "{refused}");
    assert!(refused.to_string().contains("metageneration"), "{refused}");
    let object = h.objects.raw_get("cycle").await.expect("object exists");
    assert_eq!(
        object["metadata"]["identity"],
        guard.lease().owner().as_str()
    );
    guard.release().await.expect("released");
    assert!(
        h.objects.raw_get("cycle").await.is_none(),
        "release deleted the object"
    );
    let again = rival.acquire("cycle").await.expect("free again");
    assert!(again.fence_token().expect("generation") > first);
    again.release().await.expect("released");
}

/// Listing through fake-gcs-server's `objects.list` (prefix, `maxResults`, `pageToken`,
/// metadata in the items): held locks under a prefix with pattern characters, released
/// and expired ones left out. It needs no refresh, so the conformance case runs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_held_locks() {
    let Some(mut h) = harness().await else { return };
    h.timing = server_clock_timing();
    conformance::run_case(
        &h,
        "list_shows_held_locks",
        conformance::cases::list_shows_held_locks,
    )
    .await;
}

/// The note rides in the create's metadata and comes back from inspect, `Held` and list;
/// a same-owner retake replaces it and a later grant without one shows none. (The
/// conformance case also refreshes, which fake-gcs-server's PATCH reply cannot support.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_note_is_stored_with_the_grant() {
    let Some(h) = harness().await else { return };
    let backend = &h.backend;
    let lock = LockName::new("noted/ü %*?[").expect("name");
    let owner = Identity::unique();
    let ttl = Duration::from_secs(30);
    let first = Note::new("run https://ci.example/run/42 — ✓").expect("note");
    let request = AcquireRequest::new(
        lock.clone(),
        owner.clone(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let Acquire::Acquired(_) = backend
        .acquire(&request.clone().with_note(Some(first.clone())))
        .await
        .expect("acquire")
    else {
        panic!("free name");
    };
    let shown = backend.inspect(&lock).await.expect("inspect");
    assert_eq!(shown.and_then(|i| i.note().cloned()), Some(first.clone()));
    let rival = AcquireRequest::new(
        lock.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let Acquire::Held(holder) = backend.acquire(&rival).await.expect("rival") else {
        panic!("a contender got a held lock");
    };
    assert_eq!(holder.note(), Some(&first));
    let listed = backend.list("noted/").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name(), &lock);
    assert_eq!(listed[0].holder().note(), Some(&first));

    let second = Note::new("retry 2").expect("note");
    let Acquire::Acquired(retake) = backend
        .acquire(&request.with_note(Some(second.clone())))
        .await
        .expect("retake")
    else {
        panic!("same-owner retake refused");
    };
    let shown = backend.inspect(&lock).await.expect("inspect");
    assert_eq!(shown.and_then(|i| i.note().cloned()), Some(second));
    backend.release(&retake).await.expect("release");
    let Acquire::Acquired(plain) = backend.acquire(&rival).await.expect("acquire") else {
        panic!("released");
    };
    let shown = backend.inspect(&lock).await.expect("inspect");
    assert_eq!(
        shown.expect("held").note(),
        None,
        "the old note outlived its grant"
    );
    backend.release(&plain).await.expect("release");
}

/// Our batch request, read by a server we did not write: fake-gcs-server applies each
/// PATCH of a `refresh_many` (the metadata lands on each object, a missing object is 404
/// for its lease alone), and each lease gets the answer a lone refresh gets there. Those
/// answers are `Protocol` errors, not success: fake-gcs-server's PATCH reply has no
/// `metageneration` (docs/gcs-test-server.md), so refresh cannot work on it either way; a
/// batch body it could not read would answer 400 (`InvalidInput`) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_refresh_is_applied_call_by_call() {
    let Some(h) = harness().await else { return };
    let mut leases = Vec::new();
    for lock in ["batch-a", "batch-b", "batch-c"] {
        let request = AcquireRequest::new(
            LockName::new(lock).expect("name"),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30)).expect("ttl"),
        );
        match h.backend.acquire(&request).await.expect("acquire") {
            Acquire::Acquired(lease) => leases.push(lease),
            Acquire::Held(holder) => panic!("held by {holder:?}"),
        }
    }
    h.objects.raw_delete("batch-b").await;
    for lock in ["batch-a", "batch-c"] {
        h.objects
            .raw_patch(lock, serde_json::json!({ "expires": "marker" }))
            .await;
    }
    let batched = h.backend.refresh_many(&leases).await;
    let kinds: Vec<_> = batched
        .iter()
        .map(|r| r.as_ref().err().map(lockcore::Error::kind))
        .collect();
    use lockcore::ErrorKind::{Lost, Protocol};
    assert_eq!(kinds, vec![Some(Protocol), Some(Lost), Some(Protocol)]);
    for lock in ["batch-a", "batch-c"] {
        let resource = h.objects.raw_get(lock).await.expect("exists");
        assert_ne!(
            resource["metadata"]["expires"], "marker",
            "{lock}: the batch's PATCH was applied"
        );
    }
    for (lease, batched) in leases.iter().zip(&batched) {
        let lone = h.backend.refresh(lease).await;
        assert_eq!(
            lone.as_ref().err().map(lockcore::Error::kind),
            batched.as_ref().err().map(lockcore::Error::kind),
            "{}",
            lease.name()
        );
    }
}

/// A semaphore's objects on a server we did not write: slot object names with a TAB (in
/// paths, list prefixes and JSON names), a slot's create-if-absent and a same-owner
/// retake's overwrite under the slot's generation and metageneration, the list reading
/// each slot's metadata (before the write and in the limit check after it), and
/// release. (No refresh: fake-gcs-server's PATCH reply has no `metageneration`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_cycle() {
    let Some(h) = harness().await else { return };
    let backend = &h.backend;
    let sem = LockName::new("permits/ü %*?[").expect("name");
    let ttl = lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL");
    let one = lockcore::Permits::new(1).expect("permits");
    let ask =
        |owner: &Identity| AcquireRequest::new(sem.clone(), owner.clone(), ttl).with_permits(one);
    let (a, b) = (Identity::unique(), Identity::unique());
    let note = Note::new("permit note").expect("note");
    let Acquire::Acquired(first) = backend
        .acquire_permit(&ask(&a).with_note(Some(note.clone())))
        .await
        .expect("permit")
    else {
        panic!("a free semaphore");
    };
    let listed = backend
        .inspect_permits(&sem)
        .await
        .expect("inspect_permits");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].owner(), &a);
    assert_eq!(listed[0].token(), first.token());
    assert_eq!(listed[0].note(), Some(&note));
    let Acquire::Held(holder) = backend.acquire_permit(&ask(&b)).await.expect("attempt") else {
        panic!("a second permit of 1");
    };
    assert_eq!(holder.owner(), &a);
    let lock = AcquireRequest::new(sem.clone(), b.clone(), ttl);
    let Acquire::Acquired(lock) = backend.acquire(&lock).await.expect("lock") else {
        panic!("the lock of the semaphore's name is free");
    };
    backend.release(&lock).await.expect("release the lock");
    let Acquire::Acquired(retake) = backend.acquire_permit(&ask(&a)).await.expect("retake") else {
        panic!("same-owner retake refused");
    };
    assert!(retake.token() > first.token());
    assert_eq!(
        backend.inspect_permits(&sem).await.expect("inspect").len(),
        1
    );
    backend.release(&retake).await.expect("release");
    assert!(
        backend
            .inspect_permits(&sem)
            .await
            .expect("inspect")
            .is_empty()
    );
    let Acquire::Acquired(next) = backend.acquire_permit(&ask(&b)).await.expect("permit") else {
        panic!("released");
    };
    assert!(next.token() > retake.token());
    backend.release(&next).await.expect("release");
}

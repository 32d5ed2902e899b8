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
use conformance::{Cuttable, Harness};
use lockcore::{Identity, LockBackend, LockName, LockOptions, Locker};

struct FakeGcsHarness {
    objects: Bucket,
    backend: GcsBackend,
}

/// A fresh bucket on fake-gcs-server, or `None` (skip) outside CI without it.
async fn harness() -> Option<FakeGcsHarness> {
    let url = conformance::env::require("ANYLOCK_TEST_FAKE_GCS_URL", "fake-gcs-server")?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let bucket = format!("anylock-fake-{nanos}");
    // Building a backend first installs the rustls provider a plain reqwest client needs.
    drop(GcsBackend::from_url("gs://provider-warmup").expect("backend"));
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
    let backend = objects.backend();
    Some(FakeGcsHarness { objects, backend })
}

#[async_trait]
impl Harness for FakeGcsHarness {
    fn label(&self) -> &str {
        "gcs-on-fake-gcs-server"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
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

//! Auth end to end against the test server with auth required: a service-account key
//! signs a JWT, the server's token endpoint grants a bearer token, and every API call
//! carries it. Also the failures a user meets first: no credentials, a wrong token, a
//! broken key file, an unreachable token endpoint. Needs `openssl` to make a fresh key (`scripts/servers install` installs it).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use backend_gcs::{GcsAuth, GcsBackend, GcsConfig};
use common::Gcs;
use lockcore::{ErrorKind, LockOptions, Locker, RetryStatus};
use serde_json::json;

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "anylock-gcs-auth-{tag}-{}-{}",
            std::process::id(),
            lockcore::Identity::unique().as_str().replace('/', "_")
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a service-account key file with `json`'s contents.
fn key_file(dir: &Path, json: &str) -> PathBuf {
    let path = dir.join("key.json");
    std::fs::write(&path, json).expect("write key");
    path
}

/// The test server's key JSON (a fresh RSA key) with one field replaced.
fn key_with(gcs: &Gcs, field: &str, value: &str) -> String {
    let mut key: serde_json::Value =
        serde_json::from_str(&gcs.server.service_account_key_json()).expect("key JSON");
    key[field] = json!(value);
    key.to_string()
}

async fn backend_with(gcs: &Gcs, auth: GcsAuth) -> lockcore::Result<GcsBackend> {
    let config = GcsConfig::new(&gcs.bucket)?
        .with_endpoint(&gcs.server.url())?
        .with_prefix(&gcs.prefix)?
        .with_timeout(Duration::from_secs(5))
        .with_auth(auth);
    GcsBackend::connect(config).await
}

fn locker(backend: GcsBackend) -> Locker {
    Locker::new(Arc::new(backend)).with_options(LockOptions::new(Duration::from_secs(30)))
}

/// Issue 7: service-account JSON auth works end to end, and the token is fetched once and
/// reused (gcp_auth caches it), not once per call.
#[tokio::test]
async fn a_service_account_key_authenticates_every_call() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let scratch = Scratch::new("sa");
    let path = key_file(&scratch.0, &gcs.server.service_account_key_json());
    let locker = locker(
        backend_with(&gcs, GcsAuth::ServiceAccountKey(path))
            .await
            .expect("key"),
    );
    for _ in 0..3 {
        let guard = locker.acquire("with-auth").await.expect("authorised");
        guard.release().await.expect("released");
    }
    assert_eq!(gcs.server.tokens_granted(), 1, "one token, reused");
    let statuses: Vec<u16> = gcs.server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 204, 200, 204, 200, 204]);
}

/// Without credentials the server's 401 is a permanent `PermissionDenied` that says what
/// to check, and the acquire does not retry it.
#[tokio::test]
async fn no_credentials_is_permission_denied_at_once() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let locker = locker(backend_with(&gcs, GcsAuth::None).await.expect("config"));
    let err = locker.acquire("anonymous").await.expect_err("401");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert_eq!(err.status(), RetryStatus::Permanent);
    assert!(err.to_string().contains("credentials"), "{err}");
    assert_eq!(gcs.server.requests().len(), 1, "not retried");
}

/// A static token is sent as given: a granted one works, a wrong one is refused, and the
/// error never repeats it.
#[tokio::test]
async fn a_static_token_is_sent_as_given_and_never_echoed() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    gcs.server.allow_token("ya29.granted-token");
    let good = locker(
        backend_with(&gcs, GcsAuth::AccessToken("ya29.granted-token".into()))
            .await
            .expect("ok"),
    );
    good.acquire("static")
        .await
        .expect("granted token")
        .release()
        .await
        .expect("released");
    let wrong = GcsAuth::AccessToken("ya29.wrong-s3cret".into());
    let err = locker(backend_with(&gcs, wrong).await.expect("ok"))
        .acquire("static")
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
}

/// A key file that is not a usable key fails when the backend is built, names the file,
/// and never echoes the key material.
#[tokio::test]
async fn a_broken_key_file_fails_at_construction_without_echoing_it() {
    let gcs = Gcs::start().await;
    let scratch = Scratch::new("broken");
    let pem = "-----BEGIN PRIVATE KEY-----\nS3CRETMATERIAL\n-----END PRIVATE KEY-----\n";
    let path = key_file(&scratch.0, &key_with(&gcs, "private_key", pem));
    let err = backend_with(&gcs, GcsAuth::ServiceAccountKey(path.clone()))
        .await
        .expect_err("bad key");
    assert_eq!(err.kind(), ErrorKind::Config);
    let text = format!("{err} {err:?}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(!text.contains("S3CRETMATERIAL"), "{text}");
    std::fs::write(&path, "{ not json").expect("write");
    let err = backend_with(&gcs, GcsAuth::ServiceAccountKey(path))
        .await
        .expect_err("not JSON");
    assert_eq!(err.kind(), ErrorKind::Config);
}

/// When the token endpoint cannot be reached the attempt fails as temporary
/// `Unavailable` within the request timeout, and nothing is written.
#[tokio::test]
async fn an_unreachable_token_endpoint_is_temporary_and_writes_nothing() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let scratch = Scratch::new("down");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let uri = format!("http://{}/token", closed.local_addr().expect("addr"));
    drop(closed);
    let path = key_file(&scratch.0, &key_with(&gcs, "token_uri", &uri));
    let backend = backend_with(&gcs, GcsAuth::ServiceAccountKey(path))
        .await
        .expect("key parses");
    let started = std::time::Instant::now();
    let err = locker(backend)
        .try_acquire("down")
        .await
        .expect_err("no token");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(err.status(), RetryStatus::Temporary);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(gcs.server.requests().is_empty());
}

/// A token endpoint that accepts the connection but never answers is cut off by the
/// request timeout (gcp_auth alone would wait), as a temporary `Unavailable`.
#[tokio::test]
async fn a_silent_token_endpoint_is_cut_off_by_the_request_timeout() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let scratch = Scratch::new("silent");
    // Bound and listening, never accepting: the connection opens, no reply ever comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let uri = format!("http://{}/token", silent.local_addr().expect("addr"));
    let path = key_file(&scratch.0, &key_with(&gcs, "token_uri", &uri));
    let config = GcsConfig::new(&gcs.bucket)
        .and_then(|c| c.with_endpoint(&gcs.server.url()))
        .and_then(|c| c.with_prefix(&gcs.prefix))
        .expect("config")
        .with_timeout(Duration::from_millis(500))
        .with_auth(GcsAuth::ServiceAccountKey(path));
    let backend = GcsBackend::connect(config).await.expect("key parses");
    let started = std::time::Instant::now();
    let err = locker(backend)
        .try_acquire("silent")
        .await
        .expect_err("no token");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("took longer"), "{err}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(gcs.server.requests().is_empty());
    drop(silent);
}

/// The Locker refuses options real GCS cannot sustain (a refresh more often than once a
/// second) before sending anything.
#[tokio::test]
async fn the_locker_refuses_refreshes_faster_than_gcs_allows() {
    let gcs = Gcs::start().await;
    let locker = Locker::new(Arc::new(
        backend_with(&gcs, GcsAuth::None).await.expect("ok"),
    ));
    let fast = LockOptions::new(Duration::from_secs(3));
    let err = locker
        .acquire_with("fast", &fast)
        .await
        .expect_err("375 ms refresh");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("mutation"), "{err}");
    assert!(gcs.server.requests().is_empty());
    let ok = LockOptions::new(Duration::from_secs(8));
    locker
        .acquire_with("fast", &ok)
        .await
        .expect("1 s refresh")
        .release()
        .await
        .expect("ok");
}

//! Every reply body the backend reads is bounded (`backend_gcs::REPLY_LIMITS`, docs/gcs.md
//! "Reply limits"): a fake GCS whose replies declare 6 GB or never end costs the client at
//! most the limit, and the call fails with an error naming it, long before the request
//! timeout. The fake sends at most a few times the limit, so a client without the bound
//! holds that much and then times out, instead of exhausting the machine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_gcs::{GcsAuth, GcsBackend, GcsConfig};
use common::huge::{Body, Huge};
use lockcore::{
    AcquireRequest, ErrorKind, FenceToken, Identity, Lease, LockBackend, LockName, LockOptions,
    Locker, Ttl, WaitMode,
};

const MIB: u64 = 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);

/// A backend talking to `endpoint` without auth (or with `auth`).
async fn backend(endpoint: &str, auth: GcsAuth) -> GcsBackend {
    let config = GcsConfig::new("bucket")
        .and_then(|c| c.with_endpoint(endpoint))
        .expect("valid config")
        .with_timeout(TIMEOUT)
        .with_auth(auth);
    GcsBackend::connect(config).await.expect("reachable")
}

fn ttl() -> Ttl {
    Ttl::new(Duration::from_secs(30)).expect("ttl")
}

fn request(name: &str) -> AcquireRequest {
    let name = LockName::new(name).expect("valid");
    AcquireRequest::new(name, Identity::unique(), ttl())
}

/// `err` is of `kind` and names every word in `words`.
fn assert_says(err: &lockcore::Error, kind: ErrorKind, words: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    for word in words {
        assert!(err.to_string().contains(word), "{word:?} missing: {err}");
    }
}

/// The fake sent well under what it was allowed to: the client stopped reading.
fn assert_stopped_reading(huge: &Huge, sent_at_most: u64) {
    assert!(
        huge.sent() < sent_at_most / 2,
        "{} MiB of body sent: the client kept reading",
        huge.sent() / MIB
    );
}

/// An object GET whose reply declares 6 GB: refused before reading, as a `Protocol` error
/// (real GCS never sends one; a retry cannot help).
#[tokio::test]
async fn an_object_reply_declaring_6_gb_is_refused_unread() {
    let huge = Huge::start(200, Body::Declared, 64 * MIB).await;
    let backend = backend(&huge.url, GcsAuth::None).await;
    let name = LockName::new("job").expect("valid");
    let err = backend.inspect(&name).await.expect_err("refused");
    assert_says(
        &err,
        ErrorKind::Protocol,
        &["object resource", "4 MiB", "not read"],
    );
    assert!(!err.is_temporary(), "{err}");
    assert_stopped_reading(&huge, 64 * MIB);
}

/// An insert whose reply never ends: cut at 4 MiB. The write may have landed, so the
/// outcome is unknown (the acquire loop's next attempt recognises its own lock).
#[tokio::test]
async fn an_endless_insert_reply_is_cut_at_4_mib_as_outcome_unknown() {
    let huge = Huge::start(200, Body::Endless, 64 * MIB).await;
    let backend = backend(&huge.url, GcsAuth::None).await;
    let err = backend.acquire(&request("job")).await.expect_err("refused");
    assert_says(
        &err,
        ErrorKind::OutcomeUnknown,
        &["object resource", "4 MiB", "may have been applied"],
    );
    assert_stopped_reading(&huge, 64 * MIB);
}

/// A list page declaring 6 GB: refused before reading (a page of 1000 objects is at most
/// about 69 MB).
#[tokio::test]
async fn a_list_page_declaring_6_gb_is_refused_unread() {
    let huge = Huge::start(200, Body::Declared, 512 * MIB).await;
    let backend = backend(&huge.url, GcsAuth::None).await;
    let err = backend.list("").await.expect_err("refused");
    assert_says(&err, ErrorKind::Protocol, &["list page", "128 MiB"]);
    assert_stopped_reading(&huge, 512 * MIB);
}

/// A batch reply that never ends: cut at 64 MiB, every lease's outcome unknown (its
/// PATCH may have applied; the next refresh's 412 recovery decides), none `Lost`.
#[tokio::test]
async fn an_endless_batch_reply_is_cut_at_64_mib_for_each_lease() {
    let huge = Huge::start(200, Body::Endless, 256 * MIB).await;
    let backend = backend(&huge.url, GcsAuth::None).await;
    let owner = Identity::unique();
    let leases: Vec<Lease> = ["a", "b"]
        .iter()
        .map(|name| {
            let name = LockName::new(*name).expect("valid");
            Lease::new(name, owner.clone(), ttl(), "7:1").with_token(FenceToken::new(7))
        })
        .collect();
    for result in backend.refresh_many(&leases).await {
        let err = result.expect_err("refused");
        assert_says(&err, ErrorKind::OutcomeUnknown, &["batch reply", "64 MiB"]);
    }
    assert_stopped_reading(&huge, 256 * MIB);
}

/// Workload identity federation's token endpoints.
#[cfg(feature = "auth")]
mod federation {
    use super::*;
    use std::path::PathBuf;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "anylock-gcs-limits-{tag}-{}-{}",
                std::process::id(),
                Identity::unique().as_str().replace('/', "_")
            ));
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The first acquire's error with an `external_account` file whose `token_url` is
    /// `token_url` and whose subject token comes from `source`.
    async fn federation_error(
        scratch: &Scratch,
        endpoint: &str,
        token_url: &str,
        source: serde_json::Value,
    ) -> lockcore::Error {
        let file = serde_json::json!({
            "type": "external_account",
            "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/x",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": token_url,
            "credential_source": source,
        });
        let path = scratch.write("wif.json", &file.to_string());
        // Storage is never reached: the token comes first.
        let backend = backend(endpoint, GcsAuth::ServiceAccountKey(path)).await;
        backend.acquire(&request("job")).await.expect_err("refused")
    }

    /// Token endpoint replies (the STS exchange, a subject token URL such as a metadata
    /// server's) over 64 KiB: refused before or while reading, naming the limit; a refusal
    /// (403) with a huge body is still the refusal it is, without its details.
    #[tokio::test]
    async fn token_endpoint_replies_over_64_kib_are_refused() {
        let scratch = Scratch::new("sts");
        let subject = scratch.write("subject", "eyJhbGciOiJSUzI1NiJ9.c3ViamVjdA.U0lH");
        let huge = Huge::start(200, Body::Declared, 64 * MIB).await;
        let sts = format!("{}/v1/token", huge.url);
        let err = federation_error(
            &scratch,
            &huge.url,
            &sts,
            serde_json::json!({ "file": subject }),
        )
        .await;
        assert_says(
            &err,
            ErrorKind::Protocol,
            &["STS token exchange", "64 KiB", "not read"],
        );
        assert_stopped_reading(&huge, 64 * MIB);

        let huge = Huge::start(200, Body::Endless, 64 * MIB).await;
        let source = serde_json::json!({ "url": format!("{}/token", huge.url) });
        let err = federation_error(&scratch, &huge.url, &sts, source).await;
        assert_says(&err, ErrorKind::Protocol, &["subject token URL", "64 KiB"]);
        assert_stopped_reading(&huge, 64 * MIB);

        let huge = Huge::start(403, Body::Declared, 64 * MIB).await;
        let sts = format!("{}/v1/token", huge.url);
        let err = federation_error(
            &scratch,
            &huge.url,
            &sts,
            serde_json::json!({ "file": subject }),
        )
        .await;
        assert_says(
            &err,
            ErrorKind::PermissionDenied,
            &["was refused (403", "no error details"],
        );
        assert_stopped_reading(&huge, 64 * MIB);
    }
}

/// A token command that prints 100 MB (and then lingers) is stopped at 64 KiB: `Config`
/// (its output is no token), at once, not when the request timeout kills it.
#[tokio::test]
async fn a_token_command_printing_100_mb_is_stopped_at_64_kib() {
    let command = "head -c 100000000 /dev/zero | tr '\\0' a; sleep 30";
    let huge = Huge::start(200, Body::Finite(0), 0).await;
    let auth = GcsAuth::TokenCommand(command.to_owned());
    let backend = backend(&huge.url, auth).await;
    let locker = Locker::new(Arc::new(backend))
        .with_options(LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::TryOnce));
    let err = locker.acquire("job").await.expect_err("refused");
    assert_says(
        &err,
        ErrorKind::Config,
        &["GCS_TOKEN_COMMAND", "more than 64 KiB"],
    );
}

/// Set in the child of [`a_huge_reply_costs_the_client_its_limit_not_the_reply`].
const CHILD: &str = "ANYLOCK_GCS_LIMITS_CHILD";
/// The reply's size in the child (default 512 MiB), for measuring by hand.
const CHILD_BYTES: &str = "ANYLOCK_GCS_LIMITS_BYTES";

/// Peak memory: a child process reads one object GET whose reply is a proper chunked
/// body of 512 MiB (what a client without the bound reads whole) and reports its peak
/// resident size (`VmHWM`). With the bound it reads 4 MiB of it.
#[test]
fn a_huge_reply_costs_the_client_its_limit_not_the_reply() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "peak_memory_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child test");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{shown}");
    let peak_kb: u64 = shown
        .lines()
        .find_map(|l| l.split("peak VmHWM kB: ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the child test did not run:\n{shown}"));
    eprintln!("child peak resident: {} MiB", peak_kb / 1024);
    assert!(
        peak_kb < 100 * 1024,
        "peak {} MiB for a 512 MiB reply",
        peak_kb / 1024
    );
}

/// Runs only inside [`a_huge_reply_costs_the_client_its_limit_not_the_reply`]'s child.
#[tokio::test]
async fn peak_memory_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let bytes = std::env::var(CHILD_BYTES)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(512 * MIB);
    let huge = Huge::start(200, Body::Finite(bytes), bytes).await;
    let backend = backend(&huge.url, GcsAuth::None).await;
    let name = LockName::new("job").expect("valid");
    let outcome = backend.inspect(&name).await;
    eprintln!("outcome: {outcome:?}; body sent: {} MiB", huge.sent() / MIB);
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .expect("VmHWM")
        .trim()
        .trim_end_matches("kB")
        .trim();
    println!("peak VmHWM kB: {peak}");
}

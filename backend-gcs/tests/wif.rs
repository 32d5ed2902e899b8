//! Workload identity federation and the token command, end to end against the test server
//! with auth required: its STS endpoint exchanges the subject token, its IAM endpoint
//! impersonates a service account, and tokens it grants expire within seconds here, so
//! renewal during a held lock is exercised. Issue #17 item 8.

#![cfg(feature = "auth")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_gcs::{GcsAuth, GcsBackend, GcsConfig};
use common::Gcs;
use lockcore::{ErrorKind, Health, LockOptions, Locker};
use serde_json::{Value, json};

const AUDIENCE: &str =
    "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/github";
const SUBJECT: &str = "eyJhbGciOiJSUzI1NiJ9.c3ViamVjdC1vbmU.U0lHTkFUVVJF";
const SA: &str = "locks@anylock-test.iam.gserviceaccount.com";

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "anylock-gcs-wif-{tag}-{}-{}",
            std::process::id(),
            lockcore::Identity::unique().as_str().replace('/', "_")
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        // Written beside and renamed over, as a rotating token file is.
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn backend(gcs: &Gcs, auth: GcsAuth, timeout: Duration) -> lockcore::Result<GcsBackend> {
    let config = GcsConfig::new(&gcs.bucket)?
        .with_endpoint(&gcs.server.url())?
        .with_prefix(&gcs.prefix)?
        .with_timeout(timeout)
        .with_min_refresh_interval(Duration::from_millis(100))
        .with_auth(auth);
    GcsBackend::connect(config).await
}

/// A locker whose leases refresh every 375 ms (TTL 3 s).
fn locker(backend: GcsBackend) -> Locker {
    Locker::new(Arc::new(backend)).with_options(LockOptions::new(Duration::from_secs(3)))
}

/// A server trusting the provider, with auth required, and a credential file for it.
async fn federated(scratch: &Scratch, source: Value) -> (Gcs, PathBuf) {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    gcs.server.trust_workload_identity(AUDIENCE, SUBJECT);
    let file = gcs.server.external_account_json(source);
    let path = scratch.write("wif.json", &file.to_string());
    (gcs, path)
}

async fn one_cycle(gcs: &Gcs, path: &Path) {
    let auth = GcsAuth::ServiceAccountKey(path.to_owned());
    let locker = locker(
        backend(gcs, auth, Duration::from_secs(5))
            .await
            .expect("credentials"),
    );
    let guard = locker.acquire("wif").await.expect("authorised");
    guard.release().await.expect("released");
    let statuses: Vec<u16> = gcs.server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 204]);
}

/// A file source in text format (the subject token as is) and in json format.
#[tokio::test]
async fn a_file_source_in_text_and_json_format_authenticates() {
    let scratch = Scratch::new("file");
    let token = scratch.write("token", &format!("{SUBJECT}\n"));
    let (gcs, path) = federated(&scratch, json!({ "file": token })).await;
    one_cycle(&gcs, &path).await;
    assert_eq!(gcs.server.token_exchanges(), 1, "one exchange, cached");

    let token = scratch.write("token.json", &json!({ "value": SUBJECT }).to_string());
    let source =
        json!({ "file": token, "format": { "type": "json", "subject_token_field_name": "value" } });
    let (gcs, path) = federated(&scratch, source).await;
    one_cycle(&gcs, &path).await;
    assert_eq!(gcs.server.token_exchanges(), 1);
}

/// GitHub's shape: the subject token comes from a URL that needs its own bearer header.
#[tokio::test]
async fn a_url_source_with_headers_authenticates() {
    let scratch = Scratch::new("url");
    let (gcs, _) = federated(&scratch, Value::Null).await;
    gcs.server.serve_subject_token("gh-request-token");
    let file = gcs.server.external_account_json(json!({
        "url": gcs.server.oidc_url(),
        "headers": { "Authorization": "Bearer gh-request-token" },
        "format": { "type": "json", "subject_token_field_name": "value" },
    }));
    let path = scratch.write("wif.json", &file.to_string());
    one_cycle(&gcs, &path).await;
    assert_eq!(gcs.server.token_exchanges(), 1);
}

/// With `service_account_impersonation_url` the federated token (refused by the storage
/// API here) buys a service account's token, which authorises the calls.
#[tokio::test]
async fn impersonation_turns_the_federated_token_into_the_service_accounts() {
    let scratch = Scratch::new("sa");
    let token = scratch.write("token", SUBJECT);
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    gcs.server.trust_workload_identity(AUDIENCE, SUBJECT);
    gcs.server.require_impersonation(SA);
    let mut file = gcs.server.external_account_json(json!({ "file": token }));
    file["service_account_impersonation"] = json!({ "token_lifetime_seconds": 600 });
    let path = scratch.write("wif.json", &file.to_string());
    one_cycle(&gcs, &path).await;
    assert_eq!(
        (gcs.server.token_exchanges(), gcs.server.impersonations()),
        (1, 1)
    );
}

/// Tokens living 2 s expire several times while a lease is held: each is renewed before
/// it lapses (no 401), the rotated subject token file is read again at renewal, and the
/// lease stays healthy throughout.
#[tokio::test]
async fn tokens_expiring_during_a_held_lock_are_renewed_and_the_rotated_file_reread() {
    let scratch = Scratch::new("renew");
    let token = scratch.write("token", SUBJECT);
    let (gcs, _) = federated(&scratch, Value::Null).await;
    gcs.server.require_impersonation(SA);
    let mut file = gcs.server.external_account_json(json!({ "file": token }));
    file["service_account_impersonation"] = json!({ "token_lifetime_seconds": 600 });
    let path = scratch.write("wif.json", &file.to_string());
    gcs.server.set_token_lifetime(Duration::from_secs(2));
    let auth = GcsAuth::ServiceAccountKey(path);
    let locker = locker(
        backend(&gcs, auth, Duration::from_secs(5))
            .await
            .expect("credentials"),
    );
    let guard = locker.acquire("long-deploy").await.expect("acquired");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The CI platform rotates the subject token; the old one is refused from now on.
    gcs.server
        .trust_workload_identity(AUDIENCE, "rotated-subject-token");
    scratch.write("token", "rotated-subject-token");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(guard.state(), Health::Healthy);
    guard.release().await.expect("released");
    let requests = gcs.server.requests();
    assert!(requests.iter().all(|r| r.status < 300), "{requests:?}");
    let patches = requests.iter().filter(|r| r.method == "PATCH").count();
    assert!(patches >= 10, "{patches} refreshes");
    // 6 s of 2 s tokens renewed at 1.5 s: at least 3 renewals after the first token.
    assert!(
        gcs.server.token_exchanges() >= 4,
        "{}",
        gcs.server.token_exchanges()
    );
    assert_eq!(gcs.server.token_exchanges(), gcs.server.impersonations());
}

/// A token the server stops accepting before its time (revoked) is replaced at the
/// first 401 and the call sent once more, so the refresh succeeds and the lease lives.
#[tokio::test]
async fn a_revoked_token_is_replaced_at_the_first_401() {
    let scratch = Scratch::new("revoke");
    let token = scratch.write("token", SUBJECT);
    let (gcs, path) = federated(&scratch, json!({ "file": token })).await;
    let auth = GcsAuth::ServiceAccountKey(path);
    let locker = locker(
        backend(&gcs, auth, Duration::from_secs(5))
            .await
            .expect("credentials"),
    );
    let guard = locker.acquire("revoked").await.expect("acquired");
    gcs.server.revoke_tokens();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(guard.state(), Health::Healthy);
    guard.release().await.expect("released");
    let statuses: Vec<u16> = gcs.server.requests().iter().map(|r| r.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(gcs.server.token_exchanges(), 2);
}

/// A revoked token inside a batched refresh: every call of the batch answers 401; the
/// token is replaced once and each lease is refreshed alone with the new one.
#[tokio::test]
async fn a_revoked_token_in_a_batch_is_replaced_once_and_each_lease_refreshed() {
    use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, Ttl};
    let scratch = Scratch::new("revoke-batch");
    let token = scratch.write("token", SUBJECT);
    let (gcs, path) = federated(&scratch, json!({ "file": token })).await;
    let backend = backend(
        &gcs,
        GcsAuth::ServiceAccountKey(path),
        Duration::from_secs(5),
    )
    .await
    .expect("credentials");
    let mut leases = Vec::new();
    for name in ["batch-a", "batch-b"] {
        let ttl = Ttl::new(Duration::from_secs(30)).expect("ttl");
        let request =
            AcquireRequest::new(LockName::new(name).expect("name"), Identity::unique(), ttl);
        match backend.acquire(&request).await.expect("acquire") {
            Acquire::Acquired(lease) => leases.push(lease),
            Acquire::Held(holder) => panic!("held by {holder:?}"),
        }
    }
    gcs.server.revoke_tokens();
    gcs.server.clear_requests();
    for result in backend.refresh_many(&leases).await {
        result.expect("refreshed with a new token");
    }
    let calls: Vec<(String, u16)> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.status))
        .collect();
    let expected = [
        ("PATCH", 401),
        ("PATCH", 401),
        ("POST", 200),
        ("PATCH", 200),
        ("PATCH", 200),
    ];
    let expected: Vec<(String, u16)> = expected
        .iter()
        .map(|(m, s)| ((*m).to_owned(), *s))
        .collect();
    assert_eq!(calls, expected);
    assert_eq!(gcs.server.token_exchanges(), 2, "one new token for both");
}

/// The wrong audience is refused by STS: a permanent `PermissionDenied` that names the
/// audience and what to check, never the subject token, and nothing is written.
#[tokio::test]
async fn a_wrong_audience_is_permission_denied_naming_it() {
    let scratch = Scratch::new("aud");
    let token = scratch.write("token", SUBJECT);
    let (gcs, _) = federated(&scratch, json!({ "file": token })).await;
    let mut file = gcs.server.external_account_json(json!({ "file": token }));
    file["audience"] = json!(
        "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/wrong"
    );
    let path = scratch.write("wrong.json", &file.to_string());
    let locker = locker(
        backend(
            &gcs,
            GcsAuth::ServiceAccountKey(path),
            Duration::from_secs(5),
        )
        .await
        .expect("parses"),
    );
    let err = locker.acquire("aud").await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_temporary());
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("providers/wrong") && text.contains("invalid_target"),
        "{text}"
    );
    assert!(!text.contains(SUBJECT), "{text}");
    assert!(gcs.server.requests().is_empty());
}

/// Malformed files, unknown credential types and plain-http endpoints off loopback are
/// refused when the backend is built, as `Config` naming the field and never a value.
#[tokio::test]
async fn bad_credential_files_are_config_errors_naming_the_field() {
    let scratch = Scratch::new("bad");
    let gcs = Gcs::start().await;
    gcs.server.trust_workload_identity(AUDIENCE, SUBJECT);
    let good = gcs
        .server
        .external_account_json(json!({ "file": "/dev/null", "headers": { "X": "s3cret" } }));
    let mut cases = Vec::new();
    let mut no_audience = good.clone();
    no_audience
        .as_object_mut()
        .expect("object")
        .remove("audience");
    cases.push((no_audience.to_string(), "field audience is missing"));
    let mut http = good.clone();
    http["token_url"] = json!("http://sts.example.com/v1/token");
    cases.push((http.to_string(), "field token_url is plain http"));
    let mut impersonation = good.clone();
    impersonation["service_account_impersonation_url"] = json!("http://10.1.2.3/x");
    cases.push((
        impersonation.to_string(),
        "service_account_impersonation_url is plain http",
    ));
    let mut unknown = good.clone();
    unknown["type"] = json!("impersonated_service_account");
    cases.push((
        unknown.to_string(),
        "field type is \"impersonated_service_account\"",
    ));
    cases.push(("[1]".to_owned(), "not a JSON object"));
    for (text, expected) in cases {
        let path = scratch.write("bad.json", &text);
        let err = backend(
            &gcs,
            GcsAuth::ServiceAccountKey(path.clone()),
            Duration::from_secs(5),
        )
        .await
        .expect_err(expected);
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let shown = format!("{err} {err:?}");
        assert!(
            shown.contains(expected) && shown.contains(&path.display().to_string()),
            "{shown}"
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

/// The token command runs again when its token is due (JSON `expires_in`), and at a 401
/// for a plain token; the lease stays healthy through both.
#[tokio::test]
async fn the_token_command_renews_by_expiry_and_at_a_401() {
    let scratch = Scratch::new("cmd");
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let runs = scratch.0.join("runs");
    for n in 1..=40 {
        gcs.server.allow_token(&format!("cmd-token-{n}"));
    }
    // Each run prints the next token, living 1 s.
    let command = format!(
        "echo x >> '{0}'; n=$(wc -l < '{0}'); printf '{{\"access_token\":\"cmd-token-%d\",\"expires_in\":1}}' $n",
        runs.display()
    );
    let counted = locker(
        backend(&gcs, GcsAuth::TokenCommand(command), Duration::from_secs(5))
            .await
            .expect("ok"),
    );
    let guard = counted.acquire("cmd").await.expect("acquired");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(guard.state(), Health::Healthy);
    guard.release().await.expect("released");
    let count = std::fs::read_to_string(&runs)
        .expect("runs")
        .lines()
        .count();
    assert!(count >= 3, "the command ran {count} times");

    // A plain token lives 5 minutes; a 401 makes the command run at once.
    let file = scratch.write("plain", "plain-token-a");
    gcs.server.allow_token("plain-token-a");
    let command = format!("cat '{}'", file.display());
    let plain = locker(
        backend(&gcs, GcsAuth::TokenCommand(command), Duration::from_secs(5))
            .await
            .expect("ok"),
    );
    let guard = plain.acquire("plain").await.expect("acquired");
    gcs.server.revoke_tokens();
    gcs.server.allow_token("plain-token-b");
    scratch.write("plain", "plain-token-b\n");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(guard.state(), Health::Healthy);
    guard.release().await.expect("released");
}

/// Operations that all need a fresh token at once share one fetch: 20 concurrent
/// acquires on a new backend run a slow token command once, and when the command fails,
/// the callers queued behind it get its error instead of each running it again.
#[tokio::test]
async fn concurrent_operations_share_one_token_fetch() {
    use lockcore::ErrorKind;
    let scratch = Scratch::new("single");
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    gcs.server.allow_token("shared-token");
    let runs = scratch.0.join("runs");
    let ok = format!(
        "echo x >> '{}'; sleep 0.3; echo shared-token",
        runs.display()
    );
    let fails = format!("echo x >> '{}'; sleep 0.3; exit 3", runs.display());
    let count = || {
        std::fs::read_to_string(&runs)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    for (command, succeeds) in [(ok, true), (fails, false)] {
        let _ = std::fs::remove_file(&runs);
        let locker = locker(
            backend(&gcs, GcsAuth::TokenCommand(command), Duration::from_secs(5))
                .await
                .expect("ok"),
        );
        let attempts = (0..20).map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move { locker.try_acquire(&format!("single-{succeeds}-{i}")).await })
        });
        for attempt in attempts.collect::<Vec<_>>() {
            match attempt.await.expect("task") {
                Ok(guard) => {
                    assert!(succeeds, "granted without a token");
                    guard
                        .expect("a free name")
                        .release()
                        .await
                        .expect("released");
                }
                Err(e) => {
                    assert!(!succeeds, "{e}");
                    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                }
            }
        }
        assert_eq!(
            count(),
            1,
            "the command ran {} times for 20 callers",
            count()
        );
    }
    // Callers that give up before the fetch ends (a refresh past its budget) leave it
    // running for the others: 20 backend calls that each wait 40 ms, one after another,
    // for a command that waits for a gate the test opens after them, start it once, and
    // its token serves the next call. (Backend calls, not `Locker` attempts, which go on
    // in the background when dropped.)
    let _ = std::fs::remove_file(&runs);
    let gate = scratch.0.join("gate");
    let slow = format!(
        "echo x >> '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; echo shared-token",
        runs.display(),
        gate.display()
    );
    let backend = backend(&gcs, GcsAuth::TokenCommand(slow), Duration::from_secs(5))
        .await
        .expect("ok");
    let ttl = lockcore::Ttl::new(Duration::from_secs(30)).expect("ttl");
    let request = |name: &str| {
        lockcore::AcquireRequest::new(
            lockcore::LockName::new(name).expect("name"),
            lockcore::Identity::unique(),
            ttl,
        )
    };
    for i in 0..20 {
        let request = request(&format!("impatient-{i}"));
        let attempt = lockcore::LockBackend::acquire(&backend, &request);
        let given_up = tokio::time::timeout(Duration::from_millis(40), attempt).await;
        assert!(given_up.is_err(), "attempt {i} finished within 40 ms");
    }
    std::fs::write(&gate, "").expect("open the gate");
    let granted = lockcore::LockBackend::acquire(&backend, &request("patient")).await;
    assert!(
        matches!(granted, Ok(lockcore::Acquire::Acquired(_))),
        "{granted:?}"
    );
    assert_eq!(count(), 1, "the command ran {} times", count());
}

/// A token source slower than a refresh's budget (TTL/8 = 375 ms here; a command that
/// takes 1 s, like a gcloud or vault call) never fails a refresh: renewal runs in the
/// background while the still-valid token serves. (It used to run inside the refresh,
/// which gave up, killed it and after three tries reported the lease lost.)
#[tokio::test]
async fn a_slow_token_command_renews_in_the_background_and_the_lease_stays_healthy() {
    let scratch = Scratch::new("slow");
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    for n in 1..=40 {
        gcs.server.allow_token(&format!("slow-token-{n}"));
    }
    let runs = scratch.0.join("runs");
    let command = format!(
        "sleep 1; echo x >> '{0}'; n=$(wc -l < '{0}'); printf '{{\"access_token\":\"slow-token-%d\",\"expires_in\":3}}' $n",
        runs.display()
    );
    let slow = locker(
        backend(&gcs, GcsAuth::TokenCommand(command), Duration::from_secs(5))
            .await
            .expect("ok"),
    );
    let guard = slow.acquire("slow").await.expect("acquired");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(guard.state(), Health::Healthy, "refreshes kept the lease");
    guard.release().await.expect("released");
    let count = std::fs::read_to_string(&runs)
        .expect("runs")
        .lines()
        .count();
    assert!(count >= 3, "the command was renewed {count} times");
}

/// An issuer's claim of an absurd lifetime is capped, not added to the clock (which
/// overflowed and panicked).
#[tokio::test]
async fn an_absurd_token_lifetime_is_capped_not_a_panic() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    gcs.server.allow_token("long-token");
    let command =
        "printf '{\"access_token\":\"long-token\",\"expires_in\":18446744073709551615}'".to_owned();
    let long = locker(
        backend(&gcs, GcsAuth::TokenCommand(command), Duration::from_secs(5))
            .await
            .expect("ok"),
    );
    // Bounded: the panic it used to cause left the acquire waiting forever.
    let cycle = async {
        let guard = long.acquire("long").await.expect("acquired");
        guard.release().await.expect("released");
    };
    tokio::time::timeout(Duration::from_secs(30), cycle)
        .await
        .expect("one lock cycle within 30 s");
}

/// A failing, silent-for-too-long or babbling command is a clear error that shows no
/// token: stdout never, stderr only its last line with token-like words hidden.
#[tokio::test]
async fn a_failing_token_command_is_a_clear_error_without_secrets() {
    let gcs = Gcs::start().await;
    gcs.server.require_auth();
    let failing = "echo ya29.stdoutsecretstdoutsecret; echo 'auth: token ya29.a0stderrsecretstderrsecret expired' >&2; exit 3";
    let cases = [
        (
            failing,
            Duration::from_secs(5),
            ErrorKind::Unavailable,
            "exit status: 3",
        ),
        (
            "sleep 30",
            Duration::from_millis(500),
            ErrorKind::Unavailable,
            "was killed",
        ),
        (
            "echo two ya29.stdoutsecret words",
            Duration::from_secs(5),
            ErrorKind::Config,
            "more than one word",
        ),
    ];
    for (command, timeout, kind, expected) in cases {
        let auth = GcsAuth::TokenCommand(command.to_owned());
        let locker = locker(backend(&gcs, auth, timeout).await.expect("ok"));
        let started = Instant::now();
        let err = locker.try_acquire("cmd").await.expect_err(command);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(err.kind(), kind, "{err}");
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("GCS_TOKEN_COMMAND") && text.contains(expected),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
    assert!(gcs.server.requests().is_empty());
}

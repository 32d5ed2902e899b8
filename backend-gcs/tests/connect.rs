//! Reaching the endpoint. `open` checks it as the other backends' `connect` does (a TCP
//! connection, and for `https` a TLS handshake verified against the OS trust store), so
//! an endpoint that is down or whose certificate is not trusted is reported at once with
//! its cause, instead of `anylock run`'s acquire retrying in silence until its wait runs
//! out (forever without one). After a connect, a certificate that no longer verifies is a
//! permanent error the acquire loop does not retry, and `connection_security` says TLS is
//! verified only when a handshake just verified it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockBackend, LockOptions, Locker, WaitMode};

/// The acquire attempts' timeout: every failure must be reported within it. A hang is
/// what it guards against.
const ATTEMPT: Duration = Duration::from_secs(5);

fn locker(backend: Arc<dyn LockBackend>) -> Locker {
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitMode::Forever)
        .with_attempt_timeout(ATTEMPT);
    Locker::new(backend).with_options(options)
}

/// What `anylock run` does: open `url`, then acquire waiting forever. The first error and
/// how long it took; a panic when nothing is reported for 20 s.
async fn run(url: &str) -> (lockcore::Error, Duration) {
    let started = Instant::now();
    let work = async {
        let backend = backend_gcs::open(url).await?;
        locker(backend).acquire("job").await.map(drop)
    };
    match tokio::time::timeout(Duration::from_secs(20), work).await {
        Err(_) => panic!("{url}: nothing reported for 20 s"),
        Ok(Ok(())) => panic!("{url}: acquired"),
        Ok(Err(err)) => {
            eprintln!("{url}: after {:?}: {err}", started.elapsed());
            (err, started.elapsed())
        }
    }
}

fn assert_says(err: &lockcore::Error, kind: ErrorKind, words: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    for word in words {
        assert!(err.to_string().contains(word), "{word:?} missing: {err}");
    }
}

fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A closed port (the emulator or proxy is down), over http and https: `Unavailable`
/// naming the endpoint and "connection refused", at once. Temporary, as on every other
/// backend, but reported by `open`, so no acquire starts.
#[tokio::test]
async fn a_closed_port_is_reported_by_open_as_connection_refused() {
    for scheme in ["http", "https"] {
        let port = closed_port();
        let url = format!("gs://bucket/?endpoint={scheme}://127.0.0.1:{port}&timeout_ms=1500");
        let (err, took) = run(&url).await;
        let at = format!("cannot connect to GCS at 127.0.0.1:{port} (connection refused)");
        assert_says(&err, ErrorKind::Unavailable, &[&at]);
        assert!(err.is_temporary(), "{err}");
        assert!(took < ATTEMPT, "took {took:?}");
    }
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use common::Gcs;
    use common::pki::Pki;
    use common::tls_front::TlsFront;
    use lockcore::{Transport, Verification};

    /// The request timeout the URLs below set (each of TCP connect and TLS handshake).
    const TIMEOUT: Duration = Duration::from_millis(1500);

    /// A self-signed certificate: `PermissionDenied` from `open`, naming the endpoint, TLS
    /// and what to do; never retried, within the request timeout.
    #[tokio::test]
    async fn a_self_signed_certificate_is_refused_by_open_and_never_retried() {
        let pki = Pki::new("self-signed");
        let (cert, key) = pki.self_signed();
        let front = TlsFront::start(&cert, &key, None).await;
        let url = format!("gs://bucket/?endpoint={}&timeout_ms=1500", front.url());
        let (err, took) = run(&url).await;
        assert!(backend_gcs::open(&url).await.is_err(), "open connected");
        let at = format!("GCS at 127.0.0.1:{}: TLS handshake failed", front.port);
        let words = [&at[..], "not signed by a CA we trust", "SSL_CERT_FILE"];
        assert_says(&err, ErrorKind::PermissionDenied, &words);
        assert!(!err.to_string().contains("URL parameter `ca`"), "{err}");
        assert!(!err.is_temporary(), "{err}");
        assert!(took < TIMEOUT + Duration::from_secs(1), "took {took:?}");
    }

    /// An endpoint that accepts TCP and never answers the handshake: `Unavailable`,
    /// "within" the request timeout, when it runs out.
    #[tokio::test]
    async fn a_silent_endpoint_is_reported_by_open_when_the_timeout_runs_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp);
            }
        });
        let url = format!("gs://bucket/?endpoint=https://127.0.0.1:{port}&timeout_ms=1500");
        let (err, took) = run(&url).await;
        let words = [&format!("127.0.0.1:{port}")[..], "within 1.5s"];
        assert_says(&err, ErrorKind::Unavailable, &words);
        assert!(took >= TIMEOUT && took < ATTEMPT, "took {took:?}");
    }

    /// A token endpoint (here workload identity federation's STS) with a self-signed
    /// certificate: `PermissionDenied` naming the step and TLS, never retried, where it
    /// was a temporary "cannot reach the endpoint" a waiting acquire retried in silence.
    #[cfg(feature = "auth")]
    #[tokio::test]
    async fn a_token_endpoint_with_a_self_signed_certificate_is_refused_at_once() {
        let pki = Pki::new("sts");
        let (cert, key) = pki.self_signed();
        let front = TlsFront::start(&cert, &key, None).await;
        let subject = pki.path("subject");
        std::fs::write(&subject, "eyJhbGciOiJSUzI1NiJ9.c3ViamVjdA.U0lH").expect("subject");
        let file = serde_json::json!({
            "type": "external_account",
            "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/x",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": format!("{}/v1/token", front.url()),
            "credential_source": { "file": subject },
        });
        let credentials = pki.path("wif.json");
        std::fs::write(&credentials, file.to_string()).expect("credentials");
        let gcs = Gcs::start().await;
        let url = format!(
            "gs://{}/?endpoint={}&credentials={}&timeout_ms=1500",
            gcs.bucket,
            gcs.server.url(),
            credentials.display()
        );
        let (err, took) = run(&url).await;
        let words = [
            "STS token exchange",
            "TLS handshake failed",
            "not signed by a CA we trust",
        ];
        assert_says(&err, ErrorKind::PermissionDenied, &words);
        assert!(!err.is_temporary(), "{err}");
        assert!(took < ATTEMPT, "took {took:?}");
    }

    /// Set in the child of [`a_verified_endpoint_is_reported_as_such_until_its_certificate_changes`]:
    /// the directory of its certificates.
    const CHILD: &str = "ANYLOCK_GCS_TLS_CHILD";

    /// The positive path needs a CA the process trusts: a child whose `SSL_CERT_FILE`
    /// (read by rustls-native-certs, so by reqwest's verifier and by the check alike) is
    /// the test CA.
    #[tokio::test]
    async fn a_verified_endpoint_is_reported_as_such_until_its_certificate_changes() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let pki = Pki::new("verified");
        let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "tls::verified_endpoint_child", "--nocapture"])
            .env(CHILD, pki.dir())
            .env("SSL_CERT_FILE", pki.ca())
            .env_remove("SSL_CERT_DIR")
            .output()
            .expect("run the child test");
        let shown = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "child failed:\n{shown}");
        assert!(
            shown.contains("1 passed"),
            "the child test did not run:\n{shown}"
        );
    }

    /// Runs only in the child: a TLS front with the CA's certificate before the test
    /// server. Connected and verified: `Tls(Full)` with the version and cipher, and a lock
    /// cycle. Then the front presents a self-signed certificate and cuts its connections:
    /// the report says not connected, with why, and an acquire waiting forever stops at
    /// the first attempt that meets the certificate (`PermissionDenied`).
    #[tokio::test]
    async fn verified_endpoint_child() {
        let Some(dir) = std::env::var_os(CHILD) else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let gcs = Gcs::start().await;
        let (cert, key) = (dir.join("server.pem"), dir.join("server-key.pem"));
        let front = TlsFront::start(&cert, &key, Some(gcs.server.addr())).await;
        let url = format!(
            "gs://{}/{}?endpoint={}&timeout_ms=1500",
            gcs.bucket,
            gcs.prefix,
            front.url()
        );
        let backend = backend_gcs::open(&url)
            .await
            .expect("verified: SSL_CERT_FILE");
        let report = backend.connection_security().await.expect("report");
        let Transport::Tls(tls) = &report[0].transport else {
            panic!("not TLS: {}", report[0]);
        };
        assert_eq!(tls.verification, Verification::Full, "{}", report[0]);
        assert!(
            tls.version
                .as_deref()
                .is_some_and(|v| v.starts_with("TLSv1.")),
            "{tls}"
        );
        assert!(tls.cipher.is_some(), "{tls}");
        let guard = locker(Arc::clone(&backend))
            .acquire("job")
            .await
            .expect("over TLS");
        guard.release().await.expect("released");

        front.present(
            &dir.join("self-signed.pem"),
            &dir.join("self-signed-key.pem"),
        );
        let report = backend.connection_security().await.expect("report");
        let Transport::NotConnected(why) = &report[0].transport else {
            panic!("after the certificate changed: {}", report[0]);
        };
        assert!(why.contains("not signed by a CA we trust"), "{why}");
        let started = Instant::now();
        let locker = locker(Arc::clone(&backend));
        let err = tokio::time::timeout(Duration::from_secs(20), locker.acquire("job"))
            .await
            .expect("nothing reported for 20 s")
            .expect_err("the certificate is no longer trusted");
        let at = format!("GCS at 127.0.0.1:{}: TLS handshake failed", front.port);
        assert_says(
            &err,
            ErrorKind::PermissionDenied,
            &[&at, "not signed by a CA we trust"],
        );
        assert!(started.elapsed() < ATTEMPT, "took {:?}", started.elapsed());
    }
}

//! TLS failures are permanent: a token endpoint or GCS endpoint whose certificate is not
//! trusted fails the first attempt with `PermissionDenied`, instead of a temporary error
//! that `anylock run`'s acquire retries in silence until its wait runs out (forever
//! without one).

#![cfg(feature = "tls")]

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

mod tls {
    use super::*;
    use common::Gcs;
    use common::pki::Pki;
    use common::tls_front::TlsFront;

    /// A GCS endpoint with a self-signed certificate: `PermissionDenied` at the first
    /// attempt, naming the endpoint, TLS and what to do; never retried.
    #[tokio::test]
    async fn a_self_signed_certificate_is_refused_and_never_retried() {
        let pki = Pki::new("self-signed");
        let (cert, key) = pki.self_signed();
        let front = TlsFront::start(&cert, &key, None).await;
        let url = format!("gs://bucket/?endpoint={}&timeout_ms=1500", front.url());
        let (err, took) = run(&url).await;
        let at = format!("GCS at 127.0.0.1:{}: TLS handshake failed", front.port);
        let words = [&at[..], "not signed by a CA we trust", "SSL_CERT_FILE"];
        assert_says(&err, ErrorKind::PermissionDenied, &words);
        assert!(!err.to_string().contains("URL parameter `ca`"), "{err}");
        assert!(!err.is_temporary(), "{err}");
        assert!(took < ATTEMPT, "took {took:?}");
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
}

//! TLS and authentication against the secure etcd server from `scripts/servers` (https
//! only, `--client-cert-auth`, auth enabled; users `anylock` with readwrite on `anylock/`
//! and `anylock_denied` with no role). Each failure must come from `connect`, within a
//! few seconds, with the right kind and words, and never show the password (issue #19,
//! holes 1, 6, 7, 8, 9).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, Identity, LockBackend, LockName, LockOptions,
    Locker, Transport, Verification, WaitMode,
};

/// What a failure may take: the default connect timeout is 3 s; a hang is minutes.
const BOUND: Duration = Duration::from_secs(5);

struct Secure {
    dir: PathBuf,
    port: u16,
    user: String,
    password: String,
}

impl Secure {
    fn from_env() -> Option<Self> {
        let dir = test_kit::env::require("ANYLOCK_TEST_SECURE_DIR", "secure etcd")?;
        let port = test_kit::env::require("ANYLOCK_TEST_ETCD_TLS_PORT", "secure etcd")?;
        let user = test_kit::env::require("ANYLOCK_TEST_SECURE_USER", "secure etcd")?;
        let password = test_kit::env::require("ANYLOCK_TEST_SECURE_PASSWORD", "secure etcd")?;
        Some(Self {
            dir: PathBuf::from(dir),
            port: port
                .trim()
                .parse()
                .expect("ANYLOCK_TEST_ETCD_TLS_PORT is a port"),
            user,
            password,
        })
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// An `etcds://` URL as `user` (with the secret password) and these TLS parameters.
    fn url(&self, user: Option<&str>, params: &str) -> String {
        let auth = user.map_or_else(String::new, |u| format!("{u}:{}@", self.password));
        let prefix = common::random_prefix("secure").replace("anylock-test/", "anylock/");
        format!("etcds://{auth}127.0.0.1:{}/{prefix}?{params}", self.port)
    }

    fn good_tls(&self) -> String {
        format!(
            "ca={}&cert={}&key={}",
            self.file("ca.pem"),
            self.file("client.pem"),
            self.file("client-key.pem")
        )
    }
}

/// Connects, timing it; the error, which must not show the password anywhere.
async fn refused(secure: &Secure, url: &str) -> (Error, Duration) {
    let start = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(60), EtcdBackend::from_url(url)).await;
    let took = start.elapsed();
    let err = match outcome {
        Ok(Ok(_)) => panic!("{} connected", url.replace(&secure.password, "***")),
        Ok(Err(err)) => err,
        Err(_) => panic!("connect hung for a minute"),
    };
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(&secure.password), "password shown: {shown}");
    eprintln!("refused in {took:?}: {err}");
    (err, took)
}

fn assert_says(err: &Error, kind: ErrorKind, words: &[&str]) {
    assert_eq!(err.kind(), kind, "{err}");
    for word in words {
        assert!(
            err.to_string().contains(word),
            "{word:?} missing from: {err}"
        );
    }
}

/// Hole 6: a CA that did not sign the server's certificate is a TLS error, fast.
#[tokio::test]
async fn an_untrusted_server_certificate_is_refused_quickly() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let params = format!(
        "ca={}&cert={}&key={}",
        secure.file("other-ca.pem"),
        secure.file("client.pem"),
        secure.file("client-key.pem")
    );
    let (err, took) = refused(&secure, &secure.url(Some(&secure.user), &params)).await;
    assert_says(
        &err,
        ErrorKind::PermissionDenied,
        &["TLS", "not signed by a CA we trust"],
    );
    assert!(took < BOUND, "took {took:?}");
}

/// Hole 6: without a client certificate the server (`--client-cert-auth`) refuses the
/// connection after the TLS 1.3 handshake; that must not become a silent hang.
#[tokio::test]
async fn a_missing_client_certificate_is_refused_quickly() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let params = format!("ca={}", secure.file("ca.pem"));
    let (err, took) = refused(&secure, &secure.url(Some(&secure.user), &params)).await;
    assert_says(
        &err,
        ErrorKind::PermissionDenied,
        &["TLS", "requires a client certificate", "`cert`"],
    );
    assert!(took < BOUND, "took {took:?}");
}

/// Hole 6: a client certificate from a CA the server does not trust.
#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused_quickly() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let params = format!(
        "ca={}&cert={}&key={}",
        secure.file("ca.pem"),
        secure.file("other-client.pem"),
        secure.file("other-client-key.pem")
    );
    let (err, took) = refused(&secure, &secure.url(Some(&secure.user), &params)).await;
    assert_says(
        &err,
        ErrorKind::PermissionDenied,
        &["TLS", "rejected our client certificate"],
    );
    assert!(took < BOUND, "took {took:?}");
}

/// Hole 6: a cluster that is down is Unavailable within the connect timeout, naming the
/// member, and a waiting acquire never starts (so no "timed out waiting for the lock").
#[tokio::test]
async fn a_cluster_that_is_down_is_reported_within_the_connect_timeout() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let url = format!("etcds://127.0.0.1:{port}/anylock/?{}", secure.good_tls());
    let (err, took) = refused(&secure, &url).await;
    assert_says(
        &err,
        ErrorKind::Unavailable,
        &[&format!("127.0.0.1:{port}"), "cannot connect"],
    );
    assert!(took < BOUND, "took {took:?}");
    // A plaintext URL to the TLS-only port: nothing answers in HTTP/2, so the connect
    // timeout ends it, with a hint about etcds://.
    let url = format!(
        "etcd://127.0.0.1:{}/anylock/?connect_timeout=1s",
        secure.port
    );
    let (err, took) = refused(&secure, &url).await;
    assert_says(&err, ErrorKind::Unavailable, &["etcds://"]);
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// Hole 7: a wrong password is PermissionDenied naming the user, not "invalid input".
#[tokio::test]
async fn a_wrong_password_is_permission_denied_naming_the_user() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure
        .url(Some(&secure.user), &secure.good_tls())
        .replace(&format!(":{}@", secure.password), ":not-the-password@");
    let (err, took) = refused(&secure, &url).await;
    assert_says(
        &err,
        ErrorKind::PermissionDenied,
        &["etcd refused user `anylock`", "authentication failed"],
    );
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    assert!(took < BOUND, "took {took:?}");
}

/// Hole 7: a user without a role is told which RBAC permission it needs and how to grant it.
#[tokio::test]
async fn a_user_without_the_rbac_role_is_told_the_permission_and_the_fix() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let (err, took) = refused(
        &secure,
        &secure.url(Some("anylock_denied"), &secure.good_tls()),
    )
    .await;
    assert_says(
        &err,
        ErrorKind::PermissionDenied,
        &[
            "anylock_denied",
            "readwrite",
            "etcdctl role grant-permission",
        ],
    );
    assert!(took < BOUND, "took {took:?}");
}

/// Hole 1 at the backend level: TLS files on `etcd://` never reach the network.
#[tokio::test]
async fn tls_parameters_on_plaintext_are_refused_before_connecting() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure
        .url(Some(&secure.user), &secure.good_tls())
        .replace("etcds://", "etcd://");
    let (err, took) = refused(&secure, &url).await;
    assert_says(&err, ErrorKind::Config, &["etcds://", "plaintext"]);
    assert!(took < Duration::from_millis(100), "took {took:?}");
}

/// Hole 9: the least-privilege recipe (a role with readwrite on exactly the key prefix)
/// is enough for everything the backend does, including a waiting (queued) acquire and
/// the watch that wakes it, and a listing; hole 8: the report says TLS, verified, client certificate, and
/// who we are, without the password.
#[tokio::test]
async fn the_least_privilege_role_runs_every_operation() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure.url(Some(&secure.user), &secure.good_tls());
    let backend = Arc::new(EtcdBackend::from_url(&url).await.expect("connect"));
    let report = backend.connection_security().await.expect("report");
    assert_eq!(report.len(), 1);
    let Transport::Tls(tls) = &report[0].transport else {
        panic!("not TLS: {}", report[0]);
    };
    assert_eq!(tls.verification, Verification::Full);
    assert!(tls.client_certificate);
    assert!(
        tls.version.as_deref().is_some_and(|v| v.starts_with("TLS")),
        "{}",
        report[0]
    );
    assert_eq!(
        report[0].identity.as_deref(),
        Some("user \"anylock\" (password)")
    );
    assert!(!report[0].to_string().contains(&secure.password));

    let lock = LockName::new("least-privilege").expect("name");
    let locker = Locker::new(backend.clone() as Arc<dyn LockBackend>);
    let guard = locker.acquire(lock.as_str()).await.expect("acquire");
    let holder = backend
        .inspect(&lock)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.owner(), guard.lease().owner());
    // Listing ranges inside the prefix only, so the role allows it too.
    let listed = backend.list(lock.as_str()).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder().owner(), guard.lease().owner());
    let options = LockOptions::default().with_wait(WaitMode::Timeout(Duration::from_secs(20)));
    let waiter = tokio::spawn({
        let locker = locker.clone();
        let lock = lock.clone();
        async move { locker.acquire_with(lock.as_str(), &options).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let request = AcquireRequest::new(
        lock.clone(),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
    );
    assert!(matches!(
        backend.acquire(&request).await.expect("try"),
        Acquire::Held(_)
    ));
    guard.release().await.expect("release");
    let second = waiter
        .await
        .expect("join")
        .expect("the waiter gets the lock");
    second.release().await.expect("release");
    assert!(backend.inspect(&lock).await.expect("inspect").is_none());
}

/// Hole 8: with a client certificate and no password, etcd takes the certificate's
/// common name as the user; the report says so, and the lock works.
#[tokio::test]
async fn a_client_certificate_alone_authenticates_as_its_common_name() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure.url(None, &secure.good_tls());
    let backend = EtcdBackend::from_url(&url)
        .await
        .expect("connect by certificate");
    let report = backend.connection_security().await.expect("report");
    assert_eq!(
        report[0].identity.as_deref(),
        Some("client certificate CN=anylock")
    );
    let request = AcquireRequest::new(
        LockName::new("by-cert").expect("name"),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
    );
    let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
        panic!("held");
    };
    backend.refresh(&lease).await.expect("refresh");
    backend.release(&lease).await.expect("release");
}

/// A plaintext config reports itself as plaintext (on the ordinary cluster).
#[tokio::test]
async fn a_plaintext_config_reports_plaintext_and_no_identity() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let config = EtcdConfig::new(&endpoints).expect("endpoints");
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let report = backend.connection_security().await.expect("report");
    assert_eq!(report.len(), endpoints.len());
    for entry in report {
        assert_eq!(entry.transport, Transport::Plaintext);
        assert_eq!(entry.identity, None);
    }
}

//! TLS and authentication against the secure server (`hostssl` only, SCRAM plus
//! `clientcert=verify-ca`): each case asserts the error kind, a message fragment, and that
//! the password shows nowhere in the error's `Display`, `Debug` or source chain.

use std::error::Error as _;
use std::time::Duration;

use backend_postgres::{PostgresBackend, PostgresConfig};
use lockcore::{Acquire, AcquireRequest, ErrorKind, Identity, LockBackend, LockName, Transport};

/// The secure server's settings (`None`: skip outside CI; panics in CI when unset).
struct Secure {
    dir: String,
    port: String,
    user: String,
    password: String,
}

fn secure() -> Option<Secure> {
    let var = |name: &str| conformance::env::require(name, "PostgreSQL TLS");
    Some(Secure {
        dir: var("ANYLOCK_TEST_SECURE_DIR")?,
        port: var("ANYLOCK_TEST_POSTGRES_TLS_PORT")?,
        user: var("ANYLOCK_TEST_SECURE_USER")?,
        password: var("ANYLOCK_TEST_SECURE_PASSWORD")?,
    })
}

impl Secure {
    /// A URL for `user` with `password` and the extra query `params` (`{dir}` is replaced by
    /// the directory of the test certificates).
    fn url_as(&self, user: &str, password: &str, params: &str) -> String {
        let params = params.replace("{dir}", &self.dir);
        format!(
            "postgres://{user}:{password}@localhost:{}/anylock_test?timeout_ms=5000&{params}",
            self.port
        )
    }

    fn url(&self, params: &str) -> String {
        self.url_as(&self.user, &self.password, params)
    }

    /// Connecting with `url` fails; returns the error after checking the password is hidden.
    async fn refused(&self, url: &str) -> lockcore::Error {
        let result = match PostgresConfig::from_url(url) {
            Ok(config) => PostgresBackend::connect(config.with_schema(SCHEMA)).await,
            Err(err) => Err(err),
        };
        let err = result.expect_err("the connection must be refused");
        self.assert_hidden(&err);
        eprintln!("refused ({:?}): {err}", err.kind());
        err
    }

    fn assert_hidden(&self, err: &lockcore::Error) {
        let mut shown = format!("{err}\n{err:?}");
        let mut next = err.source();
        while let Some(e) = next {
            shown.push_str(&format!("\n{e}\n{e:?}"));
            next = e.source();
        }
        assert!(
            !shown.contains(&self.password),
            "the password shows in the error: {err}"
        );
    }
}

const SCHEMA: &str = "anylock";
const FULL: &str = "sslmode=verify-full&sslrootcert={dir}/ca.pem\
    &sslcert={dir}/client.pem&sslkey={dir}/client-key.pem";

fn assert_mentions(err: &lockcore::Error, kind: ErrorKind, fragment: &str) {
    assert_eq!(err.kind(), kind, "{err}");
    assert!(
        err.to_string().contains(fragment),
        "expected {fragment:?} in: {err}"
    );
}

#[tokio::test]
async fn right_credentials_and_client_certificate_verify_full_and_lock() {
    let Some(s) = secure() else { return };
    for params in [
        FULL.to_owned(),
        // anylock's own names for the same files, and no sslmode: verify-full.
        "ca={dir}/ca.pem&cert={dir}/client.pem&key={dir}/client-key.pem".to_owned(),
    ] {
        let config = PostgresConfig::from_url(&s.url(&params)).expect("valid URL");
        let backend = PostgresBackend::connect(config.with_schema(SCHEMA))
            .await
            .expect("connect with the right credentials");
        let name = LockName::new(format!("security-{:016x}", rand::random::<u64>())).unwrap();
        let request = AcquireRequest::new(name.clone(), Identity::unique(), Duration::from_secs(5));
        let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
            panic!("a fresh lock must be free");
        };
        backend.release(&lease).await.expect("release");
        assert!(backend.inspect(&name).await.expect("inspect").is_none());

        let report = backend.connection_security().await.expect("report");
        assert_eq!(report.len(), 1, "{report:?}");
        let Transport::Tls(tls) = &report[0].transport else {
            panic!("TLS expected: {report:?}");
        };
        assert_eq!(tls.verification, lockcore::Verification::Full);
        assert!(tls.client_certificate, "{report:?}");
        assert!(tls.version.as_deref().is_some_and(|v| v.starts_with("TLS")));
        assert!(tls.cipher.is_some(), "{report:?}");
        let identity = report[0].identity.as_deref().unwrap_or_default();
        assert!(identity.contains("\"anylock\""), "{identity}");
        assert!(!format!("{report:?}").contains(&s.password));
    }
}

#[tokio::test]
async fn a_wrong_password_is_an_authentication_failure_naming_the_user() {
    let Some(s) = secure() else { return };
    let wrong = format!("{}x", s.password);
    let url = s.url_as(&s.user, &wrong, FULL);
    let err = s.refused(&url).await;
    assert_mentions(&err, ErrorKind::PermissionDenied, "authentication");
    assert!(err.to_string().contains("\"anylock\""), "{err}");
    assert!(!format!("{err:?}").contains(&wrong), "{err:?}");
}

#[tokio::test]
async fn another_ca_as_root_certificate_is_refused_with_verify_full_and_with_require() {
    let Some(s) = secure() else { return };
    for mode in ["verify-full", "require", "verify-ca"] {
        let params = format!(
            "sslmode={mode}&sslrootcert={{dir}}/other-ca.pem\
             &sslcert={{dir}}/client.pem&sslkey={{dir}}/client-key.pem"
        );
        let err = s.refused(&s.url(&params)).await;
        assert_mentions(&err, ErrorKind::PermissionDenied, "TLS handshake failed");
        assert!(
            err.to_string().contains("not signed by a CA we trust"),
            "{mode}: {err}"
        );
    }
}

#[tokio::test]
async fn a_missing_client_certificate_is_an_authentication_failure() {
    let Some(s) = secure() else { return };
    let err = s
        .refused(&s.url("sslmode=verify-full&sslrootcert={dir}/ca.pem"))
        .await;
    assert_mentions(&err, ErrorKind::PermissionDenied, "certificate");
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused_naming_tls() {
    let Some(s) = secure() else { return };
    let params = "sslmode=verify-full&sslrootcert={dir}/ca.pem\
        &sslcert={dir}/other-client.pem&sslkey={dir}/other-client-key.pem";
    let err = s.refused(&s.url(params)).await;
    assert_mentions(&err, ErrorKind::PermissionDenied, "TLS");
    assert!(err.to_string().contains("client certificate"), "{err}");
}

#[tokio::test]
async fn misspelled_parameters_are_refused_without_their_values() {
    let Some(s) = secure() else { return };
    for (param, value) in [
        ("sslmod", "verify-full".to_owned()),
        ("ssl_root_cert", format!("{}/ca.pem", s.dir)),
        ("pasword", s.password.clone()),
        ("sslpassword", s.password.clone()),
    ] {
        let url = s.url(&format!("{FULL}&{param}={value}"));
        let err = s.refused(&url).await;
        assert_mentions(&err, ErrorKind::InvalidInput, &format!("`{param}`"));
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(&value), "{param}: {shown}");
    }
}

#[tokio::test]
async fn a_missing_or_non_pem_ca_file_is_named_before_connecting() {
    let Some(s) = secure() else { return };
    let missing = s.url("sslmode=verify-full&sslrootcert={dir}/no-such-ca.pem");
    let err = s.refused(&missing).await;
    assert_mentions(&err, ErrorKind::Config, "no-such-ca.pem");
    assert!(err.to_string().contains("`ca`"), "{err}");
    // A private key is PEM but holds no certificate.
    let not_ca = s.url("sslmode=verify-full&sslrootcert={dir}/client-key.pem");
    let err = s.refused(&not_ca).await;
    assert_mentions(&err, ErrorKind::Config, "client-key.pem");
}

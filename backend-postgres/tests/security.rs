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
    let var = |name: &str| test_kit::env::require(name, "PostgreSQL TLS");
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
        let request = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
        );
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

/// A password and no `sslmode` mean `verify-full`: the real TLS server must prove itself
/// too, here against the OS trust store, which lacks the test CA. The refusal says what to
/// pass.
#[tokio::test]
async fn a_password_without_sslmode_has_the_server_verified() {
    let Some(s) = secure() else { return };
    let err = s.refused(&s.url("application_name=default-mode")).await;
    assert_mentions(
        &err,
        ErrorKind::PermissionDenied,
        "not signed by a CA we trust",
    );
    for fragment in [
        "the default over TCP without an sslmode",
        "ca=FILE",
        "sslmode=disable",
    ] {
        assert!(
            err.to_string().contains(fragment),
            "{fragment:?} missing: {err}"
        );
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
    for mode in ["require", "verify-full", "verify-ca"] {
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

/// Set in the child process that runs [`os_trust_store_child`].
const CHILD: &str = "ANYLOCK_PG_TRUST_STORE_CHILD";

/// Without `ca` the OS trust store decides (rustls-native-certs, which honours
/// `SSL_CERT_FILE`): the test CA is not in it, so verify-full fails here, and succeeds in a
/// child process whose `SSL_CERT_FILE` is the test CA.
#[tokio::test]
async fn without_ca_the_os_trust_store_is_used() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(s) = secure() else { return };
    let no_ca = "sslmode=verify-full&sslcert={dir}/client.pem&sslkey={dir}/client-key.pem";
    let err = s.refused(&s.url(no_ca)).await;
    assert_mentions(
        &err,
        ErrorKind::PermissionDenied,
        "not signed by a CA we trust",
    );

    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "os_trust_store_child", "--nocapture"])
        .env(CHILD, "1")
        .env("SSL_CERT_FILE", format!("{}/ca.pem", s.dir))
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

/// Runs only inside [`without_ca_the_os_trust_store_is_used`]'s child.
#[tokio::test]
async fn os_trust_store_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let s = secure().expect("the parent checked the settings");
    let no_ca = "sslmode=verify-full&sslcert={dir}/client.pem&sslkey={dir}/client-key.pem";
    let config = PostgresConfig::from_url(&s.url(no_ca)).expect("valid");
    PostgresBackend::connect(config.with_schema(SCHEMA))
        .await
        .expect("the OS trust store (SSL_CERT_FILE) holds the server's CA");

    // sqlx 0.9 ADDS the `ca` file to the OS trust store instead of replacing it (libpq
    // trusts the file only), so a CA that signed nothing still lets this server through
    // while the OS store trusts its CA. docs/tls-and-auth.md says so; if this starts to
    // fail, sqlx replaced the store: update the docs.
    let other = "sslmode=verify-full&sslrootcert={dir}/other-ca.pem\
        &sslcert={dir}/client.pem&sslkey={dir}/client-key.pem";
    let config = PostgresConfig::from_url(&s.url(other)).expect("valid");
    PostgresBackend::connect(config.with_schema(SCHEMA))
        .await
        .expect("sqlx adds `ca` to the OS trust store");
}

/// The least-privilege recipe of docs/tls-and-auth.md: an owner creates the objects, and a
/// role with only CONNECT on the database plus these grants can acquire, refresh, inspect
/// and release. Each grant is then revoked in turn, and the error names that grant.
#[tokio::test]
async fn a_role_with_the_documented_grants_uses_objects_an_owner_created() {
    let Some(s) = secure() else { return };
    let schema = format!("anylock_lp_{:016x}", rand::random::<u64>());
    let owner = PostgresBackend::connect(
        PostgresConfig::from_url(&s.url(FULL))
            .expect("valid")
            .with_schema(&schema),
    )
    .await
    .expect("the owner creates the objects");
    let admin = owner.pool().clone();
    let run = async |sql: String| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("admin statement");
    };
    let q = format!("\"{schema}\"");
    let grants = [
        format!("GRANT USAGE ON SCHEMA {q} TO anylock_noperm"),
        format!("GRANT SELECT, INSERT, UPDATE ON {q}.leases TO anylock_noperm"),
        format!("GRANT USAGE ON SEQUENCE {q}.leases_fence TO anylock_noperm"),
    ];
    for grant in &grants {
        run(grant.clone()).await;
    }
    let limited_url = s.url_as("anylock_noperm", &s.password, FULL);
    let limited = PostgresConfig::from_url(&limited_url)
        .expect("valid")
        .with_schema(&schema);
    let outcome = async {
        let backend = PostgresBackend::connect(limited.clone())
            .await
            .expect("connect with the documented grants");
        let name = LockName::new("least-privilege").unwrap();
        let request = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
        );
        let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
            panic!("free lock");
        };
        backend.refresh(&lease).await.expect("refresh");
        assert!(backend.inspect(&name).await.expect("inspect").is_some());
        backend.release(&lease).await.expect("release");

        for (grant, revoke, fix) in [
            (
                2,
                format!("REVOKE USAGE ON SEQUENCE {q}.leases_fence FROM anylock_noperm"),
                "GRANT USAGE ON SEQUENCE",
            ),
            (
                1,
                format!("REVOKE SELECT, INSERT, UPDATE ON {q}.leases FROM anylock_noperm"),
                "GRANT SELECT, INSERT, UPDATE ON",
            ),
            (
                0,
                format!("REVOKE USAGE ON SCHEMA {q} FROM anylock_noperm"),
                "GRANT USAGE ON SCHEMA",
            ),
        ] {
            run(revoke).await;
            let request = AcquireRequest::new(
                name.clone(),
                Identity::unique(),
                lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
            );
            let err = backend
                .acquire(&request)
                .await
                .expect_err("a grant is missing");
            s.assert_hidden(&err);
            assert_mentions(&err, ErrorKind::PermissionDenied, fix);
            run(grants[grant].clone()).await;
        }
    };
    outcome.await;
    run(format!("DROP SCHEMA {q} CASCADE")).await;
}

/// A role without CREATE on the database cannot make the schema: the error names the
/// grant and the alternative.
#[tokio::test]
async fn a_role_without_create_is_told_which_grant_is_missing() {
    let Some(s) = secure() else { return };
    let schema = format!("anylock_np_{:016x}", rand::random::<u64>());
    let url = s.url_as("anylock_noperm", &s.password, FULL);
    let config = PostgresConfig::from_url(&url)
        .expect("valid")
        .with_schema(&schema);
    let err = PostgresBackend::connect(config)
        .await
        .expect_err("no CREATE");
    s.assert_hidden(&err);
    assert_mentions(
        &err,
        ErrorKind::PermissionDenied,
        "GRANT CREATE ON DATABASE \"anylock_test\" TO \"anylock_noperm\"",
    );
}

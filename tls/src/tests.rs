//! Files, configurations, the probe and `diagnose`, against certificates `openssl` makes
//! (installed by `scripts/servers install`) and an in-test rustls server.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result, Verification};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::*;

/// A scratch dir with `ca`, `server` (localhost, 127.0.0.1) and `client` made by one CA,
/// and `other-ca` that made nothing.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("anylock-tls-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let pki = Self { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.leaf("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1");
        pki.leaf("client", "ca", "extendedKeyUsage=clientAuth");
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl must be installed (scripts/servers install)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    }

    fn ca(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn leaf(&self, name: &str, ca: &str, ext: &str) {
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.csr"),
        ]);
        std::fs::write(self.path(&format!("{name}.ext")), ext).expect("ext file");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}-key.pem"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn files(&self, ca: &str) -> TlsFiles {
        TlsFiles::default().with_ca(self.path(&format!("{ca}.pem")))
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn message(err: &Error) -> String {
    err.to_string()
}

#[test]
fn parameters_are_taken_once_and_never_empty() {
    let mut files = TlsFiles::default();
    assert!(files.take_param("cert", "c.pem").expect("cert"));
    assert!(!files.take_param("sslmode", "require").expect("not ours"));
    let twice = files.take_param("cert", "d.pem").expect_err("twice");
    assert_eq!(twice.kind(), ErrorKind::InvalidInput);
    assert!(message(&twice).contains("`cert` is given twice"), "{twice}");
    let empty = files.take_param("ca", "").expect_err("empty");
    assert!(
        message(&empty).contains("`ca` needs a file path"),
        "{empty}"
    );
    assert_eq!(files.params(), vec![("cert", "c.pem".to_owned())]);
}

#[test]
fn tls_parameters_on_a_plaintext_url_are_refused() {
    TlsFiles::default()
        .refuse_on_plaintext("etcd", "etcds")
        .expect("nothing given");
    let err = TlsFiles::default()
        .with_client_cert("c.pem", "k.pem")
        .refuse_on_plaintext("etcd", "etcds")
        .expect_err("cert on etcd://");
    assert_eq!(err.kind(), ErrorKind::Config);
    let text = message(&err);
    assert!(
        text.contains("cert, key") && text.contains("`etcds://`"),
        "{text}"
    );
}

#[test]
fn unusable_files_are_named() {
    let pki = Pki::new("files");
    let missing = pki.files("nope").load().expect_err("missing");
    assert_eq!(missing.kind(), ErrorKind::Config);
    assert!(
        message(&missing).contains("`ca`") && message(&missing).contains("nope.pem"),
        "{missing}"
    );

    std::fs::write(pki.path("text.pem"), "just some text\n").expect("write");
    let text = pki.files("text").load().expect_err("not PEM");
    assert!(message(&text).contains("not usable PEM"), "{text}");

    std::fs::write(
        pki.path("junk.pem"),
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    let junk = pki.files("junk").load().expect_err("not a certificate");
    assert!(message(&junk).contains("does not parse"), "{junk}");

    let mut half = TlsFiles::default();
    half.take_param("cert", pki.path("client.pem").to_str().expect("utf-8"))
        .expect("cert");
    let err = half.load().expect_err("cert without key");
    assert!(message(&err).contains("both"), "{err}");

    // A certificate given as the key.
    let swapped =
        TlsFiles::default().with_client_cert(pki.path("client.pem"), pki.path("client.pem"));
    let err = swapped.load().expect_err("certificate as key");
    assert!(
        message(&err).contains("`key`") && message(&err).contains("private key"),
        "{err}"
    );

    for (special, why) in [
        ("/dev/zero", "not a regular file"),
        ("/tmp", "not a regular file"),
    ] {
        let err = TlsFiles::default()
            .with_ca(special)
            .load()
            .expect_err("not a certificate file");
        assert!(message(&err).contains(why), "{err}");
    }
    let fifo = pki.path("fifo.pem");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let err = TlsFiles::default()
        .with_ca(&fifo)
        .load()
        .expect_err("a FIFO blocks");
    assert!(message(&err).contains("not a regular file"), "{err}");
    let big = pki.path("big.pem");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(MAX_FILE_LEN + 1))
        .expect("sparse file");
    let err = TlsFiles::default()
        .with_ca(&big)
        .load()
        .expect_err("too big");
    assert!(
        message(&err).contains(&format!("more than the {MAX_FILE_LEN} such a file")),
        "{err}"
    );

    let good = pki
        .files("ca")
        .with_client_cert(pki.path("client.pem"), pki.path("client-key.pem"))
        .load()
        .expect("good files");
    assert_eq!(good.ca().expect("ca").ders().len(), 1);
    assert!(format!("{good:?}").contains("<redacted>"));
    assert!(!format!("{good:?}").contains("PRIVATE KEY"));
}

/// A rustls server with `server.pem` that accepts `handshakes` connections; it asks for a
/// client certificate from `ca` when `client_ca` is set.
async fn server(pki: &Pki, client_ca: bool) -> u16 {
    let chain = vec![CertificateDer::from_pem_file(pki.path("server.pem")).expect("server cert")];
    let key = PrivateKeyDer::from_pem_file(pki.path("server-key.pem")).expect("server key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = if client_ca {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(pki.path("ca.pem")).expect("ca"))
            .expect("add ca");
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = Arc::new(builder.with_single_cert(chain, key).expect("server config"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut buf = [0u8; 16];
                    let _ = tls.read(&mut buf).await;
                }
            });
        }
    });
    port
}

async fn probe_with(port: u16, name: &str, files: TlsFiles, v: Verification) -> Result<Negotiated> {
    let config = client_config(&files.load()?, v)?;
    probe(
        "127.0.0.1",
        port,
        name,
        config,
        Preamble::None,
        Duration::from_secs(10),
    )
    .await
}

#[tokio::test]
async fn the_probe_reports_what_was_negotiated_and_why_a_handshake_failed() {
    let pki = Pki::new("probe");
    let port = server(&pki, false).await;

    let ok = probe_with(port, "localhost", pki.files("ca"), Verification::Full)
        .await
        .expect("trusted server");
    assert!(ok.version == "TLSv1.3" || ok.version == "TLSv1.2", "{ok:?}");
    assert!(!ok.cipher.is_empty() && ok.cipher != "unknown", "{ok:?}");

    let untrusted = probe_with(port, "localhost", pki.files("other-ca"), Verification::Full)
        .await
        .expect_err("server signed by another CA");
    assert_eq!(untrusted.kind(), ErrorKind::PermissionDenied);
    assert!(
        message(&untrusted).contains("not signed by a CA we trust"),
        "{untrusted}"
    );

    let misnamed = probe_with(port, "db.example", pki.files("ca"), Verification::Full)
        .await
        .expect_err("name not in the certificate");
    assert!(
        message(&misnamed).contains("not valid for the host name"),
        "{misnamed}"
    );

    // verify-ca: the chain is checked, the name is not; an untrusted chain still fails.
    probe_with(port, "db.example", pki.files("ca"), Verification::ChainOnly)
        .await
        .expect("chain only ignores the name");
    let chain = probe_with(
        port,
        "db.example",
        pki.files("other-ca"),
        Verification::ChainOnly,
    )
    .await
    .expect_err("chain only still checks the chain");
    assert_eq!(chain.kind(), ErrorKind::PermissionDenied);
    probe_with(
        port,
        "db.example",
        pki.files("other-ca"),
        Verification::None,
    )
    .await
    .expect("nothing verified");
}

#[tokio::test]
async fn a_closed_port_is_unavailable_not_a_tls_failure() {
    let pki = Pki::new("closed");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let err = probe_with(port, "localhost", pki.files("ca"), Verification::Full)
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[test]
fn diagnose_finds_a_tls_error_behind_io_and_other_errors() {
    let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
    let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
    let outer = Error::unavailable("connect failed").with_source(io);
    let found = diagnose(&outer).expect("a TLS failure");
    assert_eq!(found.kind(), ErrorKind::PermissionDenied);
    assert!(
        message(&found).starts_with("permission denied: TLS handshake failed"),
        "{found}"
    );

    let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
    assert!(message(&diagnose(&alert).expect("alert")).contains("requires a client certificate"));

    let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    assert!(diagnose(&plain).is_none());
}

/// A corrupted record is worth another attempt, so a refresh that meets one degrades the
/// lease instead of losing it; a refused certificate (by either side) or a local setting
/// is permanent.
#[test]
fn a_tls_failure_that_refuses_no_certificate_is_temporary() {
    let garbled = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
    for other in [rustls::Error::DecryptError, garbled] {
        let found = diagnose(&other).expect("a TLS failure");
        assert_eq!(found.kind(), ErrorKind::Unavailable, "{found}");
        assert!(found.is_temporary(), "{found}");
    }
    let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
    let alerted = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateExpired);
    for refused in [expired, alerted, rustls::Error::BadMaxFragmentSize] {
        assert!(
            !diagnose(&refused).expect("refused").is_temporary(),
            "{refused}"
        );
    }
}

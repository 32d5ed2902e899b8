//! Certificates `openssl` makes at test time (installed by `scripts/servers install`):
//! a CA and a server certificate it signed, and a self-signed one, all for `localhost`
//! and 127.0.0.1. Neither CA is in the OS trust store.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch directory of PEM files, removed on drop.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "anylock-gcs-pki-{tag}-{}-{}",
            std::process::id(),
            lockcore::Identity::unique().as_str().replace('/', "_")
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let pki = Self { dir };
        pki.make("ca", "/CN=anylock-gcs-test-ca", None);
        pki.make("server", "/CN=localhost", Some("ca"));
        pki.make("self-signed", "/CN=self-signed", Some("self"));
        pki
    }

    /// `name.pem` and `name-key.pem` (P-256, two days) for `subject`: a CA when `signer`
    /// is `None`, else a server certificate for this machine signed by `signer`'s CA, or
    /// by its own key for `self`.
    fn make(&self, name: &str, subject: &str, signer: Option<&str>) {
        let mut command = Command::new("openssl");
        command
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "2", "-subj", subject])
            .args([
                "-keyout",
                &format!("{name}-key.pem"),
                "-out",
                &format!("{name}.pem"),
            ])
            .current_dir(&self.dir);
        if let Some(signer) = signer {
            command
                .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
                .args(["-addext", "basicConstraints=critical,CA:FALSE"]);
            if signer != "self" {
                command.args(["-CA", &format!("{signer}.pem")]);
                command.args(["-CAkey", &format!("{signer}-key.pem")]);
            }
        }
        let out = command
            .output()
            .expect("openssl must be installed (scripts/servers install)");
        assert!(out.status.success(), "openssl for {name}: {out:?}");
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The CA that signed `server.pem`.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// (certificate, key) of the CA-signed server certificate.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.path("server.pem"), self.path("server-key.pem"))
    }

    /// (certificate, key) of the self-signed certificate.
    pub fn self_signed(&self) -> (PathBuf, PathBuf) {
        (
            self.path("self-signed.pem"),
            self.path("self-signed-key.pem"),
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

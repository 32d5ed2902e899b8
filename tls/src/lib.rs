//! The TLS settings every anylock network backend reads the same way.
//!
//! - [`TlsFiles`]: the URL parameters `ca`, `cert` and `key` (file paths), identical on
//!   every backend. Without `ca` the OS trust store is used; with it, only that file's CAs
//!   are trusted (as libpq's `sslrootcert` does).
//! - [`TlsFiles::load`] reads and checks the files before any connection, so a missing file,
//!   a file that is not PEM or a certificate without its key is a
//!   [`Config`](lockcore::ErrorKind::Config) error naming the parameter and the path.
//! - [`client_config`] builds the rustls configuration those settings mean, for a backend
//!   that connects through rustls itself and for [`probe`].
//! - [`probe`] makes one TLS handshake to report the negotiated version and cipher suite
//!   (`anylock check`).
//! - [`diagnose`] finds a TLS failure in an error chain and words it for a person: an
//!   untrusted or misnamed server certificate, a client certificate the server wanted or
//!   refused. Those are [`PermissionDenied`](lockcore::ErrorKind::PermissionDenied): the
//!   peers did not authenticate each other, so retrying cannot help.
//!
//! ```
//! let mut files = anylock_tls::TlsFiles::default();
//! assert!(files.take_param("ca", "/etc/anylock/ca.pem")?);
//! assert!(!files.take_param("prefix", "x")?);
//! assert_eq!(files.ca().map(|p| p.display().to_string()).as_deref(), Some("/etc/anylock/ca.pem"));
//! # Ok::<(), lockcore::Error>(())
//! ```

mod config;
mod diagnose;
mod files;
mod probe;
mod verifier;

pub use config::{client_config, roots_description};
pub use diagnose::diagnose;
pub use files::{
    ClientIdentity, MAX_FILE_LEN, PARAMS, PemCertificates, TlsFiles, TlsMaterial, read_regular_file,
};
pub use probe::{Negotiated, Preamble, probe};

#[cfg(test)]
mod tests;

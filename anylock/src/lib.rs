//! anylock: one lease-lock API over several coordination systems, chosen by URL.
//!
//! [`connect`] turns a backend URL into an `Arc<dyn LockBackend>`; hand it to a
//! [`Locker`]. Swap backends by changing the URL in your configuration.
//!
//! ```no_run
//! use std::time::Duration;
//! use anylock::{LockOptions, Locker, Note, WaitMode};
//! # async fn demo() -> Result<(), anylock::Error> {
//! let backend = anylock::connect("local:/tmp/locks.sqlite3").await?;
//! let options = LockOptions::new(Duration::from_secs(30))
//!     .with_wait(WaitMode::Timeout(Duration::from_secs(60)))
//!     .with_note(Note::new("nightly publish on build-3")?);
//! let guard = Locker::new(backend).with_options(options).acquire("publish-repo").await?;
//! // ... write with guard.fence_token() ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Everything a user of locks needs is re-exported here, so `anylock` is the one
//! dependency; a backend author implements [`LockBackend`] from `lockcore`.
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `local:` or `local:/path/locks.sqlite3` | embedded, one machine, no server (the default) | `local` |
//! | `memory:` | in-process only (tests, examples) | always |
//! | `redis://[:pw@]host:port/db`, `rediss://` | Redis, single instance | `redis` |
//! | `redlock://h1:p1,h2:p2,h3:p3`, `redlocks://` | Redlock over independent Redis nodes | `redis` |
//! | `postgres://user:pw@host/db` | PostgreSQL lease table | `postgres` |
//! | `etcd://h1:2379,h2:2379/prefix` | etcd | `etcd` |
//! | `gs://bucket/prefix` (Google credentials, `GCS_ACCESS_TOKEN`, or an emulator via `STORAGE_EMULATOR_HOST`) | Google Cloud Storage | `gcs` |
//!
//! Every feature is on by default. Passwords and tokens never appear in the `Display` or
//! `Debug` output of a [`BackendUrl`] or [`Config`], nor in errors from this crate.

mod config;
mod table;
mod url;

/// The workspace README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

use std::sync::Arc;

use lockcore::MemoryBackend;

pub use config::Config;
pub use lockcore;
pub use lockcore::{
    Backoff, ConnectionSecurity, Durability, Error, ErrorKind, Exclusion, ExpiryClock, Fairness,
    FenceToken, Fencing, Guarantees, Health, HeldLock, HolderInfo, Identity, LockBackend,
    LockGuard, LockName, LockOptions, Locker, LostReason, MAX_NOTE_LEN, Note, Result, Transport,
    WaitMode, Waiting, display_safe, validate_prefix,
};
pub use table::guarantees_markdown;
pub use url::{BackendUrl, redact};

/// A URL scheme anylock knows, and the cargo feature that provides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// The scheme, without `:`.
    pub scheme: &'static str,
    /// The cargo feature that must be enabled, if any.
    pub feature: Option<&'static str>,
    /// What it connects to.
    pub backend: &'static str,
}

/// Every scheme anylock knows, compiled in or not.
pub const SCHEMES: &[Scheme] = &[
    Scheme {
        scheme: "local",
        feature: Some("local"),
        backend: "embedded SQLite (one machine)",
    },
    Scheme {
        scheme: "memory",
        feature: None,
        backend: "in-process memory",
    },
    Scheme {
        scheme: "redis",
        feature: Some("redis"),
        backend: "Redis",
    },
    Scheme {
        scheme: "rediss",
        feature: Some("redis"),
        backend: "Redis over TLS",
    },
    Scheme {
        scheme: "redlock",
        feature: Some("redis"),
        backend: "Redlock over Redis nodes",
    },
    Scheme {
        scheme: "redlocks",
        feature: Some("redis"),
        backend: "Redlock over Redis nodes, TLS",
    },
    Scheme {
        scheme: "postgres",
        feature: Some("postgres"),
        backend: "PostgreSQL",
    },
    Scheme {
        scheme: "postgresql",
        feature: Some("postgres"),
        backend: "PostgreSQL",
    },
    Scheme {
        scheme: "etcd",
        feature: Some("etcd"),
        backend: "etcd",
    },
    Scheme {
        scheme: "etcds",
        feature: Some("etcd"),
        backend: "etcd over TLS",
    },
    Scheme {
        scheme: "gs",
        feature: Some("gcs"),
        backend: "Google Cloud Storage",
    },
];

/// The URL used when nothing is configured: the embedded backend at its default location.
pub const DEFAULT_URL: &str = "local:";

/// Connects to the backend named by `url`.
///
/// # Errors
/// - [`ErrorKind::InvalidInput`] for an unknown scheme (naming the known ones) or a
///   malformed URL;
/// - [`ErrorKind::Config`] when the scheme's cargo feature is disabled (naming it) or its
///   backend is not available in this release;
/// - the backend's own error when it cannot connect.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, Error> {
    connect_url(&BackendUrl::new(url)).await
}

/// Connects to the backend in `config` (or the default one).
///
/// # Errors
/// As [`connect`].
pub async fn connect_config(config: &Config) -> Result<Arc<dyn LockBackend>, Error> {
    connect_url(&config.backend_url()).await
}

async fn connect_url(url: &BackendUrl) -> Result<Arc<dyn LockBackend>, Error> {
    let scheme = url.scheme();
    let known = SCHEMES
        .iter()
        .find(|s| s.scheme == scheme)
        .ok_or_else(|| unknown(url))?;
    if let Some(feature) = known.feature.filter(|f| !feature_enabled(f)) {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{scheme}: URLs need the `{feature}` cargo feature of the anylock crate, \
                 which this build does not enable"
            ),
        ));
    }
    // Schemes are case-insensitive (RFC 3986 3.1); the backends match them in lowercase.
    #[allow(unused_variables)]
    let url = format!("{scheme}{}", &url.expose()[scheme.len()..]);
    match scheme.as_str() {
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "local")]
        "local" => {
            let config = backend_local::LocalConfig::from_url(&url)?;
            Ok(Arc::new(backend_local::LocalBackend::open(config).await?))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redlock" | "redlocks" => backend_redis::connect(&url).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let config = backend_postgres::PostgresConfig::from_url(&url)?;
            Ok(Arc::new(
                backend_postgres::PostgresBackend::connect(config).await?,
            ))
        }
        #[cfg(feature = "gcs")]
        "gs" => Ok(Arc::new(backend_gcs::GcsBackend::from_url(&url)?)),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(backend_etcd::EtcdBackend::from_url(&url).await?)),
        _ => Err(Error::new(
            ErrorKind::Config,
            format!(
                "the {} backend ({scheme}:) is not available in this release yet",
                known.backend
            ),
        )),
    }
}

fn unknown(url: &BackendUrl) -> Error {
    let known: Vec<&str> = SCHEMES.iter().map(|s| s.scheme).collect();
    Error::invalid_input(format!(
        "unknown backend URL \"{url}\": the scheme must be one of {}",
        known.join(", ")
    ))
}

// Not `matches!`: each arm is a different compile-time `cfg!`, all true in a full build.
#[allow(clippy::match_like_matches_macro)]
fn feature_enabled(feature: &str) -> bool {
    match feature {
        "local" => cfg!(feature = "local"),
        "redis" => cfg!(feature = "redis"),
        "postgres" => cfg!(feature = "postgres"),
        "etcd" => cfg!(feature = "etcd"),
        "gcs" => cfg!(feature = "gcs"),
        _ => false,
    }
}

/// The guarantees of every backend compiled into this build, by name, without connecting.
pub fn compiled_guarantees() -> Vec<(&'static str, Guarantees)> {
    [
        #[cfg(feature = "local")]
        ("local", backend_local::guarantees()),
        #[cfg(feature = "redis")]
        ("redis", backend_redis::guarantees()),
        #[cfg(feature = "redis")]
        ("redlock", backend_redis::redlock_guarantees()),
        #[cfg(feature = "postgres")]
        ("postgres", backend_postgres::guarantees()),
        #[cfg(feature = "etcd")]
        ("etcd", backend_etcd::guarantees()),
        #[cfg(feature = "gcs")]
        ("gcs", backend_gcs::guarantees()),
        ("memory", MemoryBackend::new().guarantees()),
    ]
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_schemes_name_the_known_ones() {
        let err = connect("mongodb://u:pw@h/x").await.expect_err("unknown");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(text.contains("local, memory, redis"), "{text}");
        assert!(!text.contains("pw@"), "password leaked: {text}");
        let err = connect("no-scheme-at-all").await.expect_err("unknown");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[cfg(not(feature = "local"))]
    #[tokio::test]
    async fn a_disabled_scheme_names_its_feature() {
        let err = connect("local:/tmp/x.db").await.expect_err("disabled");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("need the `local` cargo feature"),
            "{err}"
        );
    }

    #[cfg(feature = "local")]
    #[tokio::test]
    async fn memory_and_local_connect() {
        let memory = connect("memory:").await.expect("memory");
        assert_eq!(memory.backend_name(), "memory");
        let dir = std::env::temp_dir().join(format!("anylock-facade-{}", std::process::id()));
        let local = connect(&format!("local:{}/locks.sqlite3", dir.display()))
            .await
            .expect("local");
        assert_eq!(local.backend_name(), "local");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn every_compiled_backend_has_a_descriptor() {
        let names: Vec<_> = compiled_guarantees().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"memory"));
        #[cfg(feature = "local")]
        assert!(names.contains(&"local"));
    }
}

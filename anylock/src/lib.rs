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
mod config_file;
mod table;
mod url;

/// The workspace README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lockcore::MemoryBackend;

pub use config::{Config, DEFAULT_URL};
pub use config_file::MAX_CONFIG_LEN;
pub use lockcore;
pub use lockcore::{
    Backoff, ConnectionSecurity, Durability, Error, ErrorKind, Exclusion, ExpiryClock, Fairness,
    FenceToken, Fencing, Guarantees, Health, HeldLock, HolderInfo, Identity, LockBackend,
    LockGuard, LockName, LockOptions, Locker, LostReason, MAX_NOTE_LEN, Note, Result, Transport,
    WaitMode, Waiting, display_safe, validate_prefix,
};
pub use table::guarantees_markdown;
pub use url::{BackendUrl, holds_secret, redact};

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

/// Every scheme anylock knows, compiled in or not (from the facade's table of backends).
pub const SCHEMES: &[Scheme] = &{
    const COUNT: usize = {
        let mut count = 0;
        let mut i = 0;
        while i < BACKENDS.len() {
            count += BACKENDS[i].schemes.len();
            i += 1;
        }
        count
    };
    let mut all = [Scheme {
        scheme: "",
        feature: None,
        backend: "",
    }; COUNT];
    let (mut i, mut n) = (0, 0);
    while i < BACKENDS.len() {
        let row = &BACKENDS[i];
        let mut j = 0;
        while j < row.schemes.len() {
            all[n] = Scheme {
                scheme: row.schemes[j].0,
                feature: row.feature,
                backend: row.schemes[j].1,
            };
            n += 1;
            j += 1;
        }
        i += 1;
    }
    all
};

/// A boxed `open` future.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn LockBackend>, Error>> + Send + 'a>>;

/// One backend: the single table the facade dispatches from. Each backend crate has the
/// same face (`SCHEMES`, `async fn open(url)`, `guarantees()`); a row names them.
struct Backend {
    /// The name in the guarantees table and `anylock --version`.
    name: &'static str,
    /// The cargo feature that compiles it in (`None`: always there).
    feature: Option<&'static str>,
    /// Its schemes and what each connects to.
    schemes: &'static [(&'static str, &'static str)],
    /// Opens a URL of one of its schemes; `None` when the feature is off.
    open: Option<for<'a> fn(&'a str) -> Opening<'a>>,
    /// Its promises; `None` when the feature is off.
    guarantees: Option<fn() -> Guarantees>,
    /// What its replies are bounded to (`(what, bytes)`); `None` when the feature is off.
    reply_limits: Option<&'static [(&'static str, usize)]>,
}

/// A backend crate's `open` as a plain function pointer returning a boxed future.
#[allow(unused_macros)] // with every backend feature off
macro_rules! opener {
    ($krate:ident) => {{
        fn open(url: &str) -> Opening<'_> {
            Box::pin($krate::open(url))
        }
        open as for<'a> fn(&'a str) -> Opening<'a>
    }};
}

/// `Some(f)` when `$feature` is compiled in, else `None`.
macro_rules! when {
    ($feature:literal, $f:expr) => {{
        #[cfg(feature = $feature)]
        let f = Some($f);
        #[cfg(not(feature = $feature))]
        let f = None;
        f
    }};
}

/// Every backend anylock knows, compiled in or not, in the guarantees table's order.
const BACKENDS: &[Backend] = &[
    Backend {
        name: "local",
        feature: Some("local"),
        schemes: &[("local", "embedded SQLite (one machine)")],
        open: when!("local", opener!(backend_local)),
        guarantees: when!("local", backend_local::guarantees as fn() -> Guarantees),
        reply_limits: when!("local", backend_local::REPLY_LIMITS),
    },
    Backend {
        name: "redis",
        feature: Some("redis"),
        schemes: &[("redis", "Redis"), ("rediss", "Redis over TLS")],
        open: when!("redis", opener!(backend_redis)),
        guarantees: when!("redis", backend_redis::guarantees as fn() -> Guarantees),
        reply_limits: when!("redis", backend_redis::REPLY_LIMITS),
    },
    Backend {
        name: "redlock",
        feature: Some("redis"),
        schemes: &[
            ("redlock", "Redlock over Redis nodes"),
            ("redlocks", "Redlock over Redis nodes, TLS"),
        ],
        open: when!("redis", opener!(backend_redis)),
        guarantees: when!(
            "redis",
            backend_redis::redlock_guarantees as fn() -> Guarantees
        ),
        reply_limits: when!("redis", backend_redis::REPLY_LIMITS),
    },
    Backend {
        name: "postgres",
        feature: Some("postgres"),
        schemes: &[("postgres", "PostgreSQL"), ("postgresql", "PostgreSQL")],
        open: when!("postgres", opener!(backend_postgres)),
        guarantees: when!(
            "postgres",
            backend_postgres::guarantees as fn() -> Guarantees
        ),
        reply_limits: when!("postgres", backend_postgres::REPLY_LIMITS),
    },
    Backend {
        name: "etcd",
        feature: Some("etcd"),
        schemes: &[("etcd", "etcd"), ("etcds", "etcd over TLS")],
        open: when!("etcd", opener!(backend_etcd)),
        guarantees: when!("etcd", backend_etcd::guarantees as fn() -> Guarantees),
        reply_limits: when!("etcd", backend_etcd::REPLY_LIMITS),
    },
    Backend {
        name: "gcs",
        feature: Some("gcs"),
        schemes: &[("gs", "Google Cloud Storage")],
        open: when!("gcs", opener!(backend_gcs)),
        guarantees: when!("gcs", backend_gcs::guarantees as fn() -> Guarantees),
        reply_limits: when!("gcs", backend_gcs::REPLY_LIMITS),
    },
    Backend {
        name: "memory",
        feature: None,
        schemes: &[("memory", "in-process memory")],
        open: Some(open_memory),
        guarantees: Some(memory_guarantees),
        reply_limits: Some(&[]),
    },
];

fn open_memory(_: &str) -> Opening<'_> {
    Box::pin(async { Ok(Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>) })
}

fn memory_guarantees() -> Guarantees {
    MemoryBackend::new().guarantees()
}

/// Connects to the backend named by `url`.
///
/// # Errors
/// - [`ErrorKind::InvalidInput`] for an unknown scheme (naming the known ones) or a
///   malformed URL;
/// - [`ErrorKind::Config`] when the scheme's cargo feature is disabled (naming it);
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
    let backend = BACKENDS
        .iter()
        .find(|b| b.schemes.iter().any(|(s, _)| *s == scheme))
        .ok_or_else(|| unknown(url))?;
    let Some(open) = backend.open else {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "{scheme}: URLs need the `{}` cargo feature of the anylock crate, which this \
                 build does not enable",
                backend.feature.unwrap_or(backend.name)
            ),
        ));
    };
    // Schemes are case-insensitive (RFC 3986 3.1); the backends match them in lowercase.
    let url = format!("{scheme}{}", &url.expose()[scheme.len()..]);
    // Backends leave the context out (issue #15); name the backend here, as the Locker
    // does for lock calls.
    open(&url).await.map_err(|err| err.in_backend(backend.name))
}

fn unknown(url: &BackendUrl) -> Error {
    let known: Vec<&str> = SCHEMES.iter().map(|s| s.scheme).collect();
    Error::invalid_input(format!(
        "unknown backend URL \"{url}\": the scheme must be one of {}",
        known.join(", ")
    ))
}

/// What the replies of the backend that opens `url` are bounded to, `(what, bytes)`:
/// `None` for an unknown scheme or one whose cargo feature is off.
pub fn reply_limits(url: &BackendUrl) -> Option<&'static [(&'static str, usize)]> {
    let scheme = url.scheme();
    BACKENDS
        .iter()
        .find(|b| b.schemes.iter().any(|(s, _)| *s == scheme))?
        .reply_limits
}

/// The guarantees of every backend compiled into this build, by name, without connecting.
pub fn compiled_guarantees() -> Vec<(&'static str, Guarantees)> {
    BACKENDS
        .iter()
        .filter_map(|b| b.guarantees.map(|g| (b.name, g())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_schemes_name_the_known_ones() {
        let err = connect("mongodb://u:pw@h/x").await.expect_err("unknown");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(text.contains("local, redis, rediss, redlock"), "{text}");
        assert!(text.contains("gs, memory"), "{text}");
        assert!(!text.contains("pw@"), "password leaked: {text}");
        let err = connect("no-scheme-at-all").await.expect_err("unknown");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    /// The table's schemes are the ones each backend crate says it opens.
    #[test]
    fn the_table_matches_each_crates_schemes() {
        let rows = |name: &str| -> Vec<&str> {
            let row = BACKENDS.iter().find(|b| b.name == name).expect("row");
            row.schemes.iter().map(|(s, _)| *s).collect()
        };
        #[cfg(feature = "local")]
        assert_eq!(rows("local"), backend_local::SCHEMES);
        #[cfg(feature = "redis")]
        {
            assert_eq!(rows("redis"), backend_redis::SCHEMES);
            assert_eq!(rows("redlock"), backend_redis::REDLOCK_SCHEMES);
        }
        #[cfg(feature = "postgres")]
        assert_eq!(rows("postgres"), backend_postgres::SCHEMES);
        #[cfg(feature = "etcd")]
        assert_eq!(rows("etcd"), backend_etcd::SCHEMES);
        #[cfg(feature = "gcs")]
        assert_eq!(rows("gcs"), backend_gcs::SCHEMES);
        // Names and schemes are unique: `find` would shadow a second row silently.
        let mut names: Vec<_> = BACKENDS.iter().map(|b| b.name).collect();
        let mut schemes: Vec<_> = SCHEMES.iter().map(|s| s.scheme).collect();
        let (all_names, all_schemes) = (names.len(), schemes.len());
        names.sort_unstable();
        names.dedup();
        schemes.sort_unstable();
        schemes.dedup();
        assert_eq!((names.len(), schemes.len()), (all_names, all_schemes));
        assert_eq!(rows("memory"), ["memory"]);
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

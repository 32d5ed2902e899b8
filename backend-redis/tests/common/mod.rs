//! Helpers shared by this crate's integration tests: settings, raw admin connections,
//! fault proxies and server-side command counts (private redis-server processes are
//! `test_kit::servers::Redis`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use test_kit::env::{host_port, require};
use test_kit::proxy::FaultProxy;

/// The single-instance server URL, or `None` (skip) outside CI.
pub(crate) fn redis_url() -> Option<String> {
    require("ANYLOCK_TEST_REDIS_URL", "Redis")
}

/// The Redlock node URLs (5 in CI), or `None` (skip) outside CI.
pub(crate) fn redlock_urls() -> Option<Vec<String>> {
    let urls = require("ANYLOCK_TEST_REDLOCK_URLS", "Redis (Redlock)")?;
    Some(urls.split(',').map(|u| u.trim().to_owned()).collect())
}

/// A key prefix no other run or test uses.
pub(crate) fn random_prefix(what: &str) -> String {
    format!("anylock-test-{what}-{:016x}", rand::random::<u64>())
}

/// A fresh lock name.
pub(crate) fn fresh_name(what: &str) -> LockName {
    LockName::new(format!("{what}-{:016x}", rand::random::<u64>())).expect("valid name")
}

/// A plain connection for operator-style commands (`DEL`, `SET`, `INFO`).
pub(crate) async fn admin(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"))
}

/// The socket address of a `redis://host:port/…` URL.
pub(crate) fn socket_addr(url: &str) -> SocketAddr {
    host_port(url)
        .and_then(|hp| hp.parse().ok())
        .unwrap_or_else(|| panic!("{url} names no numeric host:port"))
}

/// `url` pointing at the proxy instead of the server.
pub(crate) fn through(url: &str, proxy: &FaultProxy) -> String {
    let original = host_port(url).expect("host:port");
    url.replacen(original, &proxy.local_addr().to_string(), 1)
}

/// A fault proxy in front of the server of `url`.
pub(crate) async fn proxy_for(url: &str) -> FaultProxy {
    FaultProxy::start(socket_addr(url))
        .await
        .expect("start fault proxy")
}

/// A lock value in the documented format `<token>:<unix ms>:<nonce>:<owner>`.
pub(crate) fn stored_value(token: u64, owner: &Identity) -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "{token}:{ms}:{:032x}:{}",
        rand::random::<u128>(),
        owner.as_str()
    )
}

/// `SET key value PX ttl` through a raw connection (an operator or another client).
pub(crate) async fn raw_set(
    conn: &mut MultiplexedConnection,
    key: &str,
    value: &str,
    ttl: Duration,
) {
    let ttl_ms = u64::try_from(ttl.as_millis()).expect("ttl fits");
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(ttl_ms)
        .query_async::<()>(conn)
        .await
        .expect("SET");
}

/// Whether `key` exists.
pub(crate) async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<u64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// `DEL key`, without any notification.
pub(crate) async fn raw_del(conn: &mut MultiplexedConnection, key: &str) {
    redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(conn)
        .await
        .expect("DEL");
}

/// Calls per command from `INFO commandstats` (`cmdstat_evalsha:calls=3,…` → evalsha: 3).
pub(crate) async fn command_calls(conn: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands run between two `command_calls` snapshots, without our own `INFO`.
pub(crate) fn calls_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .filter_map(|(name, calls)| {
            let delta = calls - before.get(name).copied().unwrap_or(0);
            (delta > 0).then(|| (name.clone(), delta))
        })
        .collect()
}

/// The expected command counts, for assertions.
pub(crate) fn calls(expected: &[(&str, u64)]) -> BTreeMap<String, u64> {
    expected
        .iter()
        .map(|(n, c)| ((*n).to_owned(), *c))
        .collect()
}

/// The secure Redis server of `scripts/servers` (TLS only, client certificates required, ACL
/// users), or `None` (skip) outside CI.
pub(crate) struct Secure {
    /// The directory with `ca.pem`, `client.pem`, `other-ca.pem`, …
    pub(crate) dir: PathBuf,
    /// The ACL user with `+@all` (it can create other users).
    pub(crate) user: String,
    /// The password of every ACL user on the server.
    pub(crate) password: String,
    /// The TLS port.
    pub(crate) port: u16,
}

impl Secure {
    /// The settings from `.servers/env`, or `None` (skip) outside CI.
    pub(crate) fn from_env() -> Option<Secure> {
        let dir = require("ANYLOCK_TEST_SECURE_DIR", "secure Redis")?;
        let user = require("ANYLOCK_TEST_SECURE_USER", "secure Redis")?;
        let password = require("ANYLOCK_TEST_SECURE_PASSWORD", "secure Redis")?;
        let port = require("ANYLOCK_TEST_REDIS_TLS_PORT", "secure Redis")?;
        Some(Secure {
            dir: PathBuf::from(dir),
            user,
            password,
            port: port.parse().expect("ANYLOCK_TEST_REDIS_TLS_PORT is a port"),
        })
    }

    /// A file of the secure directory.
    pub(crate) fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `rediss://user:password@127.0.0.1:port/0?ca=…&cert=…&key=…` (right CA, our client
    /// certificate).
    pub(crate) fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "rediss://{user}:{password}@127.0.0.1:{}/0?ca={}&cert={}&key={}",
            self.port,
            self.file("ca.pem"),
            self.file("client.pem"),
            self.file("client-key.pem")
        )
    }

    /// [`url_as`](Self::url_as) the admin user.
    pub(crate) fn url(&self) -> String {
        self.url_as(&self.user, &self.password)
    }

    /// A raw connection as the admin user (for `ACL SETUSER`), not through the backend.
    #[cfg(feature = "tls")]
    pub(crate) async fn admin(&self) -> MultiplexedConnection {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |name: &str| std::fs::read(self.dir.join(name)).expect("secure file");
        let url = format!(
            "rediss://{}:{}@127.0.0.1:{}/0",
            self.user, self.password, self.port
        );
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read("client.pem"),
                client_key: read("client-key.pem"),
            }),
            root_cert: Some(read("ca.pem")),
        };
        redis::Client::build_with_tls(url, certificates)
            .expect("TLS client")
            .get_multiplexed_async_connection()
            .await
            .expect("the secure Redis server accepts its admin user")
    }
}

/// Everything an error shows: Display and Debug of it and of every source.
pub(crate) fn everything_shown(err: &lockcore::Error) -> String {
    let mut shown = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        shown.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    shown
}

/// One attempt for `request` that must be granted.
pub(crate) async fn take(backend: &dyn LockBackend, request: &AcquireRequest) -> Lease {
    match backend.acquire(request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {}", holder.owner()),
    }
}

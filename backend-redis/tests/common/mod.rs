//! Helpers shared by this crate's integration tests: settings, raw admin connections,
//! fault proxies, private redis-server processes and server-side command counts.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Identity, LockName};
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

/// A redis-server process of this test's own, on a free port, killed on drop. Safe to stall
/// with `SIGSTOP` or flush, unlike the shared servers.
pub(crate) struct PrivateRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
    tls: bool,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl PrivateRedis {
    /// Starts the server and waits until it answers `PING`.
    pub(crate) async fn start() -> PrivateRedis {
        Self::launch(false, &[]).await
    }

    /// Starts a plain server with extra `--option value` arguments (later ones win).
    pub(crate) async fn start_with(extra: &[&str]) -> PrivateRedis {
        Self::launch(false, extra).await
    }

    /// Starts a TLS-only server with a fresh self-signed certificate (connect with
    /// `#insecure`) and waits until it answers `PING`.
    pub(crate) async fn start_tls() -> PrivateRedis {
        Self::launch(true, &[]).await
    }

    async fn launch(tls: bool, extra: &[&str]) -> PrivateRedis {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("anylock-redis-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        if tls {
            self_signed_certificate(&dir);
        }
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let child = spawn(port, &dir, tls, &extra);
        let server = PrivateRedis {
            child,
            port,
            dir,
            tls,
            extra,
        };
        server.wait_ready().await;
        server
    }

    /// Kills the process with `SIGKILL` (by its PID): nothing is saved on the way out.
    pub(crate) fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port, directory and arguments, so it loads
    /// whatever `dump.rdb` (or append-only file) the directory holds.
    pub(crate) async fn restart(&mut self) {
        self.crash();
        self.child = spawn(self.port, &self.dir, self.tls, &self.extra);
        self.wait_ready().await;
    }

    /// The process id, for tests that signal the server themselves.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port the server listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// Spawns `redis-server` without automatic snapshots or append-only file (an explicit
/// `SAVE` still writes `dump.rdb` into `dir`), then `extra`.
fn spawn(port: u16, dir: &std::path::Path, tls: bool, extra: &[String]) -> Child {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .current_dir(dir);
    if tls {
        command
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem"])
            .args(["--tls-ca-cert-file", "cert.pem", "--tls-auth-clients", "no"]);
    } else {
        command.args(["--port", &port.to_string()]);
    }
    command
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/servers start installs it)")
}

impl PrivateRedis {
    async fn wait_ready(&self) {
        let client = redis::Client::open(self.url()).expect("valid URL");
        for _ in 0..200 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("private redis-server on port {} never answered", self.port);
    }

    /// `redis://127.0.0.1:<port>/0`, or `rediss://…#insecure` for a TLS server.
    pub(crate) fn url(&self) -> String {
        match self.tls {
            true => format!("rediss://127.0.0.1:{}/0#insecure", self.port),
            false => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// Stalls the process (`SIGSTOP`): connections stay open, nothing is answered.
    pub(crate) fn stall(&self) {
        self.signal("-STOP");
    }

    /// Resumes a stalled process (`SIGCONT`).
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }
}

/// `cert.pem` and `key.pem` (self-signed, CN=localhost, one day) in `dir`.
fn self_signed_certificate(dir: &std::path::Path) {
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args([
            "-subj",
            "/CN=localhost",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed for the TLS test");
    assert!(status.success(), "openssl could not make a certificate");
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        // SIGKILL works on a stopped process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

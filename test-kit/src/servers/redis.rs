//! A private `redis-server` without automatic persistence (an explicit `SAVE` still writes
//! a snapshot, which the next start loads), crashed, restarted, stalled and stopped by PID.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

use super::process::{Reaper, port_or_free, scratch_dir, signal};

/// How a [`Redis`] is started; see [`Redis::options`].
#[derive(Debug, Default)]
pub struct RedisOptions {
    port: Option<u16>,
    dir: Option<PathBuf>,
    tls: bool,
    extra: Vec<String>,
    reaper: Option<Arc<Reaper>>,
}

impl RedisOptions {
    /// A fixed port (checked to be free) instead of the OS's pick.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// The server's directory (kept on drop) instead of a fresh temporary one (removed).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// TLS only, with a fresh self-signed certificate (connect with `#insecure`).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Extra `--option value` arguments, after the defaults (later ones win).
    pub fn args(mut self, extra: &[&str]) -> Self {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Registers the process with `reaper`, which kills it if this process dies first.
    pub fn reaper(mut self, reaper: Arc<Reaper>) -> Self {
        self.reaper = Some(reaper);
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Errors
    /// When the port is taken, `redis-server` (or `openssl`, for TLS) is missing, or the
    /// server never answers.
    pub async fn start(self) -> Result<Redis, String> {
        let port = port_or_free(self.port)?;
        let (dir, owned) = match self.dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                (dir, false)
            }
            None => (scratch_dir("anylock-redis-test")?, true),
        };
        if self.tls {
            self_signed_certificate(&dir)?;
        }
        let mut server = Redis {
            child: None,
            port,
            dir,
            owned,
            tls: self.tls,
            extra: self.extra,
            reaper: self.reaper,
        };
        server.spawn().await?;
        Ok(server)
    }
}

/// A redis-server process of this test's own, killed (by PID) on drop. Safe to stall with
/// `SIGSTOP`, crash or flush, unlike the shared servers.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// Whether `dir` is ours to remove on drop.
    owned: bool,
    tls: bool,
    extra: Vec<String>,
    reaper: Option<Arc<Reaper>>,
}

impl Redis {
    /// Options for a server that is not the plain default.
    pub fn options() -> RedisOptions {
        RedisOptions::default()
    }

    /// Starts a plain server on a free port and waits until it answers `PING`.
    ///
    /// # Panics
    /// When it cannot start.
    pub async fn start() -> Redis {
        Self::options()
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a plain server with extra `--option value` arguments (later ones win).
    ///
    /// # Panics
    /// When it cannot start.
    pub async fn start_with(extra: &[&str]) -> Redis {
        Self::options()
            .args(extra)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a TLS-only server with a fresh self-signed certificate (connect with
    /// `#insecure`) and waits until it answers `PING`.
    ///
    /// # Panics
    /// When it cannot start.
    pub async fn start_tls() -> Redis {
        Self::options()
            .tls()
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `redis://127.0.0.1:<port>/0`, or `rediss://…#insecure` for a TLS server.
    pub fn url(&self) -> String {
        match self.tls {
            true => format!("rediss://127.0.0.1:{}/0#insecure", self.port),
            false => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The process id, for tests that signal the server themselves.
    ///
    /// # Panics
    /// After [`crash`](Self::crash), until the next restart.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server is running").id()
    }

    /// Kills the process with `SIGKILL` (by its PID): nothing is saved on the way out.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL works on a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(reaper) = &self.reaper {
            reaper.untrack(&self.key());
        }
    }

    /// Starts the server again on the same port, directory and arguments, so it loads
    /// whatever `dump.rdb` (or append-only file) the directory holds.
    ///
    /// # Panics
    /// When it does not come back.
    pub async fn restart(&mut self) {
        self.try_restart().await.unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`restart`](Self::restart), failing with a message instead of panicking.
    ///
    /// # Errors
    /// When it cannot start or never answers within 10 s.
    pub async fn try_restart(&mut self) -> Result<(), String> {
        self.crash();
        self.spawn().await
    }

    /// Stalls the process (`SIGSTOP`): connections stay open, nothing is answered.
    pub fn stall(&self) {
        signal(self.pid(), Signal::SIGSTOP);
    }

    /// Resumes a stalled process (`SIGCONT`).
    pub fn resume(&self) {
        signal(self.pid(), Signal::SIGCONT);
    }

    /// `SAVE`: writes an RDB snapshot to [`snapshot_path`](Self::snapshot_path), which the
    /// next restart loads.
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer `+OK` within 10 s.
    pub async fn save(&self) -> Result<(), String> {
        let attempt = async {
            let mut stream = TcpStream::connect(self.addr()).await.ok()?;
            stream.write_all(b"SAVE\r\n").await.ok()?;
            let mut buf = [0u8; 5];
            stream.read_exact(&mut buf).await.ok()?;
            Some(buf)
        };
        match timeout(Duration::from_secs(10), attempt).await {
            Ok(Some(buf)) if &buf == b"+OK\r\n" => Ok(()),
            Ok(Some(buf)) => Err(format!(
                "SAVE on port {}: {:?}",
                self.port,
                String::from_utf8_lossy(&buf)
            )),
            _ => Err(format!("SAVE on port {}: no answer", self.port)),
        }
    }

    /// Where `SAVE` writes the snapshot.
    pub fn snapshot_path(&self) -> PathBuf {
        self.dir.join("dump.rdb")
    }

    /// Spawns `redis-server` without automatic snapshots or append-only file (an
    /// explicit `SAVE` still writes `dump.rdb` into the directory), then the extra
    /// arguments, and waits until it answers.
    async fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.join("redis.log"))
            .map_err(|e| format!("redis log: {e}"))?;
        let mut command = Command::new("redis-server");
        command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .current_dir(&self.dir);
        if self.tls {
            command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(["--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem"])
                .args(["--tls-ca-cert-file", "cert.pem", "--tls-auth-clients", "no"]);
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        let child = command
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} (install it with scripts/servers install)"))?;
        if let Some(reaper) = &self.reaper {
            reaper.track(&self.key(), child.id(), "redis-server");
        }
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping().await {
                return Ok(());
            }
            sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "private redis-server on port {} never answered PING",
            self.port
        ))
    }

    async fn ping(&self) -> bool {
        if self.tls {
            // No TLS client here: redis-cli speaks it.
            let port = self.port.to_string();
            let out = tokio::process::Command::new("redis-cli")
                .args([
                    "--tls",
                    "--insecure",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "PING",
                ])
                .stdin(Stdio::null())
                .output();
            return matches!(
                timeout(Duration::from_secs(2), out).await,
                Ok(Ok(out)) if out.status.success() && out.stdout.starts_with(b"PONG")
            );
        }
        let attempt = async {
            let mut stream = TcpStream::connect(self.addr()).await.ok()?;
            stream.write_all(b"PING\r\n").await.ok()?;
            let mut buf = [0u8; 7];
            stream.read_exact(&mut buf).await.ok()?;
            Some(&buf == b"+PONG\r\n")
        };
        matches!(
            timeout(Duration::from_millis(500), attempt).await,
            Ok(Some(true))
        )
    }

    fn key(&self) -> String {
        format!("redis-{}", self.port)
    }
}

/// `cert.pem` and `key.pem` (self-signed, CN=localhost, one day) in `dir`.
fn self_signed_certificate(dir: &Path) -> Result<(), String> {
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
        .map_err(|e| format!("openssl must be installed for a TLS server: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err("openssl could not make a certificate".into()),
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.crash();
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

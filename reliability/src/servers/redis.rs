//! A private `redis-server` without automatic persistence (an explicit `SAVE` still writes
//! a snapshot, which the next start loads), killed and restarted by PID.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

use super::process::{Reaper, ensure_free, signal, wait_gone};

/// One redis-server process of this run.
#[derive(Debug)]
pub struct RedisNode {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisNode {
    /// Starts a node on `port` and waits until it answers `PING`.
    ///
    /// # Errors
    /// When the port is taken, `redis-server` is missing, or it never answers.
    pub async fn start(port: u16, reaper: &Reaper) -> Result<RedisNode, String> {
        ensure_free(port)?;
        let dir = reaper.dir().join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut node = RedisNode {
            port,
            dir,
            child: None,
        };
        node.spawn(reaper).await?;
        Ok(node)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Kills the server with `SIGKILL` (a crash: everything in memory is gone).
    pub async fn kill(&mut self, reaper: &Reaper) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                signal(pid, Signal::SIGKILL);
                wait_gone(pid, Duration::from_secs(10)).await;
            }
            let _ = child.wait().await;
        }
        reaper.untrack(&self.key());
    }

    /// Starts the server (again) on the same port and waits until it answers.
    ///
    /// # Errors
    /// When it cannot start or never answers within 10 s.
    pub async fn spawn(&mut self, reaper: &Reaper) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.join("redis.log"))
            .map_err(|e| format!("redis log: {e}"))?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("redis-server: {e} (install it with scripts/servers install)"))?;
        if let Some(pid) = child.id() {
            reaper.track(&self.key(), pid, "redis-server");
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
            "redis-server on port {} never answered PING",
            self.port
        ))
    }

    /// `SAVE`: writes an RDB snapshot to [`snapshot_path`](Self::snapshot_path), which the
    /// next [`spawn`](Self::spawn) loads.
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

    async fn ping(&self) -> bool {
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

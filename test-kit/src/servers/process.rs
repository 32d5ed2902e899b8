//! Process helpers: signals by PID, port checks, scratch directories, and watchdogs that
//! stop what a test process started once it exits, however it exits.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::time::{Instant, sleep, timeout};

/// Sends `signal` to `pid` (never to a process group, never by name).
pub fn signal(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), signal);
    }
}

/// Whether `pid` names a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits until `pid` is gone (or a zombie), up to `limit`.
pub async fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A port on loopback that nothing listens on (the OS's pick).
///
/// # Panics
/// When no port can be bound.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A fresh directory `<temp>/<prefix>-<pid>-<n>` for one server of this test process.
///
/// # Errors
/// When it cannot be created.
pub fn scratch_dir(prefix: &str) -> Result<PathBuf, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// `port` if it is free, or a free port when `None`.
///
/// # Errors
/// When `port` is taken.
pub fn port_or_free(port: Option<u16>) -> Result<u16, String> {
    match port {
        Some(port) => ensure_free(port).map(|()| port),
        None => Ok(free_port()),
    }
}

/// Fails with the holder's `ss` line when `port` on loopback is taken.
pub fn ensure_free(port: u16) -> Result<(), String> {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "port {port} is in use ({e}): {}",
            std::process::Command::new("ss")
                .args(["-ltnpH", &format!("sport = :{port}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        )),
    }
}

/// Waits until something accepts TCP connections at `addr`.
pub async fn wait_listening(addr: SocketAddr, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Ok(_)) = timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing listens on {addr} after {limit:?}"));
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// One HTTP/1.0 request on loopback; returns the status code and body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let call = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = timeout(Duration::from_secs(2), call)
        .await
        .map_err(|_| format!("{method} {addr}{path}: timed out"))?
        .map_err(|e| format!("{method} {addr}{path}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{method} {addr}{path}: malformed response"))?;
    Ok((status, body.to_owned()))
}

/// Runs a command to completion; fails with its output.
pub async fn run(command: &mut Command) -> Result<String, String> {
    let out = command.stdin(Stdio::null()).output().await;
    checked(command, out)
}

/// [`run`], blocking.
pub fn run_blocking(command: &mut std::process::Command) -> Result<String, String> {
    let out = command.stdin(Stdio::null()).output();
    checked(command, out)
}

/// A finished command's stdout, or an error with its output.
fn checked(
    command: &dyn std::fmt::Debug,
    out: std::io::Result<std::process::Output>,
) -> Result<String, String> {
    let out = out.map_err(|e| format!("{command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the shell command `cleanup` once this process has exited, however it exits (a
/// detached watchdog polls for it).
///
/// # Errors
/// When `setsid` cannot start the watchdog.
pub fn on_exit(cleanup: &str) -> Result<(), String> {
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; {cleanup}",
        me = std::process::id()
    );
    // --fork: setsid returns at once, and the watchdog runs on in its own session.
    let started = std::process::Command::new("setsid")
        .args(["--fork", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("start a cleanup watchdog: {e}"))?;
    match started.success() {
        true => Ok(()),
        false => Err(format!("setsid failed: {started}")),
    }
}

/// Whether we run as root (PostgreSQL then runs as `postgres`).
pub fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The run's scratch directory plus a detached watchdog: once this process exits, the
/// watchdog resumes and kills every PID registered with [`Reaper::track`] (checking each
/// one's command name first, so a reused PID is never signalled), runs the registered
/// cleanup scripts, and removes the directory.
#[derive(Debug)]
pub struct Reaper {
    dir: PathBuf,
}

impl Reaper {
    /// Creates the directory and starts the watchdog.
    ///
    /// # Errors
    /// When the directory cannot be created or `setsid` cannot start.
    pub fn start() -> Result<Reaper, String> {
        let dir = std::env::temp_dir().join(format!("anylock-reliability-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pids")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let d = dir.display();
        on_exit(&format!(
            "for f in {d}/pids/*; do [ -f \"$f\" ] || continue; read pid name < \"$f\"; \
             if [ \"$(cat /proc/$pid/comm 2>/dev/null)\" = \"$name\" ]; then kill -CONT $pid; kill -KILL $pid; fi; done; \
             for f in {d}/*.cleanup; do [ -f \"$f\" ] && sh \"$f\"; done; sleep 1; rm -rf {d}"
        ))?;
        Ok(Reaper { dir })
    }

    /// The scratch directory (removed by the watchdog).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Registers `pid` (whose `/proc/PID/comm` is `command`) under `key`.
    pub fn track(&self, key: &str, pid: u32, command: &str) {
        let comm: String = command.chars().take(15).collect();
        let _ = std::fs::write(self.dir.join("pids").join(key), format!("{pid} {comm}\n"));
    }

    /// Forgets `key` (its process has been stopped).
    pub fn untrack(&self, key: &str) {
        let _ = std::fs::remove_file(self.dir.join("pids").join(key));
    }

    /// Registers a shell script the watchdog runs at exit.
    pub fn on_exit(&self, key: &str, script: &str) {
        let _ = std::fs::write(self.dir.join(format!("{key}.cleanup")), script);
    }
}

//! Helpers shared by the end-to-end tests: a scratch directory and backend per test, and
//! ways to watch processes.

#![allow(dead_code, unused_macros)]

/// Stamps one test per backend for each scenario `fn(&Scene)`: the embedded backend always,
/// PostgreSQL and Redis where their servers are configured (a failure in CI without them).
macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $scenario() { super::$scenario(&super::Scene::local()); } )*
        }
        mod postgres {
            $( #[test] fn $scenario() {
                if let Some(scene) = super::Scene::postgres() { super::$scenario(&scene); }
            } )*
        }
        mod redis {
            $( #[test] fn $scenario() {
                if let Some(scene) = super::Scene::redis() { super::$scenario(&scene); }
            } )*
        }
    };
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_anylock");

/// Stamps one test per backend for each scenario, like [`on_every_backend!`], plus etcd
/// and GCS (the GCS test server, in-process): for behaviour that each backend's storage
/// carries (notes, listing).
macro_rules! on_all_five_backends {
    ($($scenario:ident),* $(,)?) => {
        on_every_backend!($($scenario),*);
        mod etcd {
            $( #[test] fn $scenario() {
                if let Some(scene) = super::Scene::etcd() { super::$scenario(&scene); }
            } )*
        }
        mod gcs {
            $( #[test] fn $scenario() { super::$scenario(&super::Scene::gcs()); } )*
        }
    };
}

/// A scratch directory and a backend URL for one test.
pub(crate) struct Scene {
    pub(crate) dir: PathBuf,
    pub(crate) backend: String,
    /// A server the scene runs in-process (the GCS test server and its runtime).
    _server: Option<Box<dyn std::any::Any>>,
}

impl Scene {
    pub(crate) fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("anylock-cli-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    pub(crate) fn local() -> Self {
        let dir = Self::scratch();
        let backend = format!("local:{}/locks.sqlite3", dir.display());
        Self::new(dir, backend)
    }

    fn new(dir: PathBuf, backend: String) -> Self {
        Self {
            dir,
            backend,
            _server: None,
        }
    }

    /// The etcd cluster from the harness, under a fresh key prefix; `None` (skip) outside
    /// CI without it.
    pub(crate) fn etcd() -> Option<Self> {
        let endpoints = test_kit::env::require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd")?;
        let hosts: Vec<&str> = endpoints
            .split(',')
            .map(|e| e.trim().trim_start_matches("http://"))
            .collect();
        let prefix = format!("cli-{:016x}", rand::random::<u64>());
        let backend = format!("etcd://{}/{prefix}", hosts.join(","));
        Some(Self::new(Self::scratch(), backend))
    }

    /// A GCS test server of the scene's own, with a bucket.
    pub(crate) fn gcs() -> Self {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let server = runtime.block_on(gcs_test_server::GcsTestServer::start());
        assert!(server.create_bucket("cli-locks"));
        let backend = format!("gs://cli-locks/?endpoint={}&auth=none", server.url());
        let mut scene = Self::new(Self::scratch(), backend);
        scene._server = Some(Box::new((server, runtime)));
        scene
    }

    /// Redis from the harness, under a fresh key prefix; `None` (skip) outside CI without it.
    pub(crate) fn redis() -> Option<Self> {
        let url = test_kit::env::require("ANYLOCK_TEST_REDIS_URL", "Redis")?;
        let prefix = format!("cli-{:016x}", rand::random::<u64>());
        let separator = if url.contains('?') { '&' } else { '?' };
        let backend = format!("{url}{separator}prefix={prefix}");
        Some(Self::new(Self::scratch(), backend))
    }

    /// PostgreSQL from the harness, in a fresh schema; `None` (skip) outside CI without it.
    pub(crate) fn postgres() -> Option<Self> {
        let url = test_kit::env::require("ANYLOCK_TEST_POSTGRES_URL", "PostgreSQL")?;
        let schema = format!("cli_{:016x}", rand::random::<u64>());
        let separator = if url.contains('?') { '&' } else { '?' };
        let backend = format!("{url}{separator}schema={schema}");
        Some(Self::new(Self::scratch(), backend))
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("ANYLOCK_BACKEND", &self.backend)
            // For commands that call anylock again (`-c '"$ANYLOCK_BIN" status job'`).
            .env("ANYLOCK_BIN", BIN)
            .env_remove("ANYLOCK_CONFIG")
            .env("XDG_CONFIG_HOME", &self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        command
    }

    pub(crate) fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run anylock")
    }

    pub(crate) fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn anylock")
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn code(output: &Output) -> i32 {
    output.status.code().expect("exited normally")
}

pub(crate) fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until `check` holds, failing after `limit`.
pub(crate) fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn wait_child(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("anylock did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Dead: gone, or a zombie nobody reaped (init does not reap on this machine).
pub(crate) fn process_dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The one-letter state of process `pid` in /proc (`R`, `S`, `T`, `Z`...), `None` if gone.
pub(crate) fn process_state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Stopped by a signal (`T`), not traced.
pub(crate) fn process_stopped(pid: &str) -> bool {
    process_state(pid) == Some('T')
}

/// Runs no code: stopped, or (dash forks with vfork) waiting in `D` state for a vfork
/// child that was stopped before it could exec.
pub(crate) fn process_halted(pid: &str) -> bool {
    match process_state(pid) {
        Some('T') => true,
        Some('D') => read(Path::new(&format!("/proc/{pid}/task/{pid}/children")))
            .split_whitespace()
            .any(process_stopped),
        _ => false,
    }
}

/// Sends `signal` to process `pid`.
pub(crate) fn send(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("signal anylock");
}

/// Process ids written one per line to `path`.
pub(crate) fn pids(path: &Path) -> Vec<String> {
    read(path).lines().map(str::to_owned).collect()
}

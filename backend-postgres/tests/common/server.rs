//! A private PostgreSQL instance for tests that restart the server or change its settings.
//!
//! The shared server from `scripts/servers` must never be restarted (other tests use it).
//! This one lives in its own temporary directory on a free port, is started like
//! `scripts/servers` starts the shared one (initdb and pg_ctl as the `postgres` user when
//! running as root), and is stopped by a watchdog process as soon as the test process
//! exits, however it exits. It keeps `synchronous_commit=on` (a committed grant is in the
//! WAL before the client hears of it) and preloads `pg_stat_statements` so tests can
//! count statements.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running private server.
#[derive(Debug)]
pub(crate) struct PrivateServer {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl PrivateServer {
    /// Creates a data directory and starts the server (blocking: call from
    /// `spawn_blocking`).
    pub(crate) fn start() -> PrivateServer {
        let bin = pg_bin();
        let root = temp_root();
        let port = free_port();
        let server = PrivateServer { root, bin, port };
        server.initdb();
        server.launch();
        server.watchdog();
        server.psql("postgres", "CREATE DATABASE anylock_private");
        server
    }

    /// `postgres://postgres@127.0.0.1:<port>/anylock_private`.
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/anylock_private",
            self.port
        )
    }

    /// `127.0.0.1:<port>`.
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The postmaster's PID, from `postmaster.pid`.
    pub(crate) fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .expect("postmaster.pid of the private server");
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a PID in postmaster.pid")
    }

    /// Crashes the server (SIGQUIT to the postmaster by PID: immediate shutdown, no
    /// checkpoint, WAL replay on start), then starts it again on the same data directory.
    /// Returns how long the server was down.
    pub(crate) fn restart(&self) -> Duration {
        self.restart_after(Duration::ZERO)
    }

    /// As [`restart`](Self::restart), staying down at least `outage` before starting.
    pub(crate) fn restart_after(&self, outage: Duration) -> Duration {
        let pid = self.pid();
        let down = Instant::now();
        run(Command::new("kill").args(["-QUIT", &pid.to_string()]));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < deadline, "postmaster {pid} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(outage.saturating_sub(down.elapsed()));
        self.launch();
        down.elapsed()
    }

    /// Runs one SQL command with psql as the superuser.
    pub(crate) fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .as_postgres(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    fn initdb(&self) {
        run(self.as_postgres(self.bin.join("initdb")).args([
            "-D",
            &self.data().to_string_lossy(),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]));
    }

    fn launch(&self) {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c max_connections=100 \
             -c shared_preload_libraries=pg_stat_statements",
            self.port,
            self.root.display()
        );
        let log = self.root.join("postgres.log");
        run(self.as_postgres(self.bin.join("pg_ctl")).args([
            "-D",
            &self.data().to_string_lossy(),
            "-l",
            &log.to_string_lossy(),
            "-w",
            "-t",
            "60",
            "-o",
            &options,
            "start",
        ]));
    }

    /// Stops the server and removes its directory once this test process is gone.
    fn watchdog(&self) {
        on_exit(&format!(
            "kill -QUIT $(head -n 1 {data}/postmaster.pid) 2>/dev/null; sleep 2; rm -rf {root}",
            data = self.data().display(),
            root = self.root.display(),
        ));
    }

    /// `cmd` as the postgres user when we are root (initdb and postgres refuse root).
    fn as_postgres(&self, program: PathBuf) -> Command {
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }
}

/// Runs the shell command `cleanup` once this test process has exited, however it exits
/// (a detached watchdog polls for it).
pub(crate) fn on_exit(cleanup: &str) {
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; {cleanup}",
        me = std::process::id()
    );
    // --fork: setsid returns at once, and the watchdog runs on in its own session.
    let started = Command::new("setsid")
        .args(["--fork", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("start a cleanup watchdog");
    assert!(started.success(), "setsid failed: {started}");
}

pub(crate) fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("id -u");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The newest installed PostgreSQL's bin dir (`ANYLOCK_PG_BIN` overrides), as in
/// `scripts/servers`.
pub(crate) fn pg_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("ANYLOCK_PG_BIN") {
        return PathBuf::from(bin);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL under /usr/lib/postgresql (run scripts/servers start)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
        .1
}

/// A fresh directory under /tmp the postgres user can use.
fn temp_root() -> PathBuf {
    let random: u64 = rand::random();
    let root = PathBuf::from(format!("/tmp/anylock-pg-private-{random:016x}"));
    std::fs::create_dir_all(&root).expect("create the private server's directory");
    if is_root() {
        run(Command::new("chown").args(["postgres:postgres", &root.to_string_lossy()]));
    }
    root
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

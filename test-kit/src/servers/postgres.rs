//! A private PostgreSQL server for tests that crash or restart the server or change its
//! settings (the shared server from `scripts/servers` must never be restarted).
//!
//! It is started like `scripts/servers` starts the shared one (initdb and pg_ctl as the
//! `postgres` user when running as root), keeps `synchronous_commit=on` (a committed grant
//! is in the WAL before the client hears of it), and is stopped (`SIGQUIT` to the
//! postmaster, by PID) by a watchdog as soon as the test process exits, however it exits.
//! Every call blocks: from async code, use `spawn_blocking`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{Reaper, alive, is_root, on_exit, port_or_free, run_blocking as run, signal};

/// How a [`Postgres`] is started; see [`Postgres::options`].
#[derive(Debug)]
pub struct PostgresOptions {
    port: Option<u16>,
    dir: Option<PathBuf>,
    database: String,
    stat_statements: bool,
    wait_reaped: bool,
    reaper: Option<Arc<Reaper>>,
}

impl PostgresOptions {
    /// A fixed port (checked to be free) instead of the OS's pick.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// The server's directory instead of a fresh one under `/tmp`.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The database created for the clients (default `anylock_private`).
    pub fn database(mut self, name: &str) -> Self {
        name.clone_into(&mut self.database);
        self
    }

    /// Whether `pg_stat_statements` is preloaded so tests can count statements (default on).
    pub fn stat_statements(mut self, on: bool) -> Self {
        self.stat_statements = on;
        self
    }

    /// Whether a crash restart waits until the old postmaster is reaped, not only exited
    /// (default on: the backend's tests rely on the longer outage; the reliability harness
    /// restarts as soon as the postmaster exited).
    pub fn wait_reaped(mut self, on: bool) -> Self {
        self.wait_reaped = on;
        self
    }

    /// Leaves the stop at exit to `reaper` (and the directory to it) instead of a watchdog
    /// of the server's own.
    pub fn reaper(mut self, reaper: Arc<Reaper>) -> Self {
        self.reaper = Some(reaper);
        self
    }

    /// Creates a data directory, starts the server, creates the database.
    ///
    /// # Errors
    /// When the port is taken, PostgreSQL is not installed, or a step fails.
    pub fn start(self) -> Result<Postgres, String> {
        let port = port_or_free(self.port)?;
        let root = self.dir.unwrap_or_else(|| {
            let random: u64 = rand::random();
            PathBuf::from(format!("/tmp/anylock-pg-private-{random:016x}"))
        });
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        if is_root() {
            run(Command::new("chown").args(["postgres:postgres", &root.to_string_lossy()]))?;
        }
        let server = Postgres {
            bin: pg_bin()?,
            root,
            port,
            database: self.database,
            stat_statements: self.stat_statements,
            wait_reaped: self.wait_reaped,
        };
        let data = server.data();
        match &self.reaper {
            Some(reaper) => reaper.on_exit(
                "postgres",
                &format!(
                    "kill -QUIT $(head -n 1 {}/postmaster.pid) 2>/dev/null\n",
                    data.display()
                ),
            ),
            None => on_exit(&format!(
                "kill -QUIT $(head -n 1 {data}/postmaster.pid) 2>/dev/null; sleep 2; rm -rf {root}",
                data = data.display(),
                root = server.root.display(),
            ))?,
        }
        server.initdb()?;
        server.launch()?;
        server.try_psql("postgres", &format!("CREATE DATABASE {}", server.database))?;
        Ok(server)
    }
}

/// A running private server.
#[derive(Debug)]
pub struct Postgres {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    database: String,
    stat_statements: bool,
    wait_reaped: bool,
}

impl Postgres {
    /// Options for a server that is not the default.
    pub fn options() -> PostgresOptions {
        PostgresOptions {
            port: None,
            dir: None,
            database: "anylock_private".to_owned(),
            stat_statements: true,
            wait_reaped: true,
            reaper: None,
        }
    }

    /// Starts a server on a free port with database `anylock_private` and
    /// `pg_stat_statements` preloaded.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start() -> Postgres {
        Self::options().start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>?sslmode=disable` (this server has
    /// no TLS; without `sslmode`, anylock would insist on verifying it).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}?sslmode=disable",
            self.port, self.database
        )
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's PID, from `postmaster.pid`.
    ///
    /// # Panics
    /// When the server is not running.
    pub fn pid(&self) -> u32 {
        self.try_pid().unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_pid(&self) -> Result<u32, String> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .map_err(|e| format!("postmaster.pid of the private server: {e}"))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| "no PID in postmaster.pid".to_owned())
    }

    /// Crashes the server (`SIGQUIT` to the postmaster by PID: immediate shutdown, no
    /// checkpoint, WAL replay on start), then starts it again on the same data directory.
    /// Returns how long the server was down.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&self) -> Duration {
        self.restart_after(Duration::ZERO)
    }

    /// As [`restart`](Self::restart), staying down at least `outage` before starting.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart_after(&self, outage: Duration) -> Duration {
        self.try_restart_after(outage)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`restart_after`](Self::restart_after), failing with a message instead of panicking.
    ///
    /// # Errors
    /// When the postmaster does not exit or the server does not come back.
    pub fn try_restart_after(&self, outage: Duration) -> Result<Duration, String> {
        let pid = self.try_pid()?;
        let down = Instant::now();
        signal(pid, Signal::SIGQUIT);
        if !self.wait_gone(pid, Duration::from_secs(30)) {
            return Err(format!("postmaster {pid} did not exit"));
        }
        std::thread::sleep(outage.saturating_sub(down.elapsed()));
        self.launch()?;
        Ok(down.elapsed())
    }

    /// Stops the server (immediate shutdown), waiting up to 30 s for it to exit.
    pub fn stop(&self) {
        if let Ok(pid) = self.try_pid() {
            signal(pid, Signal::SIGQUIT);
            self.wait_gone(pid, Duration::from_secs(30));
        }
    }

    /// Runs one SQL command with psql as the superuser; its output, trimmed.
    ///
    /// # Panics
    /// When psql fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        self.try_psql(db, sql)
            .unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }

    fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = run(self
            .as_postgres("psql")
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-c", sql]))?;
        Ok(out.trim().to_owned())
    }

    /// Waits (blocking) until `pid` has exited (with `wait_reaped`: until its `/proc` entry,
    /// zombie included, is gone), up to `limit`.
    fn wait_gone(&self, pid: u32, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let running = |pid| match self.wait_reaped {
            true => Path::new(&format!("/proc/{pid}")).exists(),
            false => alive(pid),
        };
        while running(pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    fn initdb(&self) -> Result<(), String> {
        run(self
            .as_postgres("initdb")
            .args(["-D", &self.data().to_string_lossy()])
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C"))
        .map(drop)
    }

    fn launch(&self) -> Result<(), String> {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c max_connections=100",
            self.port,
            self.root.display()
        );
        if self.stat_statements {
            options.push_str(" -c shared_preload_libraries=pg_stat_statements");
        }
        let log = self.root.join("postgres.log");
        run(self
            .as_postgres("pg_ctl")
            .args(["-D", &self.data().to_string_lossy()])
            .args(["-l", &log.to_string_lossy()])
            .args(["-w", "-t", "60", "-o", &options, "start"]))
        .map(drop)
    }

    /// `program` as the postgres user when we are root (initdb and postgres refuse root).
    fn as_postgres(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }
}

/// The newest `/usr/lib/postgresql/*/bin` (`ANYLOCK_PG_BIN` overrides), as in
/// `scripts/servers`.
///
/// # Errors
/// When PostgreSQL is not installed.
pub fn pg_bin() -> Result<PathBuf, String> {
    if let Ok(bin) = std::env::var("ANYLOCK_PG_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let missing = || {
        "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; run scripts/servers install)".to_owned()
    };
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(Path::new("/usr/lib/postgresql"))
        .map_err(|_| missing())?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(missing)
}

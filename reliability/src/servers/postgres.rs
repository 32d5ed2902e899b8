//! A private PostgreSQL server, started as `scripts/servers` and the backend's restart
//! test start theirs (initdb and pg_ctl as the `postgres` user when we are root).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::time::Instant;

use super::process::{Reaper, ensure_free, is_root, run, signal, wait_gone};

/// The database the clients use.
pub const DATABASE: &str = "anylock_reliability";

/// One private PostgreSQL server.
#[derive(Debug)]
pub struct Postgres {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl Postgres {
    /// Initialises a data directory, starts the server on `port`, creates [`DATABASE`].
    ///
    /// # Errors
    /// When the port is taken, PostgreSQL is not installed, or a step fails.
    pub async fn start(port: u16, reaper: &Reaper) -> Result<Postgres, String> {
        ensure_free(port)?;
        let root = reaper.dir().join("postgres");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        if is_root() {
            run(Command::new("chown").args(["postgres:postgres", &root.to_string_lossy()])).await?;
        }
        let server = Postgres {
            bin: pg_bin()?,
            root,
            port,
        };
        let data = server.data();
        reaper.on_exit(
            "postgres",
            &format!(
                "kill -QUIT $(head -n 1 {}/postmaster.pid) 2>/dev/null\n",
                data.display()
            ),
        );
        server.initdb().await?;
        server.launch().await?;
        server
            .psql("postgres", &format!("CREATE DATABASE {DATABASE}"))
            .await?;
        Ok(server)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Crashes the server (`SIGQUIT` to the postmaster: no checkpoint, WAL replay on start),
    /// keeps it down for at least `outage`, and starts it again on the same data; returns
    /// how long it was down.
    ///
    /// # Errors
    /// When the postmaster does not exit or the server does not come back.
    pub async fn crash_restart(&self, outage: Duration) -> Result<Duration, String> {
        let pid = self.pid()?;
        let down = Instant::now();
        signal(pid, Signal::SIGQUIT);
        if !wait_gone(pid, Duration::from_secs(30)).await {
            return Err(format!("postmaster {pid} did not exit"));
        }
        tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
        self.launch().await?;
        Ok(down.elapsed())
    }

    /// Stops the server (immediate shutdown).
    pub async fn stop(&self) {
        if let Ok(pid) = self.pid() {
            signal(pid, Signal::SIGQUIT);
            wait_gone(pid, Duration::from_secs(30)).await;
        }
    }

    fn pid(&self) -> Result<u32, String> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .map_err(|e| format!("postmaster.pid: {e}"))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| "no PID in postmaster.pid".to_owned())
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    async fn initdb(&self) -> Result<(), String> {
        let data = self.data();
        let mut cmd = self.as_postgres("initdb");
        cmd.args([
            "-D",
            &data.to_string_lossy(),
            "-U",
            "postgres",
            "--auth=trust",
        ])
        .args(["--no-sync", "-E", "UTF8", "--locale=C"]);
        run(&mut cmd).await.map(drop)
    }

    async fn launch(&self) -> Result<(), String> {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c max_connections=100",
            self.port,
            self.root.display()
        );
        let (data, log) = (self.data(), self.root.join("postgres.log"));
        let mut cmd = self.as_postgres("pg_ctl");
        cmd.args(["-D", &data.to_string_lossy(), "-l", &log.to_string_lossy()])
            .args(["-w", "-t", "60", "-o", &options, "start"]);
        run(&mut cmd).await.map(drop)
    }

    async fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.as_postgres("psql");
        cmd.args([
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
        ]);
        run(&mut cmd).await
    }

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
fn pg_bin() -> Result<PathBuf, String> {
    if let Ok(bin) = std::env::var("ANYLOCK_PG_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let missing = || {
        "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; run scripts/servers install)".to_owned()
    };
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
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

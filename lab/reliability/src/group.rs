//! A group: one fenced register, client processes contending for one lock, semaphore or
//! election (three; four for permits), and a fault proxy on every link from a client to a
//! server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use test_kit::proxy::{Fault as LinkFault, FaultProxy};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::backends::Workload;
use crate::history::{Event, Op};
use crate::primitive::Primitive;
use crate::protocol::Outcome;
use crate::register::{Mode, RegisterServer};
use crate::servers::Lane;
use crate::stall::{Scope, StallLinks};
use test_kit::servers::process::{Reaper, signal};
use test_kit::suspend::MonotonicSkip;

/// One client's links, one fault proxy per server endpoint.
#[derive(Debug)]
pub struct Links {
    proxies: Vec<FaultProxy>,
    /// Relays in front of the proxies that can hold back one request (`slow-attempt`).
    pub stall: Option<StallLinks>,
}

impl Links {
    async fn new(upstreams: &[SocketAddr], stall: Option<Scope>) -> Result<Links, String> {
        let mut proxies = Vec::new();
        for upstream in upstreams {
            let proxy = FaultProxy::start(*upstream)
                .await
                .map_err(|e| format!("fault proxy to {upstream}: {e}"))?;
            proxies.push(proxy);
        }
        let mut links = Links {
            proxies,
            stall: None,
        };
        if let Some(scope) = stall {
            let relays = StallLinks::start(&links.proxy_addrs(), scope)
                .await
                .map_err(|e| format!("stall relay: {e}"))?;
            links.stall = Some(relays);
        }
        Ok(links)
    }

    fn proxy_addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(FaultProxy::local_addr).collect()
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.stall
            .as_ref()
            .map_or_else(|| self.proxy_addrs(), StallLinks::addrs)
    }

    /// Applies `fault` to every link.
    pub fn set_all(&self, fault: LinkFault) {
        for proxy in &self.proxies {
            proxy.set_fault(fault);
        }
    }

    /// Applies `fault` to the link to endpoint `index`.
    pub fn set(&self, index: usize, fault: LinkFault) {
        self.proxies[index].set_fault(fault);
    }

    async fn shutdown(self) {
        if let Some(stall) = self.stall {
            stall.shutdown();
        }
        for proxy in self.proxies {
            proxy.shutdown().await;
        }
    }
}

/// A running client process.
#[derive(Debug)]
pub struct ClientProc {
    /// The client's number (1-based).
    pub id: u32,
    pid: u32,
    child: Child,
    stdin: Mutex<ChildStdin>,
    /// Its monotonic clock's skip, when suspendable.
    pub skip: Option<MonotonicSkip>,
}

impl ClientProc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends one command line (`jump-back MS`, `stop`, ...).
    pub async fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().await;
        let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
        let _ = stdin.flush().await;
    }

    /// `SIGSTOP`.
    pub fn pause(&self) {
        signal(self.pid, Signal::SIGSTOP);
    }

    /// `SIGCONT`.
    pub fn resume(&self) {
        signal(self.pid, Signal::SIGCONT);
    }

    /// Resumes the client (it may be paused) and asks it to stop.
    async fn ask_to_stop(&self) {
        self.resume();
        self.send("stop").await;
    }

    /// Waits for the client to exit, killing it after `grace`. Returns a problem, if any.
    async fn reap(mut self, grace: Duration, reaper: &Reaper) -> Option<String> {
        let waited = timeout(grace, self.child.wait()).await;
        if waited.is_err() {
            signal(self.pid, Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        reaper.untrack(&format!("client-{}", self.pid));
        match waited {
            Err(_) => Some(format!("client {} did not stop within {grace:?}", self.id)),
            Ok(Ok(status)) if status.success() => None,
            Ok(other) => Some(format!("client {} exited with {other:?}", self.id)),
        }
    }
}

/// What every client of a group shares.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The `anylock-reliability` binary (clients run its `client` subcommand).
    pub exe: PathBuf,
    /// Where client logs go.
    pub log_dir: PathBuf,
    /// The lock, semaphore or election name.
    pub lock: String,
    /// What the clients hold during a section.
    pub primitive: Primitive,
    /// The N permit clients ask for (the checker's is `primitive.limit()`).
    pub permits: u32,
    /// Section timing.
    pub workload: Workload,
    /// Kleppmann's Redlock partition ("How to do distributed locking"): client 1 reaches
    /// nodes A, B, C; client 2 C, D, E.
    pub partition: bool,
    /// Each client in a PID namespace of its own (`Fault::PidNamespaces`).
    pub pid_namespaces: bool,
    /// Clients run with a monotonic clock a test can skip (`Fault::Suspend`).
    pub suspendable: bool,
    /// Relays that can hold back a request, in front of every link (`slow-attempt`).
    pub stall: Option<Scope>,
    /// The clients' attempt timeout (`LockOptions::with_attempt_timeout`), if not the TTL.
    pub attempt_timeout: Option<Duration>,
}

/// A register, its clients and their links.
#[derive(Debug)]
pub struct Group {
    /// Fenced or not.
    pub mode: Mode,
    /// The register.
    pub register: RegisterServer,
    /// Clients 1..=n (index = id - 1).
    pub clients: Vec<ClientProc>,
    /// Each client's links (index = id - 1).
    pub links: Vec<Links>,
}

impl Group {
    /// Starts the register, the proxies and the clients, and waits until every client is
    /// connected.
    ///
    /// # Errors
    /// When a client does not become ready within 40 s.
    pub async fn start(
        lane: &Lane,
        mode: Mode,
        spec: &GroupSpec,
        reaper: &Reaper,
    ) -> Result<Group, String> {
        let register = RegisterServer::start(mode)
            .await
            .map_err(|e| format!("register: {e}"))?;
        let mut group = Group {
            mode,
            register,
            clients: Vec::new(),
            links: Vec::new(),
        };
        for id in 1..=spec.primitive.clients() {
            let links = Links::new(&lane.upstreams(), spec.stall).await?;
            if spec.partition {
                partition(id, &links);
            }
            let url = lane.url(&links.addrs());
            group.links.push(links);
            let client = spawn(id, &url, group.register.addr(), mode, spec, reaper).await?;
            group.clients.push(client);
        }
        Ok(group)
    }

    /// Sections completed so far (every step written).
    pub fn completed(&self) -> u64 {
        completed(&self.register.history())
    }

    /// Stops the clients and proxies; returns the history and any problems.
    pub async fn stop(self, grace: Duration, reaper: &Reaper) -> (Vec<Event>, Vec<String>) {
        for client in &self.clients {
            client.ask_to_stop().await;
        }
        let mut problems = Vec::new();
        for client in self.clients {
            problems.extend(client.reap(grace, reaper).await);
        }
        for links in self.links {
            links.shutdown().await;
        }
        (self.register.history(), problems)
    }
}

/// Sections of `history` that ended `done`.
pub fn completed(history: &[Event]) -> u64 {
    let done = |e: &&Event| {
        matches!(
            e.op,
            Op::End {
                outcome: Outcome::Done
            }
        )
    };
    history.iter().filter(done).count() as u64
}

/// Kleppmann's partition ("How to do distributed locking"): client 1 cannot reach D and E,
/// client 2 cannot reach A and B.
fn partition(id: u32, links: &Links) {
    let cut: &[usize] = match id {
        1 => &[3, 4],
        2 => &[0, 1],
        _ => &[],
    };
    for index in cut {
        links.set(*index, LinkFault::Blackhole);
    }
}

async fn spawn(
    id: u32,
    url: &str,
    register: SocketAddr,
    mode: Mode,
    spec: &GroupSpec,
    reaper: &Reaper,
) -> Result<ClientProc, String> {
    let w = spec.workload;
    let log = log_file(&spec.log_dir, mode, id)?;
    let (mut command, comm) = client_command(spec);
    command.arg("client");
    let skip = spec.suspendable.then(|| {
        let library = MonotonicSkip::new(&spec.log_dir);
        library.another(spec.log_dir.join(format!("skip-{}-{id}", mode.as_str())))
    });
    if let Some(skip) = &skip {
        command.envs(skip.env());
    }
    if let Some(limit) = spec.attempt_timeout {
        command.args(["--attempt-timeout-ms", &limit.as_millis().to_string()]);
    }
    let mut child = command
        .args(["--url", url, "--register", &register.to_string()])
        .args(["--client", &id.to_string(), "--lock", &spec.lock])
        .args(["--primitive", spec.primitive.slug()])
        .args(["--permits", &spec.permits.to_string()])
        .args(["--ttl-ms", &w.ttl.as_millis().to_string()])
        .args(["--steps", &w.steps.to_string()])
        .args(["--step-ms", &w.step.as_millis().to_string()])
        .args(["--margin-ms", &w.margin.as_millis().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", spec.exe.display()))?;
    let pid = child.id().ok_or("client exited at once")?;
    reaper.track(&format!("client-{pid}"), pid, comm);
    let stdin = child.stdin.take().ok_or("client stdin")?;
    let stdout = child.stdout.take().ok_or("client stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = timeout(Duration::from_secs(40), lines.next_line()).await;
    if !matches!(&ready, Ok(Ok(Some(line))) if line == "ready") {
        return Err(format!(
            "client {id} ({mode:?}) did not become ready: {ready:?}; see {}",
            spec.log_dir.display()
        ));
    }
    // Keep draining stdout so the client never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(ClientProc {
        id,
        pid,
        child,
        stdin: Mutex::new(stdin),
        skip,
    })
}

/// The command that starts a client, and the name its pid shows in `/proc/PID/comm`.
///
/// In its own PID namespace, the client is `unshare`'s child, and the pid the harness
/// sees is `unshare`'s: `--kill-child` makes signals that kill `unshare` kill the client
/// too. (SIGSTOP would stop only `unshare`; this fault pauses nobody.)
fn client_command(spec: &GroupSpec) -> (Command, &'static str) {
    if !spec.pid_namespaces {
        return (Command::new(&spec.exe), "anylock-reliability");
    }
    let mut command = Command::new("unshare");
    command.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
    if !test_kit::servers::process::is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command.arg(&spec.exe);
    (command, "unshare")
}

fn log_file(dir: &Path, mode: Mode, id: u32) -> Result<std::fs::File, String> {
    let path = dir.join(format!("client-{}-{id}.log", mode.as_str()));
    std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))
}

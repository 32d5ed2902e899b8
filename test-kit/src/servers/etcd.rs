//! A private etcd cluster whose members can be killed and restarted by PID (the shared
//! cluster from `scripts/servers` must never be touched).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::process::{Reaper, ensure_free, http, scratch_dir};

/// How an [`Etcd`] cluster is started; see [`Etcd::options`].
#[derive(Debug)]
pub struct EtcdOptions {
    ports: Vec<(u16, u16)>,
    fsync: bool,
    dir: Option<PathBuf>,
    reaper: Option<Arc<Reaper>>,
}

impl EtcdOptions {
    /// Syncs to disk (default: `--unsafe-no-fsync`, as the shared test cluster runs).
    pub fn fsync(mut self, on: bool) -> Self {
        self.fsync = on;
        self
    }

    /// The cluster's directory (kept on drop) instead of a fresh temporary one.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Registers the members with `reaper`, which kills them if this process dies first.
    pub fn reaper(mut self, reaper: Arc<Reaper>) -> Self {
        self.reaper = Some(reaper);
        self
    }

    /// Starts every member and waits until all are healthy.
    ///
    /// # Errors
    /// When a port is taken (checked first), `etcd` is missing, or the cluster is not healthy in 30 s.
    pub async fn start(self) -> Result<Etcd, String> {
        for (client, peer) in &self.ports {
            ensure_free(*client)?;
            ensure_free(*peer)?;
        }
        let (dir, owned) = match self.dir {
            Some(dir) => (dir, false),
            None => (scratch_dir("anylock-etcd")?, true),
        };
        let members: Vec<Member> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| Member {
                name: format!("m{}", i + 1),
                client,
                peer,
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Etcd {
            dir,
            owned,
            members,
            initial_cluster,
            fsync: self.fsync,
            reaper: self.reaper,
        };
        for index in 0..cluster.members.len() {
            cluster.spawn(index)?;
        }
        cluster.try_wait_healthy(Duration::from_secs(30)).await?;
        Ok(cluster)
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// An etcd cluster of its own on loopback, stopped (by PID) when dropped, including when
/// the test panics; its temporary directory is removed unless the test panicked.
#[derive(Debug)]
pub struct Etcd {
    dir: PathBuf,
    owned: bool,
    members: Vec<Member>,
    initial_cluster: String,
    fsync: bool,
    reaper: Option<Arc<Reaper>>,
}

impl Etcd {
    /// Options for a cluster with one member per `(client port, peer port)`.
    pub fn options(ports: &[(u16, u16)]) -> EtcdOptions {
        EtcdOptions {
            ports: ports.to_vec(),
            fsync: false,
            dir: None,
            reaper: None,
        }
    }

    /// Starts one member per `(client port, peer port)` and waits until all are healthy.
    /// `fsync: false` adds `--unsafe-no-fsync` (as the shared test cluster does).
    ///
    /// # Panics
    /// When it cannot start or is not healthy in 30 s.
    pub async fn start(ports: &[(u16, u16)], fsync: bool) -> Etcd {
        Self::options(ports)
            .fsync(fsync)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// One member's client URL.
    pub fn endpoint(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[index].client)
    }

    /// The members' client addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members
            .iter()
            .map(|m| SocketAddr::from(([127, 0, 0, 1], m.client)))
            .collect()
    }

    /// Starts member `index` (again, on its data directory).
    ///
    /// # Errors
    /// When `etcd` cannot be started.
    pub fn spawn(&mut self, index: usize) -> Result<(), String> {
        let member = &self.members[index];
        let data = self.dir.join(&member.name);
        std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(data.join("etcd.log"))
            .map_err(|e| format!("etcd log: {e}"))?;
        let client = format!("http://127.0.0.1:{}", member.client);
        let peer = format!("http://127.0.0.1:{}", member.peer);
        let mut command = Command::new("etcd");
        command
            .args(["--name", &member.name, "--data-dir"])
            .arg(data.join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new", "--initial-cluster-token"])
            .arg(self.dir.to_string_lossy().as_ref())
            .args([
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1000",
            ])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if !self.fsync {
            command.arg("--unsafe-no-fsync");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("etcd: {e} (install etcd-server with scripts/servers install)"))?;
        if let Some(reaper) = &self.reaper {
            reaper.track(&format!("etcd-{}", member.name), child.id(), "etcd");
        }
        self.members[index].child = Some(child);
        Ok(())
    }

    /// Kills member `index` with `SIGKILL` (a crash, by PID) and waits for it to exit.
    pub fn kill(&mut self, index: usize) {
        let member = &mut self.members[index];
        if let Some(mut child) = member.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(reaper) = &self.reaper {
            reaper.untrack(&format!("etcd-{}", member.name));
        }
    }

    /// Kills member `index` and starts it again on its data directory.
    ///
    /// # Panics
    /// When `etcd` cannot be started.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops every member, one at a time.
    pub fn stop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }

    /// Whether member `index` answers `/health` with a leader.
    pub async fn is_healthy(&self, index: usize) -> bool {
        let addr = self.addrs()[index];
        matches!(http(addr, "GET", "/health", "").await, Ok((200, body)) if body.contains("\"true\""))
    }

    /// Waits until every running member is healthy.
    ///
    /// # Panics
    /// After `limit`, naming the directory with the logs.
    pub async fn wait_healthy(&self, limit: Duration) {
        self.try_wait_healthy(limit)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`wait_healthy`](Self::wait_healthy), failing with a message instead of panicking.
    ///
    /// # Errors
    /// When that takes longer than `limit`.
    pub async fn try_wait_healthy(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let mut all = true;
            for (index, member) in self.members.iter().enumerate() {
                if member.child.is_some() && !self.is_healthy(index).await {
                    all = false;
                }
            }
            if all {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "private etcd cluster not healthy after {limit:?}; logs in {}",
                    self.dir.display()
                ));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the current leader, by the running members' own status.
    ///
    /// # Errors
    /// When no running member names a leader within 10 s.
    pub async fn leader(&self) -> Result<usize, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            for (index, addr) in self.addrs().into_iter().enumerate() {
                if self.members[index].child.is_none() {
                    continue;
                }
                if let Some((me, leader)) = status(addr).await
                    && me == leader
                {
                    return Ok(index);
                }
            }
            sleep(Duration::from_millis(100)).await;
        }
        Err("the private etcd cluster has no leader".into())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if self.owned && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `(member id, leader id)` from the gRPC gateway's status call.
async fn status(addr: SocketAddr) -> Option<(String, String)> {
    let (code, body) = http(addr, "POST", "/v3/maintenance/status", "{}")
        .await
        .ok()?;
    if code != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let me = json["header"]["member_id"].as_str()?.to_owned();
    let leader = json["leader"].as_str()?.to_owned();
    Some((me, leader))
}

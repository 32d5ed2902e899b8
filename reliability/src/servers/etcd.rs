//! A private three-member etcd cluster whose leader can be killed by PID.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

use super::process::{Reaper, ensure_free, http, signal, wait_gone};

#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// Three etcd members on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
}

impl EtcdCluster {
    /// Starts members with client ports `clients[i]` and peer ports `peers[i]`, and waits
    /// until all are healthy.
    ///
    /// # Errors
    /// When a port is taken, `etcd` is missing, or the cluster is not healthy in 30 s.
    pub async fn start(
        clients: [u16; 3],
        peers: [u16; 3],
        reaper: &Reaper,
    ) -> Result<EtcdCluster, String> {
        for port in clients.iter().chain(&peers) {
            ensure_free(*port)?;
        }
        let members: Vec<Member> = (0..3)
            .map(|i| Member {
                name: format!("r{}", i + 1),
                client: clients[i],
                peer: peers[i],
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            dir: reaper.dir().join("etcd"),
            members,
            initial_cluster,
        };
        for index in 0..3 {
            cluster.spawn(index, reaper)?;
        }
        cluster.wait_healthy(Duration::from_secs(30)).await?;
        Ok(cluster)
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
    pub fn spawn(&mut self, index: usize, reaper: &Reaper) -> Result<(), String> {
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
        let child = Command::new("etcd")
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
            .args([
                "--unsafe-no-fsync",
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("etcd: {e} (install etcd-server with scripts/servers install)"))?;
        if let Some(pid) = child.id() {
            reaper.track(&format!("etcd-{}", member.name), pid, "etcd");
        }
        self.members[index].child = Some(child);
        Ok(())
    }

    /// Kills member `index` with `SIGKILL` and waits for it to exit.
    pub async fn kill(&mut self, index: usize, reaper: &Reaper) {
        let member = &mut self.members[index];
        if let Some(mut child) = member.child.take() {
            if let Some(pid) = child.id() {
                signal(pid, Signal::SIGKILL);
                wait_gone(pid, Duration::from_secs(10)).await;
            }
            let _ = child.wait().await;
        }
        reaper.untrack(&format!("etcd-{}", member.name));
    }

    /// Stops every member, one at a time.
    pub async fn stop(&mut self, reaper: &Reaper) {
        for index in 0..self.members.len() {
            self.kill(index, reaper).await;
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

    /// Waits until every running member reports itself healthy.
    ///
    /// # Errors
    /// When that takes longer than `limit`.
    pub async fn wait_healthy(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let mut healthy = true;
            for (index, addr) in self.addrs().into_iter().enumerate() {
                if self.members[index].child.is_some() {
                    let ok = http(addr, "GET", "/health", "").await;
                    healthy &= matches!(ok, Ok((200, body)) if body.contains("\"true\""));
                }
            }
            if healthy {
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

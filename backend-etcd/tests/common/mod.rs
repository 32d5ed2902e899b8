//! Helpers shared by the etcd test binaries: the shared cluster's settings, random key
//! prefixes, a raw etcd client for operator actions, and private etcd clusters that a test
//! may kill and restart (the shared cluster from `scripts/servers` must never be touched).

#![allow(dead_code)]

pub(crate) mod raw;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The shared cluster's endpoints, or `None` (skip) outside CI when it is not running.
pub(crate) fn shared_endpoints() -> Option<Vec<String>> {
    let value = test_kit::env::require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd")?;
    Some(value.split(',').map(|s| s.trim().to_owned()).collect())
}

/// A fresh key prefix, so runs and tests never see each other's keys.
pub(crate) fn random_prefix(what: &str) -> String {
    let random = rand_u64();
    format!("anylock-test/{what}-{random:016x}/")
}

/// 64 random bits.
pub(crate) fn rand_u64() -> u64 {
    rand::random()
}

/// A backend on `endpoints` under `prefix`.
pub(crate) async fn backend(endpoints: &[String], prefix: &str) -> EtcdBackend {
    let config = EtcdConfig::new(endpoints)
        .expect("endpoints")
        .with_prefix(prefix);
    EtcdBackend::connect(config).await.expect("connect")
}

/// A raw etcd client, for acting as an operator or another client would.
pub(crate) async fn raw(endpoints: &[String]) -> raw::Raw {
    raw::Raw::connect(endpoints)
}

/// Every key (and value) under `prefix`, lowest create revision first.
pub(crate) async fn keys_under(
    raw: &mut raw::Raw,
    prefix: &str,
) -> Vec<anylock_etcd_proto::mvccpb::KeyValue> {
    raw.by_creation(prefix, 0, false).await.expect("range")
}

/// Polls `check` every 50 ms until it holds (`true`) or `limit` passes (`false`).
pub(crate) async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// `GET path` over plain HTTP/1.0 on `127.0.0.1:port`; the body.
pub(crate) async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned()))
}

/// One member of a [`PrivateCluster`].
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// An etcd cluster of its own, in a temporary directory, stopped (by PID) and removed
/// when dropped, including when the test panics.
pub(crate) struct PrivateCluster {
    dir: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    fsync: bool,
}

impl PrivateCluster {
    /// Starts one member per `(client port, peer port)` and waits until it is healthy.
    /// `fsync: false` adds `--unsafe-no-fsync` (as the shared test cluster does).
    pub(crate) async fn start(ports: &[(u16, u16)], fsync: bool) -> PrivateCluster {
        let dir = std::env::temp_dir().join(format!("anylock-etcd-{:016x}", rand_u64()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let members: Vec<Member> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| Member {
                name: format!("p{}", i + 1),
                client_port,
                peer_port,
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = PrivateCluster {
            dir,
            members,
            initial_cluster,
            fsync,
        };
        for index in 0..cluster.members.len() {
            cluster.spawn(index);
        }
        cluster.wait_healthy(Duration::from_secs(30)).await;
        cluster
    }

    fn spawn(&mut self, index: usize) {
        let member = &self.members[index];
        let data = self.dir.join(&member.name);
        std::fs::create_dir_all(&data).expect("member dir");
        let log = File::options()
            .create(true)
            .append(true)
            .open(data.join("etcd.log"))
            .expect("log file");
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new("etcd");
        command
            .args(["--name", &member.name])
            .arg("--data-dir")
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
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &format!("{:?}", self.dir)])
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
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd binary (apt etcd-server; run scripts/servers start)");
        self.members[index].child = Some(child);
    }

    /// The members' client URLs.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// One member's client URL.
    pub(crate) fn endpoint(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[index].client_port)
    }

    /// Kills member `index` with SIGKILL (a crash) and waits for it to exit.
    pub(crate) fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its data directory.
    pub(crate) fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
    }

    /// Whether member `index` answers `/health` with a leader.
    pub(crate) async fn is_healthy(&self, index: usize) -> bool {
        let port = self.members[index].client_port;
        matches!(http_get(port, "/health").await, Ok(body) if body.contains("\"true\""))
    }

    /// Waits until every running member is healthy; panics with the logs after `limit`.
    pub(crate) async fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut all = true;
            for (index, member) in self.members.iter().enumerate() {
                if member.child.is_some() && !self.is_healthy(index).await {
                    all = false;
                }
            }
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private etcd cluster not healthy after {limit:?}; logs in {}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the current leader, per the members' own status.
    pub(crate) async fn leader(&self) -> usize {
        for _ in 0..100 {
            for (index, member) in self.members.iter().enumerate() {
                if member.child.is_none() {
                    continue;
                }
                let mut one = raw(&[self.endpoint(index)]).await;
                if let Ok(status) = one.status().await
                    && status.leader == status.header.map_or(0, |h| h.member_id)
                {
                    return index;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the private cluster has no leader");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

//! Private servers for each backend, on loopback ports 27600-27689, started and stopped
//! by this run only (the shared test servers are never touched), and the server-side
//! faults: restarts, a killed leader, 5xx bursts. The servers themselves are
//! [`test_kit::servers`].

mod snapshot;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gcs_test_server::{Fault as GcsFault, GcsTestServer};
use tokio::time::{Instant, sleep};

use test_kit::servers::process::ensure_free;
use test_kit::servers::{Etcd, Postgres, Reaper, Redis};

use crate::backends::Kind;

/// The single Redis node.
const REDIS_PORT: u16 = 27600;
/// Redlock's five nodes A..E.
const REDLOCK_PORTS: [u16; 5] = [27601, 27602, 27603, 27604, 27605];
const POSTGRES_PORT: u16 = 27610;
const ETCD_CLIENT_PORTS: [u16; 3] = [27620, 27621, 27622];
const ETCD_PEER_PORTS: [u16; 3] = [27623, 27624, 27625];
const GCS_PORT: u16 = 27630;
/// The database the PostgreSQL clients use.
const DATABASE: &str = "anylock_reliability";
/// The bucket the GCS clients use.
const BUCKET: &str = "reliability";

enum Servers {
    Local,
    Redis(Redis),
    Redlock(Vec<Redis>),
    Postgres(Arc<Postgres>),
    Etcd(Etcd),
    Gcs(GcsTestServer),
}

/// One backend's running servers.
pub struct Lane {
    kind: Kind,
    servers: Servers,
    reaper: Arc<Reaper>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("kind", &self.kind).finish()
    }
}

impl Lane {
    /// Starts the servers `kind` needs.
    ///
    /// # Errors
    /// When a server is missing, a port is taken, or a server does not come up.
    pub async fn start(kind: Kind, reaper: Arc<Reaper>) -> Result<Lane, String> {
        let servers = match kind {
            Kind::Local => Servers::Local,
            Kind::Redis => Servers::Redis(redis_node(REDIS_PORT, &reaper).await?),
            Kind::Redlock => {
                let mut nodes = Vec::new();
                for port in REDLOCK_PORTS {
                    nodes.push(redis_node(port, &reaper).await?);
                }
                Servers::Redlock(nodes)
            }
            Kind::Postgres => {
                let options = Postgres::options()
                    .port(POSTGRES_PORT)
                    .dir(reaper.dir().join("postgres"))
                    .database(DATABASE)
                    .stat_statements(false)
                    .wait_reaped(false)
                    .reaper(reaper.clone());
                let server = tokio::task::spawn_blocking(move || options.start())
                    .await
                    .map_err(|e| format!("start PostgreSQL: {e}"))??;
                Servers::Postgres(Arc::new(server))
            }
            Kind::Etcd => {
                let ports: Vec<(u16, u16)> =
                    ETCD_CLIENT_PORTS.into_iter().zip(ETCD_PEER_PORTS).collect();
                let cluster = Etcd::options(&ports)
                    .dir(reaper.dir().join("etcd"))
                    .reaper(reaper.clone())
                    .start()
                    .await?;
                Servers::Etcd(cluster)
            }
            Kind::Gcs => {
                ensure_free(GCS_PORT)?;
                let addr = SocketAddr::from(([127, 0, 0, 1], GCS_PORT));
                let server = GcsTestServer::bind(addr)
                    .await
                    .map_err(|e| format!("gcs-test-server on {addr}: {e}"))?;
                server.create_bucket(BUCKET);
                Servers::Gcs(server)
            }
        };
        let lane = Lane {
            kind,
            servers,
            reaper,
        };
        lane.prepare().await?;
        Ok(lane)
    }

    /// The backend.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The addresses clients reach the servers on, one per endpoint (none for `local`).
    pub fn upstreams(&self) -> Vec<SocketAddr> {
        match &self.servers {
            Servers::Local => Vec::new(),
            Servers::Redis(node) => vec![node.addr()],
            Servers::Redlock(nodes) => nodes.iter().map(Redis::addr).collect(),
            Servers::Postgres(pg) => vec![pg.addr()],
            Servers::Etcd(cluster) => cluster.addrs(),
            Servers::Gcs(server) => vec![server.addr()],
        }
    }

    /// The backend URL reaching endpoint `i` through `via[i]` (a fault proxy).
    pub fn url(&self, via: &[SocketAddr]) -> String {
        let hosts = |sep: &str| {
            via.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(sep)
        };
        match self.kind {
            Kind::Local => format!(
                "local:{}",
                self.reaper.dir().join("locks.sqlite3").display()
            ),
            Kind::Redis => format!("redis://{}/0", hosts(",")),
            Kind::Redlock => format!("redlock://{}", hosts(",")),
            Kind::Postgres => format!(
                "postgres://postgres@{}/{}?pool_size=3&application_name=reliability&sslmode=disable",
                hosts(","),
                DATABASE
            ),
            Kind::Etcd => format!("etcd://{}/anylock-reliability", hosts(",")),
            Kind::Gcs => format!("gs://{BUCKET}/locks?endpoint=http://{}", hosts(",")),
        }
    }

    /// Connects once, directly, so that schemas and files exist before clients race to
    /// create them.
    async fn prepare(&self) -> Result<(), String> {
        let url = self.url(&self.upstreams());
        anylock::connect(&url)
            .await
            .map(drop)
            .map_err(|e| format!("{}: cannot connect to the private server: {e}", self.kind))
    }

    /// Stops every server of this lane.
    pub async fn stop(&mut self) {
        match &mut self.servers {
            Servers::Redis(node) => node.crash(),
            Servers::Redlock(nodes) => {
                for node in nodes {
                    node.crash();
                }
            }
            Servers::Postgres(pg) => {
                let pg = pg.clone();
                let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
            }
            Servers::Etcd(cluster) => cluster.stop(),
            Servers::Local | Servers::Gcs(_) => {}
        }
    }

    /// Redis: `SIGKILL` and an immediate restart (no persistence: every lock and fence
    /// counter is forgotten).
    ///
    /// # Errors
    /// When this is not the Redis lane or the server does not come back.
    pub async fn restart_redis(&mut self) -> Result<String, String> {
        let Servers::Redis(node) = &mut self.servers else {
            return Err("not a Redis lane".into());
        };
        let started = Instant::now();
        node.try_restart().await?;
        Ok(format!(
            "Redis down for {} ms",
            started.elapsed().as_millis()
        ))
    }

    /// Redlock: kills node `index`, keeps it down for `down`, restarts it empty.
    ///
    /// # Errors
    /// When this is not the Redlock lane or the node does not come back.
    pub async fn restart_redlock_node(
        &mut self,
        index: usize,
        down: Duration,
    ) -> Result<String, String> {
        let Servers::Redlock(nodes) = &mut self.servers else {
            return Err("not a Redlock lane".into());
        };
        let started = Instant::now();
        nodes[index].crash();
        sleep(down.saturating_sub(started.elapsed())).await;
        nodes[index].try_restart().await?;
        Ok(format!(
            "node {} down for {} ms",
            node_name(index),
            started.elapsed().as_millis()
        ))
    }

    /// PostgreSQL: crash, stay down at least `outage`, restart on the same data.
    ///
    /// # Errors
    /// When this is not the PostgreSQL lane or the server does not come back.
    pub async fn restart_postgres(&self, outage: Duration) -> Result<String, String> {
        let Servers::Postgres(pg) = &self.servers else {
            return Err("not a PostgreSQL lane".into());
        };
        let pg = pg.clone();
        let down = tokio::task::spawn_blocking(move || pg.try_restart_after(outage))
            .await
            .map_err(|e| format!("restart PostgreSQL: {e}"))??;
        Ok(format!("PostgreSQL down for {} ms", down.as_millis()))
    }

    /// etcd: kills the leader, waits `rejoin_after`, restarts it and waits for health.
    ///
    /// # Errors
    /// When this is not the etcd lane or the cluster does not recover.
    pub async fn kill_etcd_leader(&mut self, rejoin_after: Duration) -> Result<String, String> {
        let Servers::Etcd(cluster) = &mut self.servers else {
            return Err("not an etcd lane".into());
        };
        let leader = cluster.leader().await?;
        let killed = Instant::now();
        cluster.kill(leader);
        let next = cluster.leader().await?;
        let elected = killed.elapsed();
        sleep(rejoin_after.saturating_sub(killed.elapsed())).await;
        cluster.spawn(leader)?;
        cluster.try_wait_healthy(Duration::from_secs(30)).await?;
        Ok(format!(
            "killed leader r{}; r{} led after {} ms; r{} rejoined after {} ms",
            leader + 1,
            next + 1,
            elected.as_millis(),
            leader + 1,
            killed.elapsed().as_millis()
        ))
    }

    /// GCS: every request answers 503 while `on`.
    ///
    /// # Errors
    /// When this is not the GCS lane.
    pub fn gcs_errors(&self, on: bool) -> Result<(), String> {
        let Servers::Gcs(server) = &self.servers else {
            return Err("not a GCS lane".into());
        };
        match on {
            true => server.inject(GcsFault::ServerErrors { count: u32::MAX }),
            false => server.clear_faults(),
        }
        Ok(())
    }
}

/// A Redis node of this run on `port`, in the run's directory, watched by `reaper`.
async fn redis_node(port: u16, reaper: &Arc<Reaper>) -> Result<Redis, String> {
    Redis::options()
        .port(port)
        .dir(reaper.dir().join(format!("redis-{port}")))
        .reaper(reaper.clone())
        .start()
        .await
}

/// Redlock node names A..E.
pub fn node_name(index: usize) -> char {
    char::from(b'A' + u8::try_from(index).unwrap_or(25))
}

//! etcd: ours under a prefix of its own, a linearizable get as the raw round trip, and
//! etcd's own Lock RPC (through etcd's generated gRPC client) as the peer. Every client talks to one
//! member, so ours, raw and peer pay the same follower-or-leader path.

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::LockBackend;

use crate::etcd_grpc::Etcd as Client;
use crate::op::{Entry, Held, Lock, Op, Res, Role};
use crate::servers::EtcdRpcs;
use crate::system::{Ctx, Kind, Peer, System, host_port};

/// Lease TTL of the peer's locks, in seconds (etcd leases are whole seconds).
const PEER_TTL: i64 = 30;
/// TTL of the peer's shared lease: outlives a full run.
const SHARED_TTL: i64 = 1_200;

/// Ours alone on the member at `url`, under run `run`'s prefix.
pub(crate) async fn ours(url: &str, run: &str) -> Res<Arc<dyn LockBackend>> {
    let member = host_port(url).ok_or("the etcd endpoint needs host:port")?;
    let ours = format!("etcd://{member}/anylock-bench-{run}");
    Ok(Arc::new(backend_etcd::EtcdBackend::from_url(&ours).await?))
}

/// etcd at `url` (`http://host:port`, one member).
pub(crate) async fn connect(url: &str, ctx: &Ctx) -> Res<System> {
    let member = host_port(url).ok_or("the etcd endpoint needs host:port")?;
    let backend = ours(url, &ctx.run).await?;
    let client = Client::connect(url)?;
    let note = role(&client, &member).await;
    let shared = client.lease_grant(SHARED_TTL).await?;
    let peers = vec![
        Peer::new(
            "etcd Lock RPC, lease per lock",
            Arc::new(EtcdLock::new(&client, ctx, None)),
            "queued in the server (watch)",
        ),
        Peer {
            label: "etcd Lock RPC, one shared lease".to_owned(),
            lock: Arc::new(EtcdLock::new(&client, ctx, Some(shared))),
            waiting: None,
        },
    ];
    Ok(System {
        kind: Kind::Etcd,
        url: url.to_owned(),
        upstreams: vec![member.clone()],
        backend: Arc::new(backend),
        raw: Some(Entry::new(
            "raw get (linearizable)",
            Role::Raw,
            Arc::new(Get(client.clone())),
        )),
        extras: vec![Entry::new(
            "raw put + delete (2 writes, the least a lock needs)",
            Role::Raw,
            Arc::new(PutDelete {
                client,
                prefix: format!("anylock-bench-raw-{}/", ctx.run),
            }),
        )],
        peers,
        // The Lock RPC's own waiter is the reference: the server queues it.
        floor: None,
        counter: Some(Arc::new(EtcdRpcs {
            url: format!("http://{member}/metrics"),
            http: reqwest::Client::new(),
        })),
        note,
    })
}

/// `member 127.0.0.1:27379 (follower)`.
async fn role(client: &Client, member: &str) -> String {
    let status = client.status().await;
    let role = match status {
        Ok(s) if s.header.is_some_and(|h| h.member_id == s.leader) => "leader",
        Ok(_) => "follower",
        Err(_) => "role unknown",
    };
    format!("every client talks to member {member} ({role})")
}

/// A linearizable `Range` of one (missing) key.
struct Get(Client);

#[async_trait]
impl Op for Get {
    async fn run(&self, _: usize) -> Res<()> {
        self.0.get("anylock-bench-raw").await
    }
}

/// A put then a delete of one key: two Raft writes, like any lock's grant and release.
struct PutDelete {
    client: Client,
    prefix: String,
}

#[async_trait]
impl Op for PutDelete {
    async fn run(&self, i: usize) -> Res<()> {
        let key = format!("{}{}", self.prefix, i % crate::op::NAMES);
        self.client.put(&key, "v").await?;
        self.client.delete(&key).await
    }
}

/// etcd's Lock RPC (`etcdctl lock`'s server side): with no shared lease, each lock grants
/// its own lease first and revokes it after the unlock, as a fresh `etcdctl lock` session
/// does.
struct EtcdLock {
    client: Client,
    prefix: String,
    shared: Option<i64>,
}

impl EtcdLock {
    fn new(client: &Client, ctx: &Ctx, shared: Option<i64>) -> Self {
        Self {
            client: client.clone(),
            prefix: format!("anylock-bench-peer-{}/", ctx.run),
            shared,
        }
    }
}

#[async_trait]
impl Lock for EtcdLock {
    /// The Lock RPC has no try-once form: without `wait` it still waits (the harness only
    /// tries once on names nobody holds, where it returns at once).
    async fn acquire(&self, name: &str, _wait: bool) -> Res<Option<Held>> {
        let client = &self.client;
        let lease = match self.shared {
            Some(id) => id,
            None => client.lease_grant(PEER_TTL).await?,
        };
        let key = client
            .lock(&format!("{}{name}", self.prefix), lease)
            .await?;
        Ok(Some(Box::new((key, lease))))
    }

    async fn release(&self, held: Held) -> Res<()> {
        let (key, lease) = *held
            .downcast::<(Vec<u8>, i64)>()
            .map_err(|_| "not an etcd lock")?;
        let client = &self.client;
        client.unlock(key).await?;
        if self.shared.is_none() {
            client.lease_revoke(lease).await?;
        }
        Ok(())
    }
}

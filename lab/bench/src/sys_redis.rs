//! Redis and Redlock: ours, `PING` and `SET NX PX` + `DEL` as raw reference points, and
//! the `rslock` crate as the peer on the same nodes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_redis::{RedlockBackend, RedlockConfig};
use futures_util::future::try_join_all;
use lockcore::LockBackend;
use redis::aio::MultiplexedConnection;
use rslock::{LockError, LockManager};

use crate::op::{Entry, Held, Lock, Op, Res, Role};
use crate::servers::RedisCommands;
use crate::system::{Ctx, Kind, PREFIX, Peer, System, host_port, with_param};

/// How rslock waits.
const RSLOCK_WAIT: &str = "polled: retries 0–200 ms apart";

/// A single Redis at `url` (`redis://host:port/db`).
pub(crate) async fn single(url: &str, ctx: &Ctx) -> Res<System> {
    let backend = ours_single(url).await?;
    let conn = connection(url).await?;
    let ping = Entry::new("raw PING", Role::Raw, Arc::new(Ping(vec![conn.clone()])));
    let set_del = Entry::new(
        "raw SET NX PX + DEL",
        Role::Raw,
        Arc::new(SetDel {
            conn,
            run: ctx.run.clone(),
        }),
    );
    Ok(System {
        kind: Kind::Redis,
        url: url.to_owned(),
        upstreams: host_port(url).into_iter().collect(),
        backend,
        raw: Some(ping),
        extras: vec![set_del],
        peers: vec![Peer::new("rslock", rslock(&[url.to_owned()]), RSLOCK_WAIT)],
        floor: Some(crate::floor::redis(
            redis::Client::open(url)?,
            connection(url).await?,
            &ctx.run,
        )),
        counter: Some(Arc::new(RedisCommands {
            nodes: vec![redis::Client::open(url)?],
        })),
        note: String::new(),
    })
}

/// Redlock over `urls`, a comma-separated list of `redis://host:port` node URLs.
pub(crate) async fn redlock(urls: &str, _ctx: &Ctx) -> Res<System> {
    let nodes = node_urls(urls);
    let backend = ours_redlock(urls).await?;
    let conns = try_join_all(nodes.iter().map(|u| connection(u))).await?;
    let n = nodes.len();
    let label = if n == 1 {
        "rslock, 1 node".to_owned()
    } else {
        format!("rslock, {n} nodes")
    };
    Ok(System {
        kind: Kind::Redlock,
        url: urls.to_owned(),
        upstreams: nodes.iter().filter_map(|u| host_port(u)).collect(),
        backend,
        raw: Some(Entry::new(
            "raw PING (1 node)",
            Role::Raw,
            Arc::new(Ping(conns[..1].to_vec())),
        )),
        extras: vec![Entry::new(
            format!("raw PING to all {n} nodes at once"),
            Role::Raw,
            Arc::new(Ping(conns.clone())),
        )],
        peers: vec![Peer::new(label, rslock(&nodes), RSLOCK_WAIT)],
        floor: None,
        counter: Some(Arc::new(RedisCommands {
            nodes: nodes
                .iter()
                .map(|u| redis::Client::open(u.as_str()))
                .collect::<Result<_, _>>()?,
        })),
        note: String::new(),
    })
}

/// Ours alone on the single Redis at `url`, under [`PREFIX`].
pub(crate) async fn ours_single(url: &str) -> Res<Arc<dyn LockBackend>> {
    Ok(backend_redis::open(&with_param(url, "prefix", PREFIX)).await?)
}

/// Ours alone on the Redlock nodes `urls` (comma-separated `redis://` URLs), under
/// [`PREFIX`].
pub(crate) async fn ours_redlock(urls: &str) -> Res<Arc<dyn LockBackend>> {
    let nodes = node_urls(urls).into_iter();
    let config = RedlockConfig::from_node_urls(nodes.map(|u| with_param(&u, "prefix", PREFIX)))?;
    Ok(Arc::new(RedlockBackend::connect(config).await?))
}

fn node_urls(urls: &str) -> Vec<String> {
    urls.split(',').map(|u| u.trim().to_owned()).collect()
}

/// A multiplexed connection whose calls may take up to 30 s (the harness's own cleanup
/// and pipelines; ours keeps the backend's timeouts).
pub(crate) async fn connection(url: &str) -> Res<MultiplexedConnection> {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// `PING` to every connection at once (one connection: the raw round trip).
struct Ping(Vec<MultiplexedConnection>);

#[async_trait]
impl Op for Ping {
    async fn run(&self, _: usize) -> Res<()> {
        try_join_all(self.0.iter().map(|conn| async move {
            let mut conn = conn.clone();
            redis::cmd("PING").query_async::<String>(&mut conn).await
        }))
        .await?;
        Ok(())
    }
}

/// The bare minimum lock: `SET key value NX PX ttl`, then `DEL key` (no compare, no
/// fencing, no notification): two round trips.
struct SetDel {
    conn: MultiplexedConnection,
    run: String,
}

#[async_trait]
impl Op for SetDel {
    async fn run(&self, i: usize) -> Res<()> {
        let mut conn = self.conn.clone();
        let key = format!("{PREFIX}-raw:{}:{}", self.run, i % crate::op::NAMES);
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("v")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await?;
        set.ok_or("raw SET NX found the key set")?;
        redis::cmd("DEL")
            .arg(&key)
            .query_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }
}

fn rslock(nodes: &[String]) -> Arc<dyn Lock> {
    Arc::new(Rslock {
        manager: LockManager::new(nodes.to_vec()),
        ttl: Duration::from_secs(30),
    })
}

/// The `rslock` crate with its defaults (3 tries per `lock`, 0–200 ms apart; `acquire`
/// loops over `lock`).
struct Rslock {
    manager: LockManager,
    ttl: Duration,
}

#[async_trait]
impl Lock for Rslock {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        if wait {
            let lock = self
                .manager
                .acquire_no_guard(name.as_bytes(), self.ttl)
                .await?;
            return Ok(Some(Box::new(lock)));
        }
        match self.manager.lock(name.as_bytes(), self.ttl).await {
            Ok(lock) => Ok(Some(Box::new(lock))),
            Err(LockError::Unavailable) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn release(&self, held: Held) -> Res<()> {
        let lock = held
            .downcast::<rslock::Lock>()
            .map_err(|_| "not an rslock::Lock")?;
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

/// Deletes every key this run left on `url`'s node (fence counters, raw keys).
pub(crate) async fn cleanup(url: &str, run: &str) -> Res<u64> {
    let mut conn = connection(url).await?;
    let mut removed = 0;
    for pattern in [
        format!("{{{PREFIX}:{run}*"),
        format!("{PREFIX}-raw:{run}:*"),
    ] {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                removed += redis::cmd("DEL")
                    .arg(&keys)
                    .query_async::<u64>(&mut conn)
                    .await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(removed)
}

//! [`System::connect`]: picks the `sys_*` module that connects a kind, above those modules
//! so that `system` (the types they share) does not depend on them.

use std::sync::Arc;

use lockcore::LockBackend;

use crate::op::Res;
use crate::system::{Ctx, Kind, System};
use crate::{sys_etcd, sys_gcs, sys_pg, sys_redis};

impl System {
    /// Connects `kind` at `url` (see each `sys_*` module for the URL form).
    pub(crate) async fn connect(kind: Kind, url: &str, ctx: &Ctx) -> Res<Self> {
        match kind {
            Kind::Redis => sys_redis::single(url, ctx).await,
            Kind::Redlock => sys_redis::redlock(url, ctx).await,
            Kind::Postgres => sys_pg::connect(url, ctx).await,
            Kind::Etcd => sys_etcd::connect(url, ctx).await,
            Kind::Gcs => sys_gcs::connect(url, ctx).await,
            Kind::Local => local(url).await,
        }
    }

    /// The same system with every server address in its URL replaced by `to(address)`.
    pub(crate) async fn reconnect_via(&self, ctx: &Ctx, to: &dyn Fn(&str) -> String) -> Res<Self> {
        let mut url = self.url.clone();
        for upstream in &self.upstreams {
            url = url.replace(upstream.as_str(), &to(upstream));
        }
        Self::connect(self.kind, &url, ctx).await
    }
}

/// Ours alone, as [`System::connect`] builds it for run `run` (the same key prefix,
/// schema or database): what a failover child process leads with.
pub(crate) async fn ours(kind: Kind, url: &str, run: &str) -> Res<Arc<dyn LockBackend>> {
    match kind {
        Kind::Redis => sys_redis::ours_single(url).await,
        Kind::Redlock => sys_redis::ours_redlock(url).await,
        Kind::Postgres => sys_pg::ours(url, run).await,
        Kind::Etcd => sys_etcd::ours(url, run).await,
        Kind::Gcs => sys_gcs::ours(url, run).await,
        Kind::Local => Ok(anylock::connect(url).await?),
    }
}

/// The embedded backend at `url` (`local:/path`): no server, so no raw round trip or peer.
async fn local(url: &str) -> Res<System> {
    Ok(System {
        kind: Kind::Local,
        url: url.to_owned(),
        upstreams: Vec::new(),
        backend: anylock::connect(url).await?,
        raw: None,
        extras: Vec::new(),
        peers: Vec::new(),
        floor: None,
        counter: None,
        note: String::new(),
    })
}

/// Removes what the run left on shared servers (Redis fence counters, the schema).
pub(crate) async fn cleanup(servers: &[(Kind, String)], ctx: &Ctx) {
    for (kind, url) in servers {
        let done = match kind {
            Kind::Redis | Kind::Redlock => {
                let mut result = Ok(());
                for url in url.split(',') {
                    result = result.and(sys_redis::cleanup(url.trim(), &ctx.run).await.map(drop));
                }
                result
            }
            Kind::Postgres => sys_pg::cleanup(url, &ctx.run).await,
            _ => Ok(()),
        };
        if let Err(e) = done {
            eprintln!("anylock-bench: cleanup of {} failed: {e}", kind.name());
        }
    }
}

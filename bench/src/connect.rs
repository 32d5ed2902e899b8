//! [`System::connect`]: picks the `sys_*` module that connects a kind, above those modules
//! so that `system` (the types they share) does not depend on them.

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
        counter: None,
        note: String::new(),
    })
}

//! Google Cloud Storage: ours, an object GET as the raw round trip, and a gcslock-style
//! loop (create with `ifGenerationMatch=0`, delete) as the peer. By default all of them
//! talk to the in-process `gcs-test-server`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_gcs::{GcsBackend, GcsConfig};
use lockcore::LockBackend;
use reqwest::StatusCode;

use crate::op::{Entry, Held, Lock, Op, Res, Role};
use crate::servers::GcsRequests;
use crate::system::{Ctx, Kind, Peer, System, host_port};

/// Ours alone at `url`, under run `run`'s prefix.
pub(crate) async fn ours(url: &str, run: &str) -> Res<Arc<dyn LockBackend>> {
    let config = GcsConfig::from_url(url)?.with_prefix(format!("anylock-bench-{run}/"))?;
    Ok(Arc::new(GcsBackend::connect(config).await?))
}

/// GCS at `url` (`gs://bucket?endpoint=http://host:port`).
pub(crate) async fn connect(url: &str, ctx: &Ctx) -> Res<System> {
    let config = GcsConfig::from_url(url)?;
    let api = Api {
        http: reqwest::Client::new(),
        base: config.endpoint().trim_end_matches('/').to_owned(),
        bucket: config.bucket().to_owned(),
        token: std::env::var(backend_gcs::TOKEN_ENV).ok(),
    };
    let backend = ours(url, &ctx.run).await?;
    let raw_object = format!("anylock-bench-raw-{}", ctx.run);
    api.insert(&raw_object, false).await?;
    let peer = Gcslock {
        api: api.clone(),
        prefix: format!("anylock-bench-peer-{}-", ctx.run),
    };
    Ok(System {
        kind: Kind::Gcs,
        url: url.to_owned(),
        upstreams: host_port(&api.base).into_iter().collect(),
        backend,
        raw: Some(Entry::new(
            "raw object GET",
            Role::Raw,
            Arc::new(Get {
                api,
                object: raw_object,
            }),
        )),
        extras: Vec::new(),
        peers: vec![Peer::new(
            "gcslock-style loop",
            Arc::new(peer),
            "polled: 10 ms doubling to 1 s",
        )],
        floor: None,
        counter: ctx
            .gcs_server
            .clone()
            .map(|server| Arc::new(GcsRequests { server }) as _),
        note: String::new(),
    })
}

/// Plain JSON API calls on one bucket.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    bucket: String,
    token: Option<String>,
}

impl Api {
    fn auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Media upload of an empty object; with `if_absent`, only when no live object exists.
    /// `Ok(false)` on a failed precondition (412).
    async fn insert(&self, object: &str, if_absent: bool) -> Res<bool> {
        let mut url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&name={}",
            self.base,
            self.bucket,
            object.replace('/', "%2F")
        );
        if if_absent {
            url.push_str("&ifGenerationMatch=0");
        }
        let reply = self.auth(self.http.post(url)).body("").send().await?;
        match reply.status() {
            StatusCode::PRECONDITION_FAILED => Ok(false),
            s if s.is_success() => Ok(true),
            s => Err(format!("GCS insert answered {s}").into()),
        }
    }

    fn object_url(&self, object: &str) -> String {
        let object = object.replace('/', "%2F");
        format!("{}/storage/v1/b/{}/o/{object}", self.base, self.bucket)
    }
}

/// A GET of one object's metadata.
struct Get {
    api: Api,
    object: String,
}

#[async_trait]
impl Op for Get {
    async fn run(&self, _: usize) -> Res<()> {
        let url = self.api.object_url(&self.object);
        self.api
            .auth(self.api.http.get(url))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

/// The classic gcslock loop: create the object with `ifGenerationMatch=0`; on 412 retry
/// after 10 ms, doubling up to 1 s; unlock by an unconditional DELETE.
struct Gcslock {
    api: Api,
    prefix: String,
}

#[async_trait]
impl Lock for Gcslock {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        let object = format!("{}{name}", self.prefix);
        let mut delay = Duration::from_millis(10);
        loop {
            if self.api.insert(&object, true).await? {
                return Ok(Some(Box::new(object)));
            }
            if !wait {
                return Ok(None);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    async fn release(&self, held: Held) -> Res<()> {
        let object = held
            .downcast::<String>()
            .map_err(|_| "not a gcslock object")?;
        let url = self.api.object_url(&object);
        self.api
            .auth(self.api.http.delete(url))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

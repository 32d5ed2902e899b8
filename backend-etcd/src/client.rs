//! The etcd client the backend makes its RPCs with: one connection per member, every RPC
//! bounded by the request timeout, counted, its error mapped (`error.rs`), and a
//! temporary failure moving later RPCs to the next member. The RPCs themselves are in
//! `client/rpcs.rs` (a semaphore's in `client/slots.rs`); the connect-time check of
//! every member in `client/verify.rs`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{Error, Result};
use tokio::sync::OnceCell;

use crate::config::EtcdConfig;
use crate::error::{Failure, Op, map_error, map_error_for};
use crate::grpc::{Connection, RpcError, Settings};
use crate::secure::{self, Who};

mod keeper;
mod rpcs;
mod slots;
mod verify;

pub(crate) use rpcs::{Created, revision_of, txn_rpc};
pub(crate) use slots::Taken;

/// One etcd client per member, used one member at a time: every RPC goes to the current
/// member, and a temporary failure (connection refused, no leader, timeout) moves later
/// RPCs to the next member. The failed RPC itself is not retried.
///
/// Why not one balanced channel over all endpoints: it keeps sending a share of
/// the requests to a dead member (each fails with "connection refused"), so with one
/// member down a refresh, which makes two RPCs, failed more often than not and a holder
/// went Lost after three in a row (see `tests/failover.rs`).
pub(crate) struct EtcdClient {
    members: Vec<Member>,
    current: AtomicUsize,
    settings: Settings,
    timeout: Duration,
    connect_timeout: Duration,
    rpcs: AtomicU64,
    /// The pool of long-lived keep-alive streams every refresh shares.
    keeper: crate::keepalive::Keeper,
    who: Who,
    prefix: String,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    client_certificate: bool,
}

/// One member: its endpoint and a client connected on first use.
struct Member {
    endpoint: String,
    client: OnceCell<Connection>,
}

impl EtcdClient {
    /// Prepares one client per endpoint from `config` and its loaded TLS `material`. No
    /// network I/O: [`verify`](Self::verify) connects.
    pub(crate) fn new(config: &EtcdConfig, material: &anylock_tls::TlsMaterial) -> Result<Self> {
        let credentials = config
            .credentials()
            .map(|(user, password)| (user.to_owned(), password.to_owned()));
        let (settings, tls) = if config.tls() {
            let settings = tls_settings(config.connect_timeout(), credentials, material)?;
            (
                settings,
                Some(std::sync::Arc::new(secure::rustls_config(material)?)),
            )
        } else {
            (plain_settings(config.connect_timeout(), credentials), None)
        };
        let members: Vec<Member> = config
            .endpoints()
            .into_iter()
            .map(|endpoint| Member {
                endpoint,
                client: OnceCell::new(),
            })
            .collect();
        Ok(Self {
            current: AtomicUsize::new(random_index(members.len())),
            members,
            settings,
            timeout: config.request_timeout(),
            connect_timeout: config.connect_timeout(),
            rpcs: AtomicU64::new(0),
            keeper: crate::keepalive::Keeper::default(),
            who: Who::new(config.credentials().map(|(user, _)| user), material),
            prefix: config.prefix().to_owned(),
            tls,
            client_certificate: material.client().is_some(),
        })
    }

    /// Who we are to etcd, from the config.
    pub(crate) fn who(&self) -> &Who {
        &self.who
    }

    /// [`map_error_for`] who we are and our key prefix.
    fn map(&self, op: Op, failure: Failure) -> Error {
        map_error_for(op, failure, self.who.user(), &self.prefix)
    }

    /// How many RPCs this client has started.
    pub(crate) fn rpcs(&self) -> u64 {
        self.rpcs.load(Ordering::Relaxed)
    }

    /// The client of member `index`, connecting it on first use.
    async fn member(&self, index: usize) -> Result<Connection, RpcError> {
        let member = &self.members[index];
        let connect = || Connection::connect(&member.endpoint, &self.settings);
        member.client.get_or_try_init(connect).await.cloned()
    }

    /// Runs one RPC on the current member under the request timeout (authenticating again
    /// and repeating it once if etcd refused an expired token), maps its error, and moves
    /// to the next member after a temporary failure.
    pub(crate) async fn call<R, T, F, Fut>(&self, op: Op, request: R, rpc: F) -> Result<T>
    where
        R: Clone,
        F: Fn(Connection, R) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        self.rpcs.fetch_add(1, Ordering::Relaxed);
        self.run(op, request, rpc).await
    }

    /// [`call`](Self::call) without counting an RPC: for calls that may not start one
    /// (keep-alives on the long-lived streams count the streams they open instead).
    async fn run<R, T, F, Fut>(&self, op: Op, request: R, rpc: F) -> Result<T>
    where
        R: Clone,
        F: Fn(Connection, R) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let index = self.current.load(Ordering::Relaxed) % self.members.len();
        let attempt = async { self.member(index).await?.call(request, rpc).await };
        let result = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.map(op, Failure::Etcd(err))),
            Err(_) => Err(map_error(op, Failure::TimedOut(self.timeout))),
        };
        if let Err(err) = &result
            && err.is_temporary()
        {
            let next = (index + 1) % self.members.len();
            let _ =
                self.current
                    .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
            tracing::debug!(error = %err, endpoint = %self.members[next].endpoint, "moving to the next etcd member");
        }
        result
    }
}

/// A random member to start with, so clients spread over the cluster.
fn random_index(members: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_usize(members);
    usize::try_from(hasher.finish() % members.max(1) as u64).unwrap_or(0)
}

fn plain_settings(connect_timeout: Duration, credentials: Option<(String, String)>) -> Settings {
    Settings {
        connect_timeout,
        credentials,
        #[cfg(feature = "tls")]
        tls: None,
    }
}

/// TLS: the `ca` file, else the OS trust store; the client certificate when given.
#[cfg(feature = "tls")]
fn tls_settings(
    connect_timeout: Duration,
    credentials: Option<(String, String)>,
    material: &anylock_tls::TlsMaterial,
) -> Result<Settings> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new();
    tls = match material.ca() {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca.pem())),
        None => tls.with_native_roots(),
    };
    if let Some(client) = material.client() {
        tls = tls.identity(Identity::from_pem(client.cert_pem(), client.key_pem()));
    }
    Ok(Settings {
        connect_timeout,
        credentials,
        tls: Some(tls),
    })
}

#[cfg(not(feature = "tls"))]
fn tls_settings(
    _: Duration,
    _: Option<(String, String)>,
    _: &anylock_tls::TlsMaterial,
) -> Result<Settings> {
    Err(Error::new(
        lockcore::ErrorKind::Config,
        "TLS requested, but backend-etcd was built without its `tls` feature",
    ))
}

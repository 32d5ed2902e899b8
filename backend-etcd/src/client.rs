//! The etcd RPCs the backend makes, each bounded by the request timeout and counted, and
//! the one function that maps etcd errors to lockcore errors.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anylock_etcd_proto::etcdserverpb::compare::CompareResult;
use anylock_etcd_proto::etcdserverpb::response_op::Response;
use anylock_etcd_proto::etcdserverpb::watch_create_request::FilterType;
use anylock_etcd_proto::etcdserverpb::watch_request::RequestUnion;
use anylock_etcd_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest, RangeResponse,
    ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse,
};
use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{Error, ErrorKind, Result};
use tokio::sync::OnceCell;
use tonic::Code;

use crate::config::EtcdConfig;
use crate::grpc::{Connection, RpcError, Settings, WatchStream};
use crate::keys::range_end;
use crate::requests;
use crate::secure::{self, Who};

/// The RPC a failure happened in: its name for messages, and whether it writes (a write
/// that times out may still have been applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    LeaseGrant,
    CreateIfFree,
    Retake,
    Enqueue,
    Claim,
    LeaseRevoke,
    Delete,
    KeepAlive,
    Get,
    List,
    LeaseTimeToLive,
    Watch,
    Authenticate,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::LeaseGrant => "LeaseGrant",
            Self::CreateIfFree => "Txn (create if free)",
            Self::Retake => "Txn (same-owner retake)",
            Self::Enqueue => "Txn (join the queue)",
            Self::Claim => "Txn (claim a queue place)",
            Self::LeaseRevoke => "LeaseRevoke",
            Self::Delete => "DeleteRange",
            Self::KeepAlive => "LeaseKeepAlive",
            Self::Get => "Range",
            Self::List => "Range (list)",
            Self::LeaseTimeToLive => "LeaseTimeToLive",
            Self::Watch => "Watch",
            Self::Authenticate => "Authenticate",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Self::LeaseGrant
                | Self::CreateIfFree
                | Self::Retake
                | Self::Enqueue
                | Self::Claim
                | Self::LeaseRevoke
                | Self::Delete
        )
    }
}

/// Why an RPC failed: etcd's (or the channel's) error, or our own request timeout.
#[derive(Debug)]
pub(crate) enum Failure {
    Etcd(RpcError),
    TimedOut(Duration),
}

/// Maps a failed RPC to a lockcore error: THE place where etcd errors get their kind.
///
/// | etcd / gRPC | kind |
/// |---|---|
/// | Unavailable, DeadlineExceeded, Cancelled, Aborted, Unknown, Internal, our timeout, I/O | `OutcomeUnknown` for writes, `Unavailable` for reads |
/// | transport error (no connection), ResourceExhausted | `Unavailable` |
/// | PermissionDenied, Unauthenticated | `PermissionDenied` |
/// | InvalidArgument, OutOfRange | `InvalidInput` |
/// | NotFound, keep-alive "lease not found" | `Lost` (callers turn it into `Ok` where gone is fine) |
/// | FailedPrecondition, bad endpoint/URI/metadata | `Config` |
/// | Unimplemented | `Unsupported` |
/// | DataLoss, malformed reply | `Protocol` |
pub(crate) fn map_error(op: Op, failure: Failure) -> Error {
    let uncertain = if op.writes() {
        ErrorKind::OutcomeUnknown
    } else {
        ErrorKind::Unavailable
    };
    let (kind, detail) = match &failure {
        Failure::TimedOut(limit) => (uncertain, format!("no reply within {limit:?}")),
        Failure::Etcd(err) => (etcd_kind(err, uncertain), err.to_string()),
    };
    let error = Error::new(kind, format!("{}: {detail}", op.name())).with_backend("etcd");
    match failure {
        Failure::Etcd(err) => error.with_source(err),
        Failure::TimedOut(_) => error,
    }
}

fn etcd_kind(err: &RpcError, uncertain: ErrorKind) -> ErrorKind {
    use RpcError as E;
    match err {
        E::Status(status) => match status.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal => uncertain,
            Code::ResourceExhausted => ErrorKind::Unavailable,
            Code::PermissionDenied | Code::Unauthenticated => ErrorKind::PermissionDenied,
            Code::InvalidArgument | Code::OutOfRange | Code::AlreadyExists => {
                ErrorKind::InvalidInput
            }
            Code::NotFound => ErrorKind::Lost,
            Code::FailedPrecondition => ErrorKind::Config,
            Code::Unimplemented => ErrorKind::Unsupported,
            Code::DataLoss | Code::Ok => ErrorKind::Protocol,
        },
        E::LeaseKeepAlive(msg) if msg.contains("not found") => ErrorKind::Lost,
        E::Transport(_) => ErrorKind::Unavailable,
        E::LeaseKeepAlive(_) | E::Watch(_) | E::Internal(_) => uncertain,
        E::InvalidUri(_) | E::InvalidMetadataValue(_) => ErrorKind::Config,
    }
}

/// The outcome of the create-if-free transaction.
#[derive(Debug)]
pub(crate) enum Created {
    /// Our key was created: it is the only key, so it owns the lock.
    Won { revision: i64 },
    /// The lock has keys; `head` has the lowest create revision (the owner).
    Held { head: KeyValue },
}

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

    /// Connects every member at once, each within the connect timeout: TCP, the TLS
    /// handshake (with the server's first bytes, so a refused client certificate shows),
    /// authentication, and one Range on the key prefix (so a user without the RBAC
    /// permission is told now). Later RPCs start at a member that passed.
    ///
    /// # Errors
    /// When no member passes: the first TLS or authentication refusal
    /// ([`PermissionDenied`](ErrorKind::PermissionDenied)) or configuration error, else
    /// [`Unavailable`](ErrorKind::Unavailable) naming every member and why.
    pub(crate) async fn verify(&self) -> Result<()> {
        let checks = (0..self.members.len()).map(|index| self.verify_member(index));
        let results = futures_util::future::join_all(checks).await;
        if let Some(index) = results.iter().position(Result::is_ok) {
            self.current.store(index, Ordering::Relaxed);
            return Ok(());
        }
        let errors: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
        if let Some(refused) = errors.iter().find(|e| !e.is_temporary()) {
            return Err(
                Error::new(refused.kind(), refused.message().to_owned()).with_backend("etcd")
            );
        }
        let why: Vec<&str> = errors.iter().map(Error::message).collect();
        Err(Error::unavailable(format!(
            "no etcd member reachable within the connect timeout ({:?}): {}",
            self.connect_timeout,
            why.join("; ")
        ))
        .with_backend("etcd"))
    }

    async fn verify_member(&self, index: usize) -> Result<()> {
        let endpoint = &self.members[index].endpoint;
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, h)| h);
        let tls = self.tls.clone().map(|c| (c, self.client_certificate));
        let plaintext_hint = |e: Error| match self.tls {
            None if e.is_temporary() => Error::unavailable(format!(
                "{} (if the server only speaks TLS, use an `etcds://` URL)",
                e.message()
            )),
            _ => e,
        };
        let check = async {
            secure::check_transport(host_port, tls).await?;
            let client = self
                .member(index)
                .await
                .map_err(|e| plaintext_hint(self.map(Op::Authenticate, Failure::Etcd(e))))?;
            let range = requests::count(self.prefix.as_bytes());
            let count = |mut c: Connection, r| async move { Ok(c.kv.range(r).await?) };
            client
                .call(range, count)
                .await
                .map(drop)
                .map_err(|e| plaintext_hint(self.map(Op::Get, Failure::Etcd(e))))
        };
        let limit = self.connect_timeout;
        match tokio::time::timeout(limit, check).await {
            Ok(result) => result,
            Err(_) if self.tls.is_none() => Err(Error::unavailable(format!(
                "{endpoint}: no etcd answer within {limit:?} (if the server only speaks TLS, \
                 use an `etcds://` URL)"
            ))),
            Err(_) => Err(Error::unavailable(format!(
                "{endpoint}: no etcd answer within {limit:?}"
            ))),
        }
    }

    /// [`map_error`], with etcd's authentication and RBAC refusals worded for a person.
    fn map(&self, op: Op, failure: Failure) -> Error {
        if let Failure::Etcd(err) = &failure
            && let Some(refusal) = secure::refusal(err)
        {
            let message = self.who.explain(refusal, op.name(), &self.prefix);
            return Error::new(ErrorKind::PermissionDenied, message).with_backend("etcd");
        }
        map_error(op, failure)
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

    /// LeaseGrant: a new lease of `ttl_secs`; returns its id and the TTL etcd granted
    /// (etcd raises TTLs below its minimum, about 2 s with default election settings).
    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<(i64, i64)> {
        let request = LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        let grant =
            |mut c: Connection, r| async move { Ok(c.lease.lease_grant(r).await?.into_inner()) };
        let resp = self.call(Op::LeaseGrant, request, grant).await?;
        Ok((resp.id, resp.ttl))
    }

    /// One Txn: if no key exists under `prefix`, put `key` bound to `lease`; otherwise
    /// read the key with the lowest create revision.
    pub(crate) async fn create_if_free(
        &self,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<Created> {
        let free = requests::create_revision_of_prefix(prefix, CompareResult::Equal, 0);
        let txn = requests::txn(
            vec![free],
            vec![requests::put(key, value, lease)],
            vec![requests::range_op(requests::first_created(prefix))],
        );
        let resp = self.call(Op::CreateIfFree, txn, txn_rpc).await?;
        if resp.succeeded {
            return Ok(Created::Won {
                revision: revision_of(resp.header.as_ref(), Op::CreateIfFree)?,
            });
        }
        match resp.responses.into_iter().next().and_then(|op| op.response) {
            Some(Response::ResponseRange(mut get)) if !get.kvs.is_empty() => Ok(Created::Held {
                head: get.kvs.swap_remove(0),
            }),
            _ => Err(malformed(
                Op::CreateIfFree,
                "no owner key in the failure branch",
            )),
        }
    }

    /// One Txn: if `head` is unchanged, delete it, and if it was the only key under
    /// `prefix`, put `key` bound to `lease` in its place. Returns the new key's create
    /// revision when it was put.
    pub(crate) async fn retake(
        &self,
        prefix: &[u8],
        head: &KeyValue,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<Option<i64>> {
        let head_key = head.key.as_slice();
        let mut after_head = head_key.to_vec();
        after_head.push(0);
        let alone = vec![
            requests::create_revision(prefix, head_key.to_vec(), CompareResult::Equal, 0),
            requests::create_revision(&after_head, range_end(prefix), CompareResult::Equal, 0),
        ];
        let put = requests::txn(alone, vec![requests::put(key, value, lease)], Vec::new());
        let txn = requests::txn(
            vec![requests::mod_revision_is(head_key, head.mod_revision)],
            vec![requests::delete_op(head_key), requests::txn_op(put)],
            Vec::new(),
        );
        let resp = self.call(Op::Retake, txn, txn_rpc).await?;
        let put_done = resp.succeeded
            && resp.responses.iter().any(
                |op| matches!(&op.response, Some(Response::ResponseTxn(inner)) if inner.succeeded),
            );
        if !put_done {
            return Ok(None);
        }
        revision_of(resp.header.as_ref(), Op::Retake).map(Some)
    }

    /// LeaseRevoke: deletes every key bound to `lease` (ours: exactly our lock key). A lease
    /// that is already gone is not an error.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<()> {
        let request = LeaseRevokeRequest { id: lease };
        let revoke = |mut c: Connection, r| async move { Ok(c.lease.lease_revoke(r).await?) };
        match self.call(Op::LeaseRevoke, request, revoke).await {
            Err(err) if err.kind() == ErrorKind::Lost => Ok(()),
            other => other.map(drop),
        }
    }

    /// DeleteRange on one key; whether it existed.
    pub(crate) async fn delete(&self, key: &[u8]) -> Result<bool> {
        let request = requests::delete(key);
        let delete =
            |mut c: Connection, r| async move { Ok(c.kv.delete_range(r).await?.into_inner()) };
        Ok(self.call(Op::Delete, request, delete).await?.deleted > 0)
    }

    /// LeaseKeepAlive: one request and its reply on a keep-alive stream, which resets the
    /// lease's TTL on the leader. `Lost` when the lease no longer exists.
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<()> {
        let keep_alive = |c: Connection, id| c.keep_alive_once(id);
        self.call(Op::KeepAlive, lease, keep_alive).await
    }

    /// Range on one key (linearizable).
    pub(crate) async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let resp = self.call(Op::Get, requests::get(key), range_rpc).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// Range on `prefix`, lowest create revision first, one key: the owner.
    pub(crate) async fn head(&self, prefix: &[u8]) -> Result<Option<KeyValue>> {
        let request = requests::first_created(prefix);
        let resp = self.call(Op::Get, request, range_rpc).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// One page of a keys-only scan of `[from, range_end)` (linearizable): the keys, and
    /// whether more follow.
    pub(crate) async fn keys_page(
        &self,
        from: &[u8],
        range_end: &[u8],
        limit: i64,
    ) -> Result<(Vec<KeyValue>, bool)> {
        let request = requests::keys_page(from, range_end, limit);
        let resp = self.call(Op::List, request, range_rpc).await?;
        Ok((resp.kvs, resp.more))
    }

    /// LeaseTimeToLive: the remaining TTL, `None` when the lease is gone.
    pub(crate) async fn time_to_live(&self, lease: i64) -> Result<Option<Duration>> {
        let request = LeaseTimeToLiveRequest {
            id: lease,
            keys: false,
        };
        let ttl = |mut c: Connection, r| async move {
            Ok(c.lease.lease_time_to_live(r).await?.into_inner())
        };
        let resp = self.call(Op::LeaseTimeToLive, request, ttl).await?;
        Ok(u64::try_from(resp.ttl).ok().map(Duration::from_secs))
    }

    /// Watch: delete events under `prefix`, returned once etcd confirmed the watch exists
    /// (so no delete after this returns is missed).
    pub(crate) async fn watch_deletes(&self, prefix: &[u8]) -> Result<WatchStream> {
        let (key, range_end) = requests::prefix_range(prefix);
        let request = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key,
                range_end,
                filters: vec![FilterType::Noput.into()],
                ..WatchCreateRequest::default()
            })),
        };
        let start = |c: Connection, r| async move {
            let mut stream = c.watch(r).await?;
            let first = stream.message().await?;
            watch_started(first.as_ref())?;
            Ok(stream)
        };
        self.call(Op::Watch, request, start).await
    }
}

/// Whether a watch's first reply confirms it. etcd refuses a watch with a stale token not
/// by failing the RPC but by a cancel whose reason names the token: that becomes the
/// status it stands for, so [`Connection::call`](crate::grpc::Connection::call)
/// re-authenticates and repeats it once, as for any other RPC.
fn watch_started(first: Option<&WatchResponse>) -> Result<(), RpcError> {
    match first {
        Some(resp) if resp.created && !resp.canceled => Ok(()),
        Some(resp) if resp.cancel_reason.contains("invalid auth token") => Err(RpcError::Status(
            tonic::Status::unauthenticated(resp.cancel_reason.clone()),
        )),
        Some(resp) if !resp.cancel_reason.is_empty() => Err(RpcError::Watch(format!(
            "watch not created: {}",
            resp.cancel_reason
        ))),
        _ => Err(RpcError::Watch("watch not created".into())),
    }
}

/// Txn, for [`EtcdClient::call`].
pub(crate) async fn txn_rpc(mut c: Connection, txn: TxnRequest) -> Result<TxnResponse, RpcError> {
    Ok(c.kv.txn(txn).await?.into_inner())
}

/// Range, for [`EtcdClient::call`].
async fn range_rpc(mut c: Connection, range: RangeRequest) -> Result<RangeResponse, RpcError> {
    Ok(c.kv.range(range).await?.into_inner())
}

/// A random member to start with, so clients spread over the cluster.
fn random_index(members: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_usize(members);
    usize::try_from(hasher.finish() % members.max(1) as u64).unwrap_or(0)
}

pub(crate) fn revision_of(header: Option<&ResponseHeader>, op: Op) -> Result<i64> {
    header
        .map(|h| h.revision)
        .filter(|rev| *rev > 0)
        .ok_or_else(|| malformed(op, "the reply has no revision"))
}

pub(crate) fn malformed(op: Op, what: &str) -> Error {
    Error::new(ErrorKind::Protocol, format!("{}: {what}", op.name())).with_backend("etcd")
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
        ErrorKind::Config,
        "TLS requested, but backend-etcd was built without its `tls` feature",
    )
    .with_backend("etcd"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use RpcError as E;

    fn status(code: Code) -> Failure {
        Failure::Etcd(E::Status(tonic::Status::new(code, "x")))
    }

    /// etcd answers a watch with a stale token by a cancel, not a failed RPC: that must
    /// read as the invalid token it is, so the call re-authenticates and repeats it.
    #[test]
    fn a_watch_cancelled_for_its_token_asks_for_a_new_token() {
        let created = WatchResponse {
            created: true,
            ..WatchResponse::default()
        };
        assert!(watch_started(Some(&created)).is_ok());
        let stale = WatchResponse {
            created: true,
            canceled: true,
            cancel_reason:
                "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token".into(),
            ..WatchResponse::default()
        };
        match watch_started(Some(&stale)) {
            Err(E::Status(s)) => assert!(crate::grpc::is_invalid_token(&s), "{s:?}"),
            other => panic!("expected an invalid-token status: {other:?}"),
        }
        let denied = WatchResponse {
            created: true,
            canceled: true,
            cancel_reason: "etcdserver: permission denied".into(),
            ..WatchResponse::default()
        };
        match watch_started(Some(&denied)) {
            Err(E::Watch(why)) => assert!(why.contains("permission denied"), "{why}"),
            other => panic!("expected the reason in the error: {other:?}"),
        }
        assert!(matches!(watch_started(None), Err(E::Watch(_))));
    }

    fn kind(op: Op, failure: Failure) -> ErrorKind {
        let err = map_error(op, failure);
        assert_eq!(err.backend(), Some("etcd"));
        assert!(err.to_string().contains(op.name()), "{err}");
        err.kind()
    }

    #[test]
    fn errors_map_by_code_and_by_whether_the_rpc_writes() {
        use ErrorKind::*;
        let second = Duration::from_secs(1);
        assert_eq!(
            kind(Op::CreateIfFree, status(Code::Unavailable)),
            OutcomeUnknown
        );
        assert_eq!(
            kind(Op::Retake, status(Code::DeadlineExceeded)),
            OutcomeUnknown
        );
        assert_eq!(
            kind(Op::LeaseRevoke, Failure::TimedOut(second)),
            OutcomeUnknown
        );
        assert_eq!(kind(Op::Get, status(Code::Unavailable)), Unavailable);
        assert_eq!(kind(Op::Get, Failure::TimedOut(second)), Unavailable);
        assert_eq!(kind(Op::Get, status(Code::ResourceExhausted)), Unavailable);
        assert_eq!(
            kind(Op::Get, status(Code::PermissionDenied)),
            PermissionDenied
        );
        assert_eq!(
            kind(Op::Get, status(Code::Unauthenticated)),
            PermissionDenied
        );
        assert_eq!(
            kind(Op::CreateIfFree, status(Code::InvalidArgument)),
            InvalidInput
        );
        assert_eq!(kind(Op::LeaseRevoke, status(Code::NotFound)), Lost);
        assert_eq!(kind(Op::Get, status(Code::Unimplemented)), Unsupported);
        assert_eq!(kind(Op::Get, status(Code::FailedPrecondition)), Config);
        let gone = Failure::Etcd(E::LeaseKeepAlive("lease not found".into()));
        assert_eq!(kind(Op::KeepAlive, gone), Lost);
        let bad = Failure::Etcd(E::InvalidUri("invalid authority".into()));
        assert_eq!(kind(Op::Get, bad), Config);
        let unanswered = Failure::Etcd(E::Watch("failed to create lease keeper".into()));
        assert_eq!(kind(Op::KeepAlive, unanswered), Unavailable);
        assert!(map_error(Op::Get, status(Code::Unavailable)).is_temporary());
        assert!(!map_error(Op::Get, status(Code::PermissionDenied)).is_temporary());
    }
}

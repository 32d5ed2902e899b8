//! The gRPC connection to one etcd member, on the clients generated from etcd's API
//! (`anylock-etcd-proto`): the channel (TLS, HTTP/2 keep-alive, connect timeout), the
//! `hasleader` and `token` request headers, authentication, and the one retry etcd's token
//! expiry calls for.
//!
//! It does what the etcd-client crate did for us before (same channel settings, same
//! headers, same token refresh), without compiling `.proto` files at build time.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anylock_etcd_proto::etcdserverpb::auth_client::AuthClient;
use anylock_etcd_proto::etcdserverpb::kv_client::KvClient;
use anylock_etcd_proto::etcdserverpb::lease_client::LeaseClient;
use anylock_etcd_proto::etcdserverpb::watch_client::WatchClient;
use anylock_etcd_proto::etcdserverpb::{AuthenticateRequest, WatchRequest, WatchResponse};
use tonic::codegen::http::Uri;
use tonic::metadata::{Ascii, AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, channel::Change};
use tonic::{Code, GrpcMethod, Status, Streaming};

/// The channel every client of a connection shares: one member, our headers added.
pub(crate) type Svc = InterceptedService<Channel, Headers>;

/// An authentication token, as sent in the `token` header.
type Token = MetadataValue<Ascii>;

/// The message etcd answers an invalid or expired token with (etcd's
/// `api/v3rpc/rpctypes/error.go`). Lock and Election lose the status code (`Unknown`).
const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";
/// etcd's answer to a JWT minted before the latest change to users or roles.
const AUTH_REVISION_OLD: &str = "etcdserver: revision of auth store is old";
/// etcd's answer to a request whose token it could not map to a user.
const USER_EMPTY: &str = "etcdserver: user name is empty";

/// Why an etcd call failed, short of our own timeout. Worded as etcd-client worded them,
/// so messages stay what users have seen.
#[derive(Debug)]
pub(crate) enum RpcError {
    /// The server (or tonic on its behalf, e.g. connection refused) answered with a status.
    Status(Status),
    /// The channel could not be built (TLS configuration).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Transport(tonic::transport::Error),
    /// The endpoint is not a URI.
    InvalidUri(String),
    /// etcd's token is not a valid header value.
    InvalidMetadataValue(String),
    /// A keep-alive stream failed, or its reply says the lease does not exist.
    LeaseKeepAlive(String),
    /// A watch (or keep-alive) stream ended before its first reply.
    Watch(String),
    /// The channel's own machinery failed.
    Internal(String),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(e) => write!(f, "grpc request error: {e}"),
            Self::Transport(e) => write!(f, "transport error: {e}"),
            Self::InvalidUri(e) => write!(f, "invalid uri: {e}"),
            Self::InvalidMetadataValue(e) => write!(f, "invalid metadata value: {e}"),
            Self::LeaseKeepAlive(e) => write!(f, "lease keep alive error: {e}"),
            Self::Watch(e) => write!(f, "watch error: {e}"),
            Self::Internal(e) => write!(f, "internal error: {e}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

/// How to connect: the channel settings shared by every member.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) connect_timeout: Duration,
    pub(crate) credentials: Option<(String, String)>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Adds `hasleader: true` to every request (etcd then refuses requests on a member that
/// lost its leader, instead of letting them hang), and the token to etcd's RPCs except
/// `Authenticate`.
#[derive(Clone)]
pub(crate) struct Headers {
    token: Arc<RwLock<Option<Token>>>,
}

impl tonic::service::Interceptor for Headers {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let etcd_rpc = request.extensions().get::<GrpcMethod>().is_some_and(|m| {
            let authenticate = (m.service(), m.method()) == ("etcdserverpb.Auth", "Authenticate");
            !authenticate
                && ["etcdserverpb", "v3electionpb", "v3lockpb"]
                    .iter()
                    .any(|s| m.service().starts_with(s))
        });
        if etcd_rpc
            && let Some(token) = self
                .token
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        {
            request.metadata_mut().append("token", token);
        }
        request
            .metadata_mut()
            .append("hasleader", AsciiMetadataValue::from_static("true"));
        Ok(request)
    }
}

/// One member's channel, token and endpoint list, cheap to clone (one `Arc`). Each RPC
/// makes the one client it needs from the channel, always through the accessors below
/// ([`kv`](Self::kv), [`lease`](Self::lease), `watch_client`, `auth_client`), which hold
/// every client's limits: a call clones the channel once, not once per kind of client.
#[derive(Clone)]
pub(crate) struct Connection(Arc<Shared>);

/// What a member's connection and its clones share.
struct Shared {
    svc: Svc,
    session: Session,
    /// The balanced channel's endpoint list, kept open for the connection's life (tonic
    /// 0.14 would keep serving a closed list's endpoints too; this does not rely on it).
    _endpoints: tokio::sync::mpsc::Sender<Change<Uri, Endpoint>>,
}

/// The credentials and the token they bought; refreshes are one at a time.
struct Session {
    credentials: Option<(String, String)>,
    token: Arc<RwLock<Option<Token>>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Connection {
    /// Builds the channel to `endpoint` (connecting lazily, on the first RPC) and, with
    /// credentials, authenticates.
    ///
    /// # Errors
    /// A bad endpoint or TLS configuration; a failed `Authenticate`.
    pub(crate) async fn connect(endpoint: &str, settings: &Settings) -> Result<Self, RpcError> {
        let endpoint = build_endpoint(endpoint, settings)?;
        // A balanced channel of one endpoint, as etcd-client made: it reconnects in the
        // background and fails RPCs fast while the member is down.
        let (channel, endpoints) = Channel::balance_channel(64);
        endpoints
            .send(Change::Insert(endpoint.uri().clone(), endpoint))
            .await
            .map_err(|_| {
                RpcError::Internal("failed to insert endpoint into the balanced channel".into())
            })?;
        let token = Arc::new(RwLock::new(None));
        let svc = InterceptedService::new(
            channel,
            Headers {
                token: Arc::clone(&token),
            },
        );
        let connection = Self(Arc::new(Shared {
            svc,
            session: Session {
                credentials: settings.credentials.clone(),
                token,
                refreshing: tokio::sync::Mutex::new(()),
            },
            _endpoints: endpoints,
        }));
        connection.authenticate().await?;
        Ok(connection)
    }

    /// A KV client on this member's channel.
    pub(crate) fn kv(&self) -> KvClient<Svc> {
        KvClient::new(self.0.svc.clone()).max_decoding_message_size(MAX_KV_REPLY)
    }

    /// A Lease client on this member's channel (tonic's default bound per reply).
    pub(crate) fn lease(&self) -> LeaseClient<Svc> {
        LeaseClient::new(self.0.svc.clone())
    }

    /// A Watch client on this member's channel (tonic's default bound per reply).
    fn watch_client(&self) -> WatchClient<Svc> {
        WatchClient::new(self.0.svc.clone())
    }

    /// An Auth client on this member's channel.
    fn auth_client(&self) -> AuthClient<Svc> {
        AuthClient::new(self.0.svc.clone())
    }

    fn session(&self) -> &Session {
        &self.0.session
    }

    /// Runs `rpc`; when it fails because etcd no longer accepts our token (it expired, or
    /// the member restarted), authenticates again and runs it once more.
    pub(crate) async fn call<R, T, F, Fut>(&self, request: R, rpc: F) -> Result<T, RpcError>
    where
        R: Clone,
        F: Fn(Self, R) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        if self.session().credentials.is_none() {
            return rpc(self.clone(), request).await;
        }
        let sent_with = self.token();
        match rpc(self.clone(), request.clone()).await {
            Err(RpcError::Status(status)) if is_invalid_token(&status) => {
                self.refresh_if_stale(sent_with).await?;
                rpc(self.clone(), request).await
            }
            other => other,
        }
    }

    fn token(&self) -> Option<Token> {
        let token = self.session().token.read();
        token.unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Authenticates again unless a concurrent call already replaced `stale`.
    async fn refresh_if_stale(&self, stale: Option<Token>) -> Result<(), RpcError> {
        let _one_at_a_time = self.session().refreshing.lock().await;
        if self.token() != stale {
            return Ok(());
        }
        self.authenticate().await
    }

    /// `Authenticate` with our credentials and keep the token; without credentials, none.
    async fn authenticate(&self) -> Result<(), RpcError> {
        let token = match &self.session().credentials {
            Some((name, password)) => {
                let request = AuthenticateRequest {
                    name: name.clone(),
                    password: password.clone(),
                };
                let reply = self.auth_client().authenticate(request).await?.into_inner();
                let token = reply
                    .token
                    .parse::<Token>()
                    .map_err(|e| RpcError::InvalidMetadataValue(e.to_string()))?;
                Some(token)
            }
            None => None,
        };
        *self
            .session()
            .token
            .write()
            .unwrap_or_else(PoisonError::into_inner) = token;
        Ok(())
    }

    /// Whether `self` and `other` are clients of the same channel (one member's
    /// connection and its clones).
    pub(crate) fn same_channel(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Opens a watch stream and sends `requests` on it.
    pub(crate) async fn watch(self, requests: Vec<WatchRequest>) -> Result<WatchStream, RpcError> {
        let (sender, stream) = request_stream::<WatchRequest>();
        for request in requests {
            sender
                .send(request)
                .await
                .map_err(|e| RpcError::Watch(e.to_string()))?;
        }
        let requests = stream;
        let replies = self.watch_client().watch(requests).await?.into_inner();
        Ok(WatchStream {
            _requests: sender,
            replies,
        })
    }
}

/// A watch: its replies, and the request side, held open (closing it ends the watch).
#[derive(Debug)]
pub(crate) struct WatchStream {
    _requests: tokio::sync::mpsc::Sender<WatchRequest>,
    replies: Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next reply; `None` when etcd ended the stream.
    pub(crate) async fn message(&mut self) -> Result<Option<WatchResponse>, RpcError> {
        Ok(self.replies.message().await?)
    }
}

/// A request stream for a bidirectional RPC, and the sender that feeds it.
fn request_stream<T: Send + 'static>() -> (
    tokio::sync::mpsc::Sender<T>,
    impl futures_util::Stream<Item = T> + Send + 'static,
) {
    let (sender, receiver) = tokio::sync::mpsc::channel::<T>(100);
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    (sender, stream)
}

/// Whether etcd refused the token (not the user): it expired, the member forgot it, or
/// (JWT tokens) it names an auth-store revision older than the store's after any user or
/// role change. Go's clientv3 re-authenticates on the same three. A request refused so
/// was not applied, so repeating it once is safe.
pub(crate) fn is_invalid_token(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message() == INVALID_AUTH_TOKEN,
        Code::InvalidArgument => {
            status.message() == AUTH_REVISION_OLD || status.message() == USER_EMPTY
        }
        _ => false,
    }
}

/// How many streams the client resets itself (an RPC abandoned at its timeout, a dropped
/// watch) HTTP/2 remembers, and for how long. A frame the server sends on a remembered
/// reset stream is ignored; one on a forgotten stream counts toward h2's limit of 1,024
/// "local error resets" over the connection's whole life, after which h2 closes the
/// channel (`too_many_internal_resets`) and every RPC on it fails at once. h2's defaults
/// (50 streams, 1 s) forget a stream before a late reply to an RPC abandoned at our
/// timeout arrives; these outlast any request timeout, so our own resets never count.
const RESET_STREAMS_REMEMBERED: usize = 4096;
const RESET_STREAMS_FOR: Duration = Duration::from_secs(60);

/// The largest KV reply read (gRPC's default is 4 MiB). A semaphore's attempt reads all
/// its slots in one Range: 10,000 permits (lockcore's most) with 512-byte notes and long
/// names are up to about 30 MB; other replies are far smaller.
/// tonic's bound on one decoded gRPC message where none is set (the Lease, Watch and
/// Auth clients).
pub(crate) const MAX_TONIC_REPLY: usize = 4 * 1024 * 1024;

pub(crate) const MAX_KV_REPLY: usize = 64 * 1024 * 1024;

/// The endpoint for `url` (`http://` or, with TLS, `https://`): HTTP/2 keep-alive pings
/// every 10 s (also when idle), 5 s to answer, the connect timeout, and reset streams
/// remembered long enough (see [`RESET_STREAMS_REMEMBERED`]).
fn build_endpoint(url: &str, settings: &Settings) -> Result<Endpoint, RpcError> {
    let uri: Uri = url
        .parse()
        .map_err(|e: tonic::codegen::http::uri::InvalidUri| RpcError::InvalidUri(e.to_string()))?;
    let endpoint = Channel::builder(uri);
    #[cfg(feature = "tls")]
    let endpoint = match &settings.tls {
        Some(tls) if url.starts_with("https://") => endpoint
            .tls_config(tls.clone())
            .map_err(RpcError::Transport)?,
        _ => endpoint,
    };
    Ok(endpoint
        .keep_alive_while_idle(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .http2_max_concurrent_reset_streams(RESET_STREAMS_REMEMBERED)
        .http2_reset_stream_duration(RESET_STREAMS_FOR)
        .connect_timeout(settings.connect_timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_of(service: &'static str, method: &'static str) -> tonic::metadata::MetadataMap {
        let mut headers = Headers {
            token: Arc::new(RwLock::new(Some("secret".parse().expect("token")))),
        };
        let mut request = tonic::Request::new(());
        request
            .extensions_mut()
            .insert(GrpcMethod::new(service, method));
        let request = tonic::service::Interceptor::call(&mut headers, request).expect("call");
        request.metadata().clone()
    }

    #[test]
    fn the_token_goes_to_etcd_rpcs_but_not_to_authenticate() {
        for (service, method) in [
            ("etcdserverpb.KV", "Range"),
            ("etcdserverpb.Lease", "LeaseKeepAlive"),
            ("etcdserverpb.Watch", "Watch"),
            ("v3lockpb.Lock", "Lock"),
        ] {
            let headers = headers_of(service, method);
            assert_eq!(
                headers.get("token").map(|t| t.to_str().ok()),
                Some(Some("secret"))
            );
            assert_eq!(
                headers.get("hasleader").map(|t| t.to_str().ok()),
                Some(Some("true"))
            );
        }
        for (service, method) in [
            ("etcdserverpb.Auth", "Authenticate"),
            ("grpc.health.v1.Health", "Check"),
        ] {
            let headers = headers_of(service, method);
            assert!(headers.get("token").is_none(), "{service}/{method}");
            assert!(headers.get("hasleader").is_some());
        }
    }

    #[test]
    fn an_expired_token_is_told_from_a_refused_user() {
        assert!(is_invalid_token(&Status::unauthenticated(
            "etcdserver: invalid auth token"
        )));
        assert!(is_invalid_token(&Status::unknown(INVALID_AUTH_TOKEN)));
        assert!(is_invalid_token(&Status::invalid_argument(
            AUTH_REVISION_OLD
        )));
        assert!(is_invalid_token(&Status::invalid_argument(USER_EMPTY)));
        assert!(!is_invalid_token(&Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(!is_invalid_token(&Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(!is_invalid_token(&Status::permission_denied(
            "etcdserver: permission denied"
        )));
    }
}

//! The server handle and the accept loop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::auth::{Grant, TOKEN_PATH};
use crate::fault::{Clock, ClockOffset, Fault};
use crate::federation::{IAM_PREFIX, OIDC_PATH, STS_PATH};
use crate::handler;
use crate::shared::{RequestRecord, Shared};

/// A running in-memory GCS JSON-API server. It stops when dropped.
///
/// Buckets must exist before objects are written to them, as on GCS (404
/// otherwise): create them with [`create_bucket`](Self::create_bucket) or
/// `POST /storage/v1/b` with `{"name": …}`.
#[derive(Debug)]
pub struct GcsTestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl GcsTestServer {
    /// Starts a server on `127.0.0.1` on a free port.
    ///
    /// # Panics
    /// If no loopback port can be bound (a test-environment failure).
    pub async fn start() -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::bind(addr)
            .await
            .expect("bind the GCS test server to 127.0.0.1")
    }

    /// Starts a server on `addr` (port 0: a free port).
    ///
    /// # Errors
    /// When the address cannot be bound.
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            base_url: format!("http://{addr}"),
            store: Mutex::default(),
            faults: Mutex::default(),
            log: Mutex::default(),
            clock: Clock::default(),
            auth: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// The base URL, e.g. `http://127.0.0.1:40123`: the JSON API lives
    /// under it, so it works as `STORAGE_EMULATOR_HOST`.
    pub fn url(&self) -> String {
        self.shared.base_url.clone()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Creates a bucket; returns false if it already existed.
    pub fn create_bucket(&self, name: &str) -> bool {
        let now = self.shared.clock.now();
        let mut store = self
            .shared
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        store.create_bucket(name, now).is_ok()
    }

    /// Injects a fault; it applies to requests that arrive from now on.
    pub fn inject(&self, fault: Fault) {
        self.shared.inject(fault);
    }

    /// Removes every fault: pending 503s and lost replies, the delay and the rate limit.
    pub fn clear_faults(&self) {
        self.shared.clear_faults();
    }

    /// Shifts the server's clock (for `updated`, `timeCreated`, the `Date`
    /// header and new generations) relative to the machine's.
    pub fn set_clock_offset(&self, offset: ClockOffset) {
        self.shared.clock.set(offset);
    }

    /// From now on, API requests need `Authorization: Bearer <token>` with a
    /// token granted by [`token_url`](Self::token_url) or passed to
    /// [`allow_token`](Self::allow_token); others get GCS's 401.
    pub fn require_auth(&self) {
        self.shared.auth().required = true;
    }

    /// Accepts `token` as a bearer token (a static token, as from
    /// `gcloud auth print-access-token`).
    pub fn allow_token(&self, token: &str) {
        let grant = Grant {
            expires: None,
            storage: true,
            federated: false,
        };
        self.shared.auth().tokens.insert(token.to_owned(), grant);
    }

    /// The OAuth2 token endpoint's URL, for a service-account key's
    /// `token_uri`.
    pub fn token_url(&self) -> String {
        format!("{}{TOKEN_PATH}", self.shared.base_url)
    }

    /// A service-account key file's JSON whose `token_uri` is this server's
    /// token endpoint, with a fresh 2048-bit RSA key made by the `openssl`
    /// command (which must be on `PATH`).
    ///
    /// # Panics
    /// When `openssl` is missing or fails (a test-environment failure).
    pub fn service_account_key_json(&self) -> String {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .expect("run openssl (scripts/servers install installs it)");
        assert!(out.status.success(), "openssl genpkey failed");
        let pem = String::from_utf8(out.stdout).expect("PEM is ASCII");
        json!({
            "type": "service_account",
            "project_id": "anylock-test",
            "private_key_id": "0123456789abcdef",
            "private_key": pem,
            "client_email": "locks@anylock-test.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": self.token_url(),
        })
        .to_string()
    }

    /// How many tokens the token endpoint has granted.
    pub fn tokens_granted(&self) -> u64 {
        self.shared.auth().granted
    }

    /// Grants every token from now on (service-account, STS and impersonated)
    /// with this lifetime, reported in whole seconds (default 3599 s), so a
    /// test can watch a client renew a token within seconds. A token past its
    /// lifetime gets GCS's 401.
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.shared.auth().lifetime = lifetime;
    }

    /// Forgets every token granted or allowed so far: the next API call with
    /// one gets 401, as after a revocation.
    pub fn revoke_tokens(&self) {
        self.shared.auth().tokens.clear();
    }

    /// Trusts a workload identity pool provider: the STS endpoint exchanges
    /// `subject_token` for `audience`, and its tokens work on the storage API
    /// unless [`require_impersonation`](Self::require_impersonation) is set.
    /// Calling it again rotates the subject token: the old one is refused.
    pub fn trust_workload_identity(&self, audience: &str, subject_token: &str) {
        let mut auth = self.shared.auth();
        auth.federation.audience = Some(audience.to_owned());
        auth.federation.subject_token = Some(subject_token.to_owned());
    }

    /// Makes federated tokens good only for impersonating `service_account`
    /// (an email) through [`impersonation_url`](Self::impersonation_url), as
    /// when the pool's principal has no bucket role of its own.
    pub fn require_impersonation(&self, service_account: &str) {
        self.shared.auth().federation.service_account = Some(service_account.to_owned());
    }

    /// Serves the current subject token at [`oidc_url`](Self::oidc_url) to
    /// callers with `Authorization: Bearer <request_token>`, as GitHub's
    /// `ACTIONS_ID_TOKEN_REQUEST_URL` does.
    pub fn serve_subject_token(&self, request_token: &str) {
        self.shared.auth().federation.oidc_request_token = Some(request_token.to_owned());
    }

    /// The STS token-exchange endpoint's URL (an `external_account` file's
    /// `token_url`).
    pub fn sts_url(&self) -> String {
        format!("{}{STS_PATH}", self.shared.base_url)
    }

    /// The generateAccessToken URL for `service_account` (an
    /// `external_account` file's `service_account_impersonation_url`).
    pub fn impersonation_url(&self, service_account: &str) -> String {
        format!(
            "{}{IAM_PREFIX}{service_account}:generateAccessToken",
            self.shared.base_url
        )
    }

    /// The OIDC endpoint's URL (a `url` credential source).
    pub fn oidc_url(&self) -> String {
        format!("{}{OIDC_PATH}", self.shared.base_url)
    }

    /// An `external_account` credential file for the trusted provider (see
    /// [`trust_workload_identity`](Self::trust_workload_identity)) with this
    /// `credential_source`, impersonating the required service account if
    /// any, as `google-github-actions/auth` writes it.
    pub fn external_account_json(&self, credential_source: Value) -> Value {
        let auth = self.shared.auth();
        let mut file = json!({
            "type": "external_account",
            "audience": auth.federation.audience.clone().unwrap_or_default(),
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": self.sts_url(),
            "credential_source": credential_source,
        });
        if let Some(account) = &auth.federation.service_account {
            file["service_account_impersonation_url"] = json!(self.impersonation_url(account));
        }
        file
    }

    /// How many subject tokens the STS endpoint has exchanged.
    pub fn token_exchanges(&self) -> u64 {
        self.shared.auth().federation.exchanges
    }

    /// How many service-account tokens generateAccessToken has issued.
    pub fn impersonations(&self) -> u64 {
        self.shared.auth().federation.impersonations
    }

    /// Every API request so far, in the order they completed.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests()
    }

    /// Empties the request log (and starts [`most_in_flight`](Self::most_in_flight) again
    /// from the requests in flight now).
    pub fn clear_requests(&self) {
        self.shared.clear_requests();
    }

    /// The most API requests handled at once (an injected [`Fault::Delay`] included) since
    /// the server started or the log was last cleared: over HTTP/1.1, the most
    /// connections a client kept busy together.
    pub fn most_in_flight(&self) -> usize {
        self.shared.most_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for GcsTestServer {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every
        // connection task.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, Arc::clone(&shared)));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let service = service_fn(move |request| handler::handle(Arc::clone(&shared), request));
    // A connection error (client went away) ends only this connection.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

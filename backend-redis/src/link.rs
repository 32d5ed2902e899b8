//! One server's connections, opened by this crate so every byte read passes a
//! [`Bounded`] stream: [`Connector`] opens them (TCP, then TLS with `anylock-tls`'s rustls
//! configuration, then the `redis` crate's handshake: `HELLO`/`AUTH`, `SELECT`), and
//! [`Link`] is the shared command connection that is opened on first use and again after
//! it breaks.
//!
//! [`Link`] replaces the `redis` crate's `ConnectionManager`, which can only open
//! connections itself (no hook to wrap the stream; see [`Bounded`]). It keeps the
//! manager's behaviour as this crate used it (no retries, lazy, one shared connection
//! attempt at a time): a call that finds the connection broken fails, and the next call
//! opens a new one.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::bounded::{Bounded, Cut};
use crate::frames::Limits;
use crate::limits::into_redis_error;

/// A byte stream to a server: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// How to open a connection to one server. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Connector {
    host: String,
    port: u16,
    info: redis::RedisConnectionInfo,
    #[cfg(feature = "tls")]
    tls: Option<Arc<rustls::ClientConfig>>,
    timeout: Duration,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Connections to `host:port` with the handshake `info` asks for (credentials,
    /// database, protocol), over TLS when `tls` is given, each bounded by `timeout` from
    /// the TCP connect to the end of the handshake.
    pub(crate) fn new(
        (host, port): (String, u16),
        info: redis::RedisConnectionInfo,
        #[cfg(feature = "tls")] tls: Option<Arc<rustls::ClientConfig>>,
        timeout: Duration,
    ) -> Self {
        Self {
            host,
            port,
            info,
            #[cfg(feature = "tls")]
            tls,
            timeout,
        }
    }

    /// The stream to the server, TLS established, wrapped in [`Bounded`].
    async fn stream(&self, limits: Limits, cut: Cut) -> RedisResult<Bounded<Box<dyn Io>>> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        #[cfg(feature = "tls")]
        if let Some(config) = &self.tls {
            let name = rustls::pki_types::ServerName::try_from(self.host.clone())?;
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
            let tls = connector.connect(name, tcp).await?;
            return Ok(Bounded::new(Box::new(tls), limits, cut));
        }
        Ok(Bounded::new(Box::new(tcp), limits, cut))
    }

    /// `attempt` within the connect timeout.
    async fn within<T>(&self, attempt: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(done) => done,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    /// A new multiplexed command connection (no response timeout: every call bounds its
    /// own wait; the client would apply one to a pipeline's whole request).
    async fn command(&self) -> RedisResult<Live> {
        let cut = Cut::default();
        let open = async {
            let stream = self.stream(Limits::REPLIES, Arc::clone(&cut)).await?;
            let config = AsyncConnectionConfig::new().set_response_timeout(None);
            MultiplexedConnection::new_with_config(&self.info, stream, config).await
        };
        let (conn, driver) = self.within(open).await?;
        tokio::spawn(driver);
        Ok(Live { conn, cut })
    }

    /// A new pub/sub connection (each message bounded like a reply); the caller bounds
    /// the wait.
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        let stream = self.stream(Limits::MESSAGES, Cut::default()).await?;
        PubSub::new(&self.info, stream).await
    }
}

/// An open command connection and why it was cut, if it was.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    cut: Cut,
}

type Opening = Shared<BoxFuture<'static, RedisResult<Live>>>;

/// The current connection attempt (or connection) and its number.
struct Slot {
    generation: u64,
    opening: Opening,
}

/// The shared command connection of one server. Clones share it.
#[derive(Clone)]
pub(crate) struct Link {
    connector: Arc<Connector>,
    slot: Arc<Mutex<Slot>>,
    db: i64,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

fn opening(connector: &Arc<Connector>) -> Opening {
    let connector = Arc::clone(connector);
    async move { connector.command().await }.boxed().shared()
}

impl Link {
    /// A link that connects on first use (no I/O here).
    pub(crate) fn lazy(connector: Arc<Connector>) -> Self {
        let db = connector.info.db();
        let slot = Slot {
            generation: 0,
            opening: opening(&connector),
        };
        Self {
            connector,
            slot: Arc::new(Mutex::new(slot)),
            db,
        }
    }

    fn current(&self) -> (u64, Opening) {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        (slot.generation, slot.opening.clone())
    }

    /// Drops connection `generation` (failed to open, or broken): the next call opens a
    /// new one. A newer connection is kept.
    fn forget(&self, generation: u64) {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.generation == generation {
            slot.generation += 1;
            slot.opening = opening(&self.connector);
        }
    }

    /// Runs `call` on the current connection; a broken connection is forgotten, and an
    /// error caused by a reply over the limits is reported as that refusal.
    async fn with<'a, T>(
        &'a self,
        call: impl FnOnce(MultiplexedConnection) -> BoxFuture<'a, RedisResult<T>>,
    ) -> RedisResult<T> {
        let (generation, opening) = self.current();
        let live = match opening.await {
            Ok(live) => live,
            Err(err) => {
                self.forget(generation);
                return Err(err);
            }
        };
        let result = call(live.conn).await;
        match (result, live.cut.get()) {
            // Cut by a refusal (an I/O error the client would retry on the same
            // connection, which is closing).
            (Err(_), Some(&cut)) => {
                self.forget(generation);
                Err(into_redis_error(cut))
            }
            (Err(err), None) if err.is_unrecoverable_error() => {
                self.forget(generation);
                Err(err)
            }
            (other, _) => other,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let this = &*self;
        this.with(move |mut conn| async move { conn.send_packed_command(cmd).await }.boxed())
            .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let this = &*self;
        this.with(move |mut conn| {
            async move { conn.send_packed_commands(pipeline, offset, count).await }.boxed()
        })
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

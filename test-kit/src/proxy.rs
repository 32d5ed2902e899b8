//! A TCP fault-injection proxy for simulating network faults on loopback.
//!
//! [`FaultProxy`] listens on a local address and forwards every accepted
//! connection to an upstream server (for example a Redis or PostgreSQL
//! instance). Point a lock client at [`FaultProxy::local_addr`] instead of the
//! server, then switch the [`Fault`] at runtime with [`FaultProxy::set_fault`]
//! (or a cloned [`FaultHandle`]). A fault change takes effect immediately on
//! new *and* existing connections.
//!
//! # Fault semantics
//!
//! * [`Fault::Pass`]: bytes flow both ways unchanged.
//! * [`Fault::Delay`]: a delay line. Every chunk, in both directions, is
//!   delivered `d` after the proxy read it, preserving order per direction.
//!   Chunks read while earlier ones are still waiting are queued with their
//!   arrival time, so a delay adds latency without throttling throughput.
//!   The delay is evaluated at delivery time: switching from `Delay(10s)` to
//!   `Pass` releases queued chunks at once.
//! * [`Fault::Blackhole`]: a network partition. Connections stay open and new
//!   ones are still accepted, but nothing is forwarded in either direction;
//!   data (and end-of-stream) arriving while blackholed is *discarded*, as lost
//!   packets would be. Because a byte stream with a hole in it would corrupt
//!   any protocol, every connection that lost data or an end-of-stream during
//!   the blackhole is **reset** (closed with `RST` on both sides) as soon as the
//!   fault changes to anything other than `Blackhole`, so clients reconnect
//!   cleanly. Connections that stayed idle through the blackhole survive.
//!   (Connections accepted during a blackhole are still connected upstream;
//!   only their data is affected.)
//! * [`Fault::Reset`]: every existing connection is closed abruptly with `RST`
//!   on both sides (`SO_LINGER` = 0), and new connections are accepted and
//!   immediately reset without contacting the upstream.
//!
//! Faults act on data only: accepting and the upstream connect are never
//! delayed. Independently of the fault: a failed upstream connect resets the
//! client connection; an end-of-stream from one side is forwarded as a
//! half-close (`shutdown(Write)`) to the other once queued data is delivered;
//! an I/O error on either side resets both.
//!
//! # Lifecycle
//!
//! [`FaultProxy::shutdown`] stops listening, closes every proxied connection
//! and waits until all proxy tasks have finished, so [`FaultProxy::connections`]
//! is 0 when it returns. Dropping the [`FaultProxy`] starts the same shutdown in
//! the background; no task outlives it for long.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Largest chunk read from either side in one go.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued per direction before the proxy stops reading (back-pressure).
const QUEUE_CHUNKS: usize = 256;
/// Pause after a failed `accept` so persistent errors (e.g. `EMFILE`) do not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The network fault a [`FaultProxy`] currently simulates.
///
/// See the [module documentation](self) for the exact semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Forward bytes unchanged in both directions.
    #[default]
    Pass,
    /// Deliver every chunk this long after it arrived (a delay line, both directions).
    Delay(Duration),
    /// Forward nothing and discard what arrives; connections that lost data
    /// are reset when the blackhole ends.
    Blackhole,
    /// Reset every existing connection and every newly accepted one.
    Reset,
}

/// Counters of a [`FaultProxy`] since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Client connections accepted (including ones reset right away).
    pub accepted: u64,
    /// Bytes delivered from clients to the upstream.
    pub bytes_up: u64,
    /// Bytes delivered from the upstream to clients.
    pub bytes_down: u64,
    /// Bytes discarded because of [`Fault::Blackhole`].
    pub bytes_dropped: u64,
    /// Connections the proxy closed with `RST` (faults, failed upstream connects, I/O errors).
    pub resets: u64,
}

/// State shared by the handles, the accept task and the connection tasks.
#[derive(Debug)]
struct Shared {
    local_addr: SocketAddr,
    fault: watch::Sender<Fault>,
    open: AtomicUsize,
    accepted: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    bytes_dropped: AtomicU64,
    resets: AtomicU64,
}

/// A cheap, cloneable control handle for a [`FaultProxy`].
///
/// It does not keep the proxy alive: after the proxy is shut down or dropped
/// the handle still reports statistics, and setting a fault has no effect.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    shared: Arc<Shared>,
}

impl FaultHandle {
    /// The address clients should connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Switches the simulated fault; applies to new and existing connections.
    pub fn set_fault(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The currently simulated fault.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Number of currently open proxied connections.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// A snapshot of the proxy's counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::SeqCst),
            bytes_up: s.bytes_up.load(Ordering::SeqCst),
            bytes_down: s.bytes_down.load(Ordering::SeqCst),
            bytes_dropped: s.bytes_dropped.load(Ordering::SeqCst),
            resets: s.resets.load(Ordering::SeqCst),
        }
    }
}

/// A running TCP fault-injection proxy; see the [module documentation](self).
///
/// Dropping it shuts the proxy down in the background; use
/// [`FaultProxy::shutdown`] to wait for that. Use [`FaultProxy::handle`] to
/// control it from several places.
#[derive(Debug)]
pub struct FaultProxy {
    handle: FaultHandle,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards every accepted connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// Listens on `listen` and forwards every accepted connection to `upstream`.
    ///
    /// Must be called from within a Tokio runtime (the proxy spawns tasks).
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(listen).await?;
        let shared = Arc::new(Shared {
            local_addr: listener.local_addr()?,
            fault: watch::Sender::new(Fault::Pass),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            bytes_dropped: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            Arc::clone(&shared),
            stopped,
        ));
        let handle = FaultHandle { shared };
        Ok(FaultProxy { handle, stop, task })
    }

    /// A cloneable control handle for this proxy.
    pub fn handle(&self) -> FaultHandle {
        self.handle.clone()
    }

    /// The address clients should connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// Switches the simulated fault; applies to new and existing connections.
    pub fn set_fault(&self, fault: Fault) {
        self.handle.set_fault(fault);
    }

    /// The currently simulated fault.
    pub fn fault(&self) -> Fault {
        self.handle.fault()
    }

    /// Number of currently open proxied connections.
    pub fn connections(&self) -> usize {
        self.handle.connections()
    }

    /// A snapshot of the proxy's counters.
    pub fn stats(&self) -> ProxyStats {
        self.handle.stats()
    }

    /// Stops listening, closes every proxied connection and waits for all
    /// proxy tasks to finish.
    pub async fn shutdown(self) {
        let FaultProxy { stop, task, .. } = self;
        // An error means the accept task already ended, which is what we want.
        let _ = stop.send(());
        if let Err(err) = task.await {
            tracing::warn!(%err, "fault proxy accept task failed");
        }
    }
}

/// Accepts clients until told to stop (or the [`FaultProxy`] is dropped),
/// then closes every connection and waits for their tasks.
async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => admit(client, upstream, &shared, &mut conns),
                Err(err) => {
                    tracing::warn!(%err, "fault proxy accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// Handles one accepted client: resets it under [`Fault::Reset`], otherwise
/// spawns its connection task.
fn admit(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>, conns: &mut JoinSet<()>) {
    shared.accepted.fetch_add(1, Ordering::SeqCst);
    // Subscribing before looking at the fault means no later change is missed.
    let faults = shared.fault.subscribe();
    if *faults.borrow() == Fault::Reset {
        reset(shared, &[&client]);
        return;
    }
    let guard = OpenGuard::new(Arc::clone(shared));
    conns.spawn(async move {
        run_connection(client, upstream, faults, &guard.0).await;
        drop(guard);
    });
}

/// Counts an open connection for as long as it lives (also when its task is aborted).
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(shared)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Arranges for the given streams to send `RST` instead of `FIN` when dropped.
fn reset(shared: &Shared, streams: &[&TcpStream]) {
    shared.resets.fetch_add(1, Ordering::SeqCst);
    for stream in streams {
        if let Err(err) = stream.set_zero_linger() {
            tracing::debug!(%err, "fault proxy could not set SO_LINGER=0");
        }
    }
}

/// How a proxied connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Both directions reached end-of-stream and were delivered.
    Closed,
    /// The connection must be closed abruptly on both sides.
    Reset,
}

/// Connects to the upstream and pipes bytes until the connection ends.
async fn run_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    faults: watch::Receiver<Fault>,
    shared: &Shared,
) {
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(err) => {
            tracing::debug!(%err, %upstream, "fault proxy upstream connect failed");
            return reset(shared, &[&client]);
        }
    };
    // The proxy forwards chunks as they come; Nagle would only add latency.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if pump(&mut client, &mut server, faults, shared).await == Outcome::Reset {
        reset(shared, &[&client, &server]);
    }
}

/// Runs both directions of one connection while watching for fault changes.
async fn pump(
    client: &mut TcpStream,
    server: &mut TcpStream,
    faults: watch::Receiver<Fault>,
    shared: &Shared,
) -> Outcome {
    let tainted = AtomicBool::new(false);
    let up = Direction::new(&faults, &tainted, &shared.bytes_up, &shared.bytes_dropped);
    let down = Direction::new(&faults, &tainted, &shared.bytes_down, &shared.bytes_dropped);
    let (client_rd, client_wr) = client.split();
    let (server_rd, server_wr) = server.split();
    let pipes =
        async { tokio::try_join!(up.run(client_rd, server_wr), down.run(server_rd, client_wr)) };
    tokio::select! {
        piped = pipes => match piped {
            Ok(_) if !tainted.load(Ordering::SeqCst) => Outcome::Closed,
            _ => Outcome::Reset,
        },
        outcome = watch_faults(faults, &tainted) => outcome,
    }
}

/// Resolves to [`Outcome::Reset`] when a fault change must kill the connection:
/// on [`Fault::Reset`], or when a blackhole that ate this connection's data ends.
async fn watch_faults(mut faults: watch::Receiver<Fault>, tainted: &AtomicBool) -> Outcome {
    while faults.changed().await.is_ok() {
        let fault = *faults.borrow_and_update();
        let lost_data = tainted.load(Ordering::SeqCst);
        if fault == Fault::Reset || (fault != Fault::Blackhole && lost_data) {
            return Outcome::Reset;
        }
    }
    // The proxy is gone; its accept task aborts this connection.
    std::future::pending().await
}

/// One chunk in flight, stamped with the time the proxy read it.
struct Chunk {
    arrived: Instant,
    data: Vec<u8>,
}

/// One direction (client to upstream or back) of a proxied connection.
struct Direction<'a> {
    faults: watch::Receiver<Fault>,
    /// Set when this connection lost data or an end-of-stream to a blackhole.
    tainted: &'a AtomicBool,
    forwarded: &'a AtomicU64,
    dropped: &'a AtomicU64,
}

impl<'a> Direction<'a> {
    fn new(
        faults: &watch::Receiver<Fault>,
        tainted: &'a AtomicBool,
        forwarded: &'a AtomicU64,
        dropped: &'a AtomicU64,
    ) -> Self {
        let faults = faults.clone();
        Direction {
            faults,
            tainted,
            forwarded,
            dropped,
        }
    }

    /// Reads from `from` into a delay line that writes to `to`.
    async fn run(self, from: ReadHalf<'_>, to: WriteHalf<'_>) -> io::Result<()> {
        let (tx, rx) = mpsc::channel(QUEUE_CHUNKS);
        tokio::try_join!(self.read_side(from, tx), self.write_side(to, rx))?;
        Ok(())
    }

    /// Reads chunks and queues them with their arrival time; end-of-stream
    /// closes the queue.
    async fn read_side(&self, mut from: ReadHalf<'_>, tx: mpsc::Sender<Chunk>) -> io::Result<()> {
        let mut buf = vec![0; CHUNK_SIZE];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            if self.discard_if_blackholed(n) {
                continue;
            }
            let chunk = Chunk {
                arrived: Instant::now(),
                data: buf[..n].to_vec(),
            };
            if tx.send(chunk).await.is_err() {
                return Ok(());
            }
        }
    }

    /// Delivers queued chunks when due, then forwards end-of-stream as a half-close.
    async fn write_side(
        &self,
        mut to: WriteHalf<'_>,
        mut rx: mpsc::Receiver<Chunk>,
    ) -> io::Result<()> {
        let mut faults = self.faults.clone();
        while let Some(chunk) = rx.recv().await {
            wait_until_due(chunk.arrived, &mut faults).await;
            let len = chunk.data.len();
            if self.discard_if_blackholed(len) {
                continue;
            }
            to.write_all(&chunk.data).await?;
            self.forwarded.fetch_add(len as u64, Ordering::SeqCst);
        }
        if self.discard_if_blackholed(0) {
            // The end-of-stream is lost; the connection is reset when the blackhole ends.
            std::future::pending::<()>().await;
        }
        to.shutdown().await
    }

    /// Under [`Fault::Blackhole`], accounts `len` bytes as dropped, marks the
    /// connection as tainted and returns `true`.
    fn discard_if_blackholed(&self, len: usize) -> bool {
        // Holding the borrow while tainting orders this before any later
        // `set_fault`, so `watch_faults` is guaranteed to see the taint.
        let fault = self.faults.borrow();
        if *fault != Fault::Blackhole {
            return false;
        }
        self.tainted.store(true, Ordering::SeqCst);
        self.dropped.fetch_add(len as u64, Ordering::SeqCst);
        true
    }
}

/// Waits until a chunk that arrived at `arrived` is due under the current
/// fault, re-evaluating whenever the fault changes.
async fn wait_until_due(arrived: Instant, faults: &mut watch::Receiver<Fault>) {
    loop {
        let delay = match *faults.borrow_and_update() {
            Fault::Delay(delay) => delay,
            _ => Duration::ZERO,
        };
        // An absurd delay (e.g. `Duration::MAX`) just means "not in this lifetime".
        let due = arrived
            .checked_add(delay)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 30));
        if due <= Instant::now() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(due) => return,
            changed = faults.changed() => {
                if changed.is_err() {
                    return tokio::time::sleep_until(due).await;
                }
            }
        }
    }
}

//! Accepting clients and piping each connection's bytes under the current fault.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::state::{Fault, Shared};

/// Largest chunk read from either side in one go.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued per direction before the proxy stops reading (back-pressure).
const QUEUE_CHUNKS: usize = 256;
/// Pause after a failed `accept` so persistent errors (e.g. `EMFILE`) do not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Accepts clients until told to stop (or the `FaultProxy` is dropped),
/// then closes every connection and waits for their tasks.
pub(super) async fn accept_loop(
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
    // Whether the upstream spoke since the client last did: the client's next chunk then
    // starts a request (the first one does too).
    let answered = AtomicBool::new(true);
    let mut up = Direction::new(&faults, &tainted, &shared.bytes_up, &shared.bytes_dropped);
    up.turn = Turn::Request {
        answered: &answered,
        requests: &shared.requests,
    };
    let mut down = Direction::new(&faults, &tainted, &shared.bytes_down, &shared.bytes_dropped);
    down.turn = Turn::Answer(&answered);
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
    turn: Turn<'a>,
}

/// How a direction takes part in counting requests.
enum Turn<'a> {
    /// Not at all.
    None,
    /// Client to upstream: a chunk delivered after an answer starts a request.
    Request {
        answered: &'a AtomicBool,
        requests: &'a AtomicU64,
    },
    /// Upstream to client: a chunk delivered is an answer.
    Answer(&'a AtomicBool),
}

impl Turn<'_> {
    fn delivered(&self) {
        match self {
            Turn::None => {}
            Turn::Request { answered, requests } => {
                if answered.swap(false, Ordering::SeqCst) {
                    requests.fetch_add(1, Ordering::SeqCst);
                }
            }
            Turn::Answer(answered) => answered.store(true, Ordering::SeqCst),
        }
    }
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
            turn: Turn::None,
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
            self.turn.delivered();
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

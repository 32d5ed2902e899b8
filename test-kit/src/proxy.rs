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

mod connection;
mod state;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use connection::accept_loop;
use state::Shared;
pub use state::{Fault, FaultHandle, ProxyStats};

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
            requests: AtomicU64::new(0),
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

//! The proxy's shared state: the simulated [`Fault`], the counters, and the
//! [`FaultHandle`] that reads and switches them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// The network fault a [`FaultProxy`](super::FaultProxy) currently simulates.
///
/// See the [module documentation](super) for the exact semantics.
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

/// Counters of a [`FaultProxy`](super::FaultProxy) since it started.
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
    /// Requests: client chunks delivered upstream that opened a connection's exchange or
    /// followed data from the upstream on that connection. A client that waits for each
    /// answer before it writes again makes one per round trip; bytes the client writes
    /// again before any answer (a pipeline) count once.
    pub requests: u64,
}

/// State shared by the handles, the accept task and the connection tasks.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) local_addr: SocketAddr,
    pub(super) fault: watch::Sender<Fault>,
    pub(super) open: AtomicUsize,
    pub(super) accepted: AtomicU64,
    pub(super) bytes_up: AtomicU64,
    pub(super) bytes_down: AtomicU64,
    pub(super) bytes_dropped: AtomicU64,
    pub(super) resets: AtomicU64,
    pub(super) requests: AtomicU64,
}

/// A cheap, cloneable control handle for a [`FaultProxy`](super::FaultProxy).
///
/// It does not keep the proxy alive: after the proxy is shut down or dropped
/// the handle still reports statistics, and setting a fault has no effect.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    pub(super) shared: Arc<Shared>,
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
            requests: s.requests.load(Ordering::SeqCst),
        }
    }
}

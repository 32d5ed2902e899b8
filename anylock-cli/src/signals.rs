//! Signal streams, installed before the command starts so that none is lost.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll};

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// Handlers for a set of signals; a handled signal no longer has its default action
/// (terminate, stop) on this process. Exec resets them for the command.
pub(crate) struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Installs handlers for `signals`.
    pub(crate) fn install(signals: &[Signal]) -> io::Result<Self> {
        let streams = signals
            .iter()
            .map(|&sig| Ok((sig, signal(SignalKind::from_raw(sig as i32))?)))
            .collect::<io::Result<_>>()?;
        Ok(Self { streams })
    }

    /// The next signal received. Cancel safe.
    pub(crate) async fn next(&mut self) -> Signal {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Also handles `signals` from now on.
    pub(crate) fn add(&mut self, signals: &[Signal]) -> io::Result<()> {
        self.streams.extend(Self::install(signals)?.streams);
        Ok(())
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Signal> {
        for (sig, stream) in &mut self.streams {
            if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                return Poll::Ready(*sig);
            }
        }
        Poll::Pending
    }
}

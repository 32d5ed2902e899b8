//! [`Bounded`]: the connection's byte stream, cut when a reply breaks a limit of
//! [`crate::limits`] before the `redis` crate's parser allocates for it.
//!
//! Hand-written because the `redis` crate (1.8) offers no way to bound a reply: its parser
//! takes a bulk length or an element count as given, and it has no parser option, maximum
//! bulk size or hook on the connections it opens itself. What it does accept is a stream
//! opened by the caller ([`MultiplexedConnection::new_with_config`] and [`PubSub::new`]),
//! so [`Connector`](crate::link::Connector) opens the TCP (and TLS) connection and hands the
//! crate this adapter around it. Measured (`tests/reply_memory.rs`) against a fake server
//! that answers `$8589934592` and then streams 1 GiB: without it the client's peak RSS grew
//! by 1,048,692 KiB, the whole stream (the per-call timeout gave up, the connection read
//! on, and would have gone on to the 8 GiB announced); with it the call fails at once and
//! the peak grows by a few hundred KiB (`docs/redis.md`, "Reply limits").
//!
//! [`MultiplexedConnection::new_with_config`]: redis::aio::MultiplexedConnection::new_with_config
//! [`PubSub::new`]: redis::aio::PubSub::new

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::frames::{Limits, Scanner};
use crate::limits::Refused;

/// Why a connection was cut, shared with the connection's owner: the calls that fail
/// because the connection closed report this instead.
pub(crate) type Cut = Arc<OnceLock<Refused>>;

/// A stream whose incoming replies are checked against [`Limits`] as they are read.
///
/// The replies to the commands written between two flushes (one pipeline, or the calls of
/// several tasks written together: the client holds a pipeline's replies until its last
/// one arrives) share one budget, which starts again once they are all in; a command is
/// counted when its last byte is written.
pub(crate) struct Bounded<S> {
    inner: S,
    replies: Scanner,
    commands: Scanner,
    /// Commands written since the last flush.
    unflushed: u64,
    /// Per flush, its commands not answered yet, oldest first.
    batches: VecDeque<u64>,
    cut: Cut,
}

impl<S> Bounded<S> {
    /// `inner` with the limits `replies` on what it reads; `cut` records a refusal.
    pub(crate) fn new(inner: S, replies: Limits, cut: Cut) -> Self {
        Self {
            inner,
            replies: Scanner::new(replies),
            commands: Scanner::new(Limits::NONE),
            unflushed: 0,
            batches: VecDeque::new(),
            cut,
        }
    }

    /// Checks bytes just read.
    fn scan_replies(&mut self, mut bytes: &[u8]) -> Result<(), Refused> {
        while !bytes.is_empty() {
            let (read, ended) = self.replies.feed(bytes)?;
            if ended == Some(false) {
                self.answered();
            }
            bytes = &bytes[read..];
        }
        Ok(())
    }

    /// One command answered: the oldest batch waits for one reply less.
    fn answered(&mut self) {
        match self.batches.front_mut() {
            Some(1) => {
                self.batches.pop_front();
                self.replies.end_batch();
            }
            Some(waiting) => *waiting -= 1,
            // Answered before its flush was seen; the budget goes on.
            None => self.unflushed = self.unflushed.saturating_sub(1),
        }
    }

    /// Counts the commands that end in bytes just written.
    fn scan_commands(&mut self, mut bytes: &[u8]) {
        while let Ok((read, ended)) = self.commands.feed(bytes) {
            if ended.is_some() {
                self.unflushed += 1;
            }
            bytes = &bytes[read..];
            if bytes.is_empty() {
                break;
            }
        }
    }
}

fn refused(refused: Refused) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, refused)
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(&cut) = this.cut.get() {
            return Poll::Ready(Err(refused(cut)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Err(cut) = this.scan_replies(&buf.filled()[before..]) {
            let _ = this.cut.set(cut);
            return Poll::Ready(Err(refused(cut)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.scan_commands(&buf[..written]);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        if this.unflushed > 0 {
            this.batches.push_back(std::mem::take(&mut this.unflushed));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_VALUE;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_huge_value_cuts_the_stream_and_says_why() {
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let cut = Cut::default();
        let mut bounded = Bounded::new(client, Limits::REPLIES, Arc::clone(&cut));
        bounded
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .expect("write");
        bounded.flush().await.expect("flush");
        server.write_all(b"+PONG\r\n").await.expect("reply");
        let mut read = [0; 7];
        bounded
            .read_exact(&mut read)
            .await
            .expect("a reply within the limits");
        server
            .write_all(format!("${}\r\n", MAX_VALUE + 1).as_bytes())
            .await
            .expect("reply");
        let err = bounded.read(&mut [0; 64]).await.expect_err("cut");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(cut.get(), Some(&Refused::Value));
        let again = bounded.read(&mut [0; 64]).await.expect_err("stays cut");
        assert!(
            again.to_string().contains("exceeds 1 MiB (a value)"),
            "{again}"
        );
    }

    #[tokio::test]
    async fn replies_to_one_flush_share_a_budget_and_the_next_flush_starts_a_new_one() {
        let (client, mut server) = tokio::io::duplex(1 << 22);
        let cut = Cut::default();
        let mut bounded = Bounded::new(client, Limits::REPLIES, Arc::clone(&cut));
        let value = [
            format!("${MAX_VALUE}\r\n").as_bytes(),
            &vec![b'x'; MAX_VALUE],
            b"\r\n",
        ]
        .concat();
        let server_task = tokio::spawn(async move {
            let mut sink = [0; 1 << 16];
            loop {
                if server.write_all(&value).await.is_err() {
                    return;
                }
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(1),
                    server.read(&mut sink),
                )
                .await;
            }
        });
        // Two flushes of 40 commands: 80 replies of 1 MiB pass, as long as each flush's
        // replies stay within 64 MiB.
        for _ in 0..2 {
            bounded
                .write_all(&b"*1\r\n$4\r\nPING\r\n".repeat(40))
                .await
                .expect("write");
            bounded.flush().await.expect("flush");
        }
        let mut buf = vec![0; 1 << 16];
        let mut total = 0usize;
        let err = loop {
            match bounded.read(&mut buf).await {
                Ok(n) => total += n,
                Err(err) => break err,
            }
        };
        server_task.abort();
        assert_eq!(cut.get(), Some(&Refused::Batch), "{err}");
        let per_reply = MAX_VALUE + 12;
        assert!(total > 80 * per_reply, "cut after {total} bytes");
        assert!(total < 80 * per_reply + (64 << 20) + (1 << 16), "{total}");
    }
}

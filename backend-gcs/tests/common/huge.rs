//! A fake GCS (any HTTP endpoint: storage, batch, a token endpoint) whose every reply has a
//! huge body: what an impostor or a broken proxy can send. It never sends more than
//! `sent_at_most` bytes of body (so a client that reads without bound holds that much and
//! then waits, instead of exhausting the machine), using one reused buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How the body is framed.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// `Content-Length` of 6,000,000,000 bytes, of which `sent_at_most` are sent.
    Declared,
    /// Chunked and never ended: `sent_at_most` bytes, then silence.
    Endless,
    /// Chunked and ended properly after this many bytes.
    Finite(u64),
}

/// The fake's address and what it sent.
pub struct Huge {
    pub url: String,
    sent: Arc<AtomicU64>,
}

const CHUNK: usize = 1024 * 1024;

impl Huge {
    /// Answers every request with `status` and `body`.
    pub async fn start(status: u16, body: Body, sent_at_most: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(answer(tcp, status, body, sent_at_most, counter));
            }
        });
        Self { url, sent }
    }

    /// Body bytes written to clients so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

async fn answer(
    mut tcp: tokio::net::TcpStream,
    status: u16,
    body: Body,
    sent_at_most: u64,
    sent: Arc<AtomicU64>,
) {
    // The request head (and whatever of its body came with it); the answer does not
    // depend on it.
    let mut request = vec![0u8; 64 * 1024];
    let _ = tcp.read(&mut request).await;
    let framing = match body {
        Body::Declared => "Content-Length: 6000000000".to_owned(),
        Body::Endless | Body::Finite(_) => "Transfer-Encoding: chunked".to_owned(),
    };
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let head = format!(
        "HTTP/1.1 {status} Whatever\r\nDate: {date}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    );
    if tcp.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let total = match body {
        Body::Finite(n) => n,
        _ => sent_at_most,
    };
    let chunked = !matches!(body, Body::Declared);
    let data = vec![b' '; CHUNK];
    let mut written = 0u64;
    while written < total {
        let n = CHUNK.min((total - written) as usize);
        let (open, close) = match chunked {
            true => (format!("{n:x}\r\n"), "\r\n"),
            false => (String::new(), ""),
        };
        let frame = [open.as_bytes(), &data[..n], close.as_bytes()];
        for piece in frame {
            if tcp.write_all(piece).await.is_err() {
                return;
            }
        }
        written += n as u64;
        sent.fetch_add(n as u64, Ordering::Relaxed);
    }
    if matches!(body, Body::Finite(_)) {
        let _ = tcp.write_all(b"0\r\n\r\n").await;
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
}

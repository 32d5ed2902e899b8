//! [`Tap`]: a loopback TCP proxy that counts round trips, and for PostgreSQL statements,
//! between a client and one server.
//!
//! A *round trip* is a client write burst that carries a request and follows data from the
//! server (or opens the connection): a request the client had to wait for. Pipelined
//! requests sent together count once, as they cost one wait. Server pushes the client
//! never answers count nothing. Under HTTP/2 (gRPC) only bursts with a `HEADERS` or `DATA`
//! frame carry a request; flow-control, ping and settings frames do not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::op::Res;

/// Counters shared by every connection through one tap.
#[derive(Debug, Default)]
pub(crate) struct TapCounts {
    round_trips: AtomicU64,
    statements: AtomicU64,
}

impl TapCounts {
    /// Round trips and PostgreSQL statements (`Query` + `Execute` messages) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.round_trips.load(Ordering::Relaxed),
            self.statements.load(Ordering::Relaxed),
        )
    }
}

/// A running proxy on `127.0.0.1`; stops accepting when dropped.
pub(crate) struct Tap {
    /// `127.0.0.1:PORT`, to put in the client's URL in place of the server's address.
    pub(crate) addr: String,
    /// What went through it.
    pub(crate) counts: Arc<TapCounts>,
    accept: JoinHandle<()>,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Tap {
    /// Starts a tap in front of `upstream` (`host:port`) that reads the client's bytes
    /// as `protocol`.
    pub(crate) async fn start(upstream: &str, protocol: Protocol) -> Res<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let counts = Arc::new(TapCounts::default());
        let upstream = upstream.to_owned();
        let shared = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counts) = (upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        pipe(client, server, counts, protocol).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            counts,
            accept,
        })
    }
}

const CLIENT: u8 = 1;
const SERVER: u8 = 2;

/// What the client speaks, as far as counting needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Every client burst is a request (RESP, HTTP/1.1).
    Plain,
    /// PostgreSQL: also count statements.
    Postgres,
    /// HTTP/2: only `HEADERS` and `DATA` frames are requests.
    Http2,
}

/// The per-connection reader of the client's bytes.
enum Reader {
    Plain,
    Postgres(PgParser),
    Http2(H2Parser),
}

impl Reader {
    fn new(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Plain => Self::Plain,
            Protocol::Postgres => Self::Postgres(PgParser::default()),
            Protocol::Http2 => Self::Http2(H2Parser::default()),
        }
    }

    /// (whether `bytes` carry a request, statements completed in them); `idle` says the
    /// server's last bytes ended in PostgreSQL's `ReadyForQuery`.
    fn feed(&mut self, bytes: &[u8], idle: bool) -> (bool, u64) {
        match self {
            Self::Plain => (true, 0),
            Self::Postgres(parser) => {
                let burst = parser.feed(bytes);
                // A lone Sync is a request (sqlx's ping) only on an idle connection; after
                // Bind/Execute it is the tail of the same request, written separately.
                (burst.requests || (burst.syncs && idle), burst.statements)
            }
            Self::Http2(parser) => (parser.feed(bytes), 0),
        }
    }
}

/// Whether `bytes` end with a complete PostgreSQL `ReadyForQuery` (`Z`, length 5, status).
pub(crate) fn ends_ready(bytes: &[u8]) -> bool {
    matches!(bytes, [.., b'Z', 0, 0, 0, 5, b'I' | b'T' | b'E'])
}

async fn pipe(client: TcpStream, server: TcpStream, counts: Arc<TapCounts>, protocol: Protocol) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let last = Arc::new(AtomicU8::new(SERVER));
    let idle = Arc::new(AtomicBool::new(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = {
        let (last, counts, idle) = (last.clone(), counts.clone(), idle.clone());
        let mut reader = Reader::new(protocol);
        forward(client_read, server_write, move |bytes| {
            let (request, statements) = reader.feed(bytes, idle.load(Ordering::Relaxed));
            if request && last.swap(CLIENT, Ordering::Relaxed) != CLIENT {
                counts.round_trips.fetch_add(1, Ordering::Relaxed);
            }
            counts.statements.fetch_add(statements, Ordering::Relaxed);
        })
    };
    let down = forward(server_read, client_write, move |bytes| {
        idle.store(ends_ready(bytes), Ordering::Relaxed);
        last.store(SERVER, Ordering::Relaxed);
    });
    tokio::join!(up, down);
}

async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut seen: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                seen(&buf[..n]);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// What one burst of PostgreSQL frontend messages held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PgBurst {
    /// A message other than `Sync` began (a startup message, `Query`, `Parse`, `Bind`…).
    pub(crate) requests: bool,
    /// A `Sync` was among them.
    pub(crate) syncs: bool,
    /// `Query` (`Q`) and `Execute` (`E`) messages completed.
    pub(crate) statements: u64,
}

/// Splits the PostgreSQL frontend stream into messages. The startup phase (`SSLRequest`,
/// `StartupMessage`) has no type byte; every later message is a type byte and a
/// big-endian length that counts itself.
#[derive(Debug, Default)]
pub(crate) struct PgParser {
    started: bool,
    pending: Vec<u8>,
}

const PROTOCOL_3: u32 = 196_608;

impl PgParser {
    /// Feeds client bytes; what the messages completed in them were.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> PgBurst {
        self.pending.extend_from_slice(bytes);
        let mut burst = PgBurst::default();
        loop {
            let header = if self.started { 5 } else { 4 };
            if self.pending.len() < header {
                break;
            }
            let at = header - 4;
            let len = u32::from_be_bytes([
                self.pending[at],
                self.pending[at + 1],
                self.pending[at + 2],
                self.pending[at + 3],
            ]) as usize;
            let total = at + len.max(4);
            if self.pending.len() < total {
                break;
            }
            if self.started {
                let kind = self.pending[0];
                burst.statements += u64::from(matches!(kind, b'Q' | b'E'));
                burst.syncs |= kind == b'S';
                burst.requests |= kind != b'S';
            } else if total >= 8 {
                burst.requests = true;
                let code = u32::from_be_bytes([
                    self.pending[4],
                    self.pending[5],
                    self.pending[6],
                    self.pending[7],
                ]);
                self.started = code == PROTOCOL_3;
            }
            self.pending.drain(..total);
        }
        burst
    }
}

/// Splits the HTTP/2 client stream (after its 24-byte preface) into frames and reports
/// whether a `DATA` (type 0) or `HEADERS` (type 1) frame began.
#[derive(Debug)]
pub(crate) struct H2Parser {
    preface: usize,
    header: Vec<u8>,
    skip: usize,
}

impl Default for H2Parser {
    fn default() -> Self {
        Self {
            preface: 24,
            header: Vec::with_capacity(9),
            skip: 0,
        }
    }
}

impl H2Parser {
    /// Feeds client bytes; whether a request-carrying frame began in them.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut request = false;
        let n = self.preface.min(bytes.len());
        self.preface -= n;
        bytes = &bytes[n..];
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if let [a, b, c, kind, _, _, _, _, _] = self.header[..] {
                request |= kind <= 1;
                self.skip = u32::from_be_bytes([0, a, b, c]) as usize;
                self.header.clear();
            }
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn counts_queries_and_executes_across_split_reads() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&8u32.to_be_bytes());
        stream.extend_from_slice(&80_877_103u32.to_be_bytes()); // SSLRequest
        stream.extend_from_slice(&12u32.to_be_bytes());
        stream.extend_from_slice(&PROTOCOL_3.to_be_bytes());
        stream.extend_from_slice(b"u\0\0\0"); // StartupMessage
        stream.extend(typed(b'P', b"stmt\0select 1\0\0\0"));
        stream.extend(typed(b'B', b"\0stmt\0\0\0\0\0\0\0"));
        stream.extend(typed(b'E', b"\0\0\0\0\0"));
        stream.extend(typed(b'S', b""));
        stream.extend(typed(b'Q', b"select 1\0"));
        let mut parser = PgParser::default();
        let total: u64 = stream
            .chunks(3)
            .map(|chunk| parser.feed(chunk).statements)
            .sum();
        assert_eq!(total, 2);
        assert!(parser.pending.is_empty());
        let sync = parser.feed(&typed(b'S', b""));
        assert_eq!(
            sync,
            PgBurst {
                requests: false,
                syncs: true,
                statements: 0
            }
        );
        let mut reader = Reader::Postgres(parser);
        assert_eq!(reader.feed(&typed(b'S', b""), true), (true, 0), "a ping");
        assert_eq!(
            reader.feed(&typed(b'S', b""), false),
            (false, 0),
            "a request's tail"
        );
        assert!(ends_ready(&[b'2', 0, 0, 0, 4, b'Z', 0, 0, 0, 5, b'I']));
        assert!(!ends_ready(&[b'2', 0, 0, 0, 4]));
    }

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let len = (payload as u32).to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 1];
        out.resize(9 + payload, 0xAA);
        out
    }

    #[test]
    fn http2_requests_are_headers_or_data_frames() {
        let mut parser = H2Parser::default();
        let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        opening.extend(frame(4, 6)); // SETTINGS
        assert!(!parser.feed(&opening));
        assert!(!parser.feed(&frame(8, 4)), "WINDOW_UPDATE");
        let request = [frame(1, 40), frame(0, 17)].concat();
        let (a, b) = request.split_at(5);
        assert!(!parser.feed(a), "the frame header is not complete yet");
        assert!(parser.feed(b));
        assert!(!parser.feed(&frame(6, 8)), "PING");
    }

    #[tokio::test]
    async fn counts_one_round_trip_per_answered_burst() {
        let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = server.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut socket, _) = server.accept().await.expect("accept");
            let mut buf = [0u8; 16];
            while let Ok(n @ 1..) = socket.read(&mut buf).await {
                socket.write_all(&buf[..n]).await.expect("echo");
            }
        });
        let tap = Tap::start(&upstream, Protocol::Plain).await.expect("tap");
        let mut client = TcpStream::connect(&tap.addr).await.expect("connect");
        let mut buf = [0u8; 4];
        for _ in 0..3 {
            client.write_all(b"ping").await.expect("write");
            client.read_exact(&mut buf).await.expect("read");
        }
        assert_eq!(tap.counts.get(), (3, 0));
    }
}

//! A scripted fake Redis server for the hostile-server tests: a tokio listener on
//! 127.0.0.1:0 that reads the client's commands and answers each with what the test's
//! script says, or with an honest answer (`PING` → `+PONG`, `SCRIPT LOAD` → the script's
//! SHA1, `CONFIG GET` → no settings, anything else → `+OK`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One command the client sent.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub(crate) args: Vec<Vec<u8>>,
}

impl Command {
    /// The command name, upper case (`SCRIPT LOAD` for the subcommand form).
    pub(crate) fn name(&self) -> String {
        let first = |i: usize| {
            self.args
                .get(i)
                .map(|a| String::from_utf8_lossy(a).to_ascii_uppercase())
                .unwrap_or_default()
        };
        match first(0).as_str() {
            "SCRIPT" | "CONFIG" | "ACL" | "CLIENT" => format!("{} {}", first(0), first(1)),
            name => name.to_owned(),
        }
    }
}

/// What the fake server does with a command.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// These bytes.
    Bytes(Vec<u8>),
    /// These bytes, then the connection is closed.
    BytesThenClose(Vec<u8>),
    /// `head`, then `filler` again and again until `total` bytes are sent (or the client
    /// hangs up), then the connection is closed.
    Stream {
        head: Vec<u8>,
        filler: Vec<u8>,
        total: u64,
    },
    /// The honest answer.
    Honest,
}

/// Decides the answer to each command.
pub(crate) type Script = Arc<dyn Fn(&Command) -> Answer + Send + Sync>;

/// A running fake server; stops when dropped.
pub(crate) struct Fake {
    addr: SocketAddr,
    task: JoinHandle<()>,
    /// Bytes the server has written, over every connection.
    pub(crate) sent: Arc<AtomicU64>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    pub(crate) async fn start(script: impl Fn(&Command) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let script: Script = Arc::new(script);
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (script, sent) = (Arc::clone(&script), Arc::clone(&counter));
                connections.push(AbortOnDrop(tokio::spawn(serve(stream, script, sent))));
            }
        });
        Self { addr, task, sent }
    }

    /// `redis://` URL of the fake server.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn serve(stream: TcpStream, script: Script, sent: Arc<AtomicU64>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    while let Some(command) = read_command(&mut read).await {
        let bytes = match script(&command) {
            Answer::Honest => honest(&command),
            Answer::Bytes(bytes) => bytes,
            Answer::BytesThenClose(bytes) => {
                let _ = write.write_all(&bytes).await;
                sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                return;
            }
            Answer::Stream {
                head,
                filler,
                total,
            } => {
                stream_bytes(&mut write, (&head, &filler), total, &sent).await;
                return;
            }
        };
        if write.write_all(&bytes).await.is_err() {
            return;
        }
        sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
}

async fn stream_bytes(
    write: &mut tokio::net::tcp::OwnedWriteHalf,
    (head, filler): (&[u8], &[u8]),
    total: u64,
    sent: &AtomicU64,
) {
    if write.write_all(head).await.is_err() {
        return;
    }
    let filler = filler.repeat((1 << 16) / filler.len().max(1) + 1);
    let mut left = total.saturating_sub(head.len() as u64);
    while left > 0 {
        let n = left.min(filler.len() as u64) as usize;
        if write.write_all(&filler[..n]).await.is_err() {
            return;
        }
        sent.fetch_add(n as u64, Ordering::Relaxed);
        left -= n as u64;
    }
}

/// The honest answer to `command`.
pub(crate) fn honest(command: &Command) -> Vec<u8> {
    match command.name().as_str() {
        "PING" => b"+PONG\r\n".to_vec(),
        "SCRIPT LOAD" => {
            let body = String::from_utf8_lossy(&command.args[2]).into_owned();
            bulk(redis::Script::new(&body).get_hash().as_bytes())
        }
        "CONFIG GET" => b"*0\r\n".to_vec(),
        _ => b"+OK\r\n".to_vec(),
    }
}

/// A RESP bulk string.
pub(crate) fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    out
}

/// Reads one RESP command (an array of bulk strings); `None` at the end of the stream.
async fn read_command<R: AsyncBufReadExt + Unpin>(read: &mut R) -> Option<Command> {
    let count = read_header(read, b'*').await?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let len = read_header(read, b'$').await?;
        let mut arg = vec![0; len + 2];
        read.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    Some(Command { args })
}

async fn read_header<R: AsyncBufReadExt + Unpin>(read: &mut R, kind: u8) -> Option<usize> {
    let mut line = Vec::new();
    read.read_until(b'\n', &mut line).await.ok()?;
    if line.first() != Some(&kind) {
        return None;
    }
    std::str::from_utf8(&line[1..]).ok()?.trim().parse().ok()
}

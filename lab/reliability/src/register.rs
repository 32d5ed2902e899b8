//! The fenced register: a counter that clients read and write under the lock.
//!
//! In [`Mode::Fenced`] it keeps the highest fencing token it has accepted and refuses any
//! operation (begin, read or write) that carries a lower one, as Kleppmann's storage
//! service does; checking reads too is what makes a read-modify-write safe, not just the
//! write. In [`Mode::Unfenced`] it accepts everything, but still records every token so
//! the checker can count what a fenced register would have refused. Either way it keeps
//! the full history, stamped by its own single clock.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::history::{Event, Op};
use crate::protocol::{Reply, Request};

/// Whether the register enforces fencing tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Accept every operation; record tokens only.
    Unfenced,
    /// Refuse operations whose token is lower than the highest accepted one.
    Fenced,
}

impl Mode {
    /// `unfenced` or `fenced`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Unfenced => "unfenced",
            Mode::Fenced => "fenced",
        }
    }
}

/// The register's state, free of I/O and clocks: feed it requests with their time.
#[derive(Debug)]
pub struct Register {
    mode: Mode,
    value: u64,
    highest: Option<u64>,
    history: Vec<Event>,
}

impl Register {
    /// An empty register (counter 0, no token seen).
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            value: 0,
            highest: None,
            history: Vec::new(),
        }
    }

    /// Handles one request made at `at_us`, records it and returns the reply.
    pub fn apply(&mut self, request: Request, at_us: u64) -> (Reply, Event) {
        let id = request.id();
        let (reply, op) = match request {
            Request::Begin { token, .. } => {
                let accepted = self.admit(token);
                (
                    self.verdict(accepted, Reply::Ok),
                    Op::Begin { token, accepted },
                )
            }
            Request::Read { token, .. } => {
                let accepted = self.admit(token);
                let value = self.value;
                let reply = self.verdict(accepted, Reply::Value(value));
                (
                    reply,
                    Op::Read {
                        token,
                        accepted,
                        value,
                    },
                )
            }
            Request::Write {
                token, read, new, ..
            } => {
                let accepted = self.admit(token);
                if accepted {
                    self.value = new;
                }
                let op = Op::Write {
                    token,
                    accepted,
                    read,
                    new,
                };
                (self.verdict(accepted, Reply::Ok), op)
            }
            Request::Check {
                held, remaining_ms, ..
            } => (Reply::Ok, Op::Check { held, remaining_ms }),
            Request::End { outcome, .. } => (Reply::Ok, Op::End { outcome }),
            Request::Lost {
                margin_ms, reason, ..
            } => (Reply::Ok, Op::Lost { margin_ms, reason }),
        };
        let seq = self.history.len() as u64;
        let event = Event { seq, at_us, id, op };
        self.history.push(event.clone());
        (reply, event)
    }

    /// The history so far.
    pub fn history(&self) -> &[Event] {
        &self.history
    }

    /// The counter's current value.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// Fenced: a token lower than the highest accepted one is refused; an accepted token
    /// raises the highest. A missing token cannot be fenced and is accepted.
    fn admit(&mut self, token: Option<u64>) -> bool {
        let Some(token) = token else { return true };
        if self.mode == Mode::Fenced && self.highest.is_some_and(|h| token < h) {
            return false;
        }
        self.highest = Some(self.highest.map_or(token, |h| h.max(token)));
        true
    }

    fn verdict(&self, accepted: bool, ok: Reply) -> Reply {
        match accepted {
            true => ok,
            false => Reply::Reject {
                highest: self.highest.unwrap_or(0),
            },
        }
    }
}

/// A [`Register`] served over TCP on loopback, one line per request.
#[derive(Debug)]
pub struct RegisterServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    register: Mutex<Register>,
    started: Instant,
    events: broadcast::Sender<Event>,
}

impl RegisterServer {
    /// Listens on `127.0.0.1:0`.
    ///
    /// # Errors
    /// When it cannot bind.
    pub async fn start(mode: Mode) -> io::Result<RegisterServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            register: Mutex::new(Register::new(mode)),
            started: Instant::now(),
            events,
        });
        let task = tokio::spawn(accept(listener, Arc::clone(&shared)));
        Ok(RegisterServer { addr, shared, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every event from now on, as the register records it.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// A copy of the history so far.
    pub fn history(&self) -> Vec<Event> {
        self.shared.lock().history().to_vec()
    }

    /// The register's clock now, in microseconds (the history's time line).
    pub fn now_us(&self) -> u64 {
        self.shared.now_us()
    }
}

impl Drop for RegisterServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Register> {
        self.register.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn handle(&self, line: &str) -> String {
        match line.parse::<Request>() {
            Ok(request) => {
                let (reply, event) = {
                    let mut register = self.lock();
                    // Stamped under the lock, so stamps follow the history's order.
                    let at = self.now_us();
                    register.apply(request, at)
                };
                let _ = self.events.send(event);
                reply.to_string()
            }
            Err(e) => format!("ERROR {e}"),
        }
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(serve(stream, Arc::clone(&shared)));
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = shared.handle(&line);
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Outcome, SectionId};

    fn id(client: u32) -> SectionId {
        SectionId { client, section: 1 }
    }

    fn write(client: u32, token: u64, read: u64) -> Request {
        Request::Write {
            id: id(client),
            token: Some(token),
            read,
            new: read + 1,
        }
    }

    #[test]
    fn fenced_refuses_lower_tokens_on_every_operation() {
        let mut r = Register::new(Mode::Fenced);
        let begin = |c, t| Request::Begin {
            id: id(c),
            token: Some(t),
        };
        assert_eq!(r.apply(begin(1, 33), 1).0, Reply::Ok);
        assert_eq!(r.apply(begin(2, 34), 2).0, Reply::Ok);
        let read = Request::Read {
            id: id(1),
            token: Some(33),
        };
        assert_eq!(r.apply(read, 3).0, Reply::Reject { highest: 34 });
        assert_eq!(r.apply(write(1, 33, 0), 4).0, Reply::Reject { highest: 34 });
        assert_eq!(r.value(), 0, "a refused write changes nothing");
        assert_eq!(r.apply(write(2, 34, 0), 5).0, Reply::Ok);
        assert_eq!(r.value(), 1);
        assert_eq!(r.history().len(), 5);
        assert!(matches!(
            r.history()[3].op,
            Op::Write {
                accepted: false,
                ..
            }
        ));
    }

    #[test]
    fn unfenced_accepts_everything_but_records_tokens() {
        let mut r = Register::new(Mode::Unfenced);
        r.apply(write(2, 34, 0), 1);
        let (reply, event) = r.apply(write(1, 33, 0), 2);
        assert_eq!(reply, Reply::Ok);
        assert_eq!(event.seq, 1);
        assert_eq!(
            event.op,
            Op::Write {
                token: Some(33),
                accepted: true,
                read: 0,
                new: 1
            }
        );
    }

    #[test]
    fn missing_tokens_cannot_be_fenced() {
        let mut r = Register::new(Mode::Fenced);
        r.apply(write(1, 10, 0), 1);
        let unfenced = Request::Write {
            id: id(2),
            token: None,
            read: 1,
            new: 2,
        };
        assert_eq!(r.apply(unfenced, 2).0, Reply::Ok);
        let end = Request::End {
            id: id(2),
            outcome: Outcome::Done,
        };
        assert_eq!(r.apply(end, 3).0, Reply::Ok);
    }

    #[tokio::test]
    async fn serves_lines_over_tcp_and_broadcasts_events() {
        let server = RegisterServer::start(Mode::Fenced).await.expect("start");
        let mut events = server.subscribe();
        let stream = TcpStream::connect(server.addr()).await.expect("connect");
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        write
            .write_all(b"READ 1 1 5\nnonsense\n")
            .await
            .expect("send");
        assert_eq!(lines.next_line().await.unwrap().unwrap(), "VALUE 0");
        assert!(
            lines
                .next_line()
                .await
                .unwrap()
                .unwrap()
                .starts_with("ERROR")
        );
        assert_eq!(events.recv().await.expect("event").seq, 0);
        assert_eq!(server.history().len(), 1);
    }
}

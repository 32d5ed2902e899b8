//! A TCP relay that holds back one connection's next request (the `slow-attempt` fault).
//!
//! `test_kit::proxy::FaultProxy` applies a fault to every connection of a link, so it
//! keeps the order in which requests reached it: a request sent later is never delivered
//! before one sent earlier. A request overtakes another only on a *different* connection
//! whose path is faster (a pool's other connection, another HTTP/2 endpoint). This relay
//! sits in front of a client's fault proxies and, once armed, delays the next chunk a
//! client sends on whichever connection carries it, and everything after it on that
//! connection (bytes on one connection stay in order), while the client's other
//! connections pass. It counts the held requests that a later request of the same client
//! overtook: that is what the transport allowed, whatever lockcore did.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::sleep;

/// Which of a client's connections one arming holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The next request on any connection to any endpoint (one server or a cluster that
    /// serialises everything: PostgreSQL, Redis, etcd, GCS).
    FirstConnection,
    /// The next request to every endpoint (Redlock: an attempt goes to every node).
    EveryEndpoint,
}

/// One arming point and its counters.
#[derive(Debug, Default)]
pub struct Switch {
    armed: AtomicBool,
    hold_ms: AtomicU64,
    held: AtomicU64,
    overtaken: AtomicU64,
    /// Chunks sent upstream without being held, by every relay sharing this switch.
    passed: AtomicU64,
}

impl Switch {
    fn arm(&self, hold: Duration) {
        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        self.hold_ms.store(ms, Ordering::SeqCst);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }
}

/// What a client's relays did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallStats {
    /// Requests held back.
    pub held: u64,
    /// Held requests that a later request of the same client overtook (sent on another
    /// connection while the held one waited).
    pub overtaken: u64,
}

impl std::ops::AddAssign for StallStats {
    fn add_assign(&mut self, other: StallStats) {
        self.held += other.held;
        self.overtaken += other.overtaken;
    }
}

/// One client's relays, one per server endpoint.
#[derive(Debug)]
pub struct StallLinks {
    addrs: Vec<SocketAddr>,
    switches: Vec<Arc<Switch>>,
    tasks: Vec<JoinHandle<()>>,
}

impl StallLinks {
    /// Starts a relay in front of each of `upstreams` (the client's fault proxies).
    ///
    /// # Errors
    /// When a listener cannot be bound.
    pub async fn start(upstreams: &[SocketAddr], scope: Scope) -> io::Result<StallLinks> {
        let shared = Arc::new(Switch::default());
        let mut links = StallLinks {
            addrs: Vec::new(),
            switches: Vec::new(),
            tasks: Vec::new(),
        };
        for upstream in upstreams {
            let switch = match scope {
                Scope::FirstConnection => Arc::clone(&shared),
                Scope::EveryEndpoint => Arc::new(Switch::default()),
            };
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            links.addrs.push(listener.local_addr()?);
            let task = tokio::spawn(accept(listener, *upstream, Arc::clone(&switch)));
            links.tasks.push(task);
            if !links.switches.iter().any(|s| Arc::ptr_eq(s, &switch)) {
                links.switches.push(switch);
            }
        }
        Ok(links)
    }

    /// The addresses the client connects to (endpoint `i` relays to `upstreams[i]`).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.addrs.clone()
    }

    /// Holds the next request (per [`Scope`]) for `hold`; a no-op while already armed.
    pub fn arm(&self, hold: Duration) {
        for switch in &self.switches {
            if !switch.is_armed() {
                switch.arm(hold);
            }
        }
    }

    /// Disarms every switch (a request already held is still delivered late).
    pub fn disarm(&self) {
        for switch in &self.switches {
            switch.armed.store(false, Ordering::SeqCst);
        }
    }

    /// What the relays did so far.
    pub fn stats(&self) -> StallStats {
        let mut stats = StallStats::default();
        for switch in &self.switches {
            stats += StallStats {
                held: switch.held.load(Ordering::SeqCst),
                overtaken: switch.overtaken.load(Ordering::SeqCst),
            };
        }
        stats
    }

    /// Stops the relays and closes their connections.
    pub fn shutdown(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, switch: Arc<Switch>) {
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else {
                    sleep(Duration::from_millis(20)).await;
                    continue;
                };
                conns.spawn(relay(client, upstream, Arc::clone(&switch)));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, switch: Arc<Switch>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (server_rd, mut server_wr) = server.into_split();
    let down = tokio::spawn(async move {
        let mut server_rd = server_rd;
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    });
    let _ = up(&mut client_rd, &mut server_wr, &switch).await;
    let _ = server_wr.shutdown().await;
    let _ = down.await;
}

/// Client to server: the first chunk after arming, and what follows it on this
/// connection, waits; other connections keep passing meanwhile.
async fn up(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    switch: &Switch,
) -> io::Result<()> {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if switch.armed.swap(false, Ordering::SeqCst) {
            let passed = switch.passed.load(Ordering::SeqCst);
            sleep(Duration::from_millis(switch.hold_ms.load(Ordering::SeqCst))).await;
            switch.held.fetch_add(1, Ordering::SeqCst);
            if switch.passed.load(Ordering::SeqCst) > passed {
                switch.overtaken.fetch_add(1, Ordering::SeqCst);
            }
        } else {
            switch.passed.fetch_add(1, Ordering::SeqCst);
        }
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::time::Instant;

    /// An echo server: what it receives, in arrival order, and each reply.
    async fn echo() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = [0; 64];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let _ = tx.send(buf[..n].to_vec());
                        let _ = conn.write_all(&buf[..n]).await;
                    }
                });
            }
        });
        (addr, rx)
    }

    async fn call(conn: &mut TcpStream, what: &[u8]) {
        conn.write_all(what).await.unwrap();
        let mut buf = vec![0; what.len()];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, what);
    }

    #[tokio::test]
    async fn a_held_request_is_overtaken_only_by_another_connection() {
        let (server, mut arrived) = echo().await;
        let links = StallLinks::start(&[server], Scope::FirstConnection)
            .await
            .unwrap();
        let addr = links.addrs()[0];
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        links.arm(Duration::from_millis(300));
        let started = Instant::now();
        let slow = tokio::spawn(async move {
            call(&mut first, b"one").await;
            first
        });
        sleep(Duration::from_millis(50)).await;
        call(&mut second, b"two").await;
        assert!(started.elapsed() < Duration::from_millis(250));
        let mut first = slow.await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(arrived.recv().await.unwrap(), b"two");
        assert_eq!(arrived.recv().await.unwrap(), b"one");
        assert_eq!(
            links.stats(),
            StallStats {
                held: 1,
                overtaken: 1
            }
        );
        // Disarmed after one hold: the next request passes at once, on either connection.
        let again = Instant::now();
        call(&mut first, b"three").await;
        assert!(again.elapsed() < Duration::from_millis(250));
        links.shutdown();
    }

    #[tokio::test]
    async fn one_connection_keeps_its_order() {
        let (server, mut arrived) = echo().await;
        let links = StallLinks::start(&[server], Scope::FirstConnection)
            .await
            .unwrap();
        let mut conn = TcpStream::connect(links.addrs()[0]).await.unwrap();
        links.arm(Duration::from_millis(200));
        let started = Instant::now();
        conn.write_all(b"a").await.unwrap();
        sleep(Duration::from_millis(50)).await;
        conn.write_all(b"b").await.unwrap();
        let mut buf = [0; 2];
        conn.read_exact(&mut buf).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        let mut got = Vec::new();
        while got.len() < 2 {
            got.extend(arrived.recv().await.unwrap());
        }
        assert_eq!(got, b"ab");
        assert_eq!(
            links.stats(),
            StallStats {
                held: 1,
                overtaken: 0
            }
        );
        links.shutdown();
    }
}

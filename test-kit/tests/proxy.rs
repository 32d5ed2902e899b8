//! Tests of the TCP fault-injection proxy against an in-process echo server.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use test_kit::proxy::{Fault, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// Upper bound for anything that should happen "promptly" (generous for loaded CI).
const PROMPT: Duration = Duration::from_secs(3);
/// How long a read must stay silent to count as "nothing forwarded".
const SILENCE: Duration = Duration::from_millis(300);

/// Starts an echo server that half-closes its side once the client has.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let (mut rd, mut wr) = stream.into_split();
                if tokio::io::copy(&mut rd, &mut wr).await.is_ok() {
                    let _ = wr.shutdown().await;
                }
            });
        }
    });
    addr
}

async fn start_proxy() -> FaultProxy {
    FaultProxy::start(echo_server().await).await.unwrap()
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends `msg`, reads the echo back and returns the round-trip time.
async fn roundtrip(stream: &mut TcpStream, msg: &[u8], limit: Duration) -> Duration {
    let start = Instant::now();
    stream.write_all(msg).await.unwrap();
    let mut buf = vec![0; msg.len()];
    timeout(limit, stream.read_exact(&mut buf))
        .await
        .expect("echo timed out")
        .unwrap();
    assert_eq!(buf, msg);
    start.elapsed()
}

/// Asserts the peer closed the connection with `RST`.
async fn expect_reset(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    match timeout(PROMPT, stream.read(&mut buf))
        .await
        .expect("no reset in time")
    {
        Err(err) => assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}"),
        Ok(n) => panic!("expected a reset, read {n} bytes"),
    }
}

/// Asserts a new connection to `addr` is reset, either already while
/// connecting (the `RST` can beat the connect's completion check) or on read.
async fn expect_new_connection_reset(addr: SocketAddr) {
    match timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect hung")
    {
        Err(err) => assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}"),
        Ok(mut stream) => expect_reset(&mut stream).await,
    }
}

/// Asserts the connection is closed (EOF or reset) without delivering data.
async fn expect_closed(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    match timeout(PROMPT, stream.read(&mut buf))
        .await
        .expect("not closed in time")
    {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected a closed connection, read {n} bytes"),
    }
}

/// Asserts that nothing arrives on `stream` for [`SILENCE`].
async fn expect_silence(stream: &mut TcpStream) {
    let mut buf = [0; 64];
    let read = timeout(SILENCE, stream.read(&mut buf)).await;
    assert!(read.is_err(), "expected silence, got {read:?}");
}

/// Polls `cond` until it holds, failing after [`PROMPT`].
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PROMPT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts nobody accepts connections at `addr` any more.
async fn expect_not_listening(addr: SocketAddr) {
    match timeout(PROMPT, TcpStream::connect(addr))
        .await
        .expect("connect hung")
    {
        Err(_) => {}
        Ok(mut stream) => expect_closed(&mut stream).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_forwards_both_ways_and_counts() {
    let proxy = start_proxy().await;
    assert_eq!(proxy.fault(), Fault::Pass);
    let mut client = connect(proxy.local_addr()).await;
    roundtrip(&mut client, b"hello", PROMPT).await;

    // A payload far larger than one chunk, echoed while still being written.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (mut rd, mut wr) = client.into_split();
    let expected = payload.clone();
    let writer = tokio::spawn(async move {
        wr.write_all(&expected).await.unwrap();
        wr.shutdown().await.unwrap();
    });
    let mut echoed = Vec::new();
    timeout(PROMPT, rd.read_to_end(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    writer.await.unwrap();
    assert!(echoed == payload, "echoed payload differs");

    let total = 5 + payload.len() as u64;
    let stats = proxy.stats();
    assert_eq!(
        (stats.accepted, stats.bytes_up, stats.bytes_down),
        (1, total, total)
    );
    assert_eq!((stats.bytes_dropped, stats.resets), (0, 0));
    wait_for("connection to close", || proxy.connections() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_is_forwarded() {
    let proxy = start_proxy().await;
    let mut client = connect(proxy.local_addr()).await;
    wait_for("connection to open", || proxy.connections() == 1).await;
    client.write_all(b"bye").await.unwrap();
    client.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    timeout(PROMPT, client.read_to_end(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(echoed, b"bye");
    wait_for("connection to close", || proxy.connections() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_is_a_delay_line_preserving_order() {
    const DELAY: Duration = Duration::from_millis(300);
    const MESSAGES: usize = 8;
    let proxy = start_proxy().await;
    proxy.set_fault(Fault::Delay(DELAY));
    assert_eq!(proxy.fault(), Fault::Delay(DELAY));
    let (mut rd, mut wr) = connect(proxy.local_addr()).await.into_split();

    // Messages sent 40 ms apart: each must take one delay per direction, no
    // more (queued, not serialised) and no less, and arrive in order.
    let writer = tokio::spawn(async move {
        let mut sent = Vec::new();
        for i in 0..MESSAGES {
            sent.push(Instant::now());
            wr.write_all(format!("msg-{i:02}").as_bytes())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        (sent, wr)
    });
    let mut received = Vec::new();
    for i in 0..MESSAGES {
        let mut buf = [0; 6];
        timeout(PROMPT + 2 * DELAY, rd.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        received.push(Instant::now());
        assert_eq!(&buf, format!("msg-{i:02}").as_bytes(), "out of order");
    }
    let (sent, _wr) = writer.await.unwrap();
    for (i, (sent, received)) in sent.iter().zip(&received).enumerate() {
        let latency = *received - *sent;
        assert!(latency >= 2 * DELAY, "message {i} took only {latency:?}");
        assert!(
            latency < 2 * DELAY + Duration::from_secs(2),
            "message {i} took {latency:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_changes_apply_to_existing_connections() {
    const DELAY: Duration = Duration::from_millis(500);
    let proxy = start_proxy().await;
    let mut client = connect(proxy.local_addr()).await;
    roundtrip(&mut client, b"one", PROMPT).await;

    proxy.set_fault(Fault::Delay(DELAY));
    let slow = roundtrip(&mut client, b"two", PROMPT + 2 * DELAY).await;
    assert!(slow >= 2 * DELAY, "delayed round trip took only {slow:?}");

    proxy.set_fault(Fault::Pass);
    let fast = roundtrip(&mut client, b"three", PROMPT).await;
    assert!(fast < 2 * DELAY, "round trip after Pass took {fast:?}");
    assert_eq!(proxy.stats().resets, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_pass_releases_delayed_chunks() {
    let proxy = start_proxy().await;
    let mut client = connect(proxy.local_addr()).await;
    proxy.set_fault(Fault::Delay(Duration::from_secs(60)));
    let start = Instant::now();
    client.write_all(b"queued").await.unwrap();
    expect_silence(&mut client).await;
    proxy.set_fault(Fault::Pass);
    let mut buf = [0; 6];
    timeout(PROMPT, client.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"queued");
    assert!(start.elapsed() < SILENCE + PROMPT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_drops_data_and_resets_affected_connections_on_recovery() {
    let proxy = start_proxy().await;
    let mut talker = connect(proxy.local_addr()).await;
    let mut idle = connect(proxy.local_addr()).await;
    roundtrip(&mut talker, b"before", PROMPT).await;
    roundtrip(&mut idle, b"before", PROMPT).await;

    proxy.set_fault(Fault::Blackhole);
    talker.write_all(b"lost").await.unwrap();
    expect_silence(&mut talker).await;
    wait_for("the bytes to be dropped", || {
        proxy.stats().bytes_dropped == 4
    })
    .await;
    // New connections are still accepted and everything stays open.
    let mut newcomer = connect(proxy.local_addr()).await;
    wait_for("three open connections", || proxy.connections() == 3).await;
    expect_silence(&mut idle).await;

    proxy.set_fault(Fault::Pass);
    expect_reset(&mut talker).await;
    roundtrip(&mut idle, b"after", PROMPT).await;
    roundtrip(&mut newcomer, b"after", PROMPT).await;
    let mut fresh = connect(proxy.local_addr()).await;
    roundtrip(&mut fresh, b"fresh", PROMPT).await;
    wait_for("the talker to be gone", || proxy.connections() == 3).await;
    assert_eq!(proxy.stats().resets, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_end_of_stream_resets_on_recovery() {
    let proxy = start_proxy().await;
    let mut client = connect(proxy.local_addr()).await;
    roundtrip(&mut client, b"hi", PROMPT).await;
    proxy.set_fault(Fault::Blackhole);
    client.shutdown().await.unwrap();
    expect_silence(&mut client).await;
    assert_eq!(proxy.connections(), 1, "the FIN must not get through");
    proxy.set_fault(Fault::Pass);
    expect_reset(&mut client).await;
    wait_for("connection to close", || proxy.connections() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_kills_existing_and_new_connections() {
    let proxy = start_proxy().await;
    let mut existing = connect(proxy.local_addr()).await;
    roundtrip(&mut existing, b"ok", PROMPT).await;

    proxy.set_fault(Fault::Reset);
    expect_reset(&mut existing).await;
    expect_new_connection_reset(proxy.local_addr()).await;
    wait_for("connections to close", || proxy.connections() == 0).await;
    let stats = proxy.stats();
    assert_eq!((stats.accepted, stats.resets), (2, 2));

    proxy.set_fault(Fault::Pass);
    let mut recovered = connect(proxy.local_addr()).await;
    roundtrip(&mut recovered, b"back", PROMPT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_upstream_connect_closes_client() {
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = dead.local_addr().unwrap();
    drop(dead);
    let proxy = FaultProxy::start(upstream).await.unwrap();
    expect_new_connection_reset(proxy.local_addr()).await;
    wait_for("connection to close", || proxy.connections() == 0).await;
    let stats = proxy.stats();
    assert_eq!((stats.accepted, stats.resets), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_everything() {
    let proxy = start_proxy().await;
    let handle = proxy.handle();
    let addr = proxy.local_addr();
    let mut client = connect(addr).await;
    roundtrip(&mut client, b"x", PROMPT).await;
    proxy.set_fault(Fault::Blackhole);

    timeout(PROMPT, proxy.shutdown())
        .await
        .expect("shutdown hung");
    assert_eq!(handle.connections(), 0);
    expect_closed(&mut client).await;
    expect_not_listening(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_closes_everything() {
    let proxy = start_proxy().await;
    let handle = proxy.handle();
    let mut client = connect(handle.local_addr()).await;
    roundtrip(&mut client, b"x", PROMPT).await;
    assert_eq!(handle.connections(), 1);

    drop(proxy);
    wait_for("connections to close", || handle.connections() == 0).await;
    expect_closed(&mut client).await;
    expect_not_listening(handle.local_addr()).await;
}

/// Starts a server that answers `ok\n` to every line it reads, and nothing before a line
/// ends.
async fn line_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let mut buf = [0; 64];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    for _ in buf[..n].iter().filter(|&&b| b == b'\n') {
                        if stream.write_all(b"ok\n").await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Reads `count` answers of the line server.
async fn answers(stream: &mut TcpStream, count: usize) {
    let mut buf = vec![0; 3 * count];
    timeout(PROMPT, stream.read_exact(&mut buf))
        .await
        .expect("answers in time")
        .unwrap();
}

/// `requests` counts round trips, not chunks: a request written in two pieces before the
/// answer counts once, and so does a pipeline of two written at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_count_round_trips() {
    let proxy = FaultProxy::start(line_server().await).await.unwrap();
    let mut client = connect(proxy.local_addr()).await;
    for _ in 0..3 {
        client.write_all(b"x\n").await.unwrap();
        answers(&mut client, 1).await;
    }
    assert_eq!(proxy.stats().requests, 3);
    client.write_all(b"a").await.unwrap();
    wait_for("the first piece upstream", || proxy.stats().bytes_up == 7).await;
    client.write_all(b"b\n").await.unwrap();
    answers(&mut client, 1).await;
    assert_eq!(proxy.stats().requests, 4, "one request in two pieces");
    client.write_all(b"c\nd\n").await.unwrap();
    answers(&mut client, 2).await;
    assert_eq!(proxy.stats().requests, 5, "a pipeline of two");
}

//! The private servers start, answer, crash, restart, stall and stop by PID. They need the
//! server binaries (`scripts/servers install`); without them these tests print one
//! `SKIPPED:` line, except in CI (`CI=true` or `ANYLOCK_REQUIRE_SERVERS=1`), where they fail.

use std::time::Duration;

use test_kit::env::servers_required;
use test_kit::servers::process::alive;
use test_kit::servers::{Etcd, Postgres, Redis};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Whether `program` is on `PATH` (or the test must fail because it is not).
fn installed(program: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && !servers_required() {
        eprintln!("SKIPPED: {program} is not installed (scripts/servers install)");
    }
    found || servers_required()
}

/// `PING`'s answer from a plain Redis on `port`, if any within a second.
async fn ping(port: u16) -> Option<String> {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn redis_crashes_restarts_stalls_and_stops_by_pid() {
    if !installed("redis-server") {
        return;
    }
    let mut server = Redis::start_with(&["--maxmemory", "64mb"]).await;
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/0", server.port())
    );
    assert_eq!(ping(server.port()).await.as_deref(), Some("+PONG\r\n"));
    server.stall();
    assert_eq!(ping(server.port()).await, None, "a stalled server answered");
    server.resume();
    assert_eq!(ping(server.port()).await.as_deref(), Some("+PONG\r\n"));
    let first = server.pid();
    server.crash();
    assert!(!alive(first), "redis-server {first} survived the crash");
    server.restart().await;
    assert_ne!(server.pid(), first);
    assert_eq!(ping(server.port()).await.as_deref(), Some("+PONG\r\n"));
    let pid = server.pid();
    drop(server);
    assert!(!alive(pid), "redis-server {pid} survived the drop");
}

#[tokio::test]
async fn a_tls_redis_answers_only_tls() {
    if !installed("redis-server") || !installed("openssl") {
        return;
    }
    let server = Redis::start_tls().await;
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    assert_ne!(ping(server.port()).await.as_deref(), Some("+PONG\r\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_restarts_on_its_data() {
    if test_kit::servers::pg_bin().is_err() && !servers_required() {
        eprintln!("SKIPPED: PostgreSQL is not installed (scripts/servers install)");
        return;
    }
    tokio::task::spawn_blocking(|| {
        let server = Postgres::start();
        server.psql(
            "anylock_private",
            "CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)",
        );
        let first = server.pid();
        server.restart();
        assert!(!alive(first), "postmaster {first} survived the crash");
        assert_eq!(server.psql("anylock_private", "SELECT n FROM kept"), "7");
        server.stop();
    })
    .await
    .expect("the PostgreSQL test");
}

#[tokio::test]
async fn an_etcd_member_restarts_and_the_cluster_stops_on_drop() {
    if !installed("etcd") {
        return;
    }
    let mut cluster = Etcd::start(&[(27596, 27696)], false).await;
    assert_eq!(cluster.endpoints(), ["http://127.0.0.1:27596"]);
    assert_eq!(cluster.leader().await, Ok(0));
    cluster.restart(0);
    cluster.wait_healthy(Duration::from_secs(30)).await;
    assert!(cluster.is_healthy(0).await);
    drop(cluster);
    assert!(
        TcpStream::connect(("127.0.0.1", 27596)).await.is_err(),
        "etcd still listens after the drop"
    );
}

//! The backend behind PgBouncer in transaction mode: no operation relies on session state,
//! so the lock protocol and fenced writes work when every transaction may land on another
//! client's server connection. Only `LISTEN` needs a session, so it goes to the server
//! directly (`listen_url`).
//!
//! The test starts its own PgBouncer (the `pgbouncer` binary, from the Debian package of
//! that name) in front of the shared server with ONE server connection for all clients.
//! A missing binary fails in CI and skips elsewhere, like a missing server.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{fresh_name, fresh_schema, grant, shared_url};
use lockcore::{Acquire, Identity, LockBackend, LockOptions, Locker, WaitMode};
use sqlx::{AssertSqlSafe, Connection, Row};
use test_kit::env::{host_port, servers_required};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

/// A PgBouncer process, killed when dropped.
struct Bouncer {
    _child: Child,
    port: u16,
}

fn pgbouncer_bin() -> Option<String> {
    let candidates = [
        std::env::var("ANYLOCK_PGBOUNCER_BIN").ok(),
        Some("/usr/sbin/pgbouncer".to_owned()),
        Some("/usr/bin/pgbouncer".to_owned()),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| std::path::Path::new(p).exists())
}

/// Starts PgBouncer in transaction mode in front of `url`'s server.
async fn start_bouncer(url: &str) -> Option<Bouncer> {
    let Some(bin) = pgbouncer_bin() else {
        assert!(
            !servers_required(),
            "pgbouncer is not installed: `apt-get install pgbouncer` (scripts/servers should)"
        );
        eprintln!("SKIPPED: pgbouncer is not installed");
        return None;
    };
    let upstream = host_port(url).expect("host:port");
    let (host, upstream_port) = upstream.rsplit_once(':').expect("port");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = std::env::temp_dir().join(format!("anylock-pgbouncer-{port}"));
    write_config(&dir, port, host, upstream_port);
    let mut cmd = Command::new(bin);
    if test_kit::servers::is_root() {
        std::process::Command::new("chown")
            .args(["-R", "postgres", &dir.to_string_lossy()])
            .status()
            .expect("chown");
        cmd.args(["-u", "postgres"]);
    }
    let child = cmd
        .arg(dir.join("pgbouncer.ini"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start pgbouncer");
    let pid = child.id().expect("pgbouncer pid");
    test_kit::servers::on_exit(&format!("kill {pid} 2>/dev/null; rm -rf {}", dir.display()))
        .expect("a cleanup watchdog");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "pgbouncer did not start");
        sleep(Duration::from_millis(50)).await;
    }
    Some(Bouncer {
        _child: child,
        port,
    })
}

/// A transaction-mode configuration with ONE server connection shared by every client.
fn write_config(dir: &std::path::Path, port: u16, host: &str, upstream_port: &str) {
    std::fs::create_dir_all(dir).expect("dir");
    let ini = format!(
        "[databases]\nanylock_test = host={host} port={upstream_port} dbname=anylock_test\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = transaction\n\
         default_pool_size = 1\nmax_client_conn = 200\n\
         ignore_startup_parameters = extra_float_digits\nlogfile = {dir}/pgbouncer.log\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini).expect("ini");
    std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users");
}

/// The pooler really is in transaction mode with one server connection: a `SET` made by
/// one client connection is seen by another. (This is why the backend keeps no session
/// state: under this pooler it would leak between clients or vanish.)
async fn assert_sessions_are_shared(bouncer_url: &str) {
    let mut a = sqlx::PgConnection::connect(bouncer_url)
        .await
        .expect("client a");
    let mut b = sqlx::PgConnection::connect(bouncer_url)
        .await
        .expect("client b");
    // 1001..=1999 ms: never a whole number of seconds, so PostgreSQL shows it as "NNNNms".
    let marker = format!("{}ms", 1001 + rand::random::<u32>() % 999);
    sqlx::query(AssertSqlSafe(format!("SET statement_timeout = '{marker}'")))
        .persistent(false)
        .execute(&mut a)
        .await
        .expect("set");
    let seen: String = sqlx::query("SELECT current_setting('statement_timeout') AS v")
        .persistent(false)
        .fetch_one(&mut b)
        .await
        .expect("show")
        .get("v");
    sqlx::query("RESET statement_timeout")
        .persistent(false)
        .execute(&mut b)
        .await
        .expect("reset");
    assert_eq!(
        seen, marker,
        "client b did not see client a's SET: the pooler is not sharing server sessions"
    );
}

/// Acquire, held, refresh (alone and in a batch), inspect, fenced write, release and a
/// notified handoff all work through the pooler, and contenders through it never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_protocol_works_through_transaction_pooling() {
    let Some(url) = shared_url() else { return };
    let Some(bouncer) = start_bouncer(&url).await else {
        return;
    };
    let port = format!("127.0.0.1:{}", bouncer.port);
    let bouncer_url = url.replace(host_port(&url).expect("host"), &port);
    assert_sessions_are_shared(&bouncer_url).await;
    let schema = fresh_schema("bouncer");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let connect = async || {
        let through = format!("{bouncer_url}&prepared_statements=false");
        let config = common::config(&through, &schema)
            .with_pool_size(4)
            .with_listen_url(&url)
            .expect("listen url");
        let backend = PostgresBackend::connect(config).await;
        backend.expect("connect through pgbouncer")
    };
    let (a, b) = (connect().await, connect().await);
    one_cycle(&a, &b).await;
    contend_without_overlap(&a, &b).await;
}

/// Every operation once, then a notified handoff from `a` to a waiter on `b`.
async fn one_cycle(a: &PostgresBackend, b: &PostgresBackend) {
    let name = fresh_name("bouncer");
    let long = Duration::from_secs(30);
    let lease = grant(a, &name, &Identity::unique(), long).await;
    let rival = common::attempt(b, &name, &Identity::unique(), long).await;
    assert!(
        matches!(rival, Acquire::Held(_)),
        "exclusion through the pooler"
    );
    a.refresh(&lease).await.expect("refresh");
    let gone = grant(a, &fresh_name("bouncer-gone"), &Identity::unique(), long).await;
    a.release(&gone).await.expect("release");
    let batch = a.refresh_many(&[lease.clone(), gone, lease.clone()]).await;
    let ok: Vec<bool> = batch.iter().map(Result::is_ok).collect();
    assert_eq!(
        ok,
        [true, false, true],
        "a batch through the pooler: {batch:?}"
    );
    assert!(b.inspect(&name).await.expect("inspect").is_some());
    let mut tx = a
        .begin_fenced(&lease)
        .await
        .expect("fenced through the pooler");
    sqlx::query("SELECT 1")
        .persistent(false)
        .execute(&mut *tx)
        .await
        .expect("stmt");
    tx.commit().await.expect("commit");
    let sleepy = lockcore::Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let waiter = Locker::new(Arc::new(b.clone())).with_options(
        LockOptions::new(long)
            .with_backoff(sleepy)
            .with_wait(WaitMode::Timeout(Duration::from_secs(90))),
    );
    let task = tokio::spawn(async move { waiter.acquire(&name).await });
    sleep(Duration::from_millis(500)).await;
    a.release(&lease).await.expect("release");
    let guard = timeout(Duration::from_secs(5), task)
        .await
        .expect("not notified through the direct LISTEN connection")
        .expect("join")
        .expect("acquire");
    guard.release().await.expect("release");
}

/// Four contenders over two backends through the pooler: never two inside at once.
async fn contend_without_overlap(a: &PostgresBackend, b: &PostgresBackend) {
    let name = fresh_name("bouncer-contend");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for backend in [a, b, a, b] {
        let locker = Locker::new(Arc::new(backend.clone()))
            .with_options(LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::Forever));
        let (name, inside, overlaps) = (name.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = locker.acquire(&name).await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender");
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders through the pooler"
    );
}

//! The connections lock calls run on (`src/conns.rs`): kept between calls without a ping
//! as they come back (one round trip per statement), never used again after a call that
//! did not end cleanly, and at most `pool_size` of them.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{fresh_name, fresh_schema, grant, shared_url};
use lockcore::{Identity, LockBackend};
use test_kit::proxy::{Fault, FaultProxy};

const LONG: Duration = Duration::from_secs(60);

/// A backend in a fresh schema whose connections go through a proxy, and the proxy.
async fn through_proxy(
    url: &str,
    schema: &str,
    configure: impl FnOnce(backend_postgres::PostgresConfig) -> backend_postgres::PostgresConfig,
) -> (PostgresBackend, FaultProxy) {
    let upstream = test_kit::env::host_port(url).expect("host:port");
    let proxy = FaultProxy::start(upstream.parse().expect("address"))
        .await
        .expect("proxy");
    let through = url.replace(upstream, &proxy.local_addr().to_string());
    let config = configure(common::config(&through, schema));
    let backend = PostgresBackend::connect(config).await.expect("connect");
    (backend, proxy)
}

/// An uncontended acquire + release is two round trips, one statement each, on one
/// connection kept between calls. Through sqlx's pool it was four: the pool pinged each
/// connection as it came back (BENCHMARKS.md, the round-trip counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_two_round_trips() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("conn_rtt");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (backend, proxy) = through_proxy(&url, &schema, |c| c).await;
    let cycle = async || {
        let lease = grant(&backend, &fresh_name("rtt"), &Identity::unique(), LONG).await;
        backend.release(&lease).await.expect("release");
    };
    // The statements are prepared on the connection by the first cycles.
    for _ in 0..3 {
        cycle().await;
    }
    // Whatever a return could still send in the background (sqlx's ping did) is sent by
    // now; the pause stays under the one-second idle ping.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = proxy.stats();
    for _ in 0..10 {
        cycle().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = proxy.stats();
    assert_eq!(
        after.requests - before.requests,
        20,
        "round trips in 10 cycles"
    );
    assert_eq!(after.accepted, before.accepted, "a connection was opened");
}

/// A call that did not end cleanly (here: no answer within the timeout) leaves its
/// connection mid-statement; it is closed, never lent again, and the next call opens a
/// fresh one and gets the right answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_left_mid_statement_is_not_used_again() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("conn_cut");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (backend, proxy) =
        through_proxy(&url, &schema, |c| c.with_timeout(Duration::from_secs(1))).await;
    let warm = grant(&backend, &fresh_name("cut"), &Identity::unique(), LONG).await;
    let before = proxy.stats().accepted;

    proxy.set_fault(Fault::Delay(Duration::from_secs(3)));
    let late = backend.refresh(&warm).await;
    let err = late.expect_err("no answer within the timeout");
    assert!(err.is_temporary(), "{err}");
    proxy.set_fault(Fault::Pass);

    let refreshed = backend.refresh(&warm).await.expect("refresh");
    assert_eq!(refreshed.grant(), warm.grant());
    assert_eq!(
        proxy.stats().accepted,
        before + 1,
        "the call after the timeout did not open a fresh connection"
    );
    backend.release(&refreshed).await.expect("release");
}

/// Ten calls at once on a backend of `pool_size` 2 open at most 2 connections, and all
/// ten are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_share_at_most_pool_size_connections() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("conn_size");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (backend, proxy) = through_proxy(&url, &schema, |c| c.with_pool_size(2)).await;
    // Connect opened one connection for its check and closed it, and keeps one (from the
    // schema check) idle.
    let before = proxy.stats().accepted;
    // Every call waits 50 ms each way, so they overlap.
    proxy.set_fault(Fault::Delay(Duration::from_millis(50)));
    let names: Vec<_> = (0..10).map(|_| fresh_name("size")).collect();
    let owner = Identity::unique();
    let leases = futures_util::future::join_all(
        names.iter().map(|name| grant(&backend, name, &owner, LONG)),
    )
    .await;
    proxy.set_fault(Fault::Pass);
    let opened = proxy.stats().accepted - before;
    assert!(
        opened <= 1,
        "{opened} connections opened beside the idle one"
    );
    assert!(proxy.connections() <= 2, "{} open", proxy.connections());
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

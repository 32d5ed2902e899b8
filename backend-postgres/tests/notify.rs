//! Release notifications on the shared server: prompt wake-ups, per-name filtering, a
//! listener that reconnects after `pg_terminate_backend`, and waiters that fall back to
//! bounded polling while the listener is down.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_postgres::{KEEPALIVE, PostgresBackend, PostgresConfig};
use common::{admin, fresh_name, fresh_schema, grant, shared_url};
use futures_util::StreamExt;
use lockcore::{
    Backoff, Identity, Jitter, LockBackend, LockName, LockOptions, Locker, ReleaseEvents, WaitMode,
};
use sqlx::Row;
use sqlx::postgres::PgPool;
use test_kit::env::host_port;
use test_kit::proxy::{Fault, FaultProxy};
use tokio::time::{Instant, sleep, timeout};

const LONG: Duration = Duration::from_secs(300);
/// How long a wake-up that should come at once may take.
const UP: Duration = Duration::from_secs(5);

/// A backend whose listener is recognisable in `pg_stat_activity`.
async fn named_backend(url: &str, schema: &str, app: &str) -> PostgresBackend {
    let url = format!("{url}&application_name={app}");
    PostgresBackend::connect(common::config(&url, schema))
        .await
        .expect("connect")
}

/// A locker whose backoff sleeps `delay` between polls.
fn waiter(backend: &PostgresBackend, delay: Duration) -> Locker {
    let backoff = Backoff::new(delay, delay).with_jitter(Jitter::None);
    let options = LockOptions::new(Duration::from_secs(30))
        .with_backoff(backoff)
        .with_wait(WaitMode::Timeout(Duration::from_secs(120)));
    Locker::new(Arc::new(backend.clone())).with_options(options)
}

/// The next item of `events`, or `None` after `limit`.
async fn next_within(events: &mut ReleaseEvents, limit: Duration) -> Option<()> {
    timeout(limit, events.next()).await.ok().flatten()
}

/// The PIDs of `app`'s listening sessions.
async fn listener_pids(admin: &PgPool, app: &str) -> Vec<i32> {
    sqlx::query("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(format!("{app} (listen)"))
        .fetch_all(admin)
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get("pid"))
        .collect()
}

/// A waiter whose backoff would keep it asleep for 60 s gets the lock within a second or
/// two of the release: the NOTIFY woke it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_sleeping_waiter_promptly() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("wake");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = common::backend(&url, &schema).await;
    let name = fresh_name("wake");
    let held = grant(&backend, &name, &Identity::unique(), LONG).await;
    let sleepy = waiter(&backend, Duration::from_secs(60));
    let task = tokio::spawn({
        let name = name.clone();
        async move { sleepy.acquire(&name).await.map(|g| (Instant::now(), g)) }
    });
    sleep(Duration::from_millis(700)).await;
    assert!(!task.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    backend.release(&held).await.expect("release");
    let (got, guard) = timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter slept on after the release")
        .expect("join")
        .expect("acquire");
    println!("notified handoff: {:?}", got - released);
    guard.release().await.expect("release");
}

/// A subscription yields for releases of its own name, and not for other names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_yields_for_its_own_name_only() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("filter");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = common::backend(&url, &schema).await;
    let (ours, other) = (fresh_name("ours"), fresh_name("other"));
    let mut events = subscribed(&backend, &ours).await;
    cycle(&backend, &other).await;
    let quiet = next_within(&mut events, Duration::from_millis(500)).await;
    assert!(quiet.is_none(), "woken by another lock's release");
    cycle(&backend, &ours).await;
    next_within(&mut events, UP)
        .await
        .expect("no wake-up for our release");
}

/// Killing the listener's session (`pg_terminate_backend`) wakes subscribers (a release
/// may have been missed), the listener reconnects on a new session, and releases wake
/// subscribers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_reconnects_after_being_killed() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let app = format!("anylock-notify-{:08x}", rand::random::<u32>());
    let schema = fresh_schema("listen");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = named_backend(&url, &schema, &app).await;
    let name = fresh_name("killed");
    let mut events = subscribed(&backend, &name).await;
    let pids = listener_pids(&admin, &app).await;
    assert_eq!(pids.len(), 1, "one listener per backend: {pids:?}");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pids[0])
        .execute(&admin)
        .await
        .expect("terminate the listener");
    next_within(&mut events, UP)
        .await
        .expect("no wake-up when the listener died");
    wait_for_new_listener(&admin, &app, pids[0]).await;
    while next_within(&mut events, Duration::from_millis(300))
        .await
        .is_some()
    {}
    cycle(&backend, &name).await;
    next_within(&mut events, UP)
        .await
        .expect("no wake-up after the reconnect");
}

/// Waits until `app` listens again on a session other than `old`.
async fn wait_for_new_listener(admin: &PgPool, app: &str, old: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = listener_pids(admin, app).await;
        if now.len() == 1 && now[0] != old {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the listener did not reconnect: {now:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Takes and releases `name` once.
async fn cycle(backend: &PostgresBackend, name: &LockName) {
    let lease = grant(backend, name, &Identity::unique(), LONG).await;
    backend.release(&lease).await.expect("release");
}

/// A subscription to `name` whose listener is up (its first wake-up was seen).
async fn subscribed(backend: &PostgresBackend, name: &LockName) -> ReleaseEvents {
    let mut events = backend
        .subscribe(name)
        .await
        .expect("subscribe")
        .expect("notified");
    next_within(&mut events, UP)
        .await
        .expect("no wake-up when the listener came up");
    events
}

/// A backend whose `LISTEN` connection goes through a fault proxy (the pool does not).
async fn proxied_listener(
    url: &str,
    schema: &str,
    timeout: Duration,
) -> (FaultProxy, PostgresBackend) {
    let upstream = host_port(url).expect("host:port").parse().expect("addr");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let listen_url = url.replace(
        host_port(url).expect("host"),
        &proxy.local_addr().to_string(),
    );
    let config = PostgresConfig::from_url(url)
        .expect("url")
        .with_schema(schema)
        .with_timeout(timeout)
        .with_listen_url(&listen_url)
        .expect("listen url");
    let backend = PostgresBackend::connect(config).await.expect("connect");
    (proxy, backend)
}

/// With the listener's path down (connections reset and refused), a waiter still gets the
/// lock by its own bounded polling, while a notification-only subscription hears nothing;
/// when the path comes back the listener reconnects and wakes subscribers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_poll_while_the_listener_is_down() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("poll");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (proxy, backend) = proxied_listener(&url, &schema, Duration::from_secs(10)).await;
    let name = fresh_name("poll");
    let mut events = subscribed(&backend, &name).await;
    let held = grant(&backend, &name, &Identity::unique(), LONG).await;
    proxy.set_fault(Fault::Reset);
    next_within(&mut events, UP).await.expect("loss noticed");
    let polling = waiter(&backend, Duration::from_millis(500));
    let task = tokio::spawn({
        let name = name.clone();
        async move { polling.acquire(&name).await }
    });
    sleep(Duration::from_millis(800)).await;
    let released = Instant::now();
    backend.release(&held).await.expect("release");
    let guard = timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter did not fall back to polling")
        .expect("join")
        .expect("acquire");
    println!("handoff by polling: {:?}", released.elapsed());
    let heard = next_within(&mut events, Duration::from_millis(300)).await;
    assert!(
        heard.is_none(),
        "a notification arrived through a dead listener"
    );
    proxy.set_fault(Fault::Pass);
    next_within(&mut events, Duration::from_secs(10))
        .await
        .expect("reconnect wake-up");
    guard.release().await.expect("release");
    next_within(&mut events, UP).await.expect("notified again");
}

/// A listener connection that dies silently (a partition: no reset, no reply) is noticed
/// by the keepalive within one keepalive period plus the timeout, and subscribers wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_notices_a_silently_dead_listener() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("keepalive");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (proxy, backend) = proxied_listener(&url, &schema, Duration::from_secs(1)).await;
    let mut events = subscribed(&backend, &fresh_name("keepalive")).await;
    let cut = Instant::now();
    proxy.set_fault(Fault::Blackhole);
    let limit = KEEPALIVE + Duration::from_secs(5);
    next_within(&mut events, limit)
        .await
        .expect("the dead listener went unnoticed");
    println!("silent loss noticed after {:?}", cut.elapsed());
    proxy.set_fault(Fault::Pass);
}

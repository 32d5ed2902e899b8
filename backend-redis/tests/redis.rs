//! Single-instance behaviour the conformance suite cannot see: round trips counted on the
//! server, `NOSCRIPT` recovery, polling after an admin `DEL`, key layout, credentials in
//! errors, a hung server, and the shared notification connection.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_redis::{LockKeys, RedisBackend, RedisConfig};
use futures_util::StreamExt;
use lockcore::{
    Acquire, AcquireRequest, Backoff, ErrorKind, Identity, LockBackend, LockOptions, Locker,
    LostReason, WaitMode,
};
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, timeout};

async fn backend_on(url: &str, timeout: Duration) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(common::random_prefix("redis"))
        .with_timeout(timeout);
    RedisBackend::connect(config).await.expect("connect")
}

fn request(name: &str, owner: &Identity) -> AcquireRequest {
    AcquireRequest::new(
        common::fresh_name(name),
        owner.clone(),
        lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    )
}

/// Runs `op` and asserts the commands the server ran meanwhile (from `INFO commandstats`).
async fn assert_commands<F: Future>(
    stats: &mut MultiplexedConnection,
    what: &str,
    expected: &[(&str, u64)],
    op: F,
) -> F::Output {
    let before = common::command_calls(stats).await;
    let output = op.await;
    let after = common::command_calls(stats).await;
    let ran = common::calls_between(&before, &after);
    assert_eq!(ran, common::calls(expected), "{what}");
    output
}

/// Uncontended acquire, refresh and release are one client command (`EVALSHA`) each,
/// counted on a private server by `INFO commandstats` deltas. Redis also counts the
/// commands a script runs under their own names, so each delta is the full expected map:
/// any extra round trip (a separate GET, PTTL, PUBLISH) would change it.
#[tokio::test]
async fn each_operation_is_one_command_on_the_server() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let stats = &mut common::admin(&server.url()).await;
    let me = Identity::unique();
    // Warm up: connection handshake and the first NOSCRIPT/SCRIPT LOAD of every script.
    let warm = common::take(&backend, &request("warm", &me)).await;
    backend.refresh(&warm).await.expect("refresh");
    backend.inspect(warm.name()).await.expect("inspect");
    backend.list(warm.name().as_str()).await.expect("list");
    backend.release(&warm).await.expect("release");
    backend.break_lock(warm.name()).await.expect("break");

    let req = request("counted", &me);
    // Every grant reads the lock and the server clock, reads and bumps the fence counter
    // in one `SET … GET`, and writes the lock: the first grant of a name and all later
    // ones alike. Without a note the note key is not touched.
    let acquire = [("evalsha", 1), ("get", 1), ("time", 1), ("set", 2)];
    let first = assert_commands(
        stats,
        "first acquire",
        &acquire,
        common::take(&backend, &req),
    )
    .await;
    backend.release(&first).await.expect("release");
    // A note is written by the same script, with the grant's TTL.
    let noted_acquire = [
        ("evalsha", 1),
        ("get", 1),
        ("time", 1),
        ("set", 2),
        ("hset", 1),
        ("pexpire", 1),
    ];
    let noted = req
        .clone()
        .with_note(Some(lockcore::Note::new("counted").expect("note")));
    let lease = assert_commands(
        stats,
        "noted",
        &noted_acquire,
        common::take(&backend, &noted),
    )
    .await;
    backend.release(&lease).await.expect("release");
    let lease = assert_commands(stats, "acquire", &acquire, common::take(&backend, &req)).await;
    let refresh = [("evalsha", 1), ("get", 1), ("pexpire", 2)];
    let refreshed = assert_commands(stats, "refresh", &refresh, backend.refresh(&lease)).await;
    assert_eq!(refreshed.expect("refresh"), lease);
    let rival = AcquireRequest::new(req.name.clone(), Identity::unique(), req.ttl);
    let held = [("evalsha", 1), ("get", 1), ("hmget", 1), ("pttl", 1)];
    let outcome = assert_commands(stats, "held", &held, backend.acquire(&rival)).await;
    assert!(matches!(outcome, Ok(Acquire::Held(_))), "{outcome:?}");
    let inspected = assert_commands(stats, "inspect", &held, backend.inspect(&req.name)).await;
    assert_eq!(
        inspected.expect("inspect").map(|h| h.token()),
        Some(lease.token())
    );
    // A listing is one SCAN per page (one page here), then one script reading the
    // candidates of that page.
    let list = [
        ("scan", 1),
        ("evalsha", 1),
        ("get", 1),
        ("hmget", 1),
        ("pttl", 1),
    ];
    let listed = assert_commands(stats, "list", &list, backend.list(req.name.as_str())).await;
    assert_eq!(listed.expect("list").len(), 1);
    let release = [("evalsha", 1), ("get", 1), ("del", 1), ("publish", 1)];
    // (`del` removes the lock key and the note key in one command.)
    let released = assert_commands(stats, "release", &release, backend.release(&lease)).await;
    released.expect("release");
    common::take(&backend, &req).await;
    let broke = [
        ("evalsha", 1),
        ("get", 1),
        ("pttl", 1),
        ("hmget", 1),
        ("del", 1),
        ("publish", 1),
    ];
    let removed = assert_commands(stats, "break", &broke, backend.break_lock(&req.name)).await;
    assert!(removed.expect("break").is_some(), "nothing was broken");
}

/// After `SCRIPT FLUSH` (or a server restart) the next call gets NOSCRIPT, loads the script
/// and succeeds; the call after that is a single EVALSHA again.
#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let me = Identity::unique();
    let lease = common::take(&backend, &request("flush", &me)).await;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    // The failed EVALSHA (NOSCRIPT), then SCRIPT LOAD and the EVALSHA again in one
    // pipeline: two round trips.
    let reload = [
        ("evalsha", 2),
        ("script|load", 1),
        ("get", 1),
        ("pexpire", 2),
    ];
    let refreshed = assert_commands(&mut admin, "reload", &reload, backend.refresh(&lease)).await;
    refreshed.expect("refresh after flush");
    let steady = [("evalsha", 1), ("get", 1), ("pexpire", 2)];
    let refreshed = assert_commands(&mut admin, "steady", &steady, backend.refresh(&lease)).await;
    refreshed.expect("refresh");
    backend.release(&lease).await.expect("release after flush");
}

/// An operator's plain `DEL` publishes nothing; a waiter still gets the lock within its
/// backoff cap because it polls between notifications.
#[tokio::test]
async fn admin_delete_without_publish_is_noticed_within_the_backoff_cap() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = Arc::new(backend_on(&url, Duration::from_secs(2)).await);
    let ttl = Duration::from_secs(60);
    let holder = Locker::new(backend.clone()).with_options(LockOptions::new(ttl));
    let name = common::fresh_name("admin-del");
    let guard = holder.acquire(name.as_str()).await.expect("free");
    let cap = Duration::from_millis(400);
    let options = LockOptions::new(ttl)
        .with_backoff(Backoff::new(Duration::from_millis(10), cap))
        .with_wait(WaitMode::Timeout(Duration::from_secs(30)));
    let waiter = Locker::new(backend.clone()).with_options(options);
    let task = tokio::spawn({
        let name = name.clone();
        async move {
            waiter
                .acquire(name.as_str())
                .await
                .map(|g| (Instant::now(), g))
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!task.is_finished(), "the waiter got a held lock");
    let deleted = Instant::now();
    common::raw_del(&mut common::admin(&url).await, backend.keys(&name).lock()).await;
    let (got, second) = timeout(Duration::from_secs(10), task)
        .await
        .expect("the waiter never noticed the DEL")
        .expect("join")
        .expect("acquire");
    let noticed = got - deleted;
    assert!(
        noticed <= cap + Duration::from_secs(1),
        "noticed {noticed:?} after the DEL; backoff cap {cap:?}"
    );
    second.release().await.expect("release");
    drop(guard);
}

/// CRC16 (XMODEM), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Redis Cluster's `CLUSTER KEYSLOT`: CRC16 of the hash tag (or the key) mod 16384.
fn key_slot(key: &str) -> u16 {
    let tagged = key.find('{').and_then(|open| {
        let len = key[open + 1..].find('}')?;
        (len > 0).then(|| &key[open + 1..open + 1 + len])
    });
    crc16(tagged.unwrap_or(key).as_bytes()) % 16384
}

/// The lock key and the fence counter are the keys the server really holds, and they hash
/// to one cluster slot (so one script may touch both on a Redis Cluster).
#[tokio::test]
async fn lock_and_fence_keys_share_one_cluster_slot() {
    assert_eq!(crc16(b"123456789"), 0x31C3, "CRC16/XMODEM check value");
    // The examples of the CLUSTER KEYSLOT documentation.
    assert_eq!(key_slot("somekey"), 11058);
    assert_eq!(key_slot("foo{hash_tag}"), 2515);
    assert_eq!(key_slot("bar{hash_tag}"), 2515);
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    for name in ["plain", "with}brace", "{tagged}", "colon:name"] {
        let name =
            lockcore::LockName::new(format!("{name}-{:x}", rand::random::<u32>())).expect("valid");
        let keys: LockKeys = backend.keys(&name);
        assert_eq!(key_slot(keys.lock()), key_slot(keys.fence()), "{name}");
        let req = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
        );
        let lease = common::take(&backend, &req).await;
        assert!(common::exists(&mut admin, keys.lock()).await, "{name}");
        let counter: u64 = redis::cmd("GET")
            .arg(keys.fence())
            .query_async(&mut admin)
            .await
            .expect("fence counter");
        assert_eq!(lease.token().map(|t| t.get()), Some(counter), "{name}");
        backend.release(&lease).await.expect("release");
        assert!(!common::exists(&mut admin, keys.lock()).await, "{name}");
        assert!(
            common::exists(&mut admin, keys.fence()).await,
            "counter kept"
        );
    }
}

/// Rejected credentials are a permanent PermissionDenied whose message, Display and Debug
/// never contain the password.
#[tokio::test]
async fn rejected_credentials_never_show_the_password() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let secret = "hunter2-do-not-print";
    let with_password = url.replacen("redis://", &format!("redis://nobody:{secret}@"), 1);
    let config = RedisConfig::from_url(&with_password).expect("valid URL");
    assert!(!format!("{config} {config:?}").contains(secret));
    let err = RedisBackend::connect(config)
        .await
        .expect_err("unknown user accepted");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_temporary());
    let mut shown = format!("{err} {err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        shown.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("nobody:***@"), "{shown}");
    // The backend leaves the context out; the Locker names the backend and the lock.
    let config = RedisConfig::from_url(&with_password).expect("valid URL");
    let lazy = RedisBackend::connect_lazy(config).await.expect("no I/O");
    let name = common::fresh_name("refused");
    let err = Locker::new(Arc::new(lazy))
        .acquire(name.as_str())
        .await
        .expect_err("unknown user accepted");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert_eq!(err.backend(), Some("redis"), "{err}");
    assert_eq!(err.lock(), Some(&name), "{err}");
    assert!(!format!("{err} {err:?}").contains(secret), "{err:?}");
}

/// A stalled server (`SIGSTOP` on a private redis-server) yields timely errors, not a hang:
/// OutcomeUnknown for writes in flight, Unavailable for reads; service resumes after
/// `SIGCONT`.
#[tokio::test]
async fn a_stalled_server_gives_timely_errors() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let limit = Duration::from_millis(300);
    let backend = backend_on(&server.url(), limit).await;
    let me = Identity::unique();
    let lease = common::take(&backend, &request("stall", &me)).await;
    server.stall();
    let bound = limit + Duration::from_secs(1);
    let start = Instant::now();
    let err = timeout(bound * 2, backend.acquire(&request("stalled", &me)))
        .await
        .expect("acquire hung")
        .expect_err("a stalled server granted a lock");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    let refresh = backend.refresh(&lease).await.expect_err("refreshed");
    assert_eq!(refresh.kind(), ErrorKind::OutcomeUnknown, "{refresh}");
    let read = backend.inspect(lease.name()).await.expect_err("read");
    assert_eq!(read.kind(), ErrorKind::Unavailable, "{read}");
    assert!(start.elapsed() < bound * 3, "took {:?}", start.elapsed());
    let fresh = RedisConfig::from_url(&server.url())
        .expect("valid")
        .with_timeout(limit);
    let start = Instant::now();
    let err = RedisBackend::connect(fresh).await.expect_err("connected");
    assert!(err.is_temporary(), "{err}");
    assert!(
        start.elapsed() < bound,
        "connect took {:?}",
        start.elapsed()
    );
    server.resume();
    backend
        .refresh(&lease)
        .await
        .expect("refresh after SIGCONT");
    backend.release(&lease).await.expect("release");
}

/// Waiters on one name share one subscription on one pub/sub connection; a release wakes
/// every waiter; when they are gone the channel is unsubscribed after a linger period, and
/// a waiter arriving within it costs no SUBSCRIBE.
#[tokio::test]
async fn waiters_share_one_subscription() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let me = Identity::unique();
    let lease = common::take(&backend, &request("shared", &me)).await;
    let channel = backend.keys(lease.name()).channel().to_owned();
    let mut first = backend
        .subscribe(lease.name())
        .await
        .expect("ok")
        .expect("some");
    let mut second = backend
        .subscribe(lease.name())
        .await
        .expect("ok")
        .expect("some");
    assert_eq!(subscribers(&mut admin, &channel).await, 1);
    assert_eq!(pubsub_connections(&mut admin).await, 1);
    backend.release(&lease).await.expect("release");
    for events in [&mut first, &mut second] {
        let woke = timeout(Duration::from_secs(5), events.next()).await;
        assert_eq!(woke.expect("no notification"), Some(()));
    }
    drop((first, second));
    let before = common::command_calls(&mut admin).await;
    let third = backend
        .subscribe(lease.name())
        .await
        .expect("ok")
        .expect("some");
    let after = common::command_calls(&mut admin).await;
    assert_eq!(
        common::calls_between(&before, &after),
        common::calls(&[]),
        "re-subscribed"
    );
    drop(third);
    assert!(
        unsubscribed(&mut admin, &channel).await,
        "the channel stayed subscribed after its waiters left"
    );
}

/// When the pub/sub connection drops, streams end (waiters fall back to polling), and the
/// next subscription opens a new connection that works.
#[tokio::test]
async fn a_dropped_notification_connection_ends_streams_and_reconnects() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let name = common::fresh_name("dropped-pubsub");
    let mut events = backend.subscribe(&name).await.expect("ok").expect("some");
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async::<u64>(&mut admin)
        .await
        .expect("CLIENT KILL");
    let ended = timeout(Duration::from_secs(5), events.next()).await;
    assert_eq!(ended.expect("the stream did not end"), None);
    let mut again = backend.subscribe(&name).await.expect("ok").expect("some");
    let lease = common::take(
        &backend,
        &AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
        ),
    )
    .await;
    backend.release(&lease).await.expect("release");
    let woke = timeout(Duration::from_secs(5), again.next()).await;
    assert_eq!(woke.expect("no notification after reconnecting"), Some(()));
}

/// Waits up to 5 s (the linger period is 1 s) for `channel` to have no subscriber.
async fn unsubscribed(admin: &mut MultiplexedConnection, channel: &str) -> bool {
    for _ in 0..250 {
        if subscribers(admin, channel).await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn subscribers(admin: &mut MultiplexedConnection, channel: &str) -> u64 {
    let reply: (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(admin)
        .await
        .expect("PUBSUB NUMSUB");
    reply.1
}

async fn pubsub_connections(admin: &mut MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg(&["LIST", "TYPE", "pubsub"])
        .query_async(admin)
        .await
        .expect("CLIENT LIST");
    list.lines().count()
}

/// A waiter dropped while its SUBSCRIBE is in flight (the server stalled) leaves no
/// subscription behind once the server answers again.
#[tokio::test]
async fn a_subscription_dropped_in_flight_is_cleaned_up() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    // Open the shared pub/sub connection first, so only the SUBSCRIBE itself stalls.
    let opener = backend
        .subscribe(&common::fresh_name("opener"))
        .await
        .expect("ok");
    let name = common::fresh_name("in-flight");
    let channel = backend.keys(&name).channel().to_owned();
    server.stall();
    let cut_short = timeout(Duration::from_millis(200), backend.subscribe(&name)).await;
    assert!(cut_short.is_err(), "subscribed on a stalled server");
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    assert!(
        unsubscribed(&mut admin, &channel).await,
        "the abandoned SUBSCRIBE left the channel subscribed"
    );
    drop(opener);
}

/// `?protocol=resp3` (passed through to the client) works for every call, notifications
/// included.
#[tokio::test]
async fn resp3_connections_work() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&format!("{url}?protocol=resp3"), Duration::from_secs(2)).await;
    let me = Identity::unique();
    let lease = common::take(&backend, &request("resp3", &me)).await;
    let holder = backend.inspect(lease.name()).await.expect("inspect");
    assert_eq!(holder.map(|h| h.owner().clone()), Some(me.clone()));
    let mut events = backend
        .subscribe(lease.name())
        .await
        .expect("ok")
        .expect("some");
    let refreshed = backend.refresh(&lease).await.expect("refresh");
    backend.release(&refreshed).await.expect("release");
    let woke = timeout(Duration::from_secs(5), events.next()).await;
    assert_eq!(woke.expect("no notification over RESP3"), Some(()));
    assert_eq!(backend.inspect(lease.name()).await.expect("inspect"), None);
}

/// An operator's break removes whoever holds the lock and reports them, wakes waiters,
/// turns the holder's guard Lost, and keeps fencing monotonic.
#[tokio::test]
async fn break_lock_removes_the_holder_and_keeps_tokens_rising() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = Arc::new(backend_on(&url, Duration::from_secs(2)).await);
    let ttl = Duration::from_secs(2);
    let locker = Locker::new(backend.clone()).with_options(LockOptions::new(ttl));
    let name = common::fresh_name("break");
    let guard = locker.acquire(name.as_str()).await.expect("free");
    let mut events = backend.subscribe(&name).await.expect("ok").expect("some");
    let removed = backend.break_lock(&name).await.expect("break");
    let removed = removed.expect("it was held");
    assert_eq!(removed.owner(), guard.lease().owner());
    assert_eq!(removed.token(), guard.fence_token());
    let woke = timeout(Duration::from_secs(5), events.next()).await;
    assert_eq!(woke.expect("waiters were not woken"), Some(()));
    let reason = timeout(ttl, guard.lost())
        .await
        .expect("the guard stayed held");
    assert!(matches!(reason, LostReason::NotOwner(_)), "{reason}");
    assert!(backend.break_lock(&name).await.expect("break").is_none());
    let next = locker
        .acquire(name.as_str())
        .await
        .expect("free after the break");
    assert!(
        next.fence_token() > guard.fence_token(),
        "fencing went back"
    );
    next.release().await.expect("release");
}

/// A server that forgets everything (a restart without persistence, here `FLUSHALL` on a
/// private server) must not hand out a fence token a live holder still uses: the counter
/// restarts at the server clock in microseconds, above every token it gave before. The
/// reliability harness found the old counter restarting at 1 and a fenced resource then
/// accepting the forgotten holder's stale write (RELIABILITY.md, `redis-restart`).
#[tokio::test]
async fn fence_tokens_keep_rising_when_the_server_forgets_its_data() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let me = Identity::unique();
    let held = common::take(&backend, &request("forgotten", &me)).await;
    let mut admin = common::admin(&server.url()).await;
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut admin)
        .await
        .expect("FLUSHALL");
    let after = common::take(&backend, &request("forgotten", &Identity::unique())).await;
    assert!(
        after.token() > held.token(),
        "{:?} after {:?}: a stale holder's token would be accepted",
        after.token(),
        held.token()
    );
    backend.release(&after).await.expect("release");
    let next = common::take(&backend, &request("forgotten", &me)).await;
    assert!(next.token() > after.token(), "and keeps rising");
}

/// `rediss://` works end to end (a private TLS-only server with a self-signed certificate,
/// `#insecure`): lock calls and notifications; a plain connection to it fails in time.
#[cfg(feature = "tls-insecure")]
#[tokio::test]
async fn tls_connections_work() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start_tls().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let me = Identity::unique();
    let lease = common::take(&backend, &request("tls", &me)).await;
    let mut events = backend
        .subscribe(lease.name())
        .await
        .expect("ok")
        .expect("some");
    backend.refresh(&lease).await.expect("refresh over TLS");
    backend.release(&lease).await.expect("release over TLS");
    let woke = timeout(Duration::from_secs(5), events.next()).await;
    assert_eq!(woke.expect("no notification over TLS"), Some(()));
    // `#insecure` checks nothing, and `check` must say so.
    let security = backend.connection_security().await.expect("security");
    let lockcore::Transport::Tls(tls) = &security[0].transport else {
        panic!("not TLS: {security:?}");
    };
    assert_eq!(tls.verification, lockcore::Verification::None);
    assert!(!tls.client_certificate);
    assert!(tls.version.is_some(), "the probe failed: {tls:?}");
    assert_eq!(
        security[0].identity.as_deref(),
        Some("user \"default\" (no password)")
    );
    let plain = server
        .url()
        .replace("rediss://", "redis://")
        .replace("#insecure", "");
    let config = RedisConfig::from_url(&plain)
        .expect("valid")
        .with_timeout(Duration::from_millis(500));
    let err = RedisBackend::connect(config)
        .await
        .expect_err("plain text to a TLS port");
    assert!(err.is_temporary(), "{err}");
}

/// A fence counter that holds no exact integer below 2^53 (corrupted, or written by some
/// other tool) is refused before anything is written. Lua numbers are doubles: at 2^53
/// `counter + 1` equals `counter`, so tokens repeated, and `1e20` was written back as a
/// negative token (found by review, issue #14).
#[tokio::test]
async fn a_fence_counter_beyond_exact_integers_is_refused_not_repeated() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    for bad in ["9007199254740993", "1e20"] {
        let name = common::fresh_name("bad-counter");
        let keys: LockKeys = backend.keys(&name);
        redis::cmd("SET")
            .arg(keys.fence())
            .arg(bad)
            .query_async::<()>(&mut admin)
            .await
            .expect("set the counter");
        let req = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
        );
        let err = backend.acquire(&req).await.expect_err(bad);
        assert!(err.to_string().contains("fence counter"), "{bad}: {err}");
        assert!(
            !common::exists(&mut admin, keys.lock()).await,
            "{bad}: no lock was written"
        );
        let stored: String = redis::cmd("GET")
            .arg(keys.fence())
            .query_async(&mut admin)
            .await
            .expect("counter");
        assert_eq!(
            stored, bad,
            "the counter is left for an operator to inspect"
        );
    }
}

/// Stored-format compatibility. A lock value written before notes existed (no note key)
/// reads as a holder without a note, in `inspect` and `list`. A grant with a note keeps the
/// lock value's old shape `<token>:<ms>:<hex nonce>:<owner>` (an older client parses the
/// owner unchanged) and puts the note in the note hash, bound to that value; when a client
/// that knows nothing of notes overwrites the value (its same-owner retake), the old note
/// is no longer shown.
#[tokio::test]
async fn values_without_notes_still_parse_and_notes_never_change_the_value() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    let owner = Identity::unique();
    let old = common::fresh_name("old-value");
    let keys = backend.keys(&old);
    let value = common::stored_value(7, &owner);
    common::raw_set(&mut admin, keys.lock(), &value, Duration::from_secs(30)).await;
    let found = backend.inspect(&old).await.expect("inspect").expect("held");
    assert_eq!(found.owner(), &owner);
    assert_eq!(found.token().map(|t| t.get()), Some(7));
    assert_eq!(found.note(), None);
    let listed = backend.list(old.as_str()).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].holder(),
        &found
            .clone()
            .with_expires_in(listed[0].holder().expires_in().expect("ttl"))
    );

    let noted = common::fresh_name("noted");
    let keys = backend.keys(&noted);
    let note = lockcore::Note::new("ci run 42").expect("note");
    let request = AcquireRequest::new(
        noted.clone(),
        owner.clone(),
        lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    )
    .with_note(Some(note.clone()));
    let lease = common::take(&backend, &request).await;
    let raw: String = redis::cmd("GET")
        .arg(keys.lock())
        .query_async(&mut admin)
        .await
        .expect("GET");
    let (token, rest) = raw.split_once(':').expect("token");
    let (ms, rest) = rest.split_once(':').expect("ms");
    let (nonce, stored_owner) = rest.split_once(':').expect("nonce");
    assert!(
        token.parse::<u64>().is_ok() && ms.parse::<u64>().is_ok(),
        "{raw}"
    );
    assert!(nonce.bytes().all(|b| b.is_ascii_hexdigit()), "{raw}");
    assert_eq!(
        stored_owner,
        owner.as_str(),
        "the note leaked into the value"
    );
    let hash: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.note())
        .query_async(&mut admin)
        .await
        .expect("HGETALL");
    assert_eq!(hash.get("grant"), Some(&raw));
    assert_eq!(hash.get("note").map(String::as_str), Some(note.as_str()));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(keys.note())
        .query_async(&mut admin)
        .await
        .expect("PTTL");
    assert!(
        pttl > 0 && pttl <= 30_000,
        "the note key must expire with the grant: {pttl}"
    );

    // An older client's retake writes a new value and leaves the note key alone.
    let retaken = common::stored_value(token.parse::<u64>().expect("token") + 1, &owner);
    common::raw_set(&mut admin, keys.lock(), &retaken, Duration::from_secs(30)).await;
    let found = backend
        .inspect(&noted)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(
        found.note(),
        None,
        "a note shown for a grant it does not belong to"
    );
    let listed = backend.list(noted.as_str()).await.expect("list");
    assert_eq!(listed[0].holder().note(), None);
    drop(lease);
    backend.break_lock(&noted).await.expect("break");
    assert!(
        !common::exists(&mut admin, keys.note()).await,
        "break leaves the note"
    );
    backend.break_lock(&old).await.expect("break");
}

/// `list` reports only lock keys: fence counters, note hashes, a hash where a lock key
/// would be, and a key whose name is not UTF-8 are left out without failing the listing.
/// A foreign string value is listed as `inspect` reports it (it blocks the lock).
#[tokio::test]
async fn list_skips_keys_that_are_not_lock_keys() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    let base = common::fresh_name("odd");
    let under = |rest: &str| lockcore::LockName::new(format!("{base}/{rest}")).expect("valid");
    let ttl = Duration::from_secs(30);
    let held = under("held");
    let note = lockcore::Note::new("listed").expect("note");
    let lease = common::take(
        &backend,
        &AcquireRequest::new(
            held.clone(),
            Identity::unique(),
            lockcore::Ttl::new(ttl).expect("valid TTL"),
        )
        .with_note(Some(note.clone())),
    )
    .await;
    let foreign = under("foreign");
    common::raw_set(
        &mut admin,
        backend.keys(&foreign).lock(),
        "my_random_value",
        ttl,
    )
    .await;
    let hashed = backend.keys(&under("hash"));
    let orphans = backend.keys(&under("orphan"));
    let prefix = backend.config().prefix().to_owned();
    let mut bad_name = format!("{{{prefix}:{base}/").into_bytes();
    bad_name.extend_from_slice(b"\xff}:lock");
    let mut pipe = redis::pipe();
    pipe.cmd("HSET")
        .arg(hashed.lock())
        .arg("f")
        .arg("v")
        .ignore();
    pipe.cmd("PEXPIRE").arg(hashed.lock()).arg(30_000).ignore();
    pipe.cmd("SET")
        .arg(orphans.fence())
        .arg("12")
        .arg("PX")
        .arg(30_000)
        .ignore();
    pipe.cmd("HSET")
        .arg(orphans.note())
        .arg("grant")
        .arg("x")
        .arg("note")
        .arg("y")
        .ignore();
    pipe.cmd("PEXPIRE").arg(orphans.note()).arg(30_000).ignore();
    pipe.cmd("SET")
        .arg(&bad_name)
        .arg(common::stored_value(1, &Identity::unique()))
        .arg("PX")
        .arg(30_000)
        .ignore();
    pipe.query_async::<()>(&mut admin).await.expect("pipeline");

    let listed = backend.list(&format!("{base}/")).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|e| e.name().as_str()).collect();
    assert_eq!(names, [foreign.as_str(), held.as_str()]);
    let inspected = backend
        .inspect(&foreign)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(listed[0].holder().owner(), inspected.owner());
    assert_eq!(listed[1].holder().note(), Some(&note));
    assert_eq!(listed[1].holder().token(), lease.token());
    backend.release(&lease).await.expect("release");
    for key in [
        hashed.lock(),
        orphans.fence(),
        orphans.note(),
        backend.keys(&foreign).lock(),
    ] {
        common::raw_del(&mut admin, key).await;
    }
    redis::cmd("DEL")
        .arg(&bad_name)
        .query_async::<()>(&mut admin)
        .await
        .expect("DEL");
}

/// A listing longer than one `SCAN` page: every held lock appears once, sorted, and the
/// server ran more than one `SCAN` (pages, not one `KEYS`).
#[tokio::test]
async fn list_pages_through_many_locks() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(5)).await;
    let stats = &mut common::admin(&server.url()).await;
    let base = common::fresh_name("many");
    let mut leases = Vec::new();
    for i in 0..1200 {
        let name = format!("{base}/{i:04}");
        let req = AcquireRequest::new(
            lockcore::LockName::new(&name).expect("valid"),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(60)).expect("valid TTL"),
        );
        leases.push(common::take(&backend, &req).await);
    }
    let before = common::command_calls(stats).await;
    let listed = backend.list(base.as_str()).await.expect("list");
    let after = common::command_calls(stats).await;
    let ran = common::calls_between(&before, &after);
    let names: Vec<&str> = listed.iter().map(|e| e.name().as_str()).collect();
    let expected: Vec<&str> = leases.iter().map(|l| l.name().as_str()).collect();
    assert_eq!(names, expected);
    assert!(ran.get("scan").copied().unwrap_or(0) > 1, "{ran:?}");
    assert_eq!(ran.get("keys"), None, "{ran:?}");
}

/// A refresh extends the note with the grant: past the first TTL, a refreshed lease still
/// shows its note (the note key has its own `PX`, extended by the refresh script).
#[tokio::test]
async fn a_refreshed_lease_keeps_its_note_past_the_first_ttl() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let name = common::fresh_name("note-refresh");
    let note = lockcore::Note::new("kept").expect("note");
    let ttl = Duration::from_millis(800);
    let req = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    )
    .with_note(Some(note.clone()));
    let lease = common::take(&backend, &req).await;
    tokio::time::sleep(ttl / 2).await;
    backend.refresh(&lease).await.expect("refresh");
    tokio::time::sleep(ttl * 3 / 4).await;
    let found = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(
        found.note(),
        Some(&note),
        "the note expired before its refreshed grant"
    );
    backend.release(&lease).await.expect("release");
}

/// Glob characters in a prefix match only themselves, including where an unescaped
/// pattern would match *less* (a class `[ab]` matches `a` or `b`, not `[ab]`; `\*` matches
/// `*`, not `\*`), which filtering the scanned names afterwards cannot repair.
#[tokio::test]
async fn list_prefixes_with_glob_characters_match_only_themselves() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let base = common::fresh_name("glob");
    let under = |rest: &str| lockcore::LockName::new(format!("{base}/{rest}")).expect("valid");
    let ttl = Duration::from_secs(30);
    let names = ["k[ab]1", "ka1", r"k\*1", "k*1", "k]1", "k?1"].map(under);
    let mut leases = Vec::new();
    for name in &names {
        let req = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(ttl).expect("valid TTL"),
        );
        leases.push(common::take(&backend, &req).await);
    }
    for (prefix, only) in [
        ("k[ab]", "k[ab]1"),
        ("ka", "ka1"),
        (r"k\*", r"k\*1"),
        ("k*", "k*1"),
        ("k]", "k]1"),
        ("k?", "k?1"),
    ] {
        let listed = backend
            .list(&format!("{base}/{prefix}"))
            .await
            .expect("list");
        let listed: Vec<&str> = listed.iter().map(|e| e.name().as_str()).collect();
        assert_eq!(listed, [format!("{base}/{only}")], "prefix {prefix:?}");
    }
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// A retake without a note drops the note of the grant it replaces: with a shorter TTL it
/// would outlive that grant, and the next holder's refreshes (which extend the note key
/// without reading it) would keep it alive. A fresh grant without a note leaves no key.
#[tokio::test]
async fn a_retake_without_a_note_leaves_no_note_behind() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    let owner = Identity::unique();
    let name = common::fresh_name("retake-note");
    let keys = backend.keys(&name);
    let ttl = |secs| lockcore::Ttl::new(Duration::from_secs(secs)).expect("valid TTL");
    let noted = AcquireRequest::new(name.clone(), owner.clone(), ttl(60))
        .with_note(Some(lockcore::Note::new("long run").expect("note")));
    common::take(&backend, &noted).await;
    assert!(common::exists(&mut admin, keys.note()).await, "noted");
    let retake = AcquireRequest::new(name.clone(), owner.clone(), ttl(2));
    let lease = common::take(&backend, &retake).await;
    assert!(
        !common::exists(&mut admin, keys.note()).await,
        "the replaced grant's note outlives the retake"
    );
    backend.refresh(&lease).await.expect("refresh");
    assert!(!common::exists(&mut admin, keys.note()).await);
    backend.release(&lease).await.expect("release");
    let fresh = AcquireRequest::new(name.clone(), Identity::unique(), ttl(30));
    let lease = common::take(&backend, &fresh).await;
    assert!(
        !common::exists(&mut admin, keys.note()).await,
        "a note key without a note"
    );
    backend.release(&lease).await.expect("release");
}

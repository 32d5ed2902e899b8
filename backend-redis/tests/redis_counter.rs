//! The fence counter's one-command read and bump (`SET counter <clock> GET`), its rare second
//! `SET` when the counter is ahead of the clock, and Redlock's one-command free grant
//! (`SET NX PX GET`), counted on private servers by `INFO commandstats` deltas.

mod common;

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backend_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, Note, Ttl};
use redis::aio::MultiplexedConnection;

fn request(name: &LockName, owner: &Identity) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        owner.clone(),
        Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    )
}

/// Runs `op` and asserts the commands the server ran meanwhile.
async fn assert_commands<F: Future>(
    stats: &mut MultiplexedConnection,
    what: &str,
    expected: &[(&str, u64)],
    op: F,
) -> F::Output {
    let before = common::command_calls(stats).await;
    let output = op.await;
    let after = common::command_calls(stats).await;
    assert_eq!(
        common::calls_between(&before, &after),
        common::calls(expected),
        "{what}"
    );
    output
}

async fn counter(admin: &mut MultiplexedConnection, key: &str) -> u64 {
    let raw: String = redis::cmd("GET")
        .arg(key)
        .query_async(admin)
        .await
        .expect("GET counter");
    raw.parse().expect("an integer counter")
}

fn now_micros() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_micros()).expect("fits")
}

/// A counter ahead of the server clock (a clock stepped back, or grants faster than one a
/// microsecond) is continued: each grant's token is the counter + 1, written back by a
/// second `SET`; a missing counter starts at the clock with the one `SET … GET`.
#[tokio::test]
async fn a_counter_ahead_of_the_clock_is_continued() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let config = RedisConfig::from_url(&server.url())
        .expect("valid URL")
        .with_prefix(common::random_prefix("counter"));
    let backend = RedisBackend::connect(config).await.expect("connect");
    let stats = &mut common::admin(&server.url()).await;
    let me = Identity::unique();
    let warm = common::take(&backend, &request(&common::fresh_name("warm"), &me)).await;
    backend.release(&warm).await.expect("release");

    let name = common::fresh_name("fresh");
    let fence = backend.keys(&name).fence().to_owned();
    let before = now_micros();
    let first = [("evalsha", 1), ("get", 1), ("time", 1), ("set", 2)];
    let lease = assert_commands(
        stats,
        "missing counter",
        &first,
        common::take(&backend, &request(&name, &me)),
    )
    .await;
    let token = lease.token().expect("fenced").get();
    assert!(token >= before, "{token} starts at the clock ({before})");
    assert_eq!(counter(stats, &fence).await, token, "written back");
    backend.release(&lease).await.expect("release");

    // 2^53 - 1 is 9 007 199 254 740 991: this is the year 2223 in microseconds.
    let ahead: u64 = 8_000_000_000_000_000;
    redis::cmd("SET")
        .arg(&fence)
        .arg(ahead)
        .query_async::<()>(stats)
        .await
        .expect("SET counter");
    let bumped = [("evalsha", 1), ("get", 1), ("time", 1), ("set", 3)];
    for k in 1..=2 {
        let lease = assert_commands(
            stats,
            "counter ahead",
            &bumped,
            common::take(&backend, &request(&name, &me)),
        )
        .await;
        assert_eq!(lease.token().expect("fenced").get(), ahead + k);
        assert_eq!(counter(stats, &fence).await, ahead + k, "written back");
        backend.release(&lease).await.expect("release");
    }
}

/// Redlock's free grant without a note is one `SET NX PX GET` per node; a refusal reads
/// the holder with the same `SET`; a same-owner retake and a grant with a note are as
/// before (the note is written before the lock).
#[tokio::test]
async fn a_free_redlock_grant_is_one_set_per_node() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let config = RedlockConfig::from_node_urls([server.url()])
        .expect("valid URL")
        .with_prefix(common::random_prefix("redlock-counts"));
    let backend = RedlockBackend::connect(config).await.expect("connect");
    let stats = &mut common::admin(&server.url()).await;
    let me = Identity::unique();
    let warm = common::take(&backend, &request(&common::fresh_name("warm"), &me)).await;
    backend.release(&warm).await.expect("release");

    let name = common::fresh_name("counted");
    let free = [("evalsha", 1), ("set", 1)];
    let lease = assert_commands(
        stats,
        "free",
        &free,
        common::take(&backend, &request(&name, &me)),
    )
    .await;
    // (Then a failed acquisition is released everywhere: the release script's `GET`.)
    let held = [
        ("evalsha", 2),
        ("set", 1),
        ("hmget", 1),
        ("pttl", 1),
        ("get", 1),
    ];
    let rival = request(&name, &Identity::unique());
    let outcome = assert_commands(stats, "held", &held, backend.acquire(&rival)).await;
    assert!(matches!(outcome, Ok(Acquire::Held(_))), "{outcome:?}");
    let retake = [("evalsha", 1), ("set", 2), ("del", 1)];
    let again = assert_commands(
        stats,
        "retake",
        &retake,
        common::take(&backend, &request(&name, &me)),
    )
    .await;
    assert!(backend.refresh(&lease).await.is_err(), "superseded");
    backend.release(&again).await.expect("release");
    let noted = request(&name, &me).with_note(Some(Note::new("n").expect("note")));
    let with_note = [
        ("evalsha", 1),
        ("get", 1),
        ("hset", 1),
        ("pexpire", 1),
        ("set", 1),
    ];
    let lease = assert_commands(stats, "noted", &with_note, common::take(&backend, &noted)).await;
    let found = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(found.note().map(Note::as_str), Some("n"));
    backend.release(&lease).await.expect("release");
}

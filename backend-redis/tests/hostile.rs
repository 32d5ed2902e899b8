//! A hostile or impostor server (a scripted fake on loopback, `fake/mod.rs`) must get a
//! typed error for every reply the backend reads, never a panic, an endless allocation or
//! a reply taken for success. Found by an outside security review: a fake Redis answering
//! `$8589934592` made the client allocate until it aborted; a malformed `SCRIPT LOAD`
//! reply tripped an assertion inside the `redis` crate; `PING` answered `:42` was taken
//! for a live server.

mod fake;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use fake::{Answer, Command, Fake, bulk};
use lockcore::{AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Ttl};

/// A backend on the fake server (connect must succeed: the answers to the connect calls
/// are honest unless the test's script says otherwise).
async fn backend(fake: &Fake) -> RedisBackend {
    connect(fake).await.expect("connect to the fake server")
}

async fn connect(fake: &Fake) -> lockcore::Result<RedisBackend> {
    let config = RedisConfig::from_url(&fake.url())
        .expect("valid URL")
        .with_timeout(Duration::from_secs(2));
    RedisBackend::connect(config).await
}

fn request() -> AcquireRequest {
    let ttl = Ttl::new(Duration::from_secs(30)).expect("valid TTL");
    AcquireRequest::new(
        LockName::new("hostile").expect("name"),
        Identity::unique(),
        ttl,
    )
}

fn lease(n: usize) -> Lease {
    let name = LockName::new(format!("hostile-{n}")).expect("name");
    let ttl = Ttl::new(Duration::from_secs(30)).expect("valid TTL");
    Lease::new(name, Identity::unique(), ttl, format!("1:1:ab:owner-{n}"))
}

fn is(command: &Command, name: &str) -> bool {
    command.name() == name
}

/// Asserts `err` is a `Protocol` error whose message contains `text`.
#[track_caller]
fn assert_refused(err: &lockcore::Error, text: &str) {
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(err.message().contains(text), "{err}");
}

/// `$8589934592` and then bytes: the call fails at once naming the limit (it waited for
/// 8 GiB before, and timed out while the connection kept reading).
#[tokio::test]
async fn a_huge_value_fails_the_call_naming_the_limit() {
    let fake = Fake::start(|c| match is(c, "EVALSHA") {
        true => Answer::Stream {
            head: b"$8589934592\r\n".to_vec(),
            filler: b"x".to_vec(),
            total: 64 << 20,
        },
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let err = backend.acquire(&request()).await.expect_err("refused");
    assert_refused(
        &err,
        "the server's reply exceeds 1 MiB (a value); is this a Redis server?",
    );
}

/// An error line that never ends is cut at 64 KiB.
#[tokio::test]
async fn an_endless_error_text_fails_the_call() {
    let fake = Fake::start(|c| match is(c, "EVALSHA") {
        true => Answer::Stream {
            head: b"-ERR ".to_vec(),
            filler: b"x".to_vec(),
            total: 16 << 20,
        },
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let err = backend.inspect(&request().name).await.expect_err("refused");
    assert_refused(&err, "exceeds 64 KiB (an error text or status line)");
}

/// A listing page announcing two billion keys is refused at its header.
#[tokio::test]
async fn a_huge_listing_page_fails_the_listing() {
    let fake = Fake::start(|c| match is(c, "SCAN") {
        true => Answer::Stream {
            head: b"*2\r\n$1\r\n0\r\n*2000000000\r\n".to_vec(),
            filler: b":1\r\n".to_vec(),
            total: 64 << 20,
        },
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let err = backend.list("").await.expect_err("refused");
    assert_refused(&err, "exceeds 100000 elements (one array, set or map)");
}

/// The replies to one pipeline are held until the last arrives: 100 refreshes answered
/// with 1 MiB each break the batch's 64 MiB budget, and every lease gets the refusal
/// (before, each lease was reported Lost to a value no server stored).
#[tokio::test]
async fn the_replies_to_one_refresh_batch_share_a_budget() {
    let big = bulk(&vec![b'v'; 1 << 20]);
    let fake = Fake::start(move |c| match is(c, "EVALSHA") {
        true => Answer::Bytes(big.clone()),
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let leases: Vec<Lease> = (0..100).map(lease).collect();
    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), 100);
    for result in results {
        let err = result.expect_err("refused");
        assert_refused(
            &err,
            "exceeds 64 MiB (the replies to one batch of commands)",
        );
    }
}

/// `PING` answered with anything but `PONG` is not a Redis server.
#[tokio::test]
async fn ping_must_be_answered_pong() {
    for reply in [&b":42\r\n"[..], b"+OK\r\n", b"*0\r\n", b"$-1\r\n"] {
        let answer = reply.to_vec();
        let fake = Fake::start(move |c| match is(c, "PING") {
            true => Answer::Bytes(answer.clone()),
            false => Answer::Honest,
        })
        .await;
        let err = connect(&fake).await.expect_err("not a Redis server");
        assert_refused(&err, "PING answered");
    }
}

/// `SCRIPT LOAD` must answer the script's SHA1 at connect (the preload).
#[tokio::test]
async fn script_load_must_answer_the_scripts_sha1_at_connect() {
    let answers: [&[u8]; 4] = [
        b"$40\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
        b":1\r\n",
        b"+OK\r\n",
        b"$3\r\nabc\r\n",
    ];
    for answer in answers {
        let answer = answer.to_vec();
        let fake = Fake::start(move |c| match is(c, "SCRIPT LOAD") {
            true => Answer::Bytes(answer.clone()),
            false => Answer::Honest,
        })
        .await;
        let err = connect(&fake).await.expect_err("not a Redis server");
        assert_refused(&err, "SCRIPT LOAD did not answer the script's SHA1");
    }
}

/// `NOSCRIPT` and then a `SCRIPT LOAD` answered with another SHA1: a typed error (this
/// tripped a `debug_assert` inside the `redis` crate: the process exited with 101).
#[tokio::test]
async fn script_load_must_answer_the_scripts_sha1_after_noscript() {
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let after = std::sync::Arc::clone(&connected);
    let fake = Fake::start(move |c| {
        let connected = after.load(std::sync::atomic::Ordering::Relaxed);
        match c.name().as_str() {
            "EVALSHA" => Answer::Bytes(b"-NOSCRIPT No matching script.\r\n".to_vec()),
            "SCRIPT LOAD" if connected => Answer::Bytes(bulk(&[b'a'; 40])),
            _ => Answer::Honest,
        }
    })
    .await;
    let backend = backend(&fake).await;
    connected.store(true, std::sync::atomic::Ordering::Relaxed);
    let err = backend.acquire(&request()).await.expect_err("refused");
    assert_refused(&err, "SCRIPT LOAD did not answer the script's SHA1");
    let err = backend.release(&lease(0)).await.expect_err("refused");
    assert_refused(&err, "SCRIPT LOAD did not answer the script's SHA1");
}

/// Bytes that are not RESP end the call with a typed error, and the next call opens a
/// new connection (which works when the server behaves).
#[tokio::test]
async fn a_cut_connection_is_replaced_on_the_next_call() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&calls);
    let fake = Fake::start(move |c| match is(c, "EVALSHA") {
        true if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 => {
            Answer::Bytes(format!("${}\r\n", 2 << 20).into_bytes())
        }
        true => Answer::Bytes(b"$-1\r\n".to_vec()),
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let err = backend.inspect(&request().name).await.expect_err("refused");
    assert_refused(&err, "exceeds 1 MiB (a value)");
    let found = backend
        .inspect(&request().name)
        .await
        .expect("a new connection");
    assert!(found.is_none());
}

/// `SCAN` answering the same cursor again and again would page forever: the listing fails
/// instead (a real server never answers the cursor it was given).
#[tokio::test]
async fn a_scan_that_never_ends_fails_the_listing() {
    let fake = Fake::start(|c| match is(c, "SCAN") {
        true => Answer::Bytes(b"*2\r\n$1\r\n7\r\n*0\r\n".to_vec()),
        false => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let listed = tokio::time::timeout(Duration::from_secs(30), backend.list("")).await;
    let err = listed.expect("the listing ends").expect_err("refused");
    assert_refused(&err, "SCAN answered the cursor it was given");
}

/// Pages of new lock keys without end (each one found held): the listing stops at its
/// limit of locks instead of growing until memory runs out.
#[tokio::test]
async fn a_listing_stops_at_its_limit_of_locks() {
    let pages = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let fake = Fake::start(move |c| match c.name().as_str() {
        "SCAN" => {
            let page = pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let cursor = (page + 1).to_string();
            let mut reply = [b"*2\r\n".to_vec(), bulk(cursor.as_bytes())].concat();
            reply.extend(b"*500\r\n");
            for i in 0..500 {
                reply.extend(bulk(format!("{{anylock:k{page}-{i}}}:lock").as_bytes()));
            }
            Answer::Bytes(reply)
        }
        "EVALSHA" => {
            let found = [bulk(b"1:1:ab:someone"), b":1000\r\n".to_vec(), bulk(b"")].concat();
            let names = (c.args.len() - 3) / 2;
            let entry = [b"*3\r\n".to_vec(), found].concat();
            Answer::Bytes([format!("*{names}\r\n").into_bytes(), entry.repeat(names)].concat())
        }
        _ => Answer::Honest,
    })
    .await;
    let backend = backend(&fake).await;
    let listed = tokio::time::timeout(Duration::from_secs(60), backend.list("")).await;
    let err = listed.expect("the listing ends").expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(
        err.message().contains("more than 100000 held locks"),
        "{err}"
    );
}

//! The client's peak memory (`VmHWM` of this test process: the only test in its binary)
//! while a fake server (`fake/mod.rs`) answers with a huge reply: a bulk string announced
//! as 8 GiB followed by 1 GiB of bytes, and an array announced with two billion elements
//! followed by 32 MiB of `:1` elements (8 million values the parser would keep). Without
//! the reply limits the client buffered everything the server sent (the per-call timeout
//! gave up, the connection read on); with them the peak stays near the baseline.

mod fake;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use fake::{Answer, Fake};
use lockcore::{AcquireRequest, Identity, LockBackend, LockName, Ttl};

/// `VmHWM` (peak resident set) of this process, in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .expect("VmHWM");
    line.split_whitespace()
        .nth(1)
        .and_then(|kib| kib.parse().ok())
        .expect("a number")
}

/// Waits until the server has stopped sending (the client hung up, or it sent all).
async fn until_quiet(fake: &Fake) -> u64 {
    let mut last = u64::MAX;
    loop {
        let sent = fake.sent.load(std::sync::atomic::Ordering::Relaxed);
        if sent == last {
            return sent;
        }
        last = sent;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Acquires on a server whose script replies are `head` then `filler` up to `total`
/// bytes; the growth of the peak RSS in KiB, and what the server sent.
async fn peak_growth(head: &[u8], filler: &[u8], total: u64) -> (u64, u64) {
    let (head, filler) = (head.to_vec(), filler.to_vec());
    let fake = Fake::start(move |c| match c.name().as_str() {
        "EVALSHA" => Answer::Stream {
            head: head.clone(),
            filler: filler.clone(),
            total,
        },
        _ => Answer::Honest,
    })
    .await;
    let config = RedisConfig::from_url(&fake.url())
        .expect("valid URL")
        .with_timeout(Duration::from_secs(3));
    let backend = RedisBackend::connect(config).await.expect("connect");
    let before = peak_kib();
    let ttl = Ttl::new(Duration::from_secs(30)).expect("TTL");
    let request = AcquireRequest::new(LockName::new("big").expect("name"), Identity::unique(), ttl);
    let err = backend
        .acquire(&request)
        .await
        .expect_err("no lock from that");
    let sent = until_quiet(&fake).await;
    let after = peak_kib();
    eprintln!("VmHWM {before} KiB before, {after} KiB after; the server sent {sent} bytes; {err}");
    (after.saturating_sub(before), sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reply_costs_the_client_no_more_than_its_limits() {
    let (bulk, _) = peak_growth(b"$8589934592\r\n", b"x", 1 << 30).await;
    let (array, _) = peak_growth(b"*2000000000\r\n", b":1\r\n", 32 << 20).await;
    for (what, grew) in [("bulk string", bulk), ("array", array)] {
        assert!(
            grew < 64 << 10,
            "the {what} grew the peak RSS by {grew} KiB"
        );
    }
}

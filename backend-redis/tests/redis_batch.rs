//! `RedisBackend::refresh_many`: each lease's result is what its own `refresh` returns, the
//! whole batch is one pipelined round trip (counted on the server), a script error fails
//! only its lease, and a failed connection fails every lease with a temporary error.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use lockcore::{AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Note, Result};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::Fault;

const TTL: Duration = Duration::from_secs(30);
/// What a test shortens a key's PTTL to before the batch, so an extension is visible.
const SHORT_MS: i64 = 5_000;

async fn backend_on(url: &str, timeout: Duration) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(common::random_prefix("batch"))
        .with_timeout(timeout);
    RedisBackend::connect(config).await.expect("connect")
}

fn request(name: &LockName, owner: &Identity) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        owner.clone(),
        lockcore::Ttl::new(TTL).expect("valid TTL"),
    )
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn pexpire(conn: &mut MultiplexedConnection, key: &str, ms: i64) {
    redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ms)
        .query_async::<()>(conn)
        .await
        .expect("PEXPIRE");
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

/// Success, or a failure that retrying can cure (never `Lost`).
fn ok_or_temporary(result: &Result<Lease>) -> bool {
    result
        .as_ref()
        .map_or_else(|err| err.is_temporary(), |_| true)
}

/// `(kind, message)` of a result, or `None` for success: what "the same result" compares.
fn shape(result: &Result<Lease>) -> Option<(ErrorKind, String)> {
    result
        .as_ref()
        .err()
        .map(|err| (err.kind(), err.message().to_owned()))
}

/// One batch holding a live lease, a released one, a stale one whose name a rival now
/// holds, one with a note, the live lease again, and an abandoned grant next to its
/// same-owner retake: one result per lease, in order, each what `refresh` of that lease
/// alone returns; the live ones extended on the server, the released key not re-created,
/// the rival untouched.
#[tokio::test]
async fn a_mixed_batch_refreshes_each_lease_as_refresh_would() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    let me = Identity::unique();
    let rival = Identity::unique();

    let live = common::take(&backend, &request(&common::fresh_name("live"), &me)).await;
    let released = common::take(&backend, &request(&common::fresh_name("released"), &me)).await;
    backend.release(&released).await.expect("release");
    let stale = common::take(&backend, &request(&common::fresh_name("stale"), &me)).await;
    // The stale lease's key expires (deleted here), and a rival takes the name.
    common::raw_del(&mut admin, backend.keys(stale.name()).lock()).await;
    let rivals = common::take(&backend, &request(stale.name(), &rival)).await;
    let noted_request = request(&common::fresh_name("noted"), &me)
        .with_note(Some(Note::new("batch note").expect("valid note")));
    let noted = common::take(&backend, &noted_request).await;
    let abandoned = common::take(&backend, &request(&common::fresh_name("retaken"), &me)).await;
    let retaken = common::take(&backend, &request(abandoned.name(), &me)).await;
    assert_ne!(
        abandoned.grant(),
        retaken.grant(),
        "a retake is a new grant"
    );

    let live_key = backend.keys(live.name()).lock().to_owned();
    let rival_key = backend.keys(rivals.name()).lock().to_owned();
    let noted_keys = backend.keys(noted.name());
    for key in [&live_key, &rival_key, noted_keys.lock(), noted_keys.note()] {
        pexpire(&mut admin, key, SHORT_MS).await;
    }
    let rival_value = get(&mut admin, &rival_key).await.expect("the rival holds");

    let batch = [
        live.clone(),
        released.clone(),
        stale.clone(),
        noted.clone(),
        live.clone(),
        abandoned.clone(),
        retaken.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len(), "one result per lease");
    for (at, (lease, result)) in batch.iter().zip(&results).enumerate() {
        if let Ok(refreshed) = result {
            assert_eq!(refreshed, lease, "lease {at}: the same lease, the same TTL");
        }
    }
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(
        ok,
        [true, false, false, true, true, false, true],
        "{results:?}"
    );
    for at in [1, 2, 5] {
        let err = results[at].as_ref().expect_err("lost");
        assert_eq!(err.kind(), ErrorKind::Lost, "lease {at}: {err}");
    }
    let taken = results[2].as_ref().expect_err("lost").message().to_owned();
    assert!(taken.contains(rival.as_str()), "names the rival: {taken}");

    // Extended on the server: the lock keys and the note key back near the 30 s TTL.
    for key in [&live_key, noted_keys.lock(), noted_keys.note()] {
        let left = pttl(&mut admin, key).await;
        assert!(left > 25_000, "{key} extended: PTTL {left} ms");
    }
    // The released lock stays deleted (no key, no note); the rival is untouched.
    let released_keys = backend.keys(released.name());
    assert!(!common::exists(&mut admin, released_keys.lock()).await);
    assert!(!common::exists(&mut admin, released_keys.note()).await);
    let left = pttl(&mut admin, &rival_key).await;
    assert!(
        left <= SHORT_MS,
        "the rival's PTTL was extended to {left} ms"
    );
    assert_eq!(get(&mut admin, &rival_key).await, Some(rival_value));

    // Each result is exactly what `refresh` of that lease alone returns.
    for (at, (lease, batched)) in batch.iter().zip(&results).enumerate() {
        let alone = backend.refresh(lease).await;
        assert_eq!(shape(&alone), shape(batched), "lease {at}");
    }
    for lease in [&live, &noted, &retaken, &rivals] {
        backend.release(lease).await.expect("release");
    }
}

/// `INFO stats` counters of the server.
async fn stats(conn: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .expect("INFO stats");
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// A batch of 200 leases is one pipeline: the server runs 200 `EVALSHA`s (a private
/// server, so only ours), but writes replies only a few times (`total_writes_processed`
/// in `INFO stats`). A client that waits for each reply before the next call (one refresh
/// after another, the trait's default) makes the server write at least once per lease.
#[tokio::test]
async fn a_batch_of_leases_is_one_round_trip() {
    if common::redis_url().is_none() {
        return;
    }
    const LEASES: u64 = 200;
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..LEASES {
        leases.push(common::take(&backend, &request(&common::fresh_name("counted"), &me)).await);
    }
    assert_eq!(backend.refresh_batch_limit(), 1000);
    // Warm: the script is loaded by the first refresh, so the counted batch is steady.
    backend.refresh(&leases[0]).await.expect("refresh");

    let calls_before = common::command_calls(&mut admin).await;
    let before = stats(&mut admin).await;
    let results = backend.refresh_many(&leases).await;
    let after = stats(&mut admin).await;
    let calls_after = common::command_calls(&mut admin).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let delta = |name: &str| after[name] - before[name];
    let ran = common::calls_between(&calls_before, &calls_after);
    // One EVALSHA per lease; the script's own GET and two PEXPIREs are counted too.
    let expected = [
        ("evalsha", LEASES),
        ("get", LEASES),
        ("pexpire", 2 * LEASES),
    ];
    assert_eq!(ran, common::calls(&expected));
    let (writes, reads) = (
        delta("total_writes_processed"),
        delta("total_reads_processed"),
    );
    println!(
        "{LEASES} leases: {writes} writes, {reads} reads, {} bytes in, {} bytes out",
        delta("total_net_input_bytes"),
        delta("total_net_output_bytes")
    );
    // Our second INFO's read and first INFO's write fall between the snapshots.
    assert!(
        writes <= LEASES / 10,
        "{writes} server writes for {LEASES} leases: not one pipeline"
    );
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// More leases than one batch holds: one result per lease, in order, over several
/// pipelines.
#[tokio::test]
async fn more_leases_than_the_batch_limit_all_get_their_result() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let me = Identity::unique();
    let count = backend.refresh_batch_limit() + 2;
    let mut leases = Vec::new();
    for _ in 0..count {
        leases.push(common::take(&backend, &request(&common::fresh_name("many"), &me)).await);
    }
    // The last lease, in the second pipeline, is released: only it is lost.
    backend.release(&leases[count - 1]).await.expect("release");
    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), count);
    let lost: Vec<usize> = (results.iter().enumerate())
        .filter(|(_, result)| result.is_err())
        .map(|(at, _)| at)
        .collect();
    assert_eq!(lost, [count - 1]);
    let err = results[count - 1].as_ref().expect_err("lost");
    assert_eq!(err.kind(), ErrorKind::Lost);
    for lease in &leases[..count - 1] {
        backend.release(lease).await.expect("release");
    }
}

/// A lock key replaced by a hash makes its script call fail with `WRONGTYPE` in the middle
/// of the pipeline: that lease alone fails, with the error `refresh` of it alone returns;
/// the calls before and after it still extend their leases.
#[tokio::test]
async fn a_script_error_in_the_pipeline_fails_only_its_lease() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = backend_on(&url, Duration::from_secs(2)).await;
    let mut admin = common::admin(&url).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(common::take(&backend, &request(&common::fresh_name("planted"), &me)).await);
    }
    let planted = backend.keys(leases[1].name()).lock().to_owned();
    common::raw_del(&mut admin, &planted).await;
    redis::cmd("HSET")
        .arg(&planted)
        .arg("field")
        .arg("value")
        .query_async::<()>(&mut admin)
        .await
        .expect("HSET");
    for lease in [&leases[0], &leases[2]] {
        pexpire(&mut admin, backend.keys(lease.name()).lock(), SHORT_MS).await;
    }

    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(results[2].is_ok(), "{:?}", results[2]);
    let err = results[1].as_ref().expect_err("WRONGTYPE");
    assert!(err.message().contains("WRONGTYPE"), "{err}");
    assert_ne!(err.kind(), ErrorKind::Lost, "{err}");
    println!("a planted hash: {:?}: {}", err.kind(), err.message());
    let alone = backend.refresh(&leases[1]).await;
    assert_eq!(shape(&alone), shape(&results[1]));
    for lease in [&leases[0], &leases[2]] {
        let left = pttl(&mut admin, backend.keys(lease.name()).lock()).await;
        assert!(left > 25_000, "{} extended: PTTL {left} ms", lease.name());
        backend.release(lease).await.expect("release");
    }
    common::raw_del(&mut admin, &planted).await;
}

/// A connection that stops answering fails every lease of the batch with the temporary
/// error a single refresh gets (`OutcomeUnknown`: the calls may have applied), never
/// `Lost`.
#[tokio::test]
async fn a_silent_connection_fails_every_lease_temporarily() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let proxy = common::proxy_for(&url).await;
    let backend = backend_on(&common::through(&url, &proxy), Duration::from_millis(300)).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(common::take(&backend, &request(&common::fresh_name("silent"), &me)).await);
    }
    proxy.set_fault(Fault::Blackhole);
    let results = backend.refresh_many(&leases).await;
    let alone = backend.refresh(&leases[0]).await;
    proxy.set_fault(Fault::Pass);
    assert_eq!(results.len(), 3);
    for result in &results {
        let err = result.as_ref().expect_err("no reply");
        assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
        assert!(err.is_temporary());
        // The kind only: the message says which of two equal timers fired first (the
        // client's response timeout, "timed out", or ours, "no reply within 300ms").
        let alone = alone.as_ref().expect_err("no reply");
        assert_eq!(alone.kind(), err.kind(), "{alone} / {err}");
    }
    // The leases were never lost. The proxy resets the connection that lost data, so the
    // first batch after the network is back may fail (temporarily: the client then
    // reconnects); the next one refreshes every lease.
    let results = backend.refresh_many(&leases).await;
    for result in &results {
        assert!(ok_or_temporary(result), "{result:?}");
    }
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// After `SCRIPT FLUSH`, a batch reloads the script once and sends the calls that got
/// `NOSCRIPT` again: every lease refreshes, with one `SCRIPT LOAD`.
#[tokio::test]
async fn a_batch_reloads_a_flushed_script_once() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..5 {
        leases.push(common::take(&backend, &request(&common::fresh_name("flush"), &me)).await);
    }
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    let before = common::command_calls(&mut admin).await;
    let results = backend.refresh_many(&leases).await;
    let after = common::command_calls(&mut admin).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Five EVALSHAs answered NOSCRIPT, one SCRIPT LOAD, the five again.
    let expected = [
        ("evalsha", 10),
        ("script|load", 1),
        ("get", 5),
        ("pexpire", 10),
    ];
    let ran = common::calls_between(&before, &after);
    assert_eq!(ran, common::calls(&expected));
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (Linux).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok());
    Duration::from_nanos(ns.expect("CPU nanoseconds"))
}

/// Not a check: prints what one full batch of 1,000 leases costs (wall time, the client
/// thread's CPU, which on this current-thread runtime includes the connection task, and the
/// server's `usec` for the `EVALSHA`s and bytes). `docs/redis.md` quotes its numbers. Run
/// with `cargo test --release -p backend-redis --test redis_batch measure -- --ignored
/// --nocapture`.
#[tokio::test]
#[ignore = "a measurement: prints costs, asserts nothing about them"]
async fn measure_a_full_batch() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), Duration::from_secs(2)).await;
    let mut admin = common::admin(&server.url()).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..backend.refresh_batch_limit() {
        let name = common::fresh_name("measured-lock-name");
        leases.push(common::take(&backend, &request(&name, &me)).await);
    }
    backend.refresh(&leases[0]).await.expect("warm");
    for round in 0..5 {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut admin)
            .await
            .expect("CONFIG RESETSTAT");
        let (cpu, started) = (thread_cpu(), std::time::Instant::now());
        let results = backend.refresh_many(&leases).await;
        let (took, cpu) = (started.elapsed(), thread_cpu() - cpu);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let calls: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await
            .expect("INFO commandstats");
        let evalsha = calls.lines().find(|l| l.starts_with("cmdstat_evalsha"));
        let stats = stats(&mut admin).await;
        println!(
            "round {round}: {} leases in {took:?}, client CPU {cpu:?}; {}; {} bytes in, {} out",
            leases.len(),
            evalsha.unwrap_or("no evalsha"),
            stats["total_net_input_bytes"],
            stats["total_net_output_bytes"]
        );
    }
}

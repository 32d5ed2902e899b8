//! `RedlockBackend::refresh_many` on real nodes: one pipeline per node for the whole batch,
//! each lease decided by the single refresh's quorum rule (the 5 nodes of
//! `ANYLOCK_TEST_REDLOCK_URLS`, behind fault proxies where a node must go silent; private
//! servers where calls are counted).

mod common;

use std::time::Duration;

use backend_redis::{RedlockBackend, RedlockConfig};
use futures_util::future::join_all;
use lockcore::{AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Note, Result};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::{Fault, FaultProxy};

const TTL: Duration = Duration::from_secs(30);
/// What a test shortens a key's PTTL to before the batch, so an extension is visible.
const SHORT_MS: i64 = 5_000;

async fn backend_on(urls: &[String], node_timeout: Duration) -> RedlockBackend {
    let config = RedlockConfig::from_node_urls(urls)
        .expect("valid URLs")
        .with_prefix(common::random_prefix("redlock-batch"))
        .with_node_timeout(node_timeout);
    RedlockBackend::connect(config).await.expect("connect")
}

fn request(name: &LockName, owner: &Identity) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        owner.clone(),
        lockcore::Ttl::new(TTL).expect("valid TTL"),
    )
}

/// `PTTL key` on every node (`-2`: no key).
async fn pttls(admins: &[MultiplexedConnection], key: &str) -> Vec<i64> {
    join_all(admins.iter().map(|admin| async move {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut admin.clone())
            .await
            .expect("PTTL")
    }))
    .await
}

async fn pexpire_all(admins: &[MultiplexedConnection], key: &str) {
    for admin in admins {
        redis::cmd("PEXPIRE")
            .arg(key)
            .arg(SHORT_MS)
            .query_async::<()>(&mut admin.clone())
            .await
            .expect("PEXPIRE");
    }
}

async fn values(admins: &[MultiplexedConnection], key: &str) -> Vec<Option<String>> {
    join_all(admins.iter().map(|admin| async move {
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut admin.clone())
            .await
            .expect("GET")
    }))
    .await
}

/// `(kind, message)` of a result, or `None` for success. The message is cut before the
/// first node error it quotes: which node answered first varies from call to call.
fn shape(result: &Result<Lease>) -> Option<(ErrorKind, String)> {
    result.as_ref().err().map(|err| {
        let message = err.message();
        let votes = message.split("; refresh on ").next().unwrap_or(message);
        (err.kind(), votes.to_owned())
    })
}

/// Waits until every node holds `key`: an acquisition returns at a quorum, and its script
/// may still be on its way to the other nodes, where it would re-create a key the test
/// deletes or reset a `PTTL` the test shortens.
async fn on_every_node(admins: &[MultiplexedConnection], key: &str) {
    for _ in 0..500 {
        if pttls(admins, key).await.iter().all(|&ms| ms > 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never reached every node");
}

async fn admins(urls: &[String]) -> Vec<MultiplexedConnection> {
    join_all(urls.iter().map(|url| common::admin(url))).await
}

/// The mixed batch on 5 nodes: a live lease (extended everywhere, validity below the TTL),
/// a released one (`Lost`, not re-created), a stale one whose name a rival holds (`Lost`,
/// the rival untouched), one with a note (the note key extended everywhere) and the live
/// lease again; each result what `refresh` of that lease alone returns.
#[tokio::test]
async fn a_mixed_batch_is_decided_per_lease_by_quorum() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    assert_eq!(urls.len(), 5, "these tests need 5 Redlock nodes: {urls:?}");
    let backend = backend_on(&urls, Duration::from_millis(500)).await;
    let admins = admins(&urls).await;
    let me = Identity::unique();
    let rival = Identity::unique();

    let live = common::take(&backend, &request(&common::fresh_name("live"), &me)).await;
    let released = common::take(&backend, &request(&common::fresh_name("released"), &me)).await;
    backend.release(&released).await.expect("release");
    let stale = common::take(&backend, &request(&common::fresh_name("stale"), &me)).await;
    let stale_key = backend.keys(stale.name()).lock().to_owned();
    on_every_node(&admins, &stale_key).await;
    for admin in &admins {
        common::raw_del(&mut admin.clone(), &stale_key).await;
    }
    let rivals = common::take(&backend, &request(stale.name(), &rival)).await;
    let noted_request = request(&common::fresh_name("noted"), &me)
        .with_note(Some(Note::new("batch note").expect("valid note")));
    let noted = common::take(&backend, &noted_request).await;

    let live_key = backend.keys(live.name()).lock().to_owned();
    let noted_keys = backend.keys(noted.name());
    for key in [&live_key, &stale_key, noted_keys.lock(), noted_keys.note()] {
        on_every_node(&admins, key).await;
        pexpire_all(&admins, key).await;
    }
    let rival_values = values(&admins, &stale_key).await;
    assert!(rival_values.iter().all(Option::is_some), "{rival_values:?}");

    let batch = [
        live.clone(),
        released.clone(),
        stale.clone(),
        noted.clone(),
        live.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len(), "one result per lease");
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, false, false, true, true], "{results:?}");
    for at in [0, 3, 4] {
        let refreshed = results[at].as_ref().expect("refreshed");
        assert_eq!(refreshed.grant(), batch[at].grant());
        assert!(
            refreshed.ttl().get() < TTL,
            "validity {:?}",
            refreshed.ttl()
        );
    }
    for at in [1, 2] {
        let err = results[at].as_ref().expect_err("lost");
        assert_eq!(err.kind(), ErrorKind::Lost, "lease {at}: {err}");
    }
    let taken = results[2].as_ref().expect_err("lost").message().to_owned();
    // Decided by the third refusal, as a single refresh is.
    assert!(
        taken.contains("3 of 5") && taken.contains(rival.as_str()),
        "{taken}"
    );

    // Extended on a quorum at least: the batch returns once every lease is decided, and
    // the last node's pipeline may still be on its way.
    for key in [&live_key, noted_keys.lock(), noted_keys.note()] {
        let left = pttls(&admins, key).await;
        let extended = left.iter().filter(|&&ms| ms > 25_000).count();
        assert!(extended >= 3, "{key} extended: {left:?}");
    }
    let released_keys = backend.keys(released.name());
    assert_eq!(pttls(&admins, released_keys.lock()).await, [-2; 5]);
    assert_eq!(pttls(&admins, released_keys.note()).await, [-2; 5]);
    let left = pttls(&admins, &stale_key).await;
    assert!(
        left.iter().all(|&ms| ms <= SHORT_MS),
        "rival extended: {left:?}"
    );
    assert_eq!(values(&admins, &stale_key).await, rival_values);

    for (at, (lease, batched)) in batch.iter().zip(&results).enumerate() {
        let alone = backend.refresh(lease).await;
        assert_eq!(shape(&alone), shape(batched), "lease {at}");
    }
    for lease in [&live, &noted, &rivals] {
        backend.release(lease).await.expect("release");
    }
}

/// With node 0 silent: a lease held on the other four refreshes by quorum; one that a
/// rival holds on three nodes is `Lost`; one held by a rival on two nodes (two yes, two
/// no, one silent) is undecided: a temporary failure, never `Lost`. Each as `refresh`
/// alone decides it.
#[tokio::test]
async fn one_silent_node_still_refreshes_by_quorum() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    assert_eq!(urls.len(), 5, "these tests need 5 Redlock nodes: {urls:?}");
    let proxies: Vec<FaultProxy> = join_all(urls.iter().map(|u| common::proxy_for(u))).await;
    let through: Vec<String> = (urls.iter().zip(&proxies))
        .map(|(url, proxy)| common::through(url, proxy))
        .collect();
    let backend = backend_on(&through, Duration::from_millis(300)).await;
    let admins = admins(&urls).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for what in ["kept", "majority", "minority"] {
        leases.push(common::take(&backend, &request(&common::fresh_name(what), &me)).await);
    }
    let rival = stored_rival();
    for (lease, nodes) in [(&leases[1], 1..4), (&leases[2], 1..3)] {
        let key = backend.keys(lease.name()).lock().to_owned();
        on_every_node(&admins, &key).await;
        for admin in &admins[nodes] {
            common::raw_set(&mut admin.clone(), &key, &rival, TTL).await;
        }
    }
    let kept_key = backend.keys(leases[0].name()).lock().to_owned();
    on_every_node(&admins, &kept_key).await;
    pexpire_all(&admins, &kept_key).await;
    proxies[0].set_fault(Fault::Blackhole);

    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    let left = pttls(&admins, &kept_key).await;
    let extended = left.iter().filter(|&&ms| ms > 25_000).count();
    assert!(extended >= 3, "extended on a quorum: {left:?}");
    let lost = results[1].as_ref().expect_err("lost on a majority");
    assert_eq!(lost.kind(), ErrorKind::Lost, "{lost}");
    let undecided = results[2].as_ref().expect_err("no quorum either way");
    assert_eq!(undecided.kind(), ErrorKind::OutcomeUnknown, "{undecided}");
    assert!(undecided.is_temporary());
    for (at, (lease, batched)) in leases.iter().zip(&results).enumerate() {
        let alone = backend.refresh(lease).await;
        assert_eq!(shape(&alone), shape(batched), "lease {at}");
    }
    proxies[0].set_fault(Fault::Pass);
    for lease in &leases {
        let key = backend.keys(lease.name()).lock().to_owned();
        for admin in &admins {
            common::raw_del(&mut admin.clone(), &key).await;
        }
    }
}

/// A rival's value in the documented format.
fn stored_rival() -> String {
    common::stored_value(0, &Identity::unique())
}

/// A lock key replaced by a hash on every node: that lease fails (each node's script call
/// answers `WRONGTYPE`), the leases before and after it in the same pipelines refresh.
#[tokio::test]
async fn a_script_error_fails_only_its_lease_on_every_node() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    let backend = backend_on(&urls, Duration::from_millis(500)).await;
    let admins = admins(&urls).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(common::take(&backend, &request(&common::fresh_name("planted"), &me)).await);
    }
    let planted = backend.keys(leases[1].name()).lock().to_owned();
    on_every_node(&admins, &planted).await;
    for admin in &admins {
        let admin = &mut admin.clone();
        common::raw_del(admin, &planted).await;
        redis::cmd("HSET")
            .arg(&planted)
            .arg("field")
            .arg("value")
            .query_async::<()>(admin)
            .await
            .expect("HSET");
    }
    let results = backend.refresh_many(&leases).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(results[2].is_ok(), "{:?}", results[2]);
    let err = results[1].as_ref().expect_err("WRONGTYPE");
    assert!(err.message().contains("WRONGTYPE"), "{err}");
    assert_ne!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(
        shape(&backend.refresh(&leases[1]).await),
        shape(&results[1])
    );
    for lease in [&leases[0], &leases[2]] {
        backend.release(lease).await.expect("release");
    }
    for admin in &admins {
        common::raw_del(&mut admin.clone(), &planted).await;
    }
}

/// `total_writes_processed` from `INFO stats`.
async fn writes(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|line| line.trim().strip_prefix("total_writes_processed:"))
        .and_then(|value| value.parse().ok())
        .expect("total_writes_processed")
}

/// 200 leases on 2 private nodes: each node runs 200 `EVALSHA`s but writes replies only a
/// few times, so each node got the batch as one pipeline (one refresh after another makes
/// every node write at least once per lease). Two nodes, because their quorum is both: with
/// more, the batch returns at a quorum while the last node's pipeline may still run.
#[tokio::test]
async fn a_batch_is_one_pipeline_per_node() {
    if common::redlock_urls().is_none() {
        return;
    }
    const LEASES: u64 = 200;
    let servers = join_all((0..2).map(|_| test_kit::servers::Redis::start())).await;
    let urls: Vec<String> = servers.iter().map(|server| server.url()).collect();
    let backend = backend_on(&urls, Duration::from_secs(2)).await;
    let mut admins = admins(&urls).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..LEASES {
        leases.push(common::take(&backend, &request(&common::fresh_name("counted"), &me)).await);
    }
    assert_eq!(backend.refresh_batch_limit(), 1000);
    backend.refresh(&leases[0]).await.expect("warm");

    let mut before = Vec::new();
    for admin in &mut admins {
        before.push((common::command_calls(admin).await, writes(admin).await));
    }
    let results = backend.refresh_many(&leases).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for (node, (admin, (calls, wrote))) in admins.iter_mut().zip(before).enumerate() {
        let written = writes(admin).await - wrote;
        let ran = common::calls_between(&calls, &common::command_calls(admin).await);
        let evalsha = ran.get("evalsha").copied();
        assert_eq!(evalsha, Some(LEASES), "node {node}: {ran:?}");
        println!("node {node}: {LEASES} leases, {written} writes");
        assert!(
            written <= LEASES / 10,
            "node {node}: {written} writes for {LEASES} leases: not one pipeline"
        );
    }
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// Not a check: prints what one full batch costs on the 5 shared nodes with the default
/// 50 ms node timeout (wall time, the client thread's CPU, failures). `docs/redis.md`
/// quotes its numbers. Run with `cargo test --release -p backend-redis --test
/// redlock_batch measure -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement: prints costs, asserts nothing about them"]
async fn measure_a_full_batch() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    let backend = backend_on(&urls, backend_redis::DEFAULT_NODE_TIMEOUT).await;
    let me = Identity::unique();
    let mut leases = Vec::new();
    for _ in 0..backend.refresh_batch_limit() {
        let name = common::fresh_name("measured-lock-name");
        leases.push(common::take(&backend, &request(&name, &me)).await);
    }
    let thread_cpu = || {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        let ns = stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse().ok());
        Duration::from_nanos(ns.expect("CPU nanoseconds"))
    };
    for round in 0..5 {
        let (cpu, started) = (thread_cpu(), std::time::Instant::now());
        let results = backend.refresh_many(&leases).await;
        let (took, cpu) = (started.elapsed(), thread_cpu() - cpu);
        let failed = results.iter().filter(|result| result.is_err()).count();
        println!(
            "round {round}: {} leases on {} nodes in {took:?}, client CPU {cpu:?}, {failed} failed",
            leases.len(),
            urls.len()
        );
    }
    for lease in &leases {
        let _ = backend.release(lease).await;
    }
}

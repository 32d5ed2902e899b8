//! How long `refresh_many` takes on the shared cluster, through the leader and through a
//! follower: one batch of 512 leases, and 4 batches of 512 at once. A measurement, not a
//! check (speed is never asserted): run it by hand and read what it prints.
//!
//! ```text
//! source .servers/env
//! cargo test --release -p backend-etcd --test refresh_timing -- --ignored --nocapture
//! ```

mod common;

use std::time::{Duration, Instant};

use backend_etcd::EtcdBackend;
use futures_util::future::join_all;
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName, Ttl};

const BATCH: usize = 512;
const BATCHES: usize = 4;
const ROUNDS: usize = 15;

/// The shared cluster's leader and one follower, asked by etcd's maintenance `Status`.
async fn leader_and_follower(endpoints: &[String]) -> (String, String) {
    let mut leader = None;
    let mut follower = None;
    for endpoint in endpoints {
        let status = common::raw(std::slice::from_ref(endpoint))
            .await
            .status()
            .await
            .expect("status");
        let me = status.header.expect("header").member_id;
        if status.leader == me {
            leader = Some(endpoint.clone());
        } else {
            follower.get_or_insert_with(|| endpoint.clone());
        }
    }
    (leader.expect("a leader"), follower.expect("a follower"))
}

/// `n` locks, each with a TTL of its own (30 s + i s), so each on a session lease of its
/// own: the keep-alive pool is measured with `n` etcd leases, as a lease per lock had it
/// (locks of one TTL share one keep-alive). The sessions expire by their TTLs after the
/// run.
async fn take_many(backend: &EtcdBackend, n: usize) -> Vec<Lease> {
    let me = Identity::unique();
    let mut leases = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let takes = chunk.iter().map(|i| {
            let name = LockName::new(format!("lock-{i}")).expect("name");
            let secs = 30 + u64::try_from(*i).expect("index");
            let ttl = Ttl::new(Duration::from_secs(secs)).expect("TTL");
            let request = AcquireRequest::new(name, me.clone(), ttl);
            async move {
                match backend.acquire(&request).await.expect("acquire") {
                    Acquire::Acquired(lease) => lease,
                    Acquire::Held(_) => panic!("held"),
                }
            }
        });
        leases.extend(join_all(takes).await);
    }
    leases
}

/// Wall time of `batches` concurrent `refresh_many` calls of `BATCH` leases each; every
/// lease must come back refreshed.
async fn time_refresh(backend: &EtcdBackend, leases: &[Lease], batches: usize) -> Duration {
    let start = Instant::now();
    let calls = leases
        .chunks(BATCH)
        .take(batches)
        .map(|batch| backend.refresh_many(batch));
    let results = join_all(calls).await;
    let took = start.elapsed();
    for result in results.iter().flatten() {
        result.as_ref().expect("refreshed");
    }
    took
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Min and median of `ROUNDS` measurements.
async fn measure(backend: &EtcdBackend, leases: &[Lease], batches: usize) -> (f64, f64) {
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        times.push(ms(time_refresh(backend, leases, batches).await));
    }
    times.sort_by(f64::total_cmp);
    (times[0], times[ROUNDS / 2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement against the shared cluster; run by hand with --ignored --nocapture"]
async fn refresh_many_wall_time_via_the_leader_and_a_follower() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (leader, follower) = leader_and_follower(&endpoints).await;
    for (role, endpoint) in [("follower", follower), ("leader", leader)] {
        let prefix = common::random_prefix("timing");
        let backend = common::backend(std::slice::from_ref(&endpoint), &prefix).await;
        let leases = take_many(&backend, BATCH * BATCHES).await;
        // Warm up: open the keep-alive stream(s) and every connection.
        time_refresh(&backend, &leases, BATCHES).await;
        let (one_min, one_p50) = measure(&backend, &leases, 1).await;
        let (all_min, all_p50) = measure(&backend, &leases, BATCHES).await;
        println!(
            "{role} {endpoint}: 1 x {BATCH}: min {one_min:.1} ms, p50 {one_p50:.1} ms; \
             {BATCHES} x {BATCH} at once: min {all_min:.1} ms, p50 {all_p50:.1} ms"
        );
        for chunk in leases.chunks(64) {
            join_all(chunk.iter().map(|lease| backend.release(lease))).await;
        }
    }
}

//! Measures what a lock cycle costs on etcd, as ratios to a raw linearizable `Range`.
//!
//! ```sh
//! source .servers/env
//! cargo run --release -p backend-etcd --example cycle -- [ENDPOINT] [ROUNDS]
//! ```
//!
//! Every measurement talks to ENDPOINT only (default: the first of
//! `ANYLOCK_TEST_ETCD_ENDPOINTS`), one client, sequential calls, p50 of ROUNDS (default
//! 2000) after 100 warm-up rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anylock_etcd_proto::etcdserverpb::kv_client::KvClient;
use anylock_etcd_proto::etcdserverpb::{DeleteRangeRequest, RangeRequest};
use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, LockOptions, Locker};
use tonic::transport::Endpoint;

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn measure<F, Fut>(rounds: usize, mut op: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..100 {
        op().await;
    }
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        op().await;
        samples.push(start.elapsed());
    }
    p50(samples)
}

#[tokio::main]
async fn main() -> Result<(), lockcore::Error> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().unwrap_or_else(|| {
        let all = std::env::var("ANYLOCK_TEST_ETCD_ENDPOINTS").expect("endpoint argument");
        all.split(',').next().unwrap_or_default().to_owned()
    });
    let rounds: usize = args.next().map_or(2000, |r| r.parse().expect("rounds"));
    let prefix = format!("anylock-bench/{:x}/", std::process::id());
    let config = EtcdConfig::new([endpoint.as_str()])?.with_prefix(&prefix);
    let backend = Arc::new(EtcdBackend::connect(config).await?);
    let channel =
        Endpoint::from_shared(format!("http://{}", endpoint.trim_start_matches("http://")))
            .expect("endpoint")
            .connect_lazy();
    let mut raw = KvClient::new(channel);

    let get = measure(rounds, || {
        let mut raw = raw.clone();
        async move {
            let probe = RangeRequest {
                key: b"anylock-bench-probe".to_vec(),
                ..RangeRequest::default()
            };
            raw.range(probe).await.expect("get");
        }
    })
    .await;
    let name = LockName::new("cycle")?;
    let owner = Identity::unique();
    let request = AcquireRequest::new(
        name.clone(),
        owner,
        lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    );
    let before = backend.rpcs_sent();
    let cycle = measure(rounds, || async {
        match backend.acquire(&request).await.expect("acquire") {
            Acquire::Acquired(lease) => backend.release(&lease).await.expect("release"),
            Acquire::Held(_) => panic!("held"),
        }
    })
    .await;
    let per_cycle = (backend.rpcs_sent() - before) as f64 / (rounds + 100) as f64;
    let holder =
        Locker::new(backend.clone()).with_options(LockOptions::new(Duration::from_secs(30)));
    let guard = holder.acquire("held").await?;
    let held_request = AcquireRequest::new(
        LockName::new("held")?,
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    );
    let held = measure(rounds, || async {
        assert!(matches!(
            backend.acquire(&held_request).await.expect("attempt"),
            Acquire::Held(_)
        ));
    })
    .await;
    guard.release().await?;
    let locker =
        Locker::new(backend.clone()).with_options(LockOptions::new(Duration::from_secs(30)));
    let guarded = measure(rounds, || async {
        let guard = locker
            .try_acquire("guarded")
            .await
            .expect("call")
            .expect("free");
        guard.release().await.expect("release");
    })
    .await;
    let mut range_end = prefix.clone().into_bytes();
    if let Some(last) = range_end.last_mut() {
        *last += 1; // the prefix ends in `/`
    }
    let everything = DeleteRangeRequest {
        key: prefix.into_bytes(),
        range_end,
        ..DeleteRangeRequest::default()
    };
    let _ = raw.delete_range(everything).await;

    let ratio = |d: Duration| d.as_secs_f64() / get.as_secs_f64();
    println!("endpoint {endpoint}, {rounds} rounds, p50");
    println!("raw linearizable Range:              {get:>10.2?}  1.0x");
    println!(
        "acquire + release (backend calls):  {cycle:>10.2?}  {:.1}x  ({per_cycle:.2} RPCs)",
        ratio(cycle)
    );
    println!(
        "acquire attempt on a held lock:     {held:>10.2?}  {:.1}x",
        ratio(held)
    );
    println!(
        "Locker try_acquire + guard release: {guarded:>10.2?}  {:.1}x",
        ratio(guarded)
    );
    Ok(())
}

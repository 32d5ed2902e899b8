//! Redlock under faults, against the 5 real nodes of `ANYLOCK_TEST_REDLOCK_URLS` reached
//! through fault proxies (and one private redis-server stalled with `SIGSTOP`).

mod common;

use std::time::Duration;

use backend_redis::{RedlockBackend, RedlockConfig};
use futures_util::future::join_all;
use lockcore::{Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::{Fault, FaultProxy};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// The 5 nodes behind proxies, a backend through the proxies, and direct admin connections.
struct Nodes {
    proxies: Vec<FaultProxy>,
    admins: Vec<MultiplexedConnection>,
    backend: RedlockBackend,
}

impl Nodes {
    async fn start(node_timeout: Duration) -> Option<Nodes> {
        let urls = common::redlock_urls()?;
        assert_eq!(urls.len(), 5, "these tests need 5 Redlock nodes: {urls:?}");
        let proxies = join_all(urls.iter().map(|u| common::proxy_for(u))).await;
        let through: Vec<String> = (urls.iter().zip(&proxies))
            .map(|(url, proxy)| common::through(url, proxy))
            .collect();
        let config = RedlockConfig::from_node_urls(&through)
            .expect("valid URLs")
            .with_prefix(common::random_prefix("redlock"))
            .with_node_timeout(node_timeout);
        let backend = RedlockBackend::connect(config).await.expect("connect");
        let admins = join_all(urls.iter().map(|u| common::admin(u))).await;
        Some(Nodes {
            proxies,
            admins,
            backend,
        })
    }

    fn fault(&self, nodes: std::ops::Range<usize>, fault: Fault) {
        for proxy in &self.proxies[nodes] {
            proxy.set_fault(fault);
        }
    }

    /// Which nodes hold the lock key of `name`, read directly (not through the proxies).
    async fn holding(&self, name: &LockName) -> Vec<usize> {
        let key = self.backend.keys(name).lock().to_owned();
        let mut holding = Vec::new();
        for (index, admin) in self.admins.iter().enumerate() {
            if common::exists(&mut admin.clone(), &key).await {
                holding.push(index);
            }
        }
        holding
    }

    async fn set_on(&self, nodes: std::ops::Range<usize>, name: &LockName, value: &str) {
        let key = self.backend.keys(name).lock().to_owned();
        for admin in &self.admins[nodes] {
            common::raw_set(&mut admin.clone(), &key, value, TTL).await;
        }
    }
}

fn request(name: &LockName) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(TTL).expect("valid TTL"),
    )
}

fn acquired(outcome: Acquire) -> Lease {
    match outcome {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {}", holder.owner()),
    }
}

/// The Redlock page's drift allowance for `TTL` ("Distributed Locks with Valkey").
fn drift() -> Duration {
    TTL / 100 + Duration::from_millis(2)
}

/// With 2 of 5 nodes unreachable, a quorum of 3 still grants the lock, and release works.
#[tokio::test]
async fn two_of_five_nodes_down_still_acquires() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    nodes.fault(0..2, Fault::Blackhole);
    let name = common::fresh_name("two-down");
    let lease = acquired(
        nodes
            .backend
            .acquire(&request(&name))
            .await
            .expect("acquire"),
    );
    assert!(
        lease.ttl().get() < TTL,
        "validity {:?} not below the TTL",
        lease.ttl()
    );
    assert_eq!(nodes.holding(&name).await, [2, 3, 4]);
    assert_eq!(
        nodes.backend.fence_token(&lease),
        None,
        "Redlock has no fencing"
    );
    nodes
        .backend
        .refresh(&lease)
        .await
        .expect("refresh by quorum");
    nodes
        .backend
        .release(&lease)
        .await
        .expect("release by quorum");
    assert_eq!(nodes.holding(&name).await, Vec::<usize>::new());
}

/// With 3 of 5 nodes unreachable there is no quorum: acquire fails within its per-node
/// timeouts (the SETs, then the releases, each bounded once, concurrently), with a
/// temporary error, and leaves no key on any node.
#[tokio::test]
async fn three_of_five_nodes_down_fails_in_time_and_leaves_no_key() {
    let node_timeout = Duration::from_millis(400);
    let Some(nodes) = Nodes::start(node_timeout).await else {
        return;
    };
    nodes.fault(0..3, Fault::Blackhole);
    let name = common::fresh_name("three-down");
    let start = Instant::now();
    let err = nodes
        .backend
        .acquire(&request(&name))
        .await
        .expect_err("acquired without a quorum");
    let took = start.elapsed();
    assert!(err.is_temporary(), "{err}");
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(
        took >= node_timeout,
        "gave up after {took:?}, before the node timeout"
    );
    let bound = node_timeout * 2 + Duration::from_millis(800);
    assert!(
        took < bound,
        "took {took:?}; concurrent timeouts allow {bound:?}"
    );
    assert_eq!(
        nodes.holding(&name).await,
        Vec::<usize>::new(),
        "leftover keys"
    );
    nodes.fault(0..3, Fault::Pass);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(nodes.holding(&name).await, Vec::<usize>::new(), "late keys");
}

/// Nodes are contacted concurrently: with every node delayed by D (so each answer takes
/// ≥ 2D), acquire takes about one 2D, not the three 2D a sequential client needs for a
/// quorum of 3.
#[tokio::test]
async fn nodes_are_contacted_concurrently() {
    let Some(nodes) = Nodes::start(Duration::from_secs(5)).await else {
        return;
    };
    let delay = Duration::from_millis(500);
    nodes.fault(0..5, Fault::Delay(delay));
    let name = common::fresh_name("concurrent");
    let start = Instant::now();
    let lease = acquired(
        nodes
            .backend
            .acquire(&request(&name))
            .await
            .expect("acquire"),
    );
    let took = start.elapsed();
    nodes.fault(0..5, Fault::Pass);
    assert!(
        took >= delay * 2,
        "took only {took:?} through a {delay:?} delay"
    );
    assert!(
        took < delay * 4,
        "took {took:?}: nodes were not asked at once"
    );
    nodes.backend.release(&lease).await.expect("release");
}

/// The validity reported is the TTL minus the time the quorum took, minus the drift.
#[tokio::test]
async fn validity_is_reduced_by_the_elapsed_time() {
    let Some(nodes) = Nodes::start(Duration::from_secs(5)).await else {
        return;
    };
    let delay = Duration::from_millis(200);
    // Three slow nodes: every quorum includes at least one of them.
    nodes.fault(0..3, Fault::Delay(delay));
    let name = common::fresh_name("validity");
    let start = Instant::now();
    let lease = acquired(
        nodes
            .backend
            .acquire(&request(&name))
            .await
            .expect("acquire"),
    );
    let took = start.elapsed();
    let ceiling = TTL - delay * 2 - drift();
    assert!(
        lease.ttl().get() <= ceiling,
        "validity {:?} > {ceiling:?}",
        lease.ttl()
    );
    // The validity is rounded down to a whole millisecond.
    let floor = TTL - took - drift() - Duration::from_millis(1);
    assert!(
        lease.ttl().get() >= floor,
        "validity {:?} < {floor:?}",
        lease.ttl()
    );
    let start = Instant::now();
    let refreshed = nodes.backend.refresh(&lease).await.expect("refresh");
    let took = start.elapsed();
    assert!(
        refreshed.ttl().get() <= ceiling,
        "refreshed to {:?}",
        refreshed.ttl()
    );
    assert!(
        refreshed.ttl().get() >= TTL - took - drift() - Duration::from_millis(1),
        "{:?}",
        refreshed.ttl()
    );
    nodes.fault(0..3, Fault::Pass);
    nodes.backend.release(&refreshed).await.expect("release");
}

/// A node stalled with SIGSTOP (a private redis-server as the fifth node) does not hold
/// acquire or refresh beyond the per-node timeout: the other four make the quorum.
#[tokio::test]
async fn a_stalled_node_does_not_hold_acquire_beyond_the_node_timeout() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    let stalled = test_kit::servers::Redis::start().await;
    let mut list: Vec<String> = urls.into_iter().take(4).collect();
    list.push(stalled.url());
    let node_timeout = Duration::from_millis(500);
    let config = RedlockConfig::from_node_urls(&list)
        .expect("valid URLs")
        .with_prefix(common::random_prefix("redlock-stall"))
        .with_node_timeout(node_timeout);
    let backend = RedlockBackend::connect(config).await.expect("connect");
    stalled.stall();
    let name = common::fresh_name("stalled");
    let start = Instant::now();
    let lease = acquired(backend.acquire(&request(&name)).await.expect("acquire"));
    assert!(
        start.elapsed() < node_timeout,
        "acquire took {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    let lease = backend.refresh(&lease).await.expect("refresh");
    assert!(
        start.elapsed() < node_timeout,
        "refresh took {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    backend.release(&lease).await.expect("release");
    let bound = node_timeout + Duration::from_millis(500);
    assert!(
        start.elapsed() < bound,
        "release took {:?}",
        start.elapsed()
    );
    stalled.resume();
}

/// A majority held by another owner: Held, naming that owner and its remaining TTL, and
/// the keys this attempt set on the other nodes are released at once.
#[tokio::test]
async fn a_majority_held_elsewhere_reports_the_holder_and_releases_ours() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    let name = common::fresh_name("majority-held");
    let other = Identity::unique();
    nodes
        .set_on(0..3, &name, &common::stored_value(0, &other))
        .await;
    let holder = match nodes
        .backend
        .acquire(&request(&name))
        .await
        .expect("acquire")
    {
        Acquire::Held(holder) => holder,
        Acquire::Acquired(_) => panic!("granted while a majority is held"),
    };
    assert_eq!(holder.owner(), &other);
    let left = holder.expires_in().expect("remaining TTL");
    assert!(left <= TTL && left > TTL / 2, "expires in {left:?}");
    assert_eq!(
        nodes.holding(&name).await,
        [0, 1, 2],
        "our partial grants stayed"
    );
    let seen = nodes.backend.inspect(&name).await.expect("inspect");
    assert_eq!(seen.map(|h| h.owner().clone()), Some(other));
}

/// Keys left on a minority (a crashed acquirer) neither block a quorum nor count as held.
#[tokio::test]
async fn minority_leftovers_do_not_block() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    let name = common::fresh_name("minority");
    let other = Identity::unique();
    nodes
        .set_on(0..2, &name, &common::stored_value(0, &other))
        .await;
    assert_eq!(nodes.backend.inspect(&name).await.expect("inspect"), None);
    let req = request(&name);
    let lease = acquired(nodes.backend.acquire(&req).await.expect("acquire"));
    let seen = nodes.backend.inspect(&name).await.expect("inspect");
    assert_eq!(seen.map(|h| h.owner().clone()), Some(req.owner));
    nodes.backend.release(&lease).await.expect("release");
    assert_eq!(
        nodes.holding(&name).await,
        [0, 1],
        "the leftovers are not ours to delete"
    );
}

/// Refresh needs a quorum: without one it is a temporary failure (the refresher retries);
/// when a majority no longer holds our value it is Lost.
#[tokio::test]
async fn refresh_needs_a_quorum_and_is_lost_when_a_majority_says_so() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    let name = common::fresh_name("refresh-quorum");
    let lease = acquired(
        nodes
            .backend
            .acquire(&request(&name))
            .await
            .expect("acquire"),
    );
    nodes.fault(0..3, Fault::Blackhole);
    let err = nodes.backend.refresh(&lease).await.expect_err("no quorum");
    assert!(err.is_temporary(), "{err}");
    nodes.fault(0..3, Fault::Pass);
    let mut refreshed = false;
    for _ in 0..20 {
        if nodes.backend.refresh(&lease).await.is_ok() {
            refreshed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refreshed, "never refreshed after the nodes came back");
    let key = nodes.backend.keys(&name).lock().to_owned();
    for admin in &nodes.admins[..3] {
        common::raw_del(&mut admin.clone(), &key).await;
    }
    let err = nodes
        .backend
        .refresh(&lease)
        .await
        .expect_err("majority deleted");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(
        nodes.holding(&name).await,
        [3, 4],
        "refresh re-created a key"
    );
    nodes.backend.release(&lease).await.expect("release");
}

/// An operator's break deletes the grant on every node and reports its holder; the
/// holder's next refresh is Lost. Without a quorum of answers it is an error.
#[tokio::test]
async fn break_lock_removes_the_grant_everywhere() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    let name = common::fresh_name("break");
    let req = request(&name);
    let lease = acquired(nodes.backend.acquire(&req).await.expect("acquire"));
    nodes.fault(0..3, Fault::Blackhole);
    let err = nodes
        .backend
        .break_lock(&name)
        .await
        .expect_err("no quorum");
    assert!(err.is_temporary(), "{err}");
    nodes.fault(0..3, Fault::Pass);
    let mut removed = None;
    for _ in 0..20 {
        if let Ok(holder) = nodes.backend.break_lock(&name).await {
            removed = Some(holder);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let removed = removed.expect("never broke after the nodes came back");
    assert_eq!(removed.map(|h| h.owner().clone()), Some(req.owner));
    assert_eq!(nodes.holding(&name).await, Vec::<usize>::new());
    let err = nodes.backend.refresh(&lease).await.expect_err("refreshed");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(nodes.backend.break_lock(&name).await.expect("break"), None);
}

/// `list` reports a name only when a majority of nodes holds the same grant (as `inspect`
/// and acquire see it), with the note stored on every node; a minority's leftovers are
/// not listed. With a node silent, a name seen on a bare minority might be held on the
/// silent node too: the listing is then an error, not a guess.
#[tokio::test]
async fn list_reports_majority_grants_and_refuses_to_guess() {
    let Some(nodes) = Nodes::start(Duration::from_millis(300)).await else {
        return;
    };
    let base = common::fresh_name("list");
    let under = |rest: &str| LockName::new(format!("{base}/{rest}")).expect("valid");
    let (majority, minority, ours) = (under("majority"), under("minority"), under("ours"));
    let other = Identity::unique();
    nodes
        .set_on(0..3, &majority, &common::stored_value(0, &other))
        .await;
    nodes
        .set_on(0..2, &minority, &common::stored_value(0, &other))
        .await;
    let note = lockcore::Note::new("redlock note").expect("note");
    let req = request(&ours).with_note(Some(note.clone()));
    let lease = acquired(nodes.backend.acquire(&req).await.expect("acquire"));
    let listed = nodes.backend.list(base.as_str()).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|e| e.name().as_str()).collect();
    assert_eq!(names, [majority.as_str(), ours.as_str()]);
    assert_eq!(listed[0].holder().owner(), &other);
    assert!(listed[0].holder().expires_in().is_some_and(|t| t <= TTL));
    assert_eq!(listed[1].holder().owner(), &req.owner);
    assert_eq!(listed[1].holder().note(), Some(&note));
    let inspected = nodes.backend.inspect(&ours).await.expect("inspect");
    assert_eq!(inspected.and_then(|h| h.note().cloned()), Some(note));

    // Node 4 silent: `minority` (on nodes 0 and 1) could hold a majority with it.
    nodes.fault(4..5, Fault::Blackhole);
    let err = nodes
        .backend
        .list(base.as_str())
        .await
        .expect_err("a guess");
    assert!(err.is_temporary(), "{err}");
    nodes.fault(4..5, Fault::Pass);
    let mut again = None;
    for _ in 0..20 {
        if let Ok(listed) = nodes.backend.list(base.as_str()).await {
            again = Some(listed.len());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(again, Some(2), "never listed after the node came back");
    nodes.backend.release(&lease).await.expect("release");
    for name in [&majority, &minority] {
        nodes.backend.break_lock(name).await.expect("break");
    }
    let left = nodes.backend.list(base.as_str()).await.expect("list");
    assert!(left.is_empty(), "{left:?}");
}

/// `backend_redis::open` picks the backend from the URL: `redis://` → single instance;
/// `redlock://h1,h2,…` or a list of node URLs → Redlock; the descriptors match the free
/// functions the facade uses for its table.
#[tokio::test]
async fn connect_picks_the_backend_from_the_url() {
    let (Some(single), Some(urls)) = (common::redis_url(), common::redlock_urls()) else {
        return;
    };
    let backend = backend_redis::open(&single).await.expect("single");
    assert_eq!(backend.backend_name(), "redis");
    assert_eq!(backend.guarantees(), backend_redis::guarantees());
    let backend = backend_redis::open(&urls.join(",")).await.expect("list");
    assert_eq!(backend.backend_name(), "redlock");
    assert_eq!(backend.guarantees(), backend_redis::redlock_guarantees());
    let hosts: Vec<&str> = urls
        .iter()
        .filter_map(|u| test_kit::env::host_port(u))
        .collect();
    let compact = format!("redlock://{}/0?prefix=x", hosts.join(","));
    let backend = backend_redis::open(&compact).await.expect("redlock://");
    assert_eq!(backend.backend_name(), "redlock");
}

/// `connect` loads every script, so the first lock call on each node is one `EVALSHA`
/// (no `NOSCRIPT`, `SCRIPT LOAD`, second `EVALSHA`: three round trips and a compile that
/// the 50 ms node timeout can miss over TLS on a busy machine). On a private server, whose
/// script cache starts empty.
#[tokio::test]
async fn connect_preloads_the_scripts() {
    if common::redlock_urls().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let mut admin = common::admin(&server.url()).await;
    let config = RedlockConfig::from_node_urls(&[server.url()])
        .expect("valid URL")
        .with_node_timeout(Duration::from_secs(5));
    let backend = RedlockBackend::connect(config).await.expect("connect");
    let before = common::command_calls(&mut admin).await;
    let name = common::fresh_name("preload");
    let lease = acquired(backend.acquire(&request(&name)).await.expect("acquire"));
    let after = common::command_calls(&mut admin).await;
    let ran = common::calls_between(&before, &after);
    assert_eq!(ran.get("evalsha"), Some(&1), "{ran:?}");
    assert_eq!(
        ran.get("script|load"),
        None,
        "the first acquire reloaded: {ran:?}"
    );
    backend.release(&lease).await.expect("release");
}

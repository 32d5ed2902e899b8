//! Leader election beside etcd's own, through the real `etcdctl elect` (Go's
//! `concurrency.Election`): the two share one key layout, so each waits for the other,
//! each observes the other's leader, and terms keep rising across them.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Identity, LockName, LockOptions, Locker, Note};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

/// `etcdctl elect <args…>` against `endpoints`, stdout piped.
fn etcdctl_elect(endpoints: &[String], args: &[&str]) -> Child {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("elect")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl (apt etcd-client) in PATH")
}

fn lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout")).lines()
}

/// The next line `etcdctl` prints, within 15 s.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, what: &str) -> String {
    timeout(Duration::from_secs(15), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("etcdctl printed no {what} in 15 s"))
        .expect("read")
        .unwrap_or_else(|| panic!("etcdctl exited before printing {what}"))
}

/// SIGINT, on which `etcdctl elect` resigns and exits (by PID, never by name).
fn interrupt(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// An anylock leader keeps `etcdctl elect` waiting; `etcdctl elect -l` shows our key (its
/// value being anylock's owner record, with the campaign value as `note`). Once we resign,
/// etcdctl is elected with a key newer than our term; anylock's `leader()` and `Observer`
/// report it with its proposal as the value; an anylock candidate waits for it and leads
/// once etcdctl resigns, with a term above etcdctl's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anylock_and_etcdctl_elect_take_turns_and_see_each_other() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("interop-elect");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let locker =
        Locker::new(backend.clone()).with_options(LockOptions::new(Duration::from_secs(30)));
    let election = locker.election("scheduler").expect("election");
    let lock = backend.lock_prefix(&LockName::new("scheduler").expect("name"));
    let name = lock.trim_end_matches('/');

    let ours = election
        .campaign(Some(Note::new("anylock-node").expect("note")))
        .await
        .expect("campaign");
    let our_term = ours.term().expect("etcd fences").get();

    let mut watcher = etcdctl_elect(&endpoints, &["-l", name]);
    let mut watched = lines(&mut watcher);
    let key = next_line(&mut watched, "the leader's key").await;
    assert!(key.starts_with(&lock), "{key} is not under {lock}");
    let value = next_line(&mut watched, "the leader's value").await;
    let record: serde_json::Value = serde_json::from_str(&value).expect("our owner record");
    assert_eq!(record["note"], "anylock-node", "{value}");

    let mut rival = etcdctl_elect(&endpoints, &[name, "etcd-node"]);
    let mut said = lines(&mut rival);
    campaigning(&endpoints, &lock, 2).await;
    let early = timeout(Duration::from_secs(2), said.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl was elected while we led: {early:?}"
    );
    assert!(ours.is_leader());

    let mut observer = election.observe();
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(seen.term().map(|t| t.get()), Some(our_term));
    ours.resign().await.expect("resign");

    let rival_key = next_line(&mut said, "its key once elected").await;
    assert!(rival_key.starts_with(&lock), "{rival_key}");
    assert_eq!(next_line(&mut said, "its proposal").await, "etcd-node");
    let leader = election.leader().await.expect("leader").expect("etcdctl");
    assert_eq!(leader.value().map(Note::as_str), Some("etcd-node"));
    assert!(
        leader.owner().as_str().starts_with("etcd-lease/"),
        "{}",
        leader.owner()
    );
    let rival_term = leader.term().expect("a term").get();
    assert!(rival_term > our_term, "{rival_term} <= {our_term}");
    let mut reported = observer.next().await.expect("observe");
    if reported.is_none() {
        // The vacancy between our resignation and etcdctl's election.
        reported = observer.next().await.expect("observe");
    }
    let reported = reported.expect("etcdctl leads");
    assert_eq!(reported.term().map(|t| t.get()), Some(rival_term));
    assert_eq!(reported.value().map(Note::as_str), Some("etcd-node"));
    assert_eq!(next_line(&mut watched, "etcdctl's key").await, rival_key);
    assert_eq!(
        next_line(&mut watched, "etcdctl's value").await,
        "etcd-node"
    );

    let candidate = election.clone();
    let next = tokio::spawn(async move { candidate.campaign(None).await });
    sleep(Duration::from_secs(1)).await;
    assert!(!next.is_finished(), "anylock led while etcdctl did");
    interrupt(&rival);
    let status = timeout(Duration::from_secs(10), rival.wait()).await;
    assert!(status.expect("etcdctl exits").expect("status").success());
    let again = timeout(Duration::from_secs(15), next)
        .await
        .expect("anylock never led after etcdctl resigned")
        .expect("task")
        .expect("campaign");
    let again_term = again.term().expect("a term").get();
    assert!(again_term > rival_term, "{again_term} <= {rival_term}");
    let key = next_line(&mut watched, "our new key").await;
    assert!(key.starts_with(&lock), "{key}");
    again.resign().await.expect("resign");
    interrupt(&watcher);
    let _ = timeout(Duration::from_secs(10), watcher.wait()).await;
}

/// Waits (up to 15 s) until `count` keys (candidates) are under `lock`: etcdctl has put
/// its key and is campaigning, not still starting.
async fn campaigning(endpoints: &[String], lock: &str, count: usize) {
    let mut raw = common::raw(endpoints).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while common::keys_under(&mut raw, lock).await.len() != count {
        assert!(
            Instant::now() < deadline,
            "{count} candidates never under {lock}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A Go leader whose proposal is JSON naming an owner, the very identity an anylock
/// candidate uses, is still a foreign leader: anylock shows it with its proposal as the
/// value and never takes it over as a same-owner retake (which would delete etcdctl's key
/// while etcdctl goes on leading: two leaders). Before values carried anylock's format
/// mark, the try-once below was granted; before a lock key's value needed the mark to be
/// shown as its owner's, the proposal of exactly anylock's older shape (`{"owner":…}`)
/// was shown as `ops`'s (so `anylock verify --owner ops` passed while etcdctl led).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_proposal_naming_our_owner_is_not_taken_for_ours() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let ops = Identity::named("ops").expect("identity");
    let proposals = [
        format!(r#"{{"owner":"{}","addr":"10.0.0.9"}}"#, ops.as_str()),
        format!(r#"{{"owner":"{}"}}"#, ops.as_str()),
    ];
    for proposal in proposals {
        json_proposal_is_foreign(&endpoints, &ops, &proposal).await;
    }
}

async fn json_proposal_is_foreign(endpoints: &[String], ops: &Identity, proposal: &str) {
    let prefix = common::random_prefix("interop-elect-json");
    let backend = Arc::new(common::backend(endpoints, &prefix).await);
    let locker = Locker::new(backend.clone())
        .with_options(LockOptions::new(Duration::from_secs(30)))
        .with_identity(ops.clone());
    let lock = backend.lock_prefix(&LockName::new("sched").expect("name"));
    let name = lock.trim_end_matches('/');
    let mut rival = etcdctl_elect(endpoints, &[name, proposal]);
    let mut said = lines(&mut rival);
    next_line(&mut said, "its key once elected").await;
    assert_eq!(next_line(&mut said, "its proposal").await, proposal);

    let election = locker.election("sched").expect("election");
    let leader = election.leader().await.expect("leader").expect("etcdctl");
    assert!(
        leader.owner().as_str().starts_with("etcd-lease/"),
        "{proposal} shown as {}'s",
        leader.owner()
    );
    assert_eq!(leader.value().map(Note::as_str), Some(proposal));
    let taken = locker.try_acquire("sched").await.expect("call");
    assert!(
        taken.is_none(),
        "took etcdctl's leadership over as our own: two leaders"
    );
    assert!(election.try_campaign(None).await.expect("call").is_none());
    let mut raw = common::raw(endpoints).await;
    let keys = common::keys_under(&mut raw, &lock).await;
    assert_eq!(keys.len(), 1, "etcdctl's key is the only one: {keys:?}");
    assert_eq!(keys[0].value, proposal.as_bytes());
    interrupt(&rival);
    let status = timeout(Duration::from_secs(10), rival.wait()).await;
    assert!(status.expect("etcdctl exits").expect("status").success());
}

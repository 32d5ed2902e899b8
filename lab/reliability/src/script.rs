//! Fault scripts: each waits for the moment that makes the fault bite (a holder's begin
//! or its lease check, seen in the register's history), applies the fault, and undoes it
//! after a fixed time. Every script is bounded.

use std::future::Future;
use std::time::Duration;

use test_kit::proxy::Fault as LinkFault;
use test_kit::suspend::Freezer;
use tokio::time::{Instant, sleep};

use crate::backends::Workload;
use crate::fault::Fault;
use crate::group::Group;
use crate::servers::{Lane, node_name};

mod moment;
mod rollback;

use moment::{begun, trigger};

/// Redlock's node C (index 2): the node both sides of Kleppmann's partition reach.
const NODE_C: usize = 2;

/// Applies `fault` to `groups` (clients) or `lane` (servers); returns what was done.
///
/// # Errors
/// When the triggering moment never came or a server did not recover.
pub async fn apply(
    fault: Fault,
    lane: &mut Lane,
    groups: &[Group],
    w: Workload,
) -> Result<Vec<String>, String> {
    let ttl = w.ttl;
    match fault {
        Fault::None => {
            sleep(ttl * 2).await;
            Ok(vec!["no fault for 2 TTL".into()])
        }
        // The clients started in their namespaces (see `GroupSpec::pid_namespaces`).
        Fault::PidNamespaces => {
            sleep(ttl * 2).await;
            Ok(vec![
                "clients in separate PID namespaces; contention for 2 TTL".into(),
            ])
        }
        Fault::Pause => each_group(groups, |g| pause(g, w)).await,
        Fault::Suspend => each_group(groups, |g| suspend(g, w)).await,
        Fault::Blackhole => {
            each_group(groups, |g| links(g, w, LinkFault::Blackhole, ttl * 3 / 2)).await
        }
        Fault::Delay => each_group(groups, |g| links(g, w, LinkFault::Delay(ttl), ttl * 3)).await,
        Fault::ClockBack => each_group(groups, |g| clock(g, w, "jump-back")).await,
        Fault::ClockForward => each_group(groups, |g| clock(g, w, "jump-forward")).await,
        _ => server(fault, lane, &groups[0], w).await,
    }
}

/// The server-side faults, triggered by the first group.
async fn server(
    fault: Fault,
    lane: &mut Lane,
    group: &Group,
    w: Workload,
) -> Result<Vec<String>, String> {
    let ttl = w.ttl;
    match fault {
        Fault::RedisRestart => {
            trigger(group, w, &[]).await?;
            Ok(vec![lane.restart_redis().await?])
        }
        Fault::RedisSnapshotRollback => rollback::snapshot_rollback(lane, group, w).await,
        Fault::RedlockRestart => Ok(vec![redlock_restart(lane, group, w, Duration::ZERO).await?]),
        Fault::RedlockDelayedRestart => {
            Ok(vec![redlock_restart(lane, group, w, ttl * 3 / 2).await?])
        }
        Fault::PostgresRestart => {
            let mut notes = Vec::new();
            for outage in [Duration::ZERO, ttl * 3 / 2] {
                trigger(group, w, &[]).await?;
                notes.push(lane.restart_postgres(outage).await?);
                sleep(ttl * 2).await;
            }
            Ok(notes)
        }
        Fault::EtcdLeaderKill => {
            trigger(group, w, &[]).await?;
            Ok(vec![lane.kill_etcd_leader(ttl * 3).await?])
        }
        Fault::GcsErrors => gcs_bursts(lane, group, w).await,
        other => Err(format!("{other} is not a server fault")),
    }
}

/// Restarts node C while client 1 or 2 (each holds a bare majority including C) is about
/// to write.
async fn redlock_restart(
    lane: &mut Lane,
    group: &Group,
    w: Workload,
    down: Duration,
) -> Result<String, String> {
    let event = trigger(group, w, &[1, 2]).await?;
    let note = lane.restart_redlock_node(NODE_C, down).await?;
    let nodes = match event.id.client {
        1 => "A, B, C",
        _ => "C, D, E",
    };
    Ok(format!(
        "{note}, {} being one of the {nodes} that client {} held the lock on",
        node_name(NODE_C),
        event.id.client
    ))
}

/// Runs `script` on every group at once.
async fn each_group<'a, F, Fut>(groups: &'a [Group], script: F) -> Result<Vec<String>, String>
where
    F: Fn(&'a Group) -> Fut,
    Fut: Future<Output = Result<String, String>>,
{
    match groups {
        [a, b] => {
            let (x, y) = tokio::join!(script(a), script(b));
            Ok(vec![x?, y?])
        }
        _ => {
            let mut notes = Vec::new();
            for group in groups {
                notes.push(script(group).await?);
            }
            Ok(notes)
        }
    }
}

async fn pause(group: &Group, w: Workload) -> Result<String, String> {
    let event = trigger(group, w, &[]).await?;
    let client = &group.clients[index(event.id.client)];
    let paused = Instant::now();
    client.pause();
    sleep(w.ttl * 5 / 2).await;
    client.resume();
    Ok(format!(
        "{}: client {} stopped {} ms after its check",
        group.mode.as_str(),
        client.id,
        paused.elapsed().as_millis()
    ))
}

/// A machine suspend: the holder is frozen without a signal for 1.5 TTL (its lease runs
/// out, the next holder enters), and thawed with its monotonic clock behind by the frozen
/// time while the servers' clocks ran on. Its links stay cut for a TTL after the thaw (a
/// laptop's network comes back after it wakes), so only its own clock can tell it that the
/// lease is gone: a clock that skipped the suspend has it check "held" inside the next
/// holder's section.
async fn suspend(group: &Group, w: Workload) -> Result<String, String> {
    let event = trigger(group, w, &[]).await?;
    let at = index(event.id.client);
    let client = &group.clients[at];
    let skip = client
        .skip
        .as_ref()
        .ok_or("the client's clock cannot skip")?;
    let freezer = Freezer::new("reliability");
    freezer.add(client.pid());
    freezer.freeze();
    let frozen = Instant::now();
    group.links[at].set_all(LinkFault::Blackhole);
    sleep(w.ttl * 3 / 2).await;
    let stood = frozen.elapsed();
    skip.add(stood);
    freezer.thaw();
    sleep(w.ttl).await;
    group.links[at].set_all(LinkFault::Pass);
    Ok(format!(
        "{}: client {} frozen {} ms after its check, its monotonic clock skipping it, its \
         links cut until a TTL after the thaw",
        group.mode.as_str(),
        client.id,
        stood.as_millis()
    ))
}

async fn links(
    group: &Group,
    w: Workload,
    fault: LinkFault,
    hold: Duration,
) -> Result<String, String> {
    let event = begun(group, w).await?;
    let links = &group.links[index(event.id.client)];
    links.set_all(fault);
    sleep(hold).await;
    links.set_all(LinkFault::Pass);
    Ok(format!(
        "{}: client {} links {fault:?} for {} ms",
        group.mode.as_str(),
        event.id.client,
        hold.as_millis()
    ))
}

async fn clock(group: &Group, w: Workload, command: &str) -> Result<String, String> {
    // Right after a check, as for the pause: the worst moment.
    let event = trigger(group, w, &[]).await?;
    let jump = w.ttl * 3;
    group.clients[index(event.id.client)]
        .send(&format!("{command} {}", jump.as_millis()))
        .await;
    // Let the holder run into (or out of) trouble before the run moves on.
    sleep(w.ttl * 3).await;
    Ok(format!(
        "{}: client {} {command} {} ms",
        group.mode.as_str(),
        event.id.client,
        jump.as_millis()
    ))
}

async fn gcs_bursts(lane: &Lane, group: &Group, w: Workload) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    for burst in [Duration::from_millis(500), Duration::from_secs(2)] {
        trigger(group, w, &[]).await?;
        lane.gcs_errors(true)?;
        sleep(burst).await;
        lane.gcs_errors(false)?;
        notes.push(format!("503 to every request for {} ms", burst.as_millis()));
        sleep(w.ttl * 2).await;
    }
    Ok(notes)
}

fn index(client: u32) -> usize {
    usize::try_from(client.saturating_sub(1)).unwrap_or(0)
}

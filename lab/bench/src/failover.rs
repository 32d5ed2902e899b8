//! Leader failover (issue 18), through lockcore's `Election`: how long an election has no
//! leader when its leader resigns (here, in-process, with an observer on another locker
//! timed too) and when its leader crashes (`crash`, a child process killed). The crash
//! samples of every backend run at once first, since they mostly wait out a TTL; then the
//! resignations, one backend after another, since they are timed to the millisecond.

use std::time::Duration;

use futures_util::future::join_all;
use lockcore::{
    DEFAULT_OBSERVE_INTERVAL, Fairness, Identity, Leader, LockBackend, Locker, Waiting,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout, timeout_at};

use crate::args::Plan;
use crate::common::{locker, millis, signed_millis};
use crate::crash;
use crate::measure::{absorb, error_budget, hold};
use crate::op::Res;
use crate::results::{ResignRow, Results};
use crate::system::{Ctx, System};

/// How long a sample waits for the candidate or the observer before it counts as failed.
const LIMIT: Duration = Duration::from_secs(30);

/// Measures every system: the crash failovers of all backends at once, then the resign
/// failovers backend by backend.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    let crashes = join_all(systems.iter().map(|s| crash::measure(s, ctx, plan))).await;
    for (system, row) in systems.iter().zip(crashes) {
        let row = row.map_err(|e| format!("crash failover on {}: {e}", system.kind.name()))?;
        out.crash_failover.push(row);
    }
    crate::common::progress("failover: crashes done");
    for system in systems {
        let row = resigns(system, ctx, plan)
            .await
            .map_err(|e| format!("resign failover on {}: {e}", system.kind.name()))?;
        out.resign_failover.push(row);
        crate::common::progress(&format!(
            "failover: {} resignations done",
            system.kind.name()
        ));
    }
    Ok(())
}

/// How a waiting candidate on `backend` learns that the leader let go.
pub(crate) fn wakes(backend: &dyn LockBackend) -> &'static str {
    let guarantees = backend.guarantees();
    match (guarantees.waiting, guarantees.fairness) {
        (Waiting::Notified, Fairness::Fifo) => "notified (its place in the waiters' queue)",
        (Waiting::Notified, Fairness::None) => "notified (release notification)",
        (Waiting::Polled, _) => "polled: backoff 20 ms doubling to 1 s, full jitter",
    }
}

/// `plan.resign_failovers` resignations on fresh names of `system`.
async fn resigns(system: &System, ctx: &Ctx, plan: &Plan) -> Res<ResignRow> {
    let candidates = locker(system.backend.clone(), ctx.ttl, LIMIT);
    // The observer runs on a locker of its own, as it would in another process.
    let watcher = locker(system.backend.clone(), ctx.ttl, LIMIT);
    let budget = error_budget(plan.resign_failovers);
    let mut row = ResignRow {
        backend: system.kind.name().to_owned(),
        wakes: wakes(system.backend.as_ref()).to_owned(),
        samples_ms: Vec::new(),
        observe_interval_ms: millis(DEFAULT_OBSERVE_INTERVAL),
        observer_lag_ms: Vec::new(),
        observer_missed: 0,
        errors: 0,
    };
    for i in 0..plan.resign_failovers {
        loop {
            let name = format!(
                "{}-{}-resign{i}-{}",
                ctx.run,
                system.kind.name(),
                row.errors
            );
            match resign(&candidates, &watcher, &name).await {
                Ok((failover, lag)) => {
                    row.samples_ms.push(millis(failover));
                    match lag {
                        Some(lag) => row.observer_lag_ms.push(lag),
                        None => row.observer_missed += 1,
                    }
                    break;
                }
                Err(err) => absorb(&mut row.errors, budget, err)?,
            }
        }
    }
    Ok(row)
}

/// One resignation on `name`: a leader elected, an observer on `watcher` that has
/// reported it, a candidate campaigning; the leader resigns after a random 50–150 ms.
/// Returns the time from the `resign` call to the candidate's `campaign` returning, and
/// from then to the observer reporting the candidate (ms, signed; `None` when it did not
/// within [`LIMIT`]).
async fn resign(candidates: &Locker, watcher: &Locker, name: &str) -> Res<(Duration, Option<f64>)> {
    let election = candidates.election(name)?;
    let leader = (election.try_campaign(None).await?)
        .ok_or_else(|| format!("{name} had a leader before the sample"))?;
    let mut observer = watcher.election(name)?.observe();
    let first = timeout(LIMIT, observer.next()).await??;
    let owner = leader.guard().lease().owner().clone();
    if first.as_ref().map(Leader::owner) != Some(&owner) {
        return Err(format!("the observer did not report {name}'s first leader").into());
    }
    // Every report from now on, with when it came.
    let (tx, mut reports) = mpsc::unbounded_channel::<(Instant, Option<Identity>)>();
    let _watching = Aborting(tokio::spawn(async move {
        while let Ok(leader) = observer.next().await {
            let owner = leader.map(|l| l.owner().clone());
            if tx.send((Instant::now(), owner)).is_err() {
                break;
            }
        }
    }));
    let mut candidate = {
        let election = election.clone();
        Aborting(tokio::spawn(async move {
            let leadership = election.campaign(None).await?;
            Res::Ok((Instant::now(), leadership))
        }))
    };
    tokio::time::sleep(hold()).await;
    let resigned = Instant::now();
    leader.resign().await?;
    let (led, next) = (timeout(LIMIT, &mut candidate.0).await)
        .map_err(|_| "the candidate did not lead within 30 s")???;
    let owner = next.guard().lease().owner().clone();
    let deadline = Instant::now() + LIMIT;
    let mut seen = None;
    while let Ok(Some((at, reported))) = timeout_at(deadline, reports.recv()).await {
        if reported.as_ref() == Some(&owner) {
            seen = Some(signed_millis(at, led));
            break;
        }
    }
    next.resign().await?;
    Ok((led.saturating_duration_since(resigned), seen))
}

/// A task aborted when this is dropped, on every path out of a sample (a candidate left
/// campaigning after an error would lead a name nobody watches).
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::MemoryBackend;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_resignation_hands_leadership_over_and_the_observer_sees_it() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let candidates = locker(backend.clone(), Duration::from_secs(5), LIMIT);
        let watcher = locker(backend.clone(), Duration::from_secs(5), LIMIT);
        let (failover, lag) = resign(&candidates, &watcher, "t-resign")
            .await
            .expect("sample");
        assert!(failover < LIMIT);
        assert!(lag.is_some(), "the observer reported the new leader");
        let free = candidates.election("t-resign").expect("name");
        assert!(free.leader().await.expect("read").is_none());
        assert!(wakes(backend.as_ref()).starts_with("notified"));
    }
}

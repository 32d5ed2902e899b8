//! Item 5: Redlock acquire latency on all nodes versus the first node alone, for ours and
//! for rslock, interleaved.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::args::Plan;
use crate::measure::{absorb, error_budget};
use crate::op::{Lock, NAMES, Res};
use crate::results::{FanoutRow, Results};
use crate::stats::Summary;
use crate::system::{Ctx, Kind, System};

/// Measures the Redlock system, if there is one, against a one-node Redlock on its first
/// node.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    let Some(all) = systems.iter().find(|s| s.kind == Kind::Redlock) else {
        return Ok(());
    };
    let nodes = all.url.split(',').count();
    let first = all.url.split(',').next().unwrap_or_default();
    let one = System::connect(Kind::Redlock, first, ctx).await?;
    let mut locks: Vec<(String, usize, Arc<dyn Lock>)> = Vec::new();
    for (system, n) in [(&one, 1), (all, nodes)] {
        locks.push(("anylock (Locker)".to_owned(), n, system.ours(ctx)));
        for peer in &system.peers {
            let label = peer.label.split(',').next().unwrap_or_default().to_owned();
            locks.push((label, n, peer.lock.clone()));
        }
    }
    let mut acquire = vec![Vec::new(); locks.len()];
    let mut cycle = vec![Vec::new(); locks.len()];
    let mut errors = vec![0; locks.len()];
    let runs = plan.fanout_batches * plan.fanout_per_batch;
    let budget = error_budget(runs);
    let name = |l: usize, k: usize| format!("{}-fanout{l}-{}", ctx.run, k % NAMES);
    // Every name once, untimed, so the timed cycles are steady state, not first uses.
    for (l, lock) in locks.iter().enumerate() {
        let mut failed = 0;
        for k in 0..runs.min(NAMES) {
            if let Err(err) = time_cycle(lock.2.as_ref(), &name(l, k)).await {
                absorb(&mut failed, budget, err)
                    .map_err(|e| format!("fan-out warm-up of {}: {e}", lock.0))?;
            }
        }
    }
    for batch in 0..plan.fanout_batches {
        for k in 0..locks.len() {
            let l = (k + batch) % locks.len();
            for i in 0..plan.fanout_per_batch {
                let key = name(l, batch * plan.fanout_per_batch + i);
                match time_cycle(locks[l].2.as_ref(), &key).await {
                    Ok((a, c)) => {
                        acquire[l].push(a);
                        cycle[l].push(c);
                    }
                    Err(err) => absorb(&mut errors[l], budget, err)?,
                }
            }
        }
    }
    for (i, (label, nodes, _)) in locks.into_iter().enumerate() {
        out.fanout.push(FanoutRow {
            label,
            nodes,
            acquire: Summary::of(&acquire[i]),
            cycle: Summary::of(&cycle[i]),
            errors: errors[i],
        });
    }
    crate::common::progress("redlock fan-out done");
    Ok(())
}

/// (acquire, acquire + release) of one uncontended cycle.
async fn time_cycle(lock: &dyn Lock, name: &str) -> Res<(Duration, Duration)> {
    let start = Instant::now();
    let held = lock
        .acquire(name, false)
        .await?
        .ok_or("held during a fan-out cycle")?;
    let acquired = start.elapsed();
    lock.release(held).await?;
    Ok((acquired, start.elapsed()))
}

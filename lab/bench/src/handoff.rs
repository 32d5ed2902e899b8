//! Item 3: contended handoff latency, from the holder's release call to the next waiter
//! holding the lock: ours with release notification, ours with notification turned off
//! (backoff polling), the raw floor where there is one ([`crate::floor`]), and each peer's
//! own waiting.

use std::sync::Arc;
use std::time::Duration;

use crate::args::Plan;
use crate::measure::{absorb, error_budget, handoff, warm_up};
use crate::op::{Entry, Lock, Ours, Res, Role};
use crate::results::{HandoffRow, Results};
use crate::stats::Summary;
use crate::system::{Ctx, System};
use crate::wrap::Observed;

/// One kind of waiter.
struct Waiter {
    label: String,
    mode: String,
    lock: Arc<dyn Lock>,
}

fn waiters(system: &System, ctx: &Ctx) -> Vec<Waiter> {
    let mut all = Vec::new();
    if system.notified() {
        all.push(Waiter {
            label: "anylock".to_owned(),
            mode: "notified".to_owned(),
            lock: system.ours(ctx),
        });
    }
    let polled = Arc::new(Observed::new(system.backend.clone(), true));
    let mode = if system.notified() {
        "polled (notifications off): backoff 20 ms doubling to 1 s, full jitter"
    } else {
        "polled (the backend has no notification): backoff 20 ms doubling to 1 s, full jitter"
    };
    all.push(Waiter {
        label: "anylock".to_owned(),
        mode: mode.to_owned(),
        lock: Arc::new(Ours::new(polled, ctx.ttl)),
    });
    for peer in system.floor.iter().chain(&system.peers) {
        if let Some(waiting) = peer.waiting {
            all.push(Waiter {
                label: peer.label.clone(),
                mode: waiting.to_owned(),
                lock: peer.lock.clone(),
            });
        }
    }
    all
}

/// Yardsticks timed between handoffs: the raw round trip and our uncontended cycle.
fn yardsticks(system: &System, ctx: &Ctx) -> [Option<Entry>; 2] {
    let prefix = format!("{}-{}-yardstick", ctx.run, system.kind.name());
    let cycle = Entry::cycle("cycle", Role::Ours, system.ours(ctx), &prefix);
    [system.raw.clone(), Some(cycle)]
}

/// Measures every system, interleaving the waiter kinds sample by sample, with the raw
/// round trip and our own cycle timed in between as yardsticks.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems {
        let waiters = waiters(system, ctx);
        let yardsticks = yardsticks(system, ctx);
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); waiters.len()];
        let mut yards: [Vec<Duration>; 2] = Default::default();
        let mut errors = vec![0; waiters.len()];
        let budget = error_budget(plan.handoffs);
        // The yardsticks' names once, untimed: they time steady state, as in the latency
        // section.
        for entry in yardsticks.iter().flatten() {
            warm_up(entry.op.as_ref(), plan.handoffs * 5, budget)
                .await
                .map_err(|e| format!("handoff yardstick {}: {e}", entry.label))?;
        }
        for i in 0..plan.handoffs {
            for (w, waiter) in waiters.iter().enumerate() {
                let name = format!("{}-{}-handoff{w}-{i}", ctx.run, system.kind.name());
                loop {
                    let attempt = format!("{name}-{}", errors[w]);
                    match handoff(waiter.lock.clone(), &attempt).await {
                        Ok(sample) => break samples[w].push(sample),
                        Err(err) => absorb(&mut errors[w], budget, err)?,
                    }
                }
            }
            for (y, entry) in yardsticks.iter().enumerate() {
                let Some(entry) = entry else { continue };
                for k in 0..5 {
                    let start = tokio::time::Instant::now();
                    if entry.op.run(i * 5 + k).await.is_ok() {
                        yards[y].push(start.elapsed());
                    }
                }
            }
        }
        let p50 = |v: &[Duration]| (!v.is_empty()).then(|| Summary::of(v).p50_us);
        for ((waiter, samples), errors) in waiters.into_iter().zip(samples).zip(errors) {
            out.handoff.push(HandoffRow {
                backend: system.kind.name().to_owned(),
                label: waiter.label,
                mode: waiter.mode,
                summary: Summary::of(&samples),
                samples_ms: samples.iter().map(|d| d.as_secs_f64() * 1e3).collect(),
                raw_p50_us: p50(&yards[0]),
                cycle_p50_us: p50(&yards[1]),
                errors,
            });
        }
        crate::common::progress(&format!("handoff: {} done", system.kind.name()));
    }
    Ok(())
}

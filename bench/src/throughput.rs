//! Item 2: throughput of uncontended cycles over 1,000 distinct names at several
//! concurrencies, beside the raw round trip's throughput at the same concurrency (what
//! redis-benchmark or pgbench would report), PostgreSQL's two-write floor (upsert +
//! update on the same pool, the same slices of names) and the peers'.

use crate::args::Plan;
use crate::measure::{throughput, warm_up_names};
use crate::op::{Entry, Res};
use crate::results::{Results, ThroughputRow};
use crate::system::{Ctx, System};

/// Ours through `Locker`, raw, the reference points that ask for it (PostgreSQL's
/// two-write floor), then the peers.
fn entries(system: &System, ctx: &Ctx) -> Vec<Entry> {
    let mut all = system.lock_entries(ctx);
    let peers = all.split_off(2);
    all.truncate(1);
    all.extend(system.raw.iter().cloned());
    all.extend(system.extras.iter().filter(|e| e.in_throughput).cloned());
    all.extend(peers);
    all
}

/// Measures every system and appends its rows (the mean over interleaved rounds), after an
/// untimed warm-up pass over every name.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems {
        let entries = entries(system, ctx);
        // Every name once, untimed, so the rates are of steady state, not of first uses.
        let widest = plan.tasks.iter().copied().max().unwrap_or(1);
        for entry in &entries {
            warm_up_names(entry.op.clone(), widest)
                .await
                .map_err(|e| format!("{}: {e}", entry.label))?;
        }
        let mut sums = vec![vec![0.0; plan.tasks.len()]; entries.len()];
        let mut errors = vec![vec![0; plan.tasks.len()]; entries.len()];
        for round in 0..plan.throughput_rounds {
            for (t, &tasks) in plan.tasks.iter().enumerate() {
                for k in 0..entries.len() {
                    let e = (k + round) % entries.len();
                    let op = entries[e].op.clone();
                    let (rate, failed) = throughput(op, tasks, plan.throughput_for).await?;
                    sums[e][t] += rate;
                    errors[e][t] += failed;
                }
            }
            if let Some(server) = &ctx.gcs_server {
                server.clear_requests();
            }
        }
        for ((entry, sums), errors) in entries.iter().zip(sums).zip(errors) {
            for ((&tasks, sum), errors) in plan.tasks.iter().zip(sums).zip(errors) {
                out.throughput.push(ThroughputRow {
                    backend: system.kind.name().to_owned(),
                    label: entry.label.clone(),
                    role: entry.role,
                    tasks,
                    per_second: sum / plan.throughput_rounds as f64,
                    errors,
                });
            }
        }
        crate::common::progress(&format!("throughput: {} done", system.kind.name()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::op::{Bare, Role};
    use crate::system::{Kind, Peer};
    use lockcore::{LockBackend, MemoryBackend};

    /// A reference point that asks for it (PostgreSQL's two-write floor) is measured
    /// beside the raw round trip; the others stay in the latency section.
    #[test]
    fn throughput_measures_the_floor_that_asks_for_it() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let lock = Arc::new(Bare::new(backend.clone(), Duration::from_secs(5)));
        let cycle = |label: &str| Entry::cycle(label, Role::Raw, lock.clone(), "t");
        let system = System {
            kind: Kind::Postgres,
            url: String::new(),
            upstreams: Vec::new(),
            backend,
            raw: Some(cycle("raw")),
            extras: vec![cycle("floor").in_throughput(), cycle("latency only")],
            peers: vec![Peer::new("peer", lock.clone(), "polled")],
            counter: None,
            note: String::new(),
        };
        let ctx = Ctx {
            run: "r".into(),
            ttl: Duration::from_secs(5),
            gcs_server: None,
        };
        let labels: Vec<String> = entries(&system, &ctx)
            .into_iter()
            .map(|e| e.label)
            .collect();
        assert_eq!(labels, ["anylock (Locker)", "raw", "floor", "peer"]);
    }
}

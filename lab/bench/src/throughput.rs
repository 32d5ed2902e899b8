//! Item 2: throughput of uncontended cycles over 1,000 distinct names at several
//! concurrencies, beside the raw round trip's throughput at the same concurrency (what
//! redis-benchmark or pgbench would report), PostgreSQL's two-write floor (upsert +
//! update on the same pool, the same slices of names) and the peers'.

use std::time::Duration;

use crate::args::Plan;
use crate::measure::{Rate, throughput, warm_up_names};
use crate::op::{Entry, Res};
use crate::results::{Results, ThroughputRow};
use crate::system::{Ctx, System};

/// Ours through `Locker` (a lock, then a semaphore's permit where the backend has them), raw,
/// the reference points that ask for it (PostgreSQL's
/// two-write floor), then the peers.
fn entries(system: &System, ctx: &Ctx) -> Vec<Entry> {
    let mut all = system.lock_entries(ctx);
    let peers = all.split_off(crate::system::OURS_ENTRIES);
    all.truncate(1);
    all.extend(system.permit_entry(ctx));
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
        let mut sums = vec![vec![Sum::default(); plan.tasks.len()]; entries.len()];
        for round in 0..plan.throughput_rounds {
            for (t, &tasks) in plan.tasks.iter().enumerate() {
                for k in 0..entries.len() {
                    let e = (k + round) % entries.len();
                    let op = entries[e].op.clone();
                    sums[e][t].add(throughput(op, tasks, plan.throughput_for).await?);
                }
            }
            if let Some(server) = &ctx.gcs_server {
                server.clear_requests();
            }
        }
        for (entry, sums) in entries.iter().zip(sums) {
            for (&tasks, sum) in plan.tasks.iter().zip(sums) {
                let (client_cpu_us, other_cpu_us) = sum.cpu_per_unit();
                out.throughput.push(ThroughputRow {
                    backend: system.kind.name().to_owned(),
                    label: entry.label.clone(),
                    role: entry.role,
                    tasks,
                    per_second: sum.per_second_mean(),
                    errors: sum.failed,
                    client_cpu_us,
                    other_cpu_us,
                });
            }
        }
        crate::common::progress(&format!("throughput: {} done", system.kind.name()));
    }
    Ok(())
}

/// The rounds of one entry at one concurrency, added up: CPU per unit is the total CPU
/// over the total completed units, so a round with few completions weighs what it did.
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    per_second: f64,
    completed: u64,
    failed: u64,
    client_cpu: Duration,
    /// `None` once a round could not read the machine's CPU.
    machine_cpu: Option<Duration>,
    rounds: u32,
}

impl Sum {
    fn add(&mut self, rate: Rate) {
        self.machine_cpu = if self.rounds == 0 {
            rate.machine_cpu
        } else {
            self.machine_cpu.zip(rate.machine_cpu).map(|(a, b)| a + b)
        };
        self.rounds += 1;
        self.per_second += rate.per_second;
        self.completed += rate.completed;
        self.failed += rate.failed;
        self.client_cpu += rate.client_cpu;
    }

    /// The rounds' mean rate.
    fn per_second_mean(&self) -> f64 {
        self.per_second / f64::from(self.rounds.max(1))
    }

    /// µs per completed unit: this process's, and the rest of the machine's.
    fn cpu_per_unit(&self) -> (Option<f64>, Option<f64>) {
        if self.completed == 0 {
            return (None, None);
        }
        let per_unit = |cpu: Duration| cpu.as_secs_f64() * 1e6 / self.completed as f64;
        let rest = self
            .machine_cpu
            .map(|machine| per_unit(machine.saturating_sub(self.client_cpu)));
        (Some(per_unit(self.client_cpu)), rest)
    }
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
    /// beside the raw round trip; the others stay in the latency section. A backend with
    /// semaphores (the memory backend here) has its permit cycle measured after the lock's.
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
            floor: None,
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
        let permit = crate::system::PERMIT_LABEL;
        assert_eq!(labels, ["anylock (Locker)", permit, "raw", "floor", "peer"]);
    }
}

//! Item 1: uncontended acquire + release latency, interleaved with the server's raw round
//! trip and the peers, as ratios to the raw round trip of the same run.

use crate::args::Plan;
use crate::measure::interleaved;
use crate::op::{Entry, Res};
use crate::results::{LatencyRow, Results};
use crate::stats::{Summary, ratio};
use crate::system::{Ctx, System};

/// Ours (`Locker` try-acquire and waiting acquire, bare calls, a semaphore's permit where
/// the backend has them), raw, extra reference points and peers, in that order.
pub(crate) fn entries(system: &System, ctx: &Ctx) -> Vec<Entry> {
    let mut all = system.lock_entries(ctx);
    let peers = all.split_off(crate::system::OURS_ENTRIES);
    all.extend(system.permit_entry(ctx));
    all.extend(system.raw.iter().cloned());
    all.extend(system.extras.iter().cloned());
    all.extend(peers);
    all
}

/// Measures every system and appends its rows.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems {
        let entries = entries(system, ctx);
        let (samples, errors) = interleaved(&entries, plan.batches, plan.per_batch).await?;
        let summaries: Vec<Summary> = samples.iter().map(|s| Summary::of(s)).collect();
        let raw = system
            .raw
            .as_ref()
            .and_then(|r| entries.iter().position(|e| e.label == r.label))
            .map(|i| summaries[i]);
        for ((entry, summary), errors) in entries.iter().zip(summaries).zip(errors) {
            out.latency.push(LatencyRow {
                backend: system.kind.name().to_owned(),
                label: entry.label.clone(),
                role: entry.role,
                summary,
                vs_raw_p50: raw.and_then(|r| ratio(summary.p50_us, r.p50_us)),
                vs_raw_p99: raw.and_then(|r| ratio(summary.p99_us, r.p99_us)),
                errors,
            });
        }
        crate::common::progress(&format!("latency: {} done", system.kind.name()));
    }
    Ok(())
}

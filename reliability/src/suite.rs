//! The plan (which backend x fault cells run, full or short) and its execution: one lane
//! of private servers per backend, lanes side by side up to `jobs` at a time.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backends::Kind;
use crate::checker::Counts;
use crate::expect::expect;
use crate::fault::Fault;
use crate::run::{CellResult, CellSettings, run_cell};
use crate::servers::Lane;
use test_kit::servers::process::Reaper;

/// The cells CI runs: every fenced backend under a paused holder (fencing must refuse
/// its stale write), each backend under its own server fault (for `local:`, clients in
/// separate PID namespaces), etcd under a blackholed link, and PostgreSQL under a clock
/// jumping back and under a slow attempt (its pool lets a later attempt overtake a held
/// one).
const SHORT: &[(Kind, Fault)] = &[
    (Kind::Local, Fault::Pause),
    (Kind::Local, Fault::PidNamespaces),
    (Kind::Redis, Fault::Pause),
    (Kind::Redis, Fault::RedisRestart),
    (Kind::Redlock, Fault::RedlockDelayedRestart),
    (Kind::Postgres, Fault::Pause),
    (Kind::Postgres, Fault::PostgresRestart),
    (Kind::Postgres, Fault::ClockBack),
    (Kind::Postgres, Fault::SlowAttempt),
    (Kind::Etcd, Fault::Pause),
    (Kind::Etcd, Fault::Blackhole),
    (Kind::Etcd, Fault::EtcdLeaderKill),
    (Kind::Gcs, Fault::Pause),
    (Kind::Gcs, Fault::GcsErrors),
];

/// Which cells run, and how long each runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The cells, in report order.
    pub cells: Vec<(Kind, Fault)>,
    /// Sections each group completes before the fault.
    pub warmup: u64,
    /// Sections each group completes after it.
    pub recovery: u64,
    /// Sections each group completes in the baseline (short steps).
    pub baseline: u64,
    /// Sections each group completes under `slow-attempt`.
    pub slow: u64,
    /// How often a pause or a clock jump is applied to each group.
    pub repeats: u64,
}

impl Plan {
    /// Every fault that applies to every backend.
    pub fn full() -> Plan {
        let cells = Kind::ALL
            .into_iter()
            .flat_map(|k| Fault::ALL.into_iter().map(move |f| (k, f)))
            .filter(|(k, f)| f.applies_to(*k))
            .collect();
        Plan {
            cells,
            warmup: 3,
            recovery: 3,
            baseline: 150,
            slow: 50,
            repeats: 3,
        }
    }

    /// The CI version: a dozen cells, one section before and after each fault.
    pub fn short() -> Plan {
        Plan {
            cells: SHORT.to_vec(),
            warmup: 1,
            recovery: 1,
            baseline: 10,
            slow: 5,
            repeats: 1,
        }
    }

    /// Keeps only the given backends and faults (`None`: all).
    pub fn only(mut self, kinds: Option<&[Kind]>, faults: Option<&[Fault]>) -> Plan {
        self.cells.retain(|(k, f)| {
            kinds.is_none_or(|ks| ks.contains(k)) && faults.is_none_or(|fs| fs.contains(f))
        });
        self
    }
}

/// Where and how a plan runs.
#[derive(Debug, Clone)]
pub struct Suite {
    /// The cells.
    pub plan: Plan,
    /// The `anylock-reliability` binary.
    pub exe: PathBuf,
    /// Histories and logs.
    pub out_dir: PathBuf,
    /// Backends run at the same time.
    pub jobs: usize,
}

/// Runs every cell of the plan; results come back in plan order.
///
/// # Errors
/// When the scratch directory or its watchdog cannot be set up.
pub async fn run(suite: &Suite) -> Result<Vec<CellResult>, String> {
    let reaper = Arc::new(Reaper::start()?);
    let gate = Arc::new(Semaphore::new(suite.jobs.max(1)));
    let mut lanes = JoinSet::new();
    for kind in Kind::ALL {
        let faults: Vec<Fault> = (suite.plan.cells.iter())
            .filter(|(k, _)| *k == kind)
            .map(|(_, f)| *f)
            .collect();
        if faults.is_empty() {
            continue;
        }
        let settings = CellSettings {
            exe: suite.exe.clone(),
            out_dir: suite.out_dir.clone(),
            warmup: suite.plan.warmup,
            recovery: suite.plan.recovery,
            baseline: suite.plan.baseline,
            slow: suite.plan.slow,
            repeats: suite.plan.repeats,
        };
        let (gate, reaper) = (Arc::clone(&gate), Arc::clone(&reaper));
        lanes.spawn(async move {
            let _permit = gate.acquire_owned().await;
            lane(kind, faults, settings, reaper).await
        });
    }
    let mut results = Vec::new();
    while let Some(done) = lanes.join_next().await {
        results.extend(done.map_err(|e| format!("a lane panicked: {e}"))?);
    }
    let position = |r: &CellResult| {
        suite
            .plan
            .cells
            .iter()
            .position(|c| *c == (r.kind, r.fault))
    };
    results.sort_by_key(position);
    Ok(results)
}

/// One backend: start its servers, run its cells one after another, stop the servers.
async fn lane(
    kind: Kind,
    faults: Vec<Fault>,
    settings: CellSettings,
    reaper: Arc<Reaper>,
) -> Vec<CellResult> {
    let guarantees = anylock::compiled_guarantees()
        .into_iter()
        .find(|(name, _)| *name == kind.name())
        .map(|(_, g)| g);
    let Some(guarantees) = guarantees else {
        return failed(
            kind,
            &faults,
            None,
            "the backend is not compiled into anylock",
        );
    };
    let started = Instant::now();
    let mut lane = match Lane::start(kind, Arc::clone(&reaper)).await {
        Ok(lane) => lane,
        Err(e) => return failed(kind, &faults, Some(&guarantees), &format!("servers: {e}")),
    };
    eprintln!(
        "reliability: {kind}: servers up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut results = Vec::new();
    for fault in faults {
        let result = run_cell(&mut lane, fault, &guarantees, &settings, &reaper).await;
        eprintln!("reliability: {}", summary(&result));
        results.push(result);
    }
    lane.stop().await;
    results
}

fn failed(
    kind: Kind,
    faults: &[Fault],
    guarantees: Option<&lockcore::Guarantees>,
    problem: &str,
) -> Vec<CellResult> {
    eprintln!("reliability: {kind}: {problem}");
    let fallback = lockcore::Guarantees::new(
        lockcore::Exclusion::SingleStore,
        lockcore::Fencing::None,
        lockcore::ExpiryClock::Server,
    );
    let g = guarantees.unwrap_or(&fallback);
    (faults.iter())
        .map(|fault| CellResult {
            kind,
            fault: *fault,
            expectation: expect(g, *fault),
            unfenced: Counts::default(),
            fenced: None,
            disagreements: Vec::new(),
            notes: Vec::new(),
            problems: vec![problem.to_owned()],
            seconds: 0.0,
        })
        .collect()
}

/// One progress line.
pub fn summary(r: &CellResult) -> String {
    let counts = |c: &Counts| {
        format!(
            "sections {} overlaps {} double grants {} stale accepted {} lost updates {} Lost {}/{} late",
            c.sections,
            c.overlaps,
            c.double_grants,
            c.stale_accepted,
            c.lost_updates,
            c.lost_signals,
            c.lost_late
        )
    };
    let fenced = r
        .fenced
        .as_ref()
        .map_or(String::new(), |c| format!(" | fenced: {}", counts(c)));
    let verdict = match (r.problems.is_empty(), r.disagreements.is_empty()) {
        (false, _) => format!(" | PROBLEMS: {}", r.problems.join("; ")),
        (true, false) => format!(" | DISAGREES: {}", r.disagreements.len()),
        (true, true) => String::new(),
    };
    format!(
        "{}/{} ({:.1} s) unfenced: {}{fenced}{verdict}",
        r.kind,
        r.fault,
        r.seconds,
        counts(&r.unfenced)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_plan_covers_every_applicable_fault_once() {
        let plan = Plan::full();
        assert_eq!(plan.cells.len(), 47, "{:?}", plan.cells);
        for (kind, fault) in &plan.cells {
            assert!(fault.applies_to(*kind));
        }
        for cell in SHORT {
            assert!(
                plan.cells.contains(cell),
                "{cell:?} is not in the full plan"
            );
        }
    }

    #[test]
    fn filters_keep_only_what_is_asked() {
        let plan = Plan::full().only(Some(&[Kind::Etcd]), Some(&[Fault::Pause, Fault::GcsErrors]));
        assert_eq!(plan.cells, vec![(Kind::Etcd, Fault::Pause)]);
    }
}

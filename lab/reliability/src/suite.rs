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
use crate::primitive::Primitive;
use crate::run::{Cell, CellResult, CellSettings, run_cell};
use crate::servers::Lane;
use test_kit::servers::process::Reaper;

/// The lock cells CI runs: every fenced backend under a paused holder (fencing must refuse
/// its stale write), Redis under a suspended one (its own clock must count the suspend), each backend under its own server fault (for `local:`, clients in
/// separate PID namespaces), etcd under a blackholed link, and PostgreSQL under a clock
/// jumping back and under a slow attempt (its pool lets a later attempt overtake a held
/// one).
const SHORT: &[(Kind, Fault)] = &[
    (Kind::Local, Fault::Pause),
    (Kind::Local, Fault::PidNamespaces),
    (Kind::Redis, Fault::Pause),
    (Kind::Redis, Fault::Suspend),
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

/// The leader cell CI runs: a leader paused past its lease, so that the fenced register
/// must refuse its older term.
const SHORT_LEADER: (Kind, Fault) = (Kind::Redis, Fault::Pause);

/// Which cells run, and how long each runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The cells, in report order.
    pub cells: Vec<Cell>,
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
    /// A broken run on purpose: permit clients ask for this N, not [`PERMITS`](crate::primitive::PERMITS).
    pub client_permits: Option<u32>,
}

impl Plan {
    /// Every fault that applies to every backend, with the lock and with permits (where
    /// the descriptor grants semaphores); leadership under [`leader_faults`](crate::primitive::leader_faults).
    pub fn full() -> Plan {
        let mut cells = Vec::new();
        for kind in Kind::ALL {
            let Some(g) = guarantees(kind) else { continue };
            for primitive in Primitive::ALL {
                let runs = Fault::ALL
                    .into_iter()
                    .filter(|f| primitive.runs(kind, *f, &g))
                    .map(|f| Cell::new(kind, f, primitive));
                cells.extend(runs);
            }
        }
        Plan {
            cells,
            warmup: 3,
            recovery: 3,
            baseline: 150,
            slow: 50,
            repeats: 3,
            client_permits: None,
        }
    }

    /// The CI version, one section before and after each fault: the lock cells of
    /// `SHORT`, the baseline with permits on every backend with semaphores, and one
    /// leader cell.
    pub fn short() -> Plan {
        let mut cells: Vec<Cell> = (SHORT.iter())
            .map(|(k, f)| Cell::new(*k, *f, Primitive::Lock))
            .collect();
        for kind in Kind::ALL {
            let runs =
                guarantees(kind).is_some_and(|g| Primitive::Permits.runs(kind, Fault::None, &g));
            if runs {
                cells.push(Cell::new(kind, Fault::None, Primitive::Permits));
            }
        }
        let (kind, fault) = SHORT_LEADER;
        cells.push(Cell::new(kind, fault, Primitive::Leader));
        Plan {
            cells,
            warmup: 1,
            recovery: 1,
            baseline: 10,
            slow: 5,
            repeats: 1,
            client_permits: None,
        }
    }

    /// Keeps only the given backends, faults and primitives (`None`: all).
    pub fn only(
        mut self,
        kinds: Option<&[Kind]>,
        faults: Option<&[Fault]>,
        primitives: Option<&[Primitive]>,
    ) -> Plan {
        self.cells.retain(|c| {
            kinds.is_none_or(|ks| ks.contains(&c.kind))
                && faults.is_none_or(|fs| fs.contains(&c.fault))
                && primitives.is_none_or(|ps| ps.contains(&c.primitive))
        });
        self
    }
}

/// `kind`'s descriptor, as compiled into the facade.
fn guarantees(kind: Kind) -> Option<lockcore::Guarantees> {
    anylock::compiled_guarantees()
        .into_iter()
        .find(|(name, _)| *name == kind.name())
        .map(|(_, g)| g)
}

/// A rough cost of `kind`'s cells, to start the longest lanes first: cells times TTL.
fn lane_cost(kind: Kind, cells: &[Cell]) -> u128 {
    cells.len() as u128 * kind.ttl().as_millis()
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
    let mut kinds: Vec<(Kind, Vec<Cell>)> = (Kind::ALL.into_iter())
        .map(|kind| {
            let cells = suite.plan.cells.iter().filter(|c| c.kind == kind);
            (kind, cells.copied().collect())
        })
        .filter(|(_, cells): &(Kind, Vec<Cell>)| !cells.is_empty())
        .collect();
    // The longest lanes first, so that the short ones fill in at the end.
    kinds.sort_by_key(|(kind, cells)| std::cmp::Reverse(lane_cost(*kind, cells)));
    for (kind, cells) in kinds {
        let settings = CellSettings {
            exe: suite.exe.clone(),
            out_dir: suite.out_dir.clone(),
            warmup: suite.plan.warmup,
            recovery: suite.plan.recovery,
            baseline: suite.plan.baseline,
            slow: suite.plan.slow,
            repeats: suite.plan.repeats,
            client_permits: suite.plan.client_permits,
        };
        let reaper = Arc::clone(&reaper);
        // Taken here, in lane order: a lane starts when an earlier one has finished.
        let permit = Arc::clone(&gate).acquire_owned().await;
        lanes.spawn(async move {
            let _permit = permit;
            lane(kind, cells, settings, reaper).await
        });
    }
    let mut results = Vec::new();
    while let Some(done) = lanes.join_next().await {
        results.extend(done.map_err(|e| format!("a lane panicked: {e}"))?);
    }
    let position = |r: &CellResult| {
        let cell = Cell::new(r.kind, r.fault, r.primitive);
        suite.plan.cells.iter().position(|c| *c == cell)
    };
    results.sort_by_key(position);
    Ok(results)
}

/// One backend: start its servers, run its cells one after another, stop the servers.
async fn lane(
    kind: Kind,
    cells: Vec<Cell>,
    settings: CellSettings,
    reaper: Arc<Reaper>,
) -> Vec<CellResult> {
    let Some(guarantees) = guarantees(kind) else {
        return failed(&cells, None, "the backend is not compiled into anylock");
    };
    let started = Instant::now();
    let mut lane = match Lane::start(kind, Arc::clone(&reaper)).await {
        Ok(lane) => lane,
        Err(e) => return failed(&cells, Some(&guarantees), &format!("servers: {e}")),
    };
    eprintln!(
        "reliability: {kind}: servers up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut results = Vec::new();
    for cell in cells {
        let result = run_cell(&mut lane, cell, &guarantees, &settings, &reaper).await;
        eprintln!("reliability: {}", summary(&result));
        results.push(result);
    }
    lane.stop().await;
    results
}

fn failed(
    cells: &[Cell],
    guarantees: Option<&lockcore::Guarantees>,
    problem: &str,
) -> Vec<CellResult> {
    if let Some(cell) = cells.first() {
        eprintln!("reliability: {}: {problem}", cell.kind);
    }
    let fallback = lockcore::Guarantees::new(
        lockcore::Exclusion::SingleStore,
        lockcore::Fencing::None,
        lockcore::ExpiryClock::Server,
    );
    let g = guarantees.unwrap_or(&fallback);
    (cells.iter())
        .map(|cell| CellResult {
            kind: cell.kind,
            fault: cell.fault,
            primitive: cell.primitive,
            expectation: expect(g, cell.fault),
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
            "sections {} overlaps {} {} {} most inside {} stale accepted {} lost updates {} Lost {}/{} late",
            c.sections,
            c.overlaps,
            if c.limit > 1 {
                "over-grants"
            } else {
                "double grants"
            },
            c.double_grants,
            c.max_inside,
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
    let cell = Cell::new(r.kind, r.fault, r.primitive).dir_name();
    format!(
        "{cell} ({:.1} s) unfenced: {}{fenced}{verdict}",
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
        let count = |p: Primitive| plan.cells.iter().filter(|c| c.primitive == p).count();
        assert_eq!(count(Primitive::Lock), 52, "{:?}", plan.cells);
        // Every lock fault but Redlock's ten (no semaphores).
        assert_eq!(count(Primitive::Permits), 52 - 10, "{:?}", plan.cells);
        assert_eq!(count(Primitive::Leader), 3 * Kind::ALL.len());
        for cell in &plan.cells {
            assert!(cell.fault.applies_to(cell.kind));
            let same = plan.cells.iter().filter(|c| *c == cell).count();
            assert_eq!(same, 1, "{cell:?}");
        }
        for cell in Plan::short().cells {
            assert!(
                plan.cells.contains(&cell),
                "{cell:?} is not in the full plan"
            );
        }
    }

    #[test]
    fn the_short_plan_has_a_permit_baseline_per_semaphore_backend_and_a_leader() {
        let short = Plan::short();
        let permits: Vec<Kind> = (short.cells.iter())
            .filter(|c| c.primitive == Primitive::Permits && c.fault == Fault::None)
            .map(|c| c.kind)
            .collect();
        let expected = [
            Kind::Local,
            Kind::Redis,
            Kind::Postgres,
            Kind::Etcd,
            Kind::Gcs,
        ];
        assert_eq!(permits, expected);
        assert!(short.cells.iter().any(|c| c.primitive == Primitive::Leader));
    }

    #[test]
    fn filters_keep_only_what_is_asked() {
        let plan = Plan::full().only(
            Some(&[Kind::Etcd]),
            Some(&[Fault::Pause, Fault::GcsErrors]),
            None,
        );
        let pause = |p| Cell::new(Kind::Etcd, Fault::Pause, p);
        let all = [Primitive::Lock, Primitive::Permits, Primitive::Leader];
        assert_eq!(plan.cells, all.map(pause));
        let plan = plan.only(None, None, Some(&[Primitive::Permits]));
        assert_eq!(plan.cells, vec![pause(Primitive::Permits)]);
    }
}

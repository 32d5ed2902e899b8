//! One cell of the table: one backend under one fault, with one primitive (the lock, N
//! permits, leadership), an unfenced and (where the backend issues tokens, and not for
//! permits) a fenced group side by side, checked and compared with the claims.
//!
//! Permit cells run unfenced only: with N > 1 a resource cannot refuse "any token below the
//! highest" (an older permit may legitimately outlive a newer one), and fencing by slot
//! ownership needs to know which permit a new grant replaced, which no token says (see
//! `docs/reliability.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use lockcore::{Fencing, Guarantees};
use serde::Serialize;
use tokio::time::{Instant, sleep};

use crate::backends::{Kind, Workload};
use crate::checker::{Counts, check_with};
use crate::expect::{Disagreement, Expectation, disagreements, expect};
use crate::fault::Fault;
use crate::group::{Group, GroupSpec};
use crate::history::Event;
use crate::primitive::{PERMITS, Primitive};
use crate::register::Mode;
use crate::script;
use crate::servers::Lane;
use crate::slow_attempt;
use test_kit::servers::process::Reaper;

/// How cells run.
#[derive(Debug, Clone)]
pub struct CellSettings {
    /// The `anylock-reliability` binary, for the client processes.
    pub exe: PathBuf,
    /// Where histories and client logs go (one directory per cell).
    pub out_dir: PathBuf,
    /// Sections every group completes before the fault.
    pub warmup: u64,
    /// Sections every group completes after the fault, to show it recovered.
    pub recovery: u64,
    /// Sections every group completes in the baseline (`none`), with short steps.
    pub baseline: u64,
    /// Sections every group completes under `slow-attempt`.
    pub slow: u64,
    /// How often a pause or a clock jump is applied to each group.
    pub repeats: u64,
    /// A broken run on purpose: permit clients ask for this N instead of [`PERMITS`].
    pub client_permits: Option<u32>,
}

/// One cell of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Cell {
    /// The backend.
    pub kind: Kind,
    /// The fault.
    pub fault: Fault,
    /// What the clients hold.
    pub primitive: Primitive,
}

impl Cell {
    /// A cell of `primitive`.
    pub fn new(kind: Kind, fault: Fault, primitive: Primitive) -> Cell {
        Cell {
            kind,
            fault,
            primitive,
        }
    }

    /// Its directory under the results: `etcd-pause`, `etcd-permits-pause`.
    pub fn dir_name(self) -> String {
        match self.primitive {
            Primitive::Lock => format!("{}-{}", self.kind, self.fault),
            p => format!("{}-{p}-{}", self.kind, self.fault),
        }
    }
}

/// The outcome of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// The backend.
    pub kind: Kind,
    /// The fault.
    pub fault: Fault,
    /// What the clients held.
    pub primitive: Primitive,
    /// What the backend's descriptor promises here.
    pub expectation: Expectation,
    /// The unfenced group's counts.
    pub unfenced: Counts,
    /// The fenced group's counts (`None` without fencing tokens).
    pub fenced: Option<Counts>,
    /// Broken promises.
    pub disagreements: Vec<Disagreement>,
    /// What the fault script did, and recovery.
    pub notes: Vec<String>,
    /// Things that went wrong with the run itself (a cell with problems proves nothing).
    pub problems: Vec<String>,
    /// Wall-clock time of the cell.
    pub seconds: f64,
}

/// Runs `cell` against the servers of `lane` (of `cell.kind`).
pub async fn run_cell(
    lane: &mut Lane,
    cell: Cell,
    guarantees: &Guarantees,
    settings: &CellSettings,
    reaper: &Reaper,
) -> CellResult {
    let started = Instant::now();
    let Cell {
        kind,
        fault,
        primitive,
    } = cell;
    let w = match fault {
        Fault::None => Workload::quick(kind),
        Fault::SlowAttempt => slow_attempt::workload(kind),
        _ => Workload::for_backend(kind, fault.needs_long_sections()),
    };
    let dir = settings.out_dir.join(cell.dir_name());
    let mut result = CellResult {
        kind,
        fault,
        primitive,
        expectation: expect(guarantees, fault),
        unfenced: Counts::default(),
        fenced: None,
        disagreements: Vec::new(),
        notes: Vec::new(),
        problems: Vec::new(),
        seconds: 0.0,
    };
    let spec = GroupSpec {
        exe: settings.exe.clone(),
        log_dir: dir,
        lock: format!("rel-{primitive}-{fault}-{:08x}", rand::random::<u32>()),
        primitive,
        permits: match primitive {
            Primitive::Permits => settings.client_permits.unwrap_or(PERMITS),
            _ => 1,
        },
        workload: w,
        partition: matches!(fault, Fault::RedlockRestart | Fault::RedlockDelayedRestart),
        pid_namespaces: fault == Fault::PidNamespaces,
        suspendable: fault == Fault::Suspend,
        stall: (fault == Fault::SlowAttempt).then(|| slow_attempt::scope(kind)),
        attempt_timeout: (fault == Fault::SlowAttempt).then_some(slow_attempt::ATTEMPT_TIMEOUT),
    };
    let modes: &[Mode] = match (primitive, guarantees.fencing) {
        (Primitive::Lock | Primitive::Leader, Fencing::Monotonic) => {
            &[Mode::Unfenced, Mode::Fenced]
        }
        _ => &[Mode::Unfenced],
    };
    if let Err(e) = execute(lane, fault, &spec, modes, settings, reaper, &mut result).await {
        result.problems.push(e);
    }
    result.problems.extend(uncontended(&result));
    result.disagreements = disagreements(
        &result.expectation,
        &result.unfenced,
        result.fenced.as_ref(),
    );
    result.seconds = started.elapsed().as_secs_f64();
    result
}

/// Starts the groups, runs the phases, stops the groups and checks their histories.
async fn execute(
    lane: &mut Lane,
    fault: Fault,
    spec: &GroupSpec,
    modes: &[Mode],
    settings: &CellSettings,
    reaper: &Reaper,
    result: &mut CellResult,
) -> Result<(), String> {
    let (w, dir) = (spec.workload, &spec.log_dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let groups = start_groups(lane, modes, spec, reaper).await?;
    match phases(lane, &groups, fault, w, settings).await {
        Ok(notes) => result.notes = notes,
        Err(e) => result.problems.push(e),
    }
    let grace = w.section() + w.ttl * 2 + Duration::from_secs(10);
    for group in groups {
        let mode = group.mode;
        let (history, problems) = group.stop(grace, reaper).await;
        result.problems.extend(problems);
        save(dir, mode, &history)?;
        let counts = check_with(&history, spec.primitive.limit());
        match mode {
            Mode::Unfenced => result.unfenced = counts,
            Mode::Fenced => result.fenced = Some(counts),
        }
    }
    Ok(())
}

async fn start_groups(
    lane: &Lane,
    modes: &[Mode],
    base: &GroupSpec,
    reaper: &Reaper,
) -> Result<Vec<Group>, String> {
    let mut groups = Vec::new();
    for mode in modes {
        let spec = GroupSpec {
            lock: format!("{}-{}", base.lock, mode.as_str()),
            ..base.clone()
        };
        match Group::start(lane, *mode, &spec, reaper).await {
            Ok(group) => groups.push(group),
            Err(e) => {
                for group in groups {
                    group.stop(Duration::from_secs(5), reaper).await;
                }
                return Err(e);
            }
        }
    }
    Ok(groups)
}

/// Warm-up, the fault, then recovery.
async fn phases(
    lane: &mut Lane,
    groups: &[Group],
    fault: Fault,
    w: Workload,
    settings: &CellSettings,
) -> Result<Vec<String>, String> {
    let per_section = w.section() + w.ttl;
    let limit = per_section * u32::try_from(settings.warmup * 3 + 3).unwrap_or(u32::MAX);
    for group in groups {
        let reached = progress(group, settings.warmup, limit).await;
        if !reached {
            return Err(format!(
                "{}: fewer than {} sections completed within {limit:?} before the fault",
                group.mode.as_str(),
                settings.warmup
            ));
        }
    }
    let mut notes = match fault {
        Fault::SlowAttempt => {
            let limit = per_section * u32::try_from(settings.slow * 3 + 4).unwrap_or(u32::MAX);
            slow_attempt::apply(groups, w, settings.slow, limit).await?
        }
        // A pause or a clock jump costs a few TTL: repeat it a few times.
        Fault::Pause | Fault::Suspend | Fault::ClockBack | Fault::ClockForward => {
            let mut notes = Vec::new();
            for _ in 0..settings.repeats.max(1) {
                notes.extend(script::apply(fault, lane, groups, w).await?);
            }
            notes
        }
        _ => script::apply(fault, lane, groups, w).await?,
    };
    // The baseline's sections are cheap: many of them, after its quiet 2 TTL.
    let recovery = match fault {
        Fault::None => settings.baseline.max(settings.recovery),
        _ => settings.recovery,
    };
    let limit = per_section * u32::try_from(recovery * 3 + 4).unwrap_or(u32::MAX);
    // Every group's target is set now, so the groups' sections count side by side.
    let targets: Vec<u64> = groups.iter().map(|g| g.completed() + recovery).collect();
    for (group, target) in groups.iter().zip(targets) {
        let recovered = progress(group, target, limit).await;
        notes.push(match recovered {
            true => format!("{}: recovered", group.mode.as_str()),
            false => format!(
                "{}: did not complete {recovery} more sections within {limit:?}",
                group.mode.as_str(),
            ),
        });
    }
    Ok(notes)
}

/// A permit cell in which never `limit` sections were open at once tested nothing about
/// the limit (clients that serialized like a lock would pass it): a problem of the run.
fn uncontended(result: &CellResult) -> Option<String> {
    let c = &result.unfenced;
    let contended = result.primitive != Primitive::Permits || c.max_inside >= u64::from(c.limit);
    (!contended && result.problems.is_empty()).then(|| {
        format!(
            "never more than {} section(s) open at once in {} sections: the limit of {} \
             permits was never reached, so the run shows nothing about over-grants",
            c.max_inside, c.sections, c.limit
        )
    })
}

/// Waits until `group` has completed `target` sections.
async fn progress(group: &Group, target: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while group.completed() < target {
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(100)).await;
    }
    true
}

fn save(dir: &Path, mode: Mode, history: &[Event]) -> Result<(), String> {
    let path = dir.join(format!("history-{}.jsonl", mode.as_str()));
    let mut text = String::new();
    for event in history {
        text.push_str(&serde_json::to_string(event).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

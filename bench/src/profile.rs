//! `--profile WORKLOAD`: a CPU profile of uncontended cycles (`Locker::try_acquire` +
//! `LockGuard::release`, or a peer's lock + unlock, on 1,000 names in turn, as the latency
//! section runs them; with `--profile-tasks N`, N tasks at once on disjoint names, as the
//! throughput section runs them), sampled in-process by `pprof` at [`FREQUENCY`] Hz over
//! every thread of the process. Writes a flamegraph SVG and a text file with the top
//! frames by share and, for the client's threads, in µs of CPU per cycle.
//!
//! A workload is `<backend>-<who>` ([`Workload`]). GCS runs on an in-process test server
//! whose threads are named apart (`gcs-server`), so the text can split the client's
//! samples from the server's; the other servers are processes of their own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::args::{Args, etcd_members};
use crate::common::{TTL, progress};
use crate::go_pprof::CpuProfile;
use crate::measure::{error_budget, task_index, warm_up};
use crate::op::{Entry, NAMES, Op, Res, Role};
use crate::procstat::{SERVER_THREADS, client_cpu, machine_busy};
use crate::system::{Ctx, Kind, System};
use crate::targets::OURS;

/// Samples per second of CPU time (not a multiple of the timer tick, so the samples do not
/// beat with periodic work).
pub(crate) const FREQUENCY: i32 = 997;

/// Frames listed in the text file, by self and by inclusive share.
const TOP: usize = 25;

/// Longest frame name the text file prints (generic parameters can run to pages).
const LONGEST: usize = 160;

/// Whose cycle a profile samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// `Locker::try_acquire` + `LockGuard::release`.
    Ours,
    /// The backend's peer at this index, in its tables' order: 0 is rslock,
    /// `pg_advisory_lock`, etcd's Lock RPC with a lease per lock, the gcslock-style loop;
    /// 1 is etcd's Lock RPC with one shared lease (`peer2`).
    Peer(usize),
    /// The reference point the throughput section measures beside ours (PostgreSQL's
    /// two-write floor).
    Floor,
}

/// A `--profile` workload: `<backend>-<who>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Workload {
    kind: Kind,
    who: Who,
}

impl Workload {
    /// `redis-ours`, `postgres-floor`, …, and the older names `redis-cycle`, `gcs-cycle`
    /// (ours) and `gcs-loop` (the peer).
    fn parse(name: &str) -> Res<Self> {
        let unknown = || {
            format!(
                "no profile workload {name:?}: name a backend (redis, redlock, postgres, etcd, \
                 gcs, local) and whose cycle (ours, peer, peer2, floor), as in redis-ours or \
                 postgres-floor"
            )
        };
        let (backend, who) = name.rsplit_once('-').ok_or_else(unknown)?;
        let kind = Kind::from_name(backend).ok_or_else(unknown)?;
        let who = match (kind, who) {
            (_, "ours") | (Kind::Redis | Kind::Gcs, "cycle") => Who::Ours,
            (_, "peer") | (Kind::Gcs, "loop") => Who::Peer(0),
            (_, "peer2") => Who::Peer(1),
            (_, "floor") => Who::Floor,
            _ => return Err(unknown().into()),
        };
        Ok(Self { kind, who })
    }
}

/// Runs the profile `workload` names and writes its files under `args.out`.
///
/// # Errors
/// When the workload is unknown, its server is not configured or unreachable, the backend
/// has no such cycle (a `floor` where there is none), too many cycles fail, or a file
/// cannot be written.
pub(crate) fn run(args: &Args, workload: &str) -> Res<()> {
    let spec = Workload::parse(workload)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bench-worker")
        .build()?;
    let ctx = Ctx {
        run: format!("p{:08x}", rand::random::<u32>()),
        ttl: TTL,
        gcs_server: None,
    };
    let (n, tasks) = (args.profile_cycles, usize::from(args.profile_tasks));
    let local_dir = std::env::temp_dir().join(format!("anylock-bench-{}", ctx.run));
    // The in-process GCS test server runs on a runtime of its own, kept to the end.
    let (_server_runtime, ctx, url) = match spec.kind {
        Kind::Gcs => {
            let (server_runtime, server) = crate::servers::gcs_test_server()?;
            let url = crate::servers::gcs_url(&server);
            let ctx = Ctx {
                gcs_server: Some(server),
                ..ctx
            };
            (Some(server_runtime), ctx, url)
        }
        Kind::Local => {
            let url = format!("local:{}/locks.sqlite3", local_dir.display());
            (None, ctx, url)
        }
        kind => {
            let url = args.server_url(kind).ok_or_else(|| {
                format!(
                    "--profile {workload} needs --{} (or its variable; run scripts/servers \
                     start, then source .servers/env)",
                    kind.name()
                )
            })?;
            (None, ctx, url)
        }
    };
    let span = if spec.kind == Kind::Etcd {
        let urls = args.etcd.as_deref().map(etcd_members).unwrap_or_default();
        Span::Members {
            urls,
            seconds: args.profile_seconds,
        }
    } else {
        Span::Cycles(n)
    };
    let outcome = runtime.block_on(async {
        let system = System::connect(spec.kind, &url, &ctx)
            .await
            .map_err(|e| format!("{}: cannot connect: {e}", spec.kind.name()))?;
        let picked = pick(&system, &ctx, spec.who).map(|(what, entry)| (what, entry.op));
        let profiled = match picked {
            Ok((what, op)) => sample(op, tasks, span)
                .await
                .map(|(r, m, members)| (r, m, members, what)),
            Err(e) => Err(e),
        };
        drop(system);
        crate::cleanup(&[(spec.kind, url.clone())], &ctx).await;
        profiled
    });
    let _ = std::fs::remove_dir_all(&local_dir);
    let (report, measured, members, what) = outcome?;
    std::fs::create_dir_all(&args.out)?;
    let tasks_part = if tasks > 1 {
        format!("-tasks{tasks}")
    } else {
        String::new()
    };
    let stem = args
        .out
        .join(format!("{workload}{tasks_part}-{}", args.profile_tag));
    let title = format!(
        "{workload}: {what}, {} cycles{}{}",
        measured.cycles,
        if tasks > 1 {
            format!(" by {tasks} tasks at once")
        } else {
            String::new()
        },
        if args.commit.is_empty() {
            String::new()
        } else {
            format!(" at {}", args.commit)
        }
    );
    let mut options = pprof::flamegraph::Options::default();
    options.title = title.clone();
    let svg = std::fs::File::create(stem.with_extension("svg"))?;
    report.flamegraph_with_options(svg, &mut options)?;
    let stacks = stacks(&report);
    let text = summary(&title, &stacks, measured);
    std::fs::write(stem.with_extension("txt"), &text)?;
    progress(&format!("wrote {}.svg and .txt", display(&stem)));
    print!("{text}");
    if let Some(members) = members {
        let stem = stem.with_file_name(format!(
            "{workload}{tasks_part}-{}-members",
            args.profile_tag
        ));
        let title = format!("etcd members' CPU under {title}");
        let mut options = pprof::flamegraph::Options::default();
        options.title = title.clone();
        options.count_name = "µs".to_owned();
        let folded = members.profile.folded();
        let svg = std::fs::File::create(stem.with_extension("svg"))?;
        pprof::flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), svg)?;
        let text = members_summary(&title, &members, measured.cycles);
        std::fs::write(stem.with_extension("txt"), &text)?;
        progress(&format!("wrote {}.svg and .txt", display(&stem)));
        print!("{text}");
    }
    Ok(())
}

/// The members' text file: their CPU per cycle (each member's, and the rest of the
/// machine's from `/proc` for scale), then µs per cycle by Go package of the innermost
/// frame, by function (self) and by function anywhere in the stack (inclusive).
fn members_summary(title: &str, members: &Members, cycles: usize) -> String {
    let per_cycle = |ns: u64| ns as f64 / 1e3 / cycles.max(1) as f64;
    let total = u64::try_from(members.profile.cpu.as_nanos()).unwrap_or(u64::MAX);
    let mut out = format!("# {title}\n\n");
    let each: Vec<String> = members
        .each
        .iter()
        .map(|(url, cpu)| {
            let ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
            format!("{url} {:.1}", per_cycle(ns))
        })
        .collect();
    let rest = members
        .rest_of_machine
        .map_or("not read".to_owned(), |cpu| {
            let ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
            format!("{:.1} µs", per_cycle(ns))
        });
    let _ = writeln!(
        out,
        "{cycles} cycles in the members' {:.1} s window; their CPU as Go's profiler counts \
         it (100 Hz): {:.1} µs per cycle ({}; {} samples). The whole machine less this \
         process, from /proc/stat over the same cycles: {rest} per cycle. Go's profiler \
         counted about 0.8 of an etcd member's CPU in /proc when checked here, so compare \
         lines between workloads, not with /proc.",
        members.profile.duration.as_secs_f64(),
        per_cycle(total),
        each.join(", "),
        members.profile.samples,
    );
    let (own, inclusive) = members.profile.by_function();
    let mut packages: HashMap<String, u64> = HashMap::new();
    for (function, ns) in &own {
        *packages.entry(go_package(function).to_owned()).or_insert(0) += ns;
    }
    // The inclusive list goes down to a floor rather than a count, so that a function
    // missing from one workload's file cost it less than the floor.
    let sections = [
        ("Go package of the innermost frame", packages, TOP, 0.0),
        ("function (self)", own, TOP, 0.0),
        (
            "function anywhere in the stack (inclusive), down to 1 µs per cycle",
            inclusive,
            usize::MAX,
            1.0,
        ),
    ];
    for (what, counts, top, floor) in sections {
        let _ = writeln!(out, "\n## by {what}: µs of the members' CPU per cycle\n");
        let mut sorted: Vec<(String, u64)> = counts.into_iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let listed = sorted.into_iter().take(top);
        for (name, ns) in listed.take_while(|(_, ns)| per_cycle(*ns) >= floor) {
            let name: String = name.chars().take(LONGEST).collect();
            let _ = writeln!(out, "{:7.1}  {name}", per_cycle(ns));
        }
    }
    out
}

/// The package of a Go function name: `go.etcd.io/etcd/mvcc` of
/// `go.etcd.io/etcd/mvcc.(*keyIndex).Less`, `runtime` of `runtime.futex`; a name without
/// a package (an assembly routine such as `cmpbody`) stands for itself.
fn go_package(function: &str) -> &str {
    let last_slash = function.rfind('/').map_or(0, |i| i + 1);
    match function[last_slash..].find('.') {
        Some(dot) => &function[..last_slash + dot],
        None => function,
    }
}

/// The cycle `who` names on `system`, and what the title calls it.
fn pick(system: &System, ctx: &Ctx, who: Who) -> Res<(String, Entry)> {
    let backend = system.kind.name();
    let prefix = format!("{}-{backend}-profile", ctx.run);
    let on = match system.kind {
        Kind::Gcs => "the in-process GCS test server".to_owned(),
        _ => backend.to_owned(),
    };
    match who {
        Who::Ours => Ok((
            format!("Locker::try_acquire + release on {on}"),
            Entry::cycle(OURS, Role::Ours, system.ours(ctx), &prefix),
        )),
        Who::Peer(index) => {
            let peer = system.peers.get(index).ok_or_else(|| {
                format!(
                    "the {backend} tables have {} peers, no peer {}",
                    system.peers.len(),
                    index + 1
                )
            })?;
            Ok((
                format!("{} on {on}", peer.label),
                Entry::cycle(&peer.label, Role::Peer, peer.lock.clone(), &prefix),
            ))
        }
        Who::Floor => {
            let floor = system
                .extras
                .iter()
                .find(|e| e.in_throughput)
                .ok_or_else(|| {
                    format!("{backend} has no floor measured beside ours (only postgres has)")
                })?;
            Ok((format!("{} on {on}", floor.label), floor.clone()))
        }
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Wall and CPU time of the profiled cycles (CPU from `/proc`: the timer signals that
/// drive the samples can coalesce, so samples undercount CPU time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured {
    /// Wall time, seconds.
    pub(crate) wall_s: f64,
    /// CPU time of the process without the in-process GCS test server's threads (the
    /// client's), seconds.
    pub(crate) cpu_s: f64,
    /// Cycles run (failed ones included).
    pub(crate) cycles: usize,
    /// Cycles that failed.
    pub(crate) failed: u64,
}

/// How long the profiled cycles run.
enum Span {
    /// This many cycles in all.
    Cycles(usize),
    /// Until every etcd member at `urls` has answered a CPU profile of `seconds`.
    Members { urls: Vec<String>, seconds: u64 },
}

/// The etcd members' own CPU profiles over the profiled cycles.
struct Members {
    /// Every member's profile, merged.
    profile: CpuProfile,
    /// Each member's URL and its profile's CPU time.
    each: Vec<(String, Duration)>,
    /// The CPU time of the machine less this process's over the same window (`/proc`),
    /// where `/proc/stat` is readable.
    rest_of_machine: Option<Duration>,
}

/// One untimed pass over the names, then the profiled cycles, shared among `tasks` tasks
/// on disjoint names, for as long as `span` says: the report, what the profiled cycles
/// took, and with [`Span::Members`] the members' profiles. A few failed cycles are
/// counted (as the throughput section does); more fail the profile.
async fn sample(
    op: Arc<dyn Op>,
    tasks: usize,
    span: Span,
) -> Res<(pprof::Report, Measured, Option<Members>)> {
    warm_up(op.as_ref(), NAMES, error_budget(NAMES)).await?;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libgcc", "vdso"])
        .build()?;
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let per_task = match &span {
        Span::Cycles(n) => n.div_ceil(tasks.max(1)),
        Span::Members { .. } => usize::MAX,
    };
    let start = Instant::now();
    let (cpu, machine) = (client_cpu(), machine_busy());
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (op, done, failed, stop) = (op.clone(), done.clone(), failed.clone(), stop.clone());
            tokio::spawn(async move {
                for k in 0..per_task {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let counter = if op.run(task_index(task, tasks, k)).await.is_ok() {
                        &done
                    } else {
                        &failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let members = match span {
        Span::Cycles(_) => None,
        Span::Members { urls, seconds } => {
            let client = reqwest::Client::new();
            let fetched = futures_util::future::join_all(
                urls.iter()
                    .map(|url| crate::go_pprof::fetch_cpu_profile(&client, url, seconds)),
            )
            .await;
            stop.store(true, Ordering::Relaxed);
            Some((urls, fetched))
        }
    };
    for handle in handles {
        handle.await?;
    }
    let client_cpu_s = client_cpu().saturating_sub(cpu);
    let rest_of_machine = machine_busy()
        .zip(machine)
        .map(|(after, before)| after.saturating_sub(before).saturating_sub(client_cpu_s));
    let cycles = done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
    let measured = Measured {
        wall_s: start.elapsed().as_secs_f64(),
        cpu_s: client_cpu_s.as_secs_f64(),
        cycles: usize::try_from(cycles).unwrap_or(usize::MAX),
        failed: failed.load(Ordering::Relaxed),
    };
    if measured.failed > error_budget(measured.cycles) {
        return Err(format!(
            "{} of {} profiled cycles failed",
            measured.failed, measured.cycles
        )
        .into());
    }
    let members = match members {
        None => None,
        Some((urls, fetched)) => {
            let mut merged = CpuProfile::default();
            let mut each = Vec::new();
            for (url, profile) in urls.into_iter().zip(fetched) {
                let profile = profile.map_err(|e| format!("etcd member {url}: {e}"))?;
                each.push((url, profile.cpu));
                merged.merge(profile);
            }
            Some(Members {
                profile: merged,
                each,
                rest_of_machine,
            })
        }
    };
    Ok((guard.report().build()?, measured, members))
}

/// One sampled stack: its thread, its frames from the innermost out, and its samples.
pub(crate) struct Stack {
    thread: String,
    frames: Vec<String>,
    samples: u64,
}

/// The report's stacks with readable function names (hash suffixes dropped).
fn stacks(report: &pprof::Report) -> Vec<Stack> {
    report
        .data
        .iter()
        .map(|(frames, count)| Stack {
            thread: frames.thread_name.clone(),
            frames: frames
                .frames
                .iter()
                .flat_map(|symbols| symbols.iter().map(|s| clean(&s.name())))
                .collect(),
            samples: u64::try_from(*count).unwrap_or(0),
        })
        .collect()
}

/// `tokio::runtime::park::Inner::park::h0123456789abcdef` without the `::h…` hash.
pub(crate) fn clean(name: &str) -> String {
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            head.to_owned()
        }
        _ => name.to_owned(),
    }
}

/// The text file: totals, CPU per cycle, and shares of the samples by thread, by crate
/// of the innermost frame, by innermost frame (self), and by frame of anylock's own
/// crates anywhere in the stack (inclusive).
pub(crate) fn summary(title: &str, stacks: &[Stack], m: Measured) -> String {
    let total: u64 = stacks.iter().map(|s| s.samples).sum();
    let cycles = m.cycles;
    let per_cycle = |s: f64| 1e6 * s / cycles.max(1) as f64;
    let mut out = format!("# {title}\n\n");
    let _ = writeln!(
        out,
        "{cycles} cycles ({} failed) in {:.2} s, {:.0} a second: {:.1} µs of wall time and \
         {:.1} µs of process CPU per cycle ({:.0} % of a core; CPU from /proc, without an \
         in-process test server's threads). {total} samples at {FREQUENCY} Hz, the server's \
         threads included.",
        m.failed,
        m.wall_s,
        cycles as f64 / m.wall_s.max(f64::EPSILON),
        per_cycle(m.wall_s),
        per_cycle(m.cpu_s),
        100.0 * m.cpu_s / m.wall_s.max(f64::EPSILON),
    );
    let share = |n: u64| 100.0 * n as f64 / total.max(1) as f64;
    let innermost = |s: &Stack| s.frames.first().cloned().into_iter().collect();
    let sections: [(&str, HashMap<String, u64>); 5] = [
        ("thread", tally(stacks, |s| vec![thread_kind(&s.thread)])),
        (
            "crate of the innermost frame",
            tally(stacks, |s| {
                s.frames.first().map(|f| crate_of(f)).into_iter().collect()
            }),
        ),
        ("innermost frame (self)", tally(stacks, innermost)),
        (
            "system call: the innermost C frame and the Rust frame that called it",
            tally(stacks, |s| syscall_caller(s).into_iter().collect()),
        ),
        (
            "frame of lockcore, a backend_* crate or anylock anywhere in the stack \
             (inclusive)",
            tally(stacks, |s| {
                inclusive(s)
                    .into_iter()
                    .filter(|f| is_ours(&crate_of(f)))
                    .collect()
            }),
        ),
    ];
    for (what, counts) in sections {
        let _ = writeln!(out, "\n## by {what}\n");
        let mut sorted: Vec<(String, u64)> = counts.into_iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (name, n) in sorted.into_iter().take(TOP) {
            let name: String = name.chars().take(LONGEST).collect();
            let _ = writeln!(out, "{:5.1} %  {name}", share(n));
        }
    }
    client_sections(&mut out, stacks, per_cycle(m.cpu_s));
    out
}

/// The client's threads alone (an in-process test server's left out), in µs of client CPU
/// per cycle: each key's share of the client's samples times the CPU per cycle from
/// `/proc`. Two workloads' profiles compare line by line here.
fn client_sections(out: &mut String, stacks: &[Stack], cpu_per_cycle: f64) {
    let client: Vec<&Stack> = stacks
        .iter()
        .filter(|s| !s.thread.starts_with(SERVER_THREADS))
        .collect();
    let total: u64 = client.iter().map(|s| s.samples).sum();
    if total == 0 {
        return;
    }
    let sections: [(&str, HashMap<String, u64>); 2] = [
        (
            "crate of the innermost frame",
            tally_of(&client, |s| {
                s.frames.first().map(|f| crate_of(f)).into_iter().collect()
            }),
        ),
        (
            "frame anywhere in the stack (inclusive)",
            tally_of(&client, inclusive),
        ),
    ];
    for (what, counts) in sections {
        let _ = writeln!(
            out,
            "\n## client threads only, by {what}: µs of client CPU per cycle\n"
        );
        let mut sorted: Vec<(String, u64)> = counts.into_iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (name, n) in sorted.into_iter().take(4 * TOP) {
            let name: String = name.chars().take(LONGEST).collect();
            let us = cpu_per_cycle * n as f64 / total as f64;
            let _ = writeln!(out, "{us:7.1}  {name}");
        }
    }
}

/// Whether `krate` is one of anylock's own: `lockcore`, a backend, the facade.
fn is_ours(krate: &str) -> bool {
    krate == "lockcore" || krate == "anylock" || krate.starts_with("backend_")
}

/// The crate a frame belongs to: the first path segment of its name (of the `Self` type
/// for a trait method); frames without a Rust path are C code (libc, the kernel's
/// system call entry points).
fn crate_of(frame: &str) -> String {
    let name = frame
        .trim_start_matches(['<', '&', '*'])
        .trim_start_matches("mut ");
    match name.split_once("::") {
        Some((head, _)) if !head.contains([' ', '<', '>']) => head.to_owned(),
        _ => "C (libc, system calls)".to_owned(),
    }
}

/// For a stack whose innermost frame is C: `write ← mio::…::Waker::wake`.
fn syscall_caller(stack: &Stack) -> Option<String> {
    let innermost = stack.frames.first()?;
    if !crate_of(innermost).starts_with("C ") {
        return None;
    }
    let caller = stack
        .frames
        .iter()
        .find(|f| !crate_of(f).starts_with("C "))
        .map_or("?", String::as_str);
    Some(format!("{innermost} ← {caller}"))
}

/// Worker threads share a name pattern; the numbers would split one kind into many.
fn thread_kind(name: &str) -> String {
    name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
        .to_owned()
}

/// Each distinct frame of a stack once.
fn inclusive(stack: &Stack) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for frame in &stack.frames {
        if !seen.contains(frame) {
            seen.push(frame.clone());
        }
    }
    seen
}

fn tally(stacks: &[Stack], keys: impl Fn(&Stack) -> Vec<String>) -> HashMap<String, u64> {
    tally_of(&stacks.iter().collect::<Vec<_>>(), keys)
}

fn tally_of(stacks: &[&Stack], keys: impl Fn(&Stack) -> Vec<String>) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for stack in stacks {
        for key in keys(stack) {
            *counts.entry(key).or_insert(0) += stack.samples;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(thread: &str, frames: &[&str], samples: u64) -> Stack {
        Stack {
            thread: thread.to_owned(),
            frames: frames.iter().map(|f| (*f).to_owned()).collect(),
            samples,
        }
    }

    #[test]
    fn frames_belong_to_the_crate_of_their_path() {
        assert_eq!(
            crate_of("<backend_redis::B as lockcore::L>::acquire"),
            "backend_redis"
        );
        assert_eq!(crate_of("lockcore::locker::Locker::acquire"), "lockcore");
        assert_eq!(crate_of("epoll_wait"), "C (libc, system calls)");
    }

    #[test]
    fn hashes_are_dropped_from_names() {
        assert_eq!(clean("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(clean("a::hello"), "a::hello");
    }

    #[test]
    fn shares_count_self_once_and_inclusive_once_per_stack() {
        let stacks = [
            stack(
                "bench-worker",
                &[
                    "__GI___writev",
                    "lockcore::send",
                    "lockcore::send",
                    "lockcore::main",
                ],
                3,
            ),
            stack(
                "main",
                &[
                    "<redis::Parser as X>::parse",
                    "tokio::park",
                    "lockcore::main",
                ],
                1,
            ),
        ];
        let measured = Measured {
            wall_s: 1.0,
            cpu_s: 0.5,
            cycles: 2,
            failed: 1,
        };
        let text = summary("t", &stacks, measured);
        assert!(
            text.contains("2 cycles (1 failed) in 1.00 s, 2 a second"),
            "{text}"
        );
        assert!(text.contains(" 75.0 %  bench-worker"), "{text}");
        assert!(text.contains(" 75.0 %  C (libc, system calls)"), "{text}");
        assert!(text.contains(" 75.0 %  __GI___writev"), "{text}");
        // `send` appears twice in one stack but counts its samples once.
        assert!(text.contains(" 75.0 %  lockcore::send"), "{text}");
        assert!(text.contains("100.0 %  lockcore::main"), "{text}");
        assert!(!text.contains("%  tokio::park"), "{text}");
        assert!(
            text.contains(" 75.0 %  __GI___writev ← lockcore::send"),
            "{text}"
        );
        assert!(
            text.contains("250000.0 µs of process CPU per cycle (50 % of a core"),
            "{text}"
        );
        assert!(text.contains("4 samples at 997 Hz"), "{text}");
    }

    #[test]
    fn client_sections_leave_the_test_servers_threads_out() {
        let stacks = [
            stack("bench-worker-1", &["__GI___writev", "backend_gcs::send"], 3),
            stack(
                "anylock-bench",
                &["lockcore::acquire", "backend_gcs::send"],
                1,
            ),
            stack("gcs-server-0", &["gcs_test_server::handle"], 4),
        ];
        let measured = Measured {
            wall_s: 1.0,
            cpu_s: 0.5,
            cycles: 2,
            failed: 0,
        };
        // 0.5 s of client CPU over 2 cycles: 250,000 µs per cycle, split 3:1.
        let text = summary("t", &stacks, measured);
        let client = &text[text.find("## client threads only").expect("client part")..];
        assert!(
            client.contains("187500.0  C (libc, system calls)"),
            "{client}"
        );
        assert!(client.contains("\n62500.0  lockcore\n"), "{client}");
        assert!(client.contains("250000.0  backend_gcs::send"), "{client}");
        assert!(!client.contains("gcs_test_server"), "{client}");
        // With the server in another process every thread is the client's, and the
        // sections still price each line per cycle, so two profiles compare line by line.
        let alone = summary("t", &stacks[..2], measured);
        let client = &alone[alone.find("## client threads only").expect("client part")..];
        assert!(client.contains("250000.0  backend_gcs::send"), "{client}");
    }

    #[test]
    fn go_functions_belong_to_their_package() {
        assert_eq!(
            go_package("go.etcd.io/etcd/mvcc.(*keyIndex).Less"),
            "go.etcd.io/etcd/mvcc"
        );
        assert_eq!(
            go_package("google.golang.org/grpc/internal/transport.(*loopyWriter).run.func1"),
            "google.golang.org/grpc/internal/transport"
        );
        assert_eq!(go_package("runtime.futex"), "runtime");
        assert_eq!(go_package("cmpbody"), "cmpbody");
    }

    #[test]
    fn the_members_text_prices_each_line_per_cycle() {
        let ms = |ms: u64| Duration::from_millis(ms);
        let mut profile = CpuProfile {
            duration: ms(10_000),
            cpu: ms(30),
            samples: 3,
            stacks: vec![(
                vec![
                    "runtime.futex".to_owned(),
                    "go.etcd.io/etcd/mvcc.put".to_owned(),
                ],
                20_000_000,
            )],
        };
        profile.merge(CpuProfile {
            duration: ms(10_000),
            cpu: ms(10),
            samples: 1,
            stacks: vec![(vec!["go.etcd.io/etcd/mvcc.put".to_owned()], 10_000_000)],
        });
        // Half a µs per cycle: listed by self, below the inclusive list's floor.
        profile.stacks.push((vec!["raft.tiny".to_owned()], 500_000));
        let members = Members {
            profile,
            each: vec![
                ("http://a".to_owned(), ms(30)),
                ("http://b".to_owned(), ms(10)),
            ],
            rest_of_machine: Some(ms(100)),
        };
        // 40 ms over 1,000 cycles: 40 µs per cycle, 30 of them in `put` itself or below.
        let text = members_summary("t", &members, 1_000);
        assert!(
            text.contains("40.0 µs per cycle (http://a 30.0, http://b 10.0; 4 samples)"),
            "{text}"
        );
        assert!(
            text.contains("over the same cycles: 100.0 µs per cycle"),
            "{text}"
        );
        let packages = &text[text.find("## by Go package").expect("packages")..];
        assert!(packages.contains("   20.0  runtime\n"), "{packages}");
        assert!(
            packages.contains("   10.0  go.etcd.io/etcd/mvcc\n"),
            "{packages}"
        );
        let inclusive = &text[text.find("(inclusive)").expect("inclusive")..];
        assert!(
            inclusive.contains("   30.0  go.etcd.io/etcd/mvcc.put\n"),
            "{inclusive}"
        );
        assert!(!inclusive.contains("raft.tiny"), "{inclusive}");
        assert!(text.contains("    0.5  raft.tiny\n"), "{text}");
    }

    #[test]
    fn workloads_name_a_backend_and_whose_cycle() {
        let parsed = |name| Workload::parse(name).expect(name);
        assert_eq!(
            parsed("postgres-floor"),
            Workload {
                kind: Kind::Postgres,
                who: Who::Floor
            }
        );
        assert_eq!(parsed("redis-peer").who, Who::Peer(0));
        assert_eq!(parsed("etcd-peer2").who, Who::Peer(1));
        assert_eq!(parsed("etcd-ours").kind, Kind::Etcd);
        // The older names of the Redis and GCS profiles still work.
        assert_eq!(parsed("redis-cycle"), parsed("redis-ours"));
        assert_eq!(parsed("gcs-cycle"), parsed("gcs-ours"));
        assert_eq!(parsed("gcs-loop"), parsed("gcs-peer"));
        for bad in [
            "redis",
            "postgres-loop",
            "mysql-ours",
            "",
            "-ours",
            "etcd-cycle",
        ] {
            let err = Workload::parse(bad).expect_err(bad).to_string();
            assert!(err.contains("name a backend"), "{bad}: {err}");
        }
    }
}

//! The text files of `--profile`: the client's samples by thread, crate, frame and system
//! call, in shares and in µs of client CPU per cycle, and the etcd members' CPU per cycle
//! by Go package and function.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::go_pprof::CpuProfile;
use crate::procstat::SERVER_THREADS;

/// Samples per second of CPU time (not a multiple of the timer tick, so the samples do not
/// beat with periodic work).
pub(crate) const FREQUENCY: i32 = 997;

/// Frames listed in the text file, by self and by inclusive share.
const TOP: usize = 25;

/// Longest frame name the text file prints (generic parameters can run to pages).
const LONGEST: usize = 160;

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

/// The etcd members' own CPU profiles over the profiled cycles.
pub(super) struct Members {
    /// Every member's profile, merged.
    pub(super) profile: CpuProfile,
    /// Each member's URL and its profile's CPU time.
    pub(super) each: Vec<(String, Duration)>,
    /// The CPU time of the machine less this process's over the same window (`/proc`),
    /// where `/proc/stat` is readable.
    pub(super) rest_of_machine: Option<Duration>,
}

/// The members' text file: their CPU per cycle (each member's, and the rest of the
/// machine's from `/proc` for scale), then µs per cycle by Go package of the innermost
/// frame, by function (self) and by function anywhere in the stack (inclusive).
pub(super) fn members_summary(title: &str, members: &Members, cycles: usize) -> String {
    let per_cycle = |ns: u64| ns as f64 / 1e3 / cycles.max(1) as f64;
    let profile = &members.profile;
    let total = nanos(profile.cpu);
    // One sample's CPU time (10 ms at Go's 100 Hz): a line's samples tell how well it is
    // known (about ±2√n).
    let tick = total.checked_div(profile.samples).unwrap_or(0).max(1);
    let mut out = format!("# {title}\n\n");
    let each: Vec<String> = members
        .each
        .iter()
        .map(|(url, cpu)| format!("{url} {:.1}", per_cycle(nanos(*cpu))))
        .collect();
    let rest = members
        .rest_of_machine
        .map_or("not read".to_owned(), |cpu| {
            format!("{:.1} µs", per_cycle(nanos(cpu)))
        });
    let _ = writeln!(
        out,
        "{cycles} cycles in the members' {:.1} s window; their CPU as Go's profiler counts \
         it ({} samples of {:.1} ms): {:.1} µs per cycle ({}). The whole machine less this \
         process, from /proc/stat over the same cycles: {rest} per cycle. Go's profiler \
         counted about 0.8 of an etcd member's CPU in /proc when checked here, so compare \
         lines between workloads, not with /proc. Each line: µs per cycle, then samples (a \
         line of n samples is known to about ±2√n).",
        profile.duration.as_secs_f64(),
        profile.samples,
        tick as f64 / 1e6,
        per_cycle(total),
        each.join(", "),
    );
    let (own, inclusive) = profile.by_function();
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
        let listed = largest_first(counts).into_iter().take(top);
        for (name, ns) in listed.take_while(|(_, ns)| per_cycle(*ns) >= floor) {
            let name: String = name.chars().take(LONGEST).collect();
            let samples = (ns + tick / 2) / tick;
            let _ = writeln!(out, "{:7.1} {samples:6}  {name}", per_cycle(ns));
        }
    }
    out
}

/// A duration in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `counts` largest first, ties by name.
fn largest_first(counts: HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut sorted: Vec<(String, u64)> = counts.into_iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sorted
}

/// The package of a Go function name: `go.etcd.io/etcd/mvcc` of
/// `go.etcd.io/etcd/mvcc.(*keyIndex).Less`, `runtime` of `runtime.futex`; a name without
/// a package (an assembly routine such as `cmpbody`) stands for itself.
pub(super) fn go_package(function: &str) -> &str {
    let last_slash = function.rfind('/').map_or(0, |i| i + 1);
    match function[last_slash..].find('.') {
        Some(dot) => &function[..last_slash + dot],
        None => function,
    }
}

/// One sampled stack: its thread, its frames from the innermost out, and its samples.
pub(crate) struct Stack {
    pub(super) thread: String,
    pub(super) frames: Vec<String>,
    pub(super) samples: u64,
}

/// The report's stacks with readable function names (hash suffixes dropped).
pub(super) fn stacks(report: &pprof::Report) -> Vec<Stack> {
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
        for (name, n) in largest_first(counts).into_iter().take(TOP) {
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
        for (name, n) in largest_first(counts).into_iter().take(4 * TOP) {
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
pub(super) fn crate_of(frame: &str) -> String {
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

//! `--profile WORKLOAD`: a CPU profile of one uncontended cycle (`Locker::try_acquire` +
//! `LockGuard::release`, or a peer's lock + unlock, on 1,000 names in turn, as the latency
//! section runs it), sampled in-process by `pprof` at [`FREQUENCY`] Hz over every thread of
//! the process. Writes a flamegraph SVG and a text file with the top frames by share.
//!
//! Workloads: `redis-cycle` (ours on `--redis`), `gcs-cycle` (ours) and `gcs-loop` (the
//! gcslock-style loop), both on an in-process GCS test server whose threads are named
//! apart (`gcs-server`), so the text can split the client's samples from the server's.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use tokio::time::Instant;

use crate::args::Args;
use crate::common::{TTL, progress};
use crate::measure::{error_budget, warm_up};
use crate::op::{Entry, NAMES, Op, Ours, Res, Role};
use crate::procstat::{SERVER_THREADS, client_cpu};
use crate::system::{Ctx, PREFIX, with_param};
use crate::targets::OURS;

/// Samples per second of CPU time (not a multiple of the timer tick, so the samples do not
/// beat with periodic work).
pub(crate) const FREQUENCY: i32 = 997;

/// Frames listed in the text file, by self and by inclusive share.
const TOP: usize = 25;

/// Longest frame name the text file prints (generic parameters can run to pages).
const LONGEST: usize = 160;

/// The crates whose frames the inclusive list keeps: anylock's own.
const OURS_CRATES: [&str; 4] = ["lockcore", "backend_redis", "backend_gcs", "anylock"];

/// Runs the profile `args.profile` names and writes its files under `args.out`.
///
/// # Errors
/// When the workload is unknown, Redis is not configured or unreachable, a cycle fails,
/// or a file cannot be written.
pub(crate) fn run(args: &Args, workload: &str) -> Res<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bench-worker")
        .build()?;
    let run = format!("p{:08x}", rand::random::<u32>());
    let n = args.profile_cycles;
    let (report, measured, what) = match workload {
        "redis-cycle" => {
            let url = args
                .redis
                .clone()
                .ok_or("--profile redis-cycle needs --redis or ANYLOCK_TEST_REDIS_URL")?;
            let profiled = runtime.block_on(redis_cycles(&url, &run, n));
            let cleaned = runtime.block_on(crate::sys_redis::cleanup(&url, &run));
            let (report, measured) = profiled?;
            cleaned?;
            (report, measured, "Locker::try_acquire + release on Redis")
        }
        "gcs-cycle" | "gcs-loop" => {
            let peer = workload == "gcs-loop";
            let (_server_runtime, server) = crate::servers::gcs_test_server()?;
            let ctx = Ctx {
                run: run.clone(),
                ttl: TTL,
                gcs_server: Some(server.clone()),
            };
            let url = crate::servers::gcs_url(&server);
            let (report, measured) = runtime.block_on(gcs_cycles(&url, &ctx, peer, n))?;
            let what = if peer {
                "the gcslock-style loop (create with ifGenerationMatch=0, DELETE) on the \
                 in-process GCS test server"
            } else {
                "Locker::try_acquire + release on the in-process GCS test server"
            };
            (report, measured, what)
        }
        other => return Err(format!("no profile workload {other}").into()),
    };
    std::fs::create_dir_all(&args.out)?;
    let stem = args.out.join(format!("{workload}-{}", args.profile_tag));
    let title = format!(
        "{workload}: {what}, {n} cycles{}",
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
    let text = summary(&title, &stacks, n, measured);
    std::fs::write(stem.with_extension("txt"), &text)?;
    progress(&format!("wrote {}.svg and .txt", display(&stem)));
    print!("{text}");
    Ok(())
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
}

/// Ours on Redis at `url`: see [`sample`].
async fn redis_cycles(url: &str, run: &str, n: usize) -> Res<(pprof::Report, Measured)> {
    let backend = backend_redis::open(&with_param(url, "prefix", PREFIX)).await?;
    let lock = Arc::new(Ours::new(backend, TTL));
    let entry = Entry::cycle(OURS, Role::Ours, lock, &format!("{run}-profile"));
    sample(entry.op.as_ref(), n).await
}

/// Ours, or with `peer` the gcslock-style loop, on GCS at `url`: see [`sample`].
async fn gcs_cycles(url: &str, ctx: &Ctx, peer: bool, n: usize) -> Res<(pprof::Report, Measured)> {
    let system = crate::sys_gcs::connect(url, ctx).await?;
    let prefix = format!("{}-profile", ctx.run);
    let entry = if peer {
        let peer = system.peers.first().ok_or("the GCS system has no peer")?;
        Entry::cycle(&peer.label, Role::Peer, peer.lock.clone(), &prefix)
    } else {
        let lock = Arc::new(Ours::new(system.backend.clone(), TTL));
        Entry::cycle(OURS, Role::Ours, lock, &prefix)
    };
    sample(entry.op.as_ref(), n).await
}

/// One untimed pass over the names, then `n` profiled cycles: the report and what the
/// profiled cycles took.
async fn sample(op: &dyn Op, n: usize) -> Res<(pprof::Report, Measured)> {
    warm_up(op, NAMES, error_budget(NAMES)).await?;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libgcc", "vdso"])
        .build()?;
    let start = Instant::now();
    let cpu = client_cpu();
    for i in 0..n {
        op.run(i).await?;
    }
    let measured = Measured {
        wall_s: start.elapsed().as_secs_f64(),
        cpu_s: client_cpu().saturating_sub(cpu).as_secs_f64(),
    };
    Ok((guard.report().build()?, measured))
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
pub(crate) fn summary(title: &str, stacks: &[Stack], cycles: usize, m: Measured) -> String {
    let total: u64 = stacks.iter().map(|s| s.samples).sum();
    let per_cycle = |s: f64| 1e6 * s / cycles.max(1) as f64;
    let mut out = format!("# {title}\n\n");
    let _ = writeln!(
        out,
        "{cycles} cycles in {:.2} s: {:.1} µs of wall time and {:.1} µs of process CPU per \
         cycle ({:.0} % of a core; CPU from /proc, without an in-process test server's \
         threads). {total} samples at {FREQUENCY} Hz, the server's threads included.",
        m.wall_s,
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
            "frame of lockcore, backend_redis, backend_gcs or anylock anywhere in the stack \
             (inclusive)",
            tally(stacks, |s| {
                inclusive(s)
                    .into_iter()
                    .filter(|f| OURS_CRATES.contains(&crate_of(f).as_str()))
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
    if total == 0 || client.len() == stacks.len() {
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
        };
        let text = summary("t", &stacks, 2, measured);
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
        };
        // 0.5 s of client CPU over 2 cycles: 250,000 µs per cycle, split 3:1.
        let text = summary("t", &stacks, 2, measured);
        let client = &text[text.find("## client threads only").expect("client part")..];
        assert!(
            client.contains("187500.0  C (libc, system calls)"),
            "{client}"
        );
        assert!(client.contains("\n62500.0  lockcore\n"), "{client}");
        assert!(client.contains("250000.0  backend_gcs::send"), "{client}");
        assert!(!client.contains("gcs_test_server"), "{client}");
        // Without a server thread there is nothing to split off.
        let alone = summary("t", &stacks[..2], 2, measured);
        assert!(!alone.contains("## client threads only"), "{alone}");
    }
}

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

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::time::Instant;

use crate::args::{Args, etcd_members};
use crate::common::{TTL, progress};
use crate::go_pprof::CpuProfile;
use crate::measure::{error_budget, task_index, warm_up};
use crate::op::{Entry, NAMES, Op, Res, Role};
use crate::procstat::{client_cpu, machine_busy};
use crate::system::{Ctx, Kind, System};
use crate::targets::OURS;

#[cfg(test)]
mod tests;
mod text;

use text::{FREQUENCY, Measured, Members, members_summary, stacks, summary};

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
        crate::connect::cleanup(&[(spec.kind, url.clone())], &ctx).await;
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
    // The files' names end in `.svg` and `.txt` appended to the stem, so a tag with a
    // dot in it (`v0.3`) is kept whole.
    let stem = format!("{workload}{tasks_part}-{}", args.profile_tag);
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
    let mut svg = Vec::new();
    report.flamegraph_with_options(&mut svg, &mut options)?;
    let text = summary(&title, &stacks(&report), measured);
    write_pair(&args.out, &stem, &svg, &text)?;
    if let Some(members) = members {
        let title = format!("etcd members' CPU under {title}");
        let mut options = pprof::flamegraph::Options::default();
        options.title = format!("{title} (µs over the whole window, not per cycle)");
        options.count_name = "µs".to_owned();
        let folded = members.profile.folded();
        let mut svg = Vec::new();
        pprof::flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), &mut svg)?;
        let text = members_summary(&title, &members, measured.cycles);
        write_pair(&args.out, &format!("{stem}-members"), &svg, &text)?;
    }
    Ok(())
}

/// Writes `dir/stem.svg` and `dir/stem.txt`, and prints the text.
fn write_pair(dir: &Path, stem: &str, svg: &[u8], text: &str) -> Res<()> {
    std::fs::write(dir.join(format!("{stem}.svg")), svg)?;
    std::fs::write(dir.join(format!("{stem}.txt")), text)?;
    progress(&format!("wrote {}.svg and .txt", dir.join(stem).display()));
    print!("{text}");
    Ok(())
}

/// The cycle `who` names on `system`, and what the title calls it.
fn pick(system: &System, ctx: &Ctx, who: Who) -> Res<(String, Entry)> {
    let backend = system.kind.name();
    let prefix = format!("{}-{backend}-profile", ctx.run);
    let on = match system.kind {
        Kind::Gcs => "the in-process GCS test server".to_owned(),
        _ if !system.note.is_empty() => format!("{backend} ({})", system.note),
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

/// How long the profiled cycles run.
enum Span {
    /// This many cycles in all.
    Cycles(usize),
    /// Until every etcd member at `urls` has answered a CPU profile of `seconds`.
    Members { urls: Vec<String>, seconds: u64 },
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
                    .map(|url| crate::go_pprof::fetch_body(&client, url, seconds)),
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
    // The client's report is taken before the members' profiles are decoded: decoding
    // is this process's CPU, after the window.
    let report = guard.report().build()?;
    drop(guard);
    let members = match members {
        None => None,
        Some((urls, fetched)) => {
            let mut merged = CpuProfile::default();
            let mut each = Vec::new();
            for (url, body) in urls.into_iter().zip(fetched) {
                let profile = body
                    .and_then(|body| crate::go_pprof::decode(&body))
                    .map_err(|e| format!("etcd member {url}: {e}"))?;
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
    Ok((report, measured, members))
}

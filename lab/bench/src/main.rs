//! `anylock-bench`: measures anylock's backends side by side with their servers' raw round
//! trips and with peer lock libraries, in one run, as ratios (issue 9). It writes
//! `results.json`, `tables.md` and SVG plots under `--out`, and with `--doc` replaces the
//! generated block of BENCHMARKS.md.
//!
//! ```text
//! anylock-bench [--redis URL] [--redlock URLS] [--postgres URL] [--etcd URL] [--gcs URL]
//!               [--only LIST] [--smoke] [--out DIR] [--doc BENCHMARKS.md]
//! ```
//!
//! Sections, in run order: round trips (item 1), scale (item 4), latency (item 1),
//! throughput (item 2), handoff (item 3), leader failover (issue 18), Redlock fan-out
//! (item 5).

mod args;
mod child;
mod common;
mod connect;
mod counts;
mod crash;
mod etcd_grpc;
mod failover;
mod failover_table;
mod fanout;
mod floor;
#[cfg(target_os = "linux")]
mod go_pprof;
mod handoff;
mod info;
mod latency;
mod measure;
mod op;
mod procstat;
#[cfg(target_os = "linux")]
mod profile;
#[cfg(not(target_os = "linux"))]
mod profile {
    //! `--profile` samples with `pprof`, which this harness builds on Linux only.

    /// Fails: no profiler on this platform.
    pub(crate) fn run(_: &crate::args::Args, _: &str) -> crate::op::Res<()> {
        Err("--profile needs Linux".into())
    }
}
mod proto;
mod raw_conns;
mod report;
mod results;
mod scale;
mod scale_child;
mod servers;
mod stats;
mod svg;
mod sys_etcd;
mod sys_gcs;
mod sys_pg;
mod sys_redis;
mod system;
mod tap;
mod targets;
mod targets9;
mod throughput;
mod wrap;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::SystemTime;

use clap::Parser;
use gcs_test_server::GcsTestServer;

use crate::args::Args;
use crate::common::{TTL, progress, started};
use crate::op::Res;
use crate::results::Results;
use crate::system::{Ctx, Kind, System};

fn main() -> ExitCode {
    let args = Args::parse();
    let _ = started();
    // The rustls provider that plain reqwest clients need (the GCS test server and the
    // gcslock-style loop build some); a second install is refused, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(workload) = &args.profile {
        return match profile::run(&args, workload) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        };
    }
    if let Some(path) = &args.from_results {
        return match rerender(&args, path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        };
    }
    let gcs = match start_gcs(&args) {
        Ok(gcs) => gcs,
        Err(e) => return fail(&e),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bench-worker")
        .build();
    let server = gcs.as_ref().map(|g| g.1.clone());
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(async move {
            match (args.scale_child.clone(), args.failover_child.clone()) {
                (Some(job), _) => scale_child::run(&job).await,
                (None, Some(job)) => crash::child(&job).await,
                (None, None) => run(args, server).await,
            }
        }),
        Err(e) => Err(e.into()),
    };
    drop(gcs);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &op::BoxError) -> ExitCode {
    eprintln!("anylock-bench: error: {e}");
    ExitCode::FAILURE
}

/// Starts the in-process GCS test server ([`servers::gcs_test_server`]), unless `--gcs`
/// names another.
fn start_gcs(args: &Args) -> Res<Option<(tokio::runtime::Runtime, Arc<GcsTestServer>)>> {
    let wanted = args.only.is_empty() || args.only.iter().any(|o| o == "gcs");
    let child = args.scale_child.is_some() || args.failover_child.is_some();
    if !wanted || args.gcs.is_some() || child {
        return Ok(None);
    }
    servers::gcs_test_server().map(Some)
}

async fn run(args: Args, gcs_server: Option<Arc<GcsTestServer>>) -> Res<()> {
    if args.doc.is_some() && !args.sections.is_empty() {
        return Err("--sections measures only some sections, so it does not write --doc".into());
    }
    let targets = args.targets()?;
    let plan = args.plan();
    let ctx = Ctx {
        run: format!("b{:08x}", rand::random::<u32>()),
        ttl: TTL,
        gcs_server: gcs_server.clone(),
    };
    let local_dir = std::env::temp_dir().join(format!("anylock-bench-{}", ctx.run));
    let mut systems = Vec::new();
    for (kind, url) in targets.list {
        let url = match (kind, url, &gcs_server) {
            (_, Some(url), _) => url,
            (Kind::Gcs, None, Some(server)) => servers::gcs_url(server),
            (Kind::Local, None, _) => format!("local:{}/locks.sqlite3", local_dir.display()),
            (kind, None, _) => return Err(format!("no URL for {}", kind.name()).into()),
        };
        let system = System::connect(kind, &url, &ctx).await;
        systems.push(system.map_err(|e| format!("{}: cannot connect: {e}", kind.name()))?);
    }
    progress(&format!(
        "{} run {}: {} backends connected",
        plan.mode,
        ctx.run,
        systems.len()
    ));
    let mut results = Results::default();
    results.meta = results::Meta {
        date: procstat::utc_date(SystemTime::now()),
        machine: procstat::machine(),
        commit: args.commit.clone(),
        mode: plan.mode.to_owned(),
        seconds: 0.0,
        servers: Vec::new(),
    };
    for system in &systems {
        results.meta.servers.push(info::describe(system).await);
    }
    let measured = sections(&systems, &ctx, &plan, &mut results).await;
    // Close every connection first: the PostgreSQL pools (up to 194 connections) could
    // otherwise leave the server no slot for the cleanup's own.
    let servers: Vec<(Kind, String)> = systems.iter().map(|s| (s.kind, s.url.clone())).collect();
    drop(systems);
    connect::cleanup(&servers, &ctx).await;
    let _ = std::fs::remove_dir_all(&local_dir);
    measured?;
    results.meta.seconds = started().elapsed().as_secs_f64();
    write(&args, &results, true)
}

async fn sections(systems: &[System], ctx: &Ctx, plan: &args::Plan, out: &mut Results) -> Res<()> {
    // Counts first (scale prices a refresh with them), then scale while the heap is still
    // small, so its resident-memory growth is the leases' and not reused free space.
    if plan.runs("counts") {
        counts::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("scale") {
        scale::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("latency") {
        latency::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("throughput") {
        throughput::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("handoff") {
        handoff::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("failover") {
        failover::run(systems, ctx, plan, out).await?;
    }
    if plan.runs("fanout") {
        fanout::run(systems, ctx, plan, out).await?;
    }
    Ok(())
}

/// Re-renders the outputs of an earlier run from its results.json.
fn rerender(args: &Args, path: &std::path::Path) -> Res<()> {
    let results: Results = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    write(args, &results, false)
}

/// Writes results.json (when `measured`), tables.md and the plots under `--out`, and
/// splices `--doc`.
fn write(args: &Args, results: &Results, measured: bool) -> Res<()> {
    std::fs::create_dir_all(&args.out)?;
    if measured {
        let json = serde_json::to_string_pretty(results)?;
        std::fs::write(args.out.join("results.json"), json)?;
    }
    std::fs::write(args.out.join("tables.md"), report::render(results, "."))?;
    std::fs::write(args.out.join("handoff.svg"), plots::handoff(results))?;
    std::fs::write(args.out.join("throughput.svg"), plots::throughput(results))?;
    if let Some(doc) = &args.doc {
        let text = std::fs::read_to_string(doc)?;
        let block = report::render(results, &args.plots_link);
        std::fs::write(doc, report::splice(&text, &block)?)?;
    }
    progress(&format!("wrote {}", args.out.display()));
    Ok(())
}

mod plots {
    //! The two plots of the report, from the results.

    use crate::results::Results;
    use crate::svg::{Panel, Series, panels, strip_plot};

    /// Every handoff sample, one row per backend and waiter.
    pub(crate) fn handoff(r: &Results) -> String {
        let rows: Vec<(String, Vec<f64>)> = r
            .handoff
            .iter()
            .map(|h| {
                let mode = h.mode.split([':', '(']).next().unwrap_or_default().trim();
                (
                    format!("{} · {} · {mode}", h.backend, h.label),
                    h.samples_ms.clone(),
                )
            })
            .collect();
        strip_plot(
            "Handoff latency: release to next holder (dots: samples, bar: median)",
            &rows,
        )
    }

    /// One panel per backend: units per second against concurrent tasks.
    pub(crate) fn throughput(r: &Results) -> String {
        let mut grid: Vec<Panel> = Vec::new();
        for t in &r.throughput {
            if !grid.iter().any(|p| p.title == t.backend) {
                grid.push(Panel {
                    title: t.backend.clone(),
                    series: Vec::new(),
                });
            }
            let panel = grid
                .iter_mut()
                .find(|p| p.title == t.backend)
                .expect("just added");
            match panel.series.iter_mut().find(|s| s.label == t.label) {
                Some(series) => series.points.push((t.tasks as f64, t.per_second)),
                None => panel.series.push(Series {
                    label: t.label.clone(),
                    points: vec![(t.tasks as f64, t.per_second)],
                }),
            }
        }
        panels(
            "Throughput (cycles or round trips per second) against concurrent tasks",
            &grid,
        )
    }
}

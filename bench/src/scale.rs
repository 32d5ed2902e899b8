//! Item 4: many leases held and refreshed by one process (memory per lease, refresh
//! traffic, client CPU), then the same load through a prototype of the batched fix where
//! the backend's server allows one (see `proto`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use lockcore::{LockGuard, LockOptions, Locker};
use tokio::time::Instant;

use crate::args::Plan;
use crate::counts::REFRESH;
use crate::op::Res;
use crate::procstat::{client_cpu, rss_bytes};
use crate::results::{Results, ScaleRow};
use crate::system::{Ctx, Kind, System};
use crate::wrap::Observed;

/// Acquisitions (and releases) in flight at once.
pub(crate) const CONCURRENCY: usize = 64;

/// The scale figures of every server backend, today and with the prototype fix, each
/// backend measured in a child process of its own (see `child`).
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems.iter().filter(|s| s.kind != Kind::Local) {
        let per_refresh = out
            .counts
            .iter()
            .find(|c| c.backend == system.kind.name() && c.label == REFRESH)
            .and_then(|c| c.round_trips);
        let job = crate::child::Job {
            kind: system.kind.name().to_owned(),
            url: system.url.clone(),
            run: ctx.run.clone(),
            per_refresh,
            smoke: plan.mode == "smoke",
        };
        out.scale.extend(crate::child::spawn(&job).await?);
        crate::common::progress(&format!("scale: {} done", system.kind.name()));
    }
    Ok(())
}

/// What a window of steady refreshing cost.
pub(crate) struct Window {
    /// Its length.
    pub(crate) length: Duration,
    /// Client CPU time spent in it.
    pub(crate) cpu: Duration,
}

impl Window {
    /// Measures client CPU over `length` while `work` runs (a plain sleep when the
    /// refreshing happens in background tasks).
    pub(crate) async fn measure<F: Future>(length: Duration, work: F) -> (Self, F::Output) {
        let cpu = client_cpu();
        let output = work.await;
        let window = Self {
            length,
            cpu: client_cpu().saturating_sub(cpu),
        };
        (window, output)
    }

    /// CPU as a percentage of one core.
    pub(crate) fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu.as_secs_f64() / self.length.as_secs_f64()
    }
}

/// anylock today: `leases` guards from one `Locker`, each refreshed by its own task. A
/// backend that fails part-way gets a row saying how far it got and why.
pub(crate) async fn ours(
    system: &System,
    ctx: &Ctx,
    plan: &Plan,
    per_refresh: Option<f64>,
) -> Res<ScaleRow> {
    let observed = Arc::new(Observed::new(system.backend.clone(), false));
    let options = LockOptions::new(plan.scale_ttl);
    let interval = options.refresh_interval();
    let locker = Locker::new(observed.clone()).with_options(options);
    let mut row = empty_row(system, plan, interval);
    let rss = rss_bytes();
    let start = Instant::now();
    let (guards, error) = acquire_all(&locker, ctx, system, plan.leases).await;
    if let Some(error) = error {
        row.error = Some(format!(
            "acquired {} of {}, then: {error}",
            guards.len(),
            plan.leases
        ));
        row.lost = guards.iter().filter(|g| !g.is_held()).count();
        release_all(guards).await;
        return Ok(row);
    }
    row.acquire_s = Some(start.elapsed().as_secs_f64());
    row.rss_per_lease = Some(rss_bytes().saturating_sub(rss) as f64 / plan.leases as f64);
    let before = observed.refreshes();
    let length = interval * plan.scale_intervals;
    let (window, ()) = Window::measure(length, tokio::time::sleep(length)).await;
    let after = observed.refreshes();
    row.lost = guards.iter().filter(|g| !g.is_held()).count();
    release_all(guards).await;
    row.refreshes_per_s = (after.0 - before.0) as f64 / length.as_secs_f64();
    row.round_trips_per_s = per_refresh.map(|r| r * row.refreshes_per_s);
    row.cpu_percent = window.cpu_percent();
    row.failures = after.1 - before.1;
    if row.failures > 0 {
        row.error = observed
            .first_failure()
            .map(|e| format!("first refresh failure: {e}"));
    }
    Ok(row)
}

/// A row for anylock today with nothing measured yet.
fn empty_row(system: &System, plan: &Plan, interval: Duration) -> ScaleRow {
    ScaleRow {
        backend: system.kind.name().to_owned(),
        variant: "anylock today: one refresh call per lease".to_owned(),
        leases: plan.leases,
        ttl_s: plan.scale_ttl.as_secs_f64(),
        interval_s: interval.as_secs_f64(),
        acquire_s: None,
        rss_per_lease: None,
        refreshes_per_s: 0.0,
        round_trips_per_s: None,
        cpu_percent: 0.0,
        failures: 0,
        lost: 0,
        error: None,
    }
}

/// Acquires `leases` distinct names, `CONCURRENCY` at a time: the guards, and the first
/// error if any acquisition failed.
async fn acquire_all(
    locker: &Locker,
    ctx: &Ctx,
    system: &System,
    leases: usize,
) -> (Vec<LockGuard>, Option<String>) {
    let names = (0..leases).map(|i| format!("{}-{}-scale-{i}", ctx.run, system.kind.name()));
    let outcomes: Vec<Res<LockGuard>> = stream::iter(names)
        .map(|name| {
            let locker = locker.clone();
            async move {
                let guard = locker.try_acquire(&name).await?;
                Res::Ok(guard.ok_or_else(|| format!("{name} was held"))?)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut guards = Vec::with_capacity(leases);
    let mut error = None;
    for outcome in outcomes {
        match outcome {
            Ok(guard) => guards.push(guard),
            Err(e) => {
                error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    (guards, error)
}

/// Releases every guard, `CONCURRENCY` at a time; lost ones are simply dropped.
async fn release_all(guards: Vec<LockGuard>) {
    stream::iter(guards)
        .for_each_concurrent(CONCURRENCY, |guard| async move {
            let _ = guard.release().await;
        })
        .await;
}

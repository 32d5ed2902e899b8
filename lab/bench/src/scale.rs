//! Item 4: many leases held and refreshed by one process (memory per lease, refresh
//! calls and round trips, client CPU), then the same load through the prototype of a
//! batched refresh written on the servers' plain clients, where the server allows one
//! (see `proto`): the reference floor anylock's batching is measured against.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use lockcore::{LockBackend, LockGuard, LockOptions, Locker};
use tokio::time::Instant;

use crate::args::Plan;
use crate::common::CONCURRENCY;
use crate::counts::{REFRESH, REFRESH_MANY};
use crate::op::Res;
use crate::procstat::{client_cpu, rss_bytes};
use crate::results::{Results, ScaleRow};
use crate::system::{Ctx, Kind, System};
use crate::wrap::{Observed, Refreshes};

/// Round trips per refresh call of each kind, from the counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prices {
    /// Per `refresh` call.
    pub(crate) refresh: Option<f64>,
    /// Per `refresh_many` call.
    pub(crate) refresh_many: Option<f64>,
}

impl Prices {
    /// `system`'s prices from the counts in `out`; the embedded backend, which has no
    /// network, counts each call as one.
    pub(crate) fn of(system: &System, out: &Results) -> Self {
        if system.kind == Kind::Local {
            return Self {
                refresh: Some(1.0),
                refresh_many: Some(1.0),
            };
        }
        let find = |wanted: &dyn Fn(&str) -> bool| {
            out.counts
                .iter()
                .find(|c| c.backend == system.kind.name() && wanted(&c.label))
                .and_then(|c| c.round_trips)
        };
        Self {
            refresh: find(&|l| l == REFRESH),
            refresh_many: find(&|l| l.starts_with(REFRESH_MANY)),
        }
    }

    /// Round trips of `counted` calls, where each kind made is priced.
    pub(crate) fn round_trips(&self, counted: &Refreshes) -> Option<f64> {
        let single = match counted.single_calls {
            0 => 0.0,
            n => self.refresh? * n as f64,
        };
        let batched = match counted.batch_calls {
            0 => 0.0,
            n => self.refresh_many? * n as f64,
        };
        Some(single + batched)
    }
}

/// The scale figures of every backend, anylock's and the prototypes of a batched refresh
/// (the reference floor), each backend measured in a child process of its own (see
/// `child`).
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems {
        let prices = Prices::of(system, out);
        let job = crate::child::Job {
            kind: system.kind.name().to_owned(),
            url: system.url.clone(),
            run: ctx.run.clone(),
            per_refresh: prices.refresh,
            per_refresh_many: prices.refresh_many,
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

/// anylock: `leases` guards from one `Locker`, refreshed as the `Locker` schedules them
/// (in `refresh_many` batches where the backend takes them). A backend that fails
/// part-way gets a row saying how far it got and why.
pub(crate) async fn ours(system: &System, ctx: &Ctx, plan: &Plan, prices: Prices) -> Res<ScaleRow> {
    let observed = Arc::new(Observed::new(system.backend.clone(), false));
    let options = LockOptions::new(plan.scale_ttl);
    let interval = options.refresh_interval();
    let locker = Locker::new(observed.clone()).with_options(options);
    let mut row = empty_row(system, plan, interval);
    row.batch_limit = Some(observed.refresh_batch_limit());
    row.variant = match observed.refresh_batch_limit() {
        1 => "anylock (Locker): one refresh call per lease".to_owned(),
        n => format!("anylock (Locker): refresh_many, up to {n} leases a call"),
    };
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
    let counted = observed.refreshes().since(&before);
    row.lost = guards.iter().filter(|g| !g.is_held()).count();
    release_all(guards).await;
    let seconds = length.as_secs_f64();
    row.refreshes_per_s = counted.leases() as f64 / seconds;
    row.refresh_calls_per_s = Some(counted.calls() as f64 / seconds);
    row.round_trips_per_s = prices.round_trips(&counted).map(|r| r / seconds);
    row.cpu_percent = window.cpu_percent();
    row.failures = counted.failures;
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
        variant: String::new(),
        leases: plan.leases,
        ttl_s: plan.scale_ttl.as_secs_f64(),
        interval_s: interval.as_secs_f64(),
        acquire_s: None,
        rss_per_lease: None,
        refreshes_per_s: 0.0,
        refresh_calls_per_s: None,
        batch_limit: None,
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

//! Item 1: round trips and API calls per cycle. Every entry runs once more through
//! loopback taps (round trips, PostgreSQL statements) while the server's own counters are
//! read around it (Redis commandstats, etcd gRPC metrics, the GCS request log).
//!
//! The servers are shared with other clients, so each entry runs in several batches and
//! the quietest batch (fewest server-counted calls) is reported: other clients only ever
//! add calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{StreamExt, stream};
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName};
use tokio::sync::Mutex;

use crate::args::{self, Plan};
use crate::latency::entries;
use crate::op::{Entry, Op, Res, Role};
use crate::results::{CountRow, Results};
use crate::servers::{Calls, delta, describe};
use crate::system::{Ctx, Kind, System};
use crate::tap::{Protocol, Tap};

/// Label of the refresh row (used by the scale section to price a refresh).
pub(crate) const REFRESH: &str = "anylock refresh (backend call)";

/// How the label of the batched refresh row starts (the scale section prices a batched
/// call with it); the lease count follows.
pub(crate) const REFRESH_MANY: &str = "anylock refresh_many";

/// The label of a batched refresh of `leases` leases.
pub(crate) fn refresh_many_label(leases: usize) -> String {
    format!("{REFRESH_MANY} of {leases} leases (one backend call)")
}

/// Counting batches of the batched refresh: fewer units than the cycles (each unit
/// refreshes up to 1,000 leases).
const BATCH_UNITS: usize = 4;

/// Counts every system that talks to a server and appends its rows.
pub(crate) async fn run(systems: &[System], ctx: &Ctx, plan: &Plan, out: &mut Results) -> Res<()> {
    for system in systems.iter().filter(|s| !s.upstreams.is_empty()) {
        let mut taps = Vec::new();
        for upstream in &system.upstreams {
            taps.push((
                upstream.clone(),
                Tap::start(upstream, protocol(system.kind)).await?,
            ));
        }
        let addrs: HashMap<String, String> = taps
            .iter()
            .map(|(u, t)| (u.clone(), t.addr.clone()))
            .collect();
        let tapped = system.reconnect_via(ctx, &|u| addrs[u].clone()).await?;
        let mut all = entries(&tapped, ctx);
        let refresh = refresh_op(&tapped, ctx).await?;
        all.push(Entry::new(REFRESH, Role::Ours, refresh.clone()));
        let taps: Vec<&Tap> = taps.iter().map(|(_, t)| t).collect();
        for entry in &all {
            let row = count(system, &taps, entry, plan).await?;
            out.counts.push(row);
        }
        refresh.release().await?;
        // A batched refresh only where the backend batches (a `Locker` never calls
        // `refresh_many` on a backend whose limit is 1).
        let limit = tapped.backend.refresh_batch_limit();
        if limit > 1 {
            let leases = plan.batch_leases.min(limit);
            let batch = refresh_many_op(&tapped, ctx, leases).await?;
            let entry = Entry::new(refresh_many_label(leases), Role::Ours, batch.clone());
            let units = args::Plan {
                count_cycles: BATCH_UNITS,
                ..plan.clone()
            };
            out.counts.push(count(system, &taps, &entry, &units).await?);
            batch.release().await;
        }
        crate::common::progress(&format!("counts: {} done", system.kind.name()));
    }
    Ok(())
}

/// Runs `entry` in batches and returns the per-unit counts of its quietest batch.
async fn count(system: &System, taps: &[&Tap], entry: &Entry, plan: &Plan) -> Res<CountRow> {
    let tap_total = || {
        taps.iter().fold((0, 0), |(r, s), t| {
            let (r2, s2) = t.counts.get();
            (r + r2, s + s2)
        })
    };
    let n = plan.count_cycles;
    // Warm up, untimed and uncounted, on every index the batches use: each name's first use
    // is behind us (on Redis a first grant also seeds the fence counter: `TIME` + `SET`),
    // and connection pools grow (sqlx returns a connection to its pool in a task of its
    // own, so back-to-back calls open new ones until enough are idle).
    for i in 0..n * plan.count_batches.max(2) {
        let _ = entry.op.run(i).await;
    }
    let mut best: Option<((u64, u64), Option<Calls>)> = None;
    let mut last_error = None;
    for batch in 0..plan.count_batches {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before_server = snapshot(system).await?;
        let before = tap_total();
        let mut failed = None;
        for i in 0..n {
            if let Err(e) = entry.op.run(batch * n + i).await {
                failed = Some(e);
            }
        }
        let after = tap_total();
        if let Some(e) = failed {
            // A failed call has no defined count; this batch does not count.
            last_error = Some(e);
            continue;
        }
        // Redlock answers at a quorum: let the last nodes' replies land before counting.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let server = match (before_server, snapshot(system).await?) {
            (Some(b), Some(a)) => Some(delta(&b, &a)),
            _ => None,
        };
        let taps = (after.0 - before.0, after.1 - before.1);
        let quieter = match (&best, &server) {
            (None, _) => true,
            (Some((_, Some(old))), Some(new)) => total(new) < total(old),
            (Some((old, _)), _) => taps.0 < old.0,
        };
        if quieter {
            best = Some((taps, server));
        }
    }
    let Some(((round_trips, statements), server)) = best else {
        let why = last_error.map_or_else(|| "no batch ran".to_owned(), |e| e.to_string());
        return Err(format!("{}: every counting batch failed: {why}", entry.label).into());
    };
    let per = |v: u64| Some(v as f64 / n as f64);
    Ok(CountRow {
        backend: system.kind.name().to_owned(),
        label: entry.label.clone(),
        round_trips: per(round_trips),
        statements: (system.kind == Kind::Postgres).then(|| statements as f64 / n as f64),
        server_calls: server.as_ref().and_then(|s| per(total(s))),
        server_detail: server.map(|s| describe(&s, n as u64)).unwrap_or_default(),
    })
}

/// How the tap reads `kind`'s client bytes.
fn protocol(kind: Kind) -> Protocol {
    match kind {
        Kind::Postgres => Protocol::Postgres,
        Kind::Etcd => Protocol::Http2,
        _ => Protocol::Plain,
    }
}

async fn snapshot(system: &System) -> Res<Option<Calls>> {
    match &system.counter {
        Some(counter) => Ok(Some(counter.snapshot().await?)),
        None => Ok(None),
    }
}

fn total(calls: &Calls) -> u64 {
    calls.values().sum()
}

/// One lease of `system`'s backend, refreshed by every run.
async fn refresh_op(system: &System, ctx: &Ctx) -> Res<Arc<Refresh>> {
    let name = LockName::new(format!("{}-{}-refresh", ctx.run, system.kind.name()))?;
    let request = AcquireRequest::new(
        name,
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(30))?,
    );
    let Acquire::Acquired(lease) = system.backend.acquire(&request).await? else {
        return Err("a fresh name was held".into());
    };
    Ok(Arc::new(Refresh {
        backend: system.backend.clone(),
        lease: Mutex::new(lease),
    }))
}

/// `leases` leases of `system`'s backend, refreshed together by every run.
async fn refresh_many_op(system: &System, ctx: &Ctx, leases: usize) -> Res<Arc<RefreshMany>> {
    let backend = system.backend.clone();
    let requests = (0..leases).map(|i| {
        let name = format!("{}-{}-refresh-many-{i}", ctx.run, system.kind.name());
        Res::Ok(AcquireRequest::new(
            LockName::new(name)?,
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30))?,
        ))
    });
    let requests: Vec<AcquireRequest> = requests.collect::<Res<_>>()?;
    let granted: Vec<Res<Lease>> = stream::iter(requests)
        .map(|request| {
            let backend = backend.clone();
            async move {
                match backend.acquire(&request).await? {
                    Acquire::Acquired(lease) => Ok(lease),
                    Acquire::Held(_) => Err("a fresh name was held".into()),
                }
            }
        })
        .buffer_unordered(crate::common::CONCURRENCY)
        .collect()
        .await;
    let batch = RefreshMany {
        backend,
        leases: Mutex::new(Vec::with_capacity(leases)),
    };
    let mut first_error = None;
    for outcome in granted {
        match outcome {
            Ok(lease) => batch.leases.lock().await.push(lease),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        batch.release().await;
        return Err(format!("refresh_many: acquiring its leases: {e}").into());
    }
    Ok(Arc::new(batch))
}

/// Refreshes several leases with one `refresh_many` call.
struct RefreshMany {
    backend: Arc<dyn LockBackend>,
    leases: Mutex<Vec<Lease>>,
}

impl RefreshMany {
    /// Releases every lease (the counting is over); a failed release only leaves a lease
    /// to expire.
    async fn release(&self) {
        let leases = std::mem::take(&mut *self.leases.lock().await);
        stream::iter(leases)
            .for_each_concurrent(crate::common::CONCURRENCY, |lease| async move {
                let _ = self.backend.release(&lease).await;
            })
            .await;
    }
}

#[async_trait]
impl Op for RefreshMany {
    async fn run(&self, _: usize) -> Res<()> {
        let mut leases = self.leases.lock().await;
        let outcomes = self.backend.refresh_many(&leases).await;
        if outcomes.len() != leases.len() {
            return Err(format!(
                "refresh_many returned {} results for {} leases",
                outcomes.len(),
                leases.len()
            )
            .into());
        }
        for (lease, outcome) in leases.iter_mut().zip(outcomes) {
            *lease = outcome?;
        }
        Ok(())
    }
}

/// Refreshes one lease.
struct Refresh {
    backend: Arc<dyn LockBackend>,
    lease: Mutex<Lease>,
}

impl Refresh {
    /// Releases the lease (the counting is over).
    async fn release(&self) -> Res<()> {
        Ok(self.backend.release(&*self.lease.lock().await).await?)
    }
}

#[async_trait]
impl Op for Refresh {
    async fn run(&self, _: usize) -> Res<()> {
        let mut lease = self.lease.lock().await;
        *lease = self.backend.refresh(&lease).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::Kind;
    use lockcore::MemoryBackend;

    #[tokio::test]
    async fn a_batched_refresh_refreshes_every_lease_in_one_call_and_releases_them() {
        let memory = Arc::new(MemoryBackend::new().with_refresh_batch_limit(10));
        let observed = Arc::new(crate::wrap::Observed::new(memory.clone(), false));
        let system = System {
            kind: Kind::Local,
            url: String::new(),
            upstreams: Vec::new(),
            backend: observed.clone(),
            raw: None,
            extras: Vec::new(),
            peers: Vec::new(),
            floor: None,
            counter: None,
            note: String::new(),
        };
        let ctx = Ctx {
            run: "r".into(),
            ttl: Duration::from_secs(5),
            gcs_server: None,
        };
        let batch = refresh_many_op(&system, &ctx, 10).await.expect("leases");
        batch.run(0).await.expect("refresh");
        batch
            .run(1)
            .await
            .expect("refresh again, with the refreshed leases");
        let counted = observed.refreshes();
        assert_eq!((counted.calls(), counted.leases()), (2, 20), "{counted:?}");
        let name = LockName::new("r-local-refresh-many-3").expect("name");
        assert!(memory.inspect(&name).await.expect("inspect").is_some());
        // A lease lost in between fails the unit (a count of failed refreshes means nothing).
        let lease = batch.leases.lock().await[3].clone();
        memory.release(&lease).await.expect("release");
        assert!(batch.run(2).await.is_err());
        batch.release().await;
        assert!(memory.list("r-local").await.expect("list").is_empty());
    }
}

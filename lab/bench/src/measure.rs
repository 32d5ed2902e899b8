//! The timing loops: interleaved latency batches, fixed-duration throughput, and one
//! contended handoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use crate::op::{BoxError, Entry, Lock, NAMES, Op, Res};
use crate::procstat;

/// How many failed units a measurement tolerates before it gives up: the shared test
/// servers sometimes miss a tight timeout (Redlock's 50 ms per node) under load, and one
/// such miss is a fact to report, not a reason to lose the run.
pub(crate) fn error_budget(units: usize) -> u64 {
    (units as u64 / 50).max(3)
}

/// Times `per_batch` sequential runs of every entry, `batches` times, rotating which entry
/// goes first, so ours and the raw round trip see the same machine noise. The `k`-th timed
/// run of an entry uses index `k`; before any timing, each entry makes one untimed
/// [`warm_up`] pass over every index (so every name) its timed runs will use, so the timed
/// runs measure steady state and not a name's first use. Returns the samples and the
/// failed timed runs per entry, in entry order.
///
/// # Errors
/// The error that took an entry past its [`error_budget`] (in the warm-up or the timed
/// runs).
pub(crate) async fn interleaved(
    entries: &[Entry],
    batches: usize,
    per_batch: usize,
) -> Res<(Vec<Vec<Duration>>, Vec<u64>)> {
    let runs = batches * per_batch;
    let mut samples = vec![Vec::with_capacity(runs); entries.len()];
    let mut errors = vec![0; entries.len()];
    let mut done = vec![0; entries.len()];
    let budget = error_budget(runs);
    for entry in entries {
        warm_up(entry.op.as_ref(), runs.min(NAMES), budget)
            .await
            .map_err(|e| format!("{}: {e}", entry.label))?;
    }
    for batch in 0..batches {
        for k in 0..entries.len() {
            let e = (k + batch) % entries.len();
            for _ in 0..per_batch {
                let start = Instant::now();
                match entries[e].op.run(done[e]).await {
                    Ok(()) => samples[e].push(start.elapsed()),
                    Err(err) => absorb(&mut errors[e], budget, err)?,
                }
                done[e] += 1;
            }
        }
    }
    Ok((samples, errors))
}

/// One untimed pass of `op` over the indices `0..n`, in order: names get used once (on
/// Redis a name's first grant also seeds its fence counter from the server clock, a
/// one-off per name) and connection pools grow to what back-to-back runs need.
///
/// # Errors
/// When more than `budget` runs failed.
pub(crate) async fn warm_up(op: &dyn Op, n: usize, budget: u64) -> Res<()> {
    let mut errors = 0;
    for i in 0..n {
        if let Err(err) = op.run(i).await {
            absorb(&mut errors, budget, err).map_err(|e| format!("warm-up: {e}"))?;
        }
    }
    Ok(())
}

/// [`warm_up`] from `tasks` concurrent tasks, each over its own slice of the [`NAMES`]
/// (the slices [`throughput`] gives them), so every name is used once.
///
/// # Errors
/// When more than [`error_budget`]`(NAMES)` runs failed.
pub(crate) async fn warm_up_names(op: Arc<dyn Op>, tasks: usize) -> Res<()> {
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let (mut failed, mut last) = (0_u64, None);
                for k in 0..NAMES.saturating_sub(task).div_ceil(tasks) {
                    if let Err(err) = op.run(task_index(task, tasks, k)).await {
                        failed += 1;
                        last = Some(err.to_string());
                    }
                }
                (failed, last)
            })
        })
        .collect();
    let (mut failed, mut last) = (0, None);
    for handle in handles {
        let (f, l) = handle.await?;
        failed += f;
        last = l.or(last);
    }
    if failed > error_budget(NAMES) {
        let last = last.unwrap_or_default();
        return Err(format!("warm-up: {failed} failures (the last: {last})").into());
    }
    Ok(())
}

/// Counts `err` against `budget`; returns it once the budget is spent.
pub(crate) fn absorb(errors: &mut u64, budget: u64, err: BoxError) -> Res<()> {
    *errors += 1;
    if *errors > budget {
        return Err(format!("{errors} failures (the last: {err})").into());
    }
    Ok(())
}

/// The index task `task` of `tasks` uses for its `k`-th run: tasks keep to disjoint names
/// among [`NAMES`], so the cycles stay uncontended.
pub(crate) fn task_index(task: usize, tasks: usize, k: usize) -> usize {
    let own = (NAMES - task).div_ceil(tasks).max(1);
    task + tasks * (k % own)
}

/// What one [`throughput`] run measured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rate {
    /// Completed runs per second.
    pub(crate) per_second: f64,
    /// Completed runs.
    pub(crate) completed: u64,
    /// Failed runs (not counted as completed).
    pub(crate) failed: u64,
    /// This process's CPU time over the run ([`procstat::client_cpu`]).
    pub(crate) client_cpu: Duration,
    /// The whole machine's busy CPU time over the run ([`procstat::machine_busy`]);
    /// `None` without `/proc/stat`.
    pub(crate) machine_cpu: Option<Duration>,
}

/// Runs `op` from `tasks` concurrent tasks for `duration`: the rate, the failures, and the
/// CPU time this process and the whole machine spent meanwhile (with the servers on this
/// machine, the difference is mostly theirs). CPU times come from `/proc` in 10 ms ticks:
/// a second of 2 busy cores is 200 ticks, and each reading is off by at most one tick.
///
/// # Errors
/// When more than one run in 20 (and more than 3) failed.
pub(crate) async fn throughput(op: Arc<dyn Op>, tasks: usize, duration: Duration) -> Res<Rate> {
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let (client_before, machine_before) = (procstat::client_cpu(), procstat::machine_busy());
    let start = Instant::now();
    let deadline = start + duration;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (op, done, failed) = (op.clone(), done.clone(), failed.clone());
            tokio::spawn(async move {
                let mut k = 0;
                while Instant::now() < deadline {
                    let counter = if op.run(task_index(task, tasks, k)).await.is_ok() {
                        &done
                    } else {
                        &failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    k += 1;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await?;
    }
    let elapsed = start.elapsed();
    let client_cpu = procstat::client_cpu().saturating_sub(client_before);
    let machine_cpu = procstat::machine_busy()
        .zip(machine_before)
        .map(|(after, before)| after.saturating_sub(before));
    let (done, failed) = (
        done.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed) as u64,
    );
    if failed > error_budget(done * 50 / 20) {
        return Err(format!("{failed} of {} runs failed", done as u64 + failed).into());
    }
    Ok(Rate {
        per_second: done as f64 / elapsed.as_secs_f64(),
        completed: done as u64,
        failed,
        client_cpu,
        machine_cpu,
    })
}

/// How long a holder keeps a contended lock before it lets go: a random 50–150 ms, so the
/// waiter is well into its wait, at no fixed phase of its backoff.
pub(crate) fn hold() -> Duration {
    Duration::from_millis(rand::rng().random_range(50..150))
}

/// One contended handoff on `name`: a holder takes the lock, a waiter starts waiting, the
/// holder keeps it for a random 50–150 ms, then releases. Returns the time from the
/// holder's release call to the waiter holding the lock.
pub(crate) async fn handoff(lock: Arc<dyn Lock>, name: &str) -> Res<Duration> {
    let holder = lock
        .acquire(name, false)
        .await?
        .ok_or_else(|| format!("{name} was held before the handoff"))?;
    let waiter = {
        let (lock, name) = (lock.clone(), name.to_owned());
        tokio::spawn(async move {
            let held = lock.acquire(&name, true).await?;
            Res::Ok((Instant::now(), held))
        })
    };
    tokio::time::sleep(hold()).await;
    let released = Instant::now();
    lock.release(holder).await?;
    let (got, held) = waiter.await??;
    let held = held.ok_or("a waiting acquire returned without the lock")?;
    lock.release(held).await?;
    Ok(got.saturating_duration_since(released))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Ours, Role};
    use lockcore::{LockBackend, MemoryBackend};
    use std::collections::HashSet;

    #[test]
    fn errors_are_absorbed_up_to_the_budget() {
        assert_eq!(error_budget(10), 3);
        assert_eq!(error_budget(1000), 20);
        let mut errors = 0;
        for _ in 0..3 {
            absorb(&mut errors, 3, "timed out".into()).expect("within budget");
        }
        let err = absorb(&mut errors, 3, "timed out".into()).expect_err("over budget");
        assert!(err.to_string().contains("4 failures"), "{err}");
    }

    #[test]
    fn task_indices_are_disjoint_and_cover_every_name() {
        for tasks in [1, 8, 64] {
            let mut seen = HashSet::new();
            for task in 0..tasks {
                let own: HashSet<_> = (0..NAMES).map(|k| task_index(task, tasks, k)).collect();
                assert!(own.iter().all(|i| i % tasks == task && *i < NAMES));
                seen.extend(own);
            }
            assert_eq!(seen.len(), NAMES, "{tasks} tasks");
        }
    }

    /// Records the index of every run.
    #[derive(Default)]
    struct Record(std::sync::Mutex<Vec<usize>>);

    #[async_trait::async_trait]
    impl Op for Record {
        async fn run(&self, i: usize) -> Res<()> {
            self.0.lock().expect("lock").push(i % NAMES);
            Ok(())
        }
    }

    #[tokio::test]
    async fn warm_up_uses_every_name_the_timed_runs_use() {
        for (batches, per_batch) in [(2, 3), (10, 100), (3, 500)] {
            let record = Arc::new(Record::default());
            let entry = Entry::new("r", Role::Raw, record.clone());
            let entries = [entry.clone(), entry];
            interleaved(&entries, batches, per_batch)
                .await
                .expect("latency");
            let seen = record.0.lock().expect("lock").clone();
            let runs = batches * per_batch;
            let warm = runs.min(NAMES);
            // Both entries share the op: their warm-ups come first, then the timed runs.
            let (warm_up, timed) = seen.split_at(2 * warm);
            assert_eq!(timed.len(), 2 * runs);
            let warmed: HashSet<_> = warm_up.iter().collect();
            assert!(
                timed.iter().all(|i| warmed.contains(i)),
                "{batches}×{per_batch}"
            );
        }
        let record = Arc::new(Record::default());
        warm_up_names(record.clone(), 64).await.expect("warm-up");
        let mut seen = record.0.lock().expect("lock").clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..NAMES).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn loops_measure_a_memory_backend() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let lock = Arc::new(Ours::new(backend, Duration::from_secs(5)));
        let entry = Entry::cycle("ours", Role::Ours, lock.clone(), "m");
        let (samples, errors) = interleaved(std::slice::from_ref(&entry), 2, 3)
            .await
            .expect("latency");
        assert_eq!((samples[0].len(), errors[0]), (6, 0));
        let rate = throughput(entry.op.clone(), 8, Duration::from_millis(200))
            .await
            .expect("throughput");
        assert!(
            rate.per_second > 0.0 && rate.completed > 0 && rate.failed == 0,
            "{rate:?}"
        );
        // The loop ran on this process's threads for 200 ms: some CPU was counted, and
        // the machine was at least as busy as this process.
        assert!(rate.client_cpu > Duration::ZERO, "{rate:?}");
        let machine = rate.machine_cpu.expect("/proc/stat on Linux");
        assert!(
            machine + Duration::from_millis(20) >= rate.client_cpu,
            "{rate:?}"
        );
        let waited = handoff(lock, "h").await.expect("handoff");
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }
}

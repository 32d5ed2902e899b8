//! Crash failover: a leader in a child process of its own (this executable with
//! `--failover-child`) takes the election's lease with a short TTL and never refreshes it;
//! a candidate in this process starts campaigning, and [`HEAD_START`] later the child is
//! killed with SIGKILL, so nothing is released and every connection, socket and file lock
//! of the leader's is gone, as after a real crash. The sample is the time from the kill to
//! the candidate's `campaign` returning, and from the child's grant (the leader's last
//! lease write: the crash came right after a refresh, the worst case) to it, less the TTL.

use std::process::Stdio;
use std::time::Duration;

use lockcore::{Acquire, AcquireRequest, Identity, LockName, Locker, Ttl};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{Instant, timeout};

use crate::args::Plan;
use crate::common::{locker, millis, signed_millis};
use crate::measure::{absorb, error_budget};
use crate::op::Res;
use crate::results::CrashRow;
use crate::system::{Ctx, Kind, System};

/// The crashed leader's lease TTL: etcd's least (it raises shorter leases to about 2 s
/// with its default election timing), and on every backend the same, so the slack beyond
/// it compares.
pub(crate) const CRASH_TTL: Duration = Duration::from_secs(2);

/// How long the candidate campaigns before the leader is killed: past its first attempt
/// and into its wait (subscribed, queued).
pub(crate) const HEAD_START: Duration = Duration::from_millis(50);

/// How long the child may take to connect and take the lease.
const STARTUP: Duration = Duration::from_secs(30);

/// What the child prints once it leads.
const GRANTED: &str = "granted";

/// What the child does.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    /// The backend's name (`Kind::name`).
    pub(crate) kind: String,
    /// Its URL, as the parent connected it.
    pub(crate) url: String,
    /// The run tag (prefix, schema).
    pub(crate) run: String,
    /// The election's (lock) name.
    pub(crate) name: String,
    /// The lease TTL, ms.
    pub(crate) ttl_ms: u64,
}

/// `plan.crash_failovers` crashes on fresh names of `system`, one after another.
///
/// # Errors
/// When more samples failed than [`error_budget`] allows.
pub(crate) async fn measure(system: &System, ctx: &Ctx, plan: &Plan) -> Res<CrashRow> {
    let candidates = locker(system.backend.clone(), ctx.ttl, CRASH_TTL * 10);
    let budget = error_budget(plan.crash_failovers);
    let mut row = CrashRow {
        backend: system.kind.name().to_owned(),
        ttl_ms: millis(CRASH_TTL),
        samples_ms: Vec::new(),
        beyond_ttl_ms: Vec::new(),
        errors: 0,
    };
    for i in 0..plan.crash_failovers {
        loop {
            let job = Job {
                kind: system.kind.name().to_owned(),
                url: system.url.clone(),
                run: ctx.run.clone(),
                name: format!("{}-{}-crash{i}-{}", ctx.run, system.kind.name(), row.errors),
                ttl_ms: CRASH_TTL.as_millis() as u64,
            };
            match sample(&candidates, &job).await {
                Ok((from_kill, beyond_ttl)) => {
                    row.samples_ms.push(from_kill);
                    row.beyond_ttl_ms.push(beyond_ttl);
                    break;
                }
                Err(err) => absorb(&mut row.errors, budget, err)?,
            }
        }
    }
    Ok(row)
}

/// One crash: the child leads, the candidate campaigns, the child is killed. Returns the
/// time from the kill to the candidate leading and from the grant to it less the TTL,
/// both ms.
async fn sample(candidates: &Locker, job: &Job) -> Res<(f64, f64)> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--failover-child")
        .arg(serde_json::to_string(job)?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("the child has no stdout")?;
    let line = (timeout(STARTUP, BufReader::new(stdout).lines().next_line()).await)
        .map_err(|_| "the child did not lead within 30 s")??;
    let granted = Instant::now();
    if line.as_deref() != Some(GRANTED) {
        return Err(format!("the child did not lead: {line:?}").into());
    }
    let election = candidates.election(&job.name)?;
    let candidate = tokio::spawn(async move {
        let leadership = election.campaign(None).await?;
        Res::Ok((Instant::now(), leadership))
    });
    tokio::time::sleep(HEAD_START).await;
    let killed = Instant::now();
    child.start_kill()?;
    child.wait().await?;
    let (led, leadership) = candidate.await??;
    leadership.resign().await?;
    let ttl = Duration::from_millis(job.ttl_ms);
    Ok((
        signed_millis(led, killed),
        signed_millis(led, granted) - millis(ttl),
    ))
}

/// In the child: takes the lease and says so on stdout, then waits to be killed (and
/// exits on its own after a minute, so that no orphan lingers).
///
/// # Errors
/// When the backend cannot be reached or the name is held.
pub(crate) async fn child(job: &str) -> Res<()> {
    let job: Job = serde_json::from_str(job)?;
    let kind = Kind::from_name(&job.kind).ok_or_else(|| format!("unknown backend {}", job.kind))?;
    let backend = crate::connect::ours(kind, &job.url, &job.run).await?;
    let request = AcquireRequest::new(
        LockName::new(&job.name)?,
        Identity::unique(),
        Ttl::new(Duration::from_millis(job.ttl_ms))?,
    );
    let lease = match backend.acquire(&request).await? {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => return Err(format!("held by {}", holder.owner()).into()),
    };
    println!("{GRANTED}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop((lease, backend));
    Ok(())
}

//! Runs one backend's scale measurement in a child process of its own: a fresh heap, so
//! the resident-memory growth is the leases' own and not reused free space, and no other
//! section's tasks (nor the in-process GCS test server) in its CPU time.

use std::process::Stdio;

use serde::{Deserialize, Serialize};

use crate::args::Plan;
use crate::op::Res;
use crate::results::ScaleRow;
use crate::system::{Ctx, Kind, System};

/// What the child measures.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    /// The backend's name (`Kind::name`).
    pub(crate) kind: String,
    /// Its URL, as the parent connected it.
    pub(crate) url: String,
    /// The run tag (names, schema, key prefix).
    pub(crate) run: String,
    /// Round trips per refresh, from the parent's counts.
    pub(crate) per_refresh: Option<f64>,
    /// Smoke-sized plan.
    pub(crate) smoke: bool,
}

/// In the parent: runs `job` in a child process (this executable with `--scale-child`)
/// and returns the rows it printed.
///
/// # Errors
/// When the child cannot start, fails, or prints no rows.
pub(crate) async fn spawn(job: &Job) -> Res<Vec<ScaleRow>> {
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--scale-child")
        .arg(serde_json::to_string(job)?)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!("the scale child for {} failed: {}", job.kind, output.status).into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// In the child: measures anylock today and the prototype, and prints the rows as JSON.
///
/// # Errors
/// When the backend cannot be reached or a measurement fails outright.
pub(crate) async fn run(job: &str) -> Res<()> {
    let job: Job = serde_json::from_str(job)?;
    let kind = Kind::from_name(&job.kind).ok_or_else(|| format!("unknown backend {}", job.kind))?;
    let plan = if job.smoke {
        Plan::smoke()
    } else {
        Plan::full()
    };
    let ctx = Ctx {
        run: job.run,
        ttl: crate::TTL,
        gcs_server: None,
    };
    let system = System::connect(kind, &job.url, &ctx).await?;
    let mut rows = vec![crate::scale::ours(&system, &ctx, &plan, job.per_refresh).await?];
    rows.extend(crate::proto::run(&system, &ctx, &plan).await?);
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}

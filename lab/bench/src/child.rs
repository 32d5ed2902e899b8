//! Runs one backend's scale measurement in a child process of its own: a fresh heap, so
//! the resident-memory growth is the leases' own and not reused free space, and no other
//! section's tasks (nor the in-process GCS test server) in its CPU time. This module is
//! the parent's side (the [`Job`] and [`spawn`]); the child's side is `scale_child`.

use std::process::Stdio;

use serde::{Deserialize, Serialize};

use crate::op::Res;
use crate::results::ScaleRow;

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
    /// Round trips per batched refresh call (`refresh_many`), from the parent's counts.
    #[serde(default)]
    pub(crate) per_refresh_many: Option<f64>,
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

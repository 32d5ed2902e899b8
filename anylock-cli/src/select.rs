//! Choosing the backend: `--backend`, then `ANYLOCK_BACKEND` (both through clap), then
//! the config file, then the embedded default.

use std::path::PathBuf;
use std::sync::Arc;

use anylock::{BackendUrl, Config};
use lockcore::{Error, ErrorKind, LockBackend};

use crate::cli::Cli;

/// The configuration in effect.
pub(crate) fn config(cli: &Cli) -> Result<Config, Error> {
    if let Some(url) = cli
        .backend
        .as_deref()
        .filter(|_| cli.backend_on_command_line)
    {
        crate::secrets::refuse_on_command_line("--backend", url)?;
    }
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => match default_config_path().filter(|p| p.exists()) {
            Some(path) => Config::load(&path)?,
            None => Config::default(),
        },
    };
    if let Some(url) = &cli.backend {
        config.backend = Some(url.clone());
    }
    Ok(config)
}

/// The backend to use. With `CI` set (GitHub Actions, GitLab CI and most others set
/// `CI=true`) and no backend configured, the embedded default is refused: a `local:` lock
/// only excludes processes on one machine, and CI jobs run on separate, short-lived
/// runners, so it would exclude nothing. `--backend local:` (or `ANYLOCK_BACKEND=local:`)
/// still chooses it explicitly.
pub(crate) fn backend_url(config: &Config) -> Result<BackendUrl, Error> {
    if config.backend.is_none() && in_ci() {
        return Err(Error::new(
            ErrorKind::Config,
            "CI is set and no backend is configured: the embedded local: default only \
             excludes processes on one machine, and CI runners are separate machines; set \
             ANYLOCK_BACKEND (redis://, postgres://, etcd://, gs://) or pass --backend local: \
             to lock this machine only",
        ));
    }
    Ok(config.backend_url())
}

/// Variables CI systems set that `CI` alone misses (Azure Pipelines, Jenkins, AWS
/// CodeBuild, TeamCity, Buildkite); GitHub Actions and GitLab CI set `CI` too.
const CI_MARKERS: &[&str] = &[
    "TF_BUILD",
    "JENKINS_URL",
    "CODEBUILD_BUILD_ID",
    "TEAMCITY_VERSION",
    "BUILDKITE",
];

/// `CI` is set to anything but empty, `0` or `false`, or another CI system's marker is set.
fn in_ci() -> bool {
    CI_MARKERS
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
        || ci_variable()
}

fn ci_variable() -> bool {
    std::env::var("CI")
        .is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("anylock/config.toml"))
}

/// Connects to `url`, logging which backend (redacted) is used.
pub(crate) async fn connect(url: &BackendUrl) -> Result<Arc<dyn LockBackend>, Error> {
    if url.scheme() == "memory" {
        return Err(Error::new(
            ErrorKind::Config,
            "memory: keeps locks inside one process, so separate anylock commands would all \
             get the same lock; use local: (every process on this machine) or a server \
             backend (redis://, redlock://, postgres://, etcd://, gs://)",
        ));
    }
    tracing::info!(backend = %url, "connecting");
    anylock::connect(url.expose()).await
}

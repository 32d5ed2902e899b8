//! The supervised command: its own process group, signal forwarding, and stopping the
//! whole tree (children and grandchildren) when the lock is lost.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep, timeout};

use crate::exit;

/// A running command, leader of its own process group.
#[derive(Debug)]
pub(crate) struct Child {
    inner: tokio::process::Child,
    group: Pid,
}

impl Child {
    /// Starts `command` in a new process group with `env` added to its environment.
    pub(crate) fn spawn(command: &[OsString], env: &[(&str, String)]) -> io::Result<Self> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            // Its own group, so one signal reaches every process it starts.
            .process_group(0);
        let inner = cmd.spawn()?;
        let pid = inner
            .id()
            .ok_or_else(|| io::Error::other("the command exited at once"))?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(io::Error::other)?);
        Ok(Self { inner, group })
    }

    /// Waits for the command to exit. Cancel safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.inner.wait().await
    }

    /// Sends `signal` to every process in the command's group.
    pub(crate) fn signal_group(&self, signal: Signal) {
        if let Err(err) = killpg(self.group, signal) {
            tracing::debug!(%err, ?signal, "signalling the command's process group failed");
        }
    }

    fn group_alive(&self) -> bool {
        killpg(self.group, None).is_ok()
    }

    /// SIGTERM to the whole group; SIGKILL to whatever is left after `grace`, including
    /// grandchildren that outlive the command itself.
    pub(crate) async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + grace;
        self.signal_group(Signal::SIGTERM);
        let status = timeout(grace, self.inner.wait())
            .await
            .ok()
            .and_then(Result::ok);
        while self.group_alive() && Instant::now() < deadline {
            sleep(Duration::from_millis(50)).await;
        }
        self.signal_group(Signal::SIGKILL);
        match status {
            Some(status) => Some(status),
            None => self.inner.wait().await.ok(),
        }
    }
}

/// The shell convention: the command's code, or 128 + the signal that killed it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::FAILED),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(exit::FAILED),
        (None, None) => exit::FAILED,
    }
}

/// The exit code for a command that could not be started.
pub(crate) fn spawn_error_code(err: &io::Error) -> u8 {
    match err.kind() {
        io::ErrorKind::NotFound => exit::NOT_FOUND,
        io::ErrorKind::PermissionDenied => exit::NOT_EXECUTABLE,
        _ => exit::FAILED,
    }
}

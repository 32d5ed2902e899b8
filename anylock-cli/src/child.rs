//! The supervised command: the supervisor (a re-exec of `anylock`, see
//! `supervisor.rs`) leads the command's process group; signal forwarding, and stopping the
//! whole group (children and grandchildren) when the lock is lost.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::{Instant, sleep, timeout};

use lockcore::Clock;

use crate::watchdog::Watchdog;

use crate::cli::Leftovers;
use crate::supervisor::{self, Plan};
use crate::{exit, group};

/// How long SIGKILLed processes get to disappear before anylock gives up watching them.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// A running command under its supervisor, the leader of its own process group.
#[derive(Debug)]
pub(crate) struct Child {
    inner: tokio::process::Child,
    group: Pid,
}

impl Child {
    /// Starts the supervisor of `command` in a new process group with `env` added to the
    /// environment; it handles `leftovers` with `grace` once the command exits.
    pub(crate) fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        grace: Duration,
        leftovers: Leftovers,
    ) -> io::Result<Self> {
        let plan = Plan {
            parent: nix::unistd::getpid(),
            grace,
            leftovers,
            command: command.to_vec(),
        };
        // This very binary, even if its file was replaced or deleted since it started.
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg0("anylock")
            .arg(supervisor::ARG)
            .args(plan.to_args())
            .envs(env.iter().map(|(k, v)| (k, v)))
            // Its own group, so one signal reaches every process the command starts.
            .process_group(0);
        let inner = cmd.spawn()?;
        let pid = inner
            .id()
            .ok_or_else(|| io::Error::other("the supervisor exited at once"))?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(io::Error::other)?);
        Ok(Self { inner, group })
    }

    /// Waits for the supervisor to exit: the command has exited and its leftovers are
    /// gone. Cancel safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.inner.wait().await
    }

    /// The command's process group (its supervisor leads it).
    pub(crate) fn group(&self) -> Pid {
        self.group
    }

    /// Sends `signal` to every process in the command's group.
    pub(crate) fn signal_group(&self, signal: Signal) {
        if let Err(err) = killpg(self.group, signal) {
            tracing::debug!(%err, ?signal, "signalling the command's process group failed");
        }
    }

    fn group_alive(&self) -> bool {
        !group::members(self.group, None).is_empty()
    }

    /// SIGTERM to the whole group, SIGKILL to whatever is left after `grace` (at once if
    /// `grace` is zero), grandchildren that outlive the command included. Returns once the
    /// group is gone. The grace is measured on `clock`, the lease's (a suspend during it
    /// counts, as it does on the server). `watchdog` keeps watching until the supervisor
    /// has exited or the grace is over, and is stopped before the final SIGKILL.
    pub(crate) async fn stop(
        &mut self,
        grace: Duration,
        clock: &Clock,
        watchdog: Option<Watchdog>,
    ) {
        let deadline = clock.now() + grace;
        if !grace.is_zero() {
            self.signal_group(Signal::SIGTERM);
            tokio::select! {
                _ = self.inner.wait() => {}
                () = clock.sleep_until(deadline) => {}
            }
        }
        if let Some(watchdog) = watchdog {
            watchdog.stop();
        }
        while self.group_alive() && clock.now() < deadline {
            sleep(Duration::from_millis(50)).await;
        }
        self.kill_group().await;
    }

    /// SIGKILLs whatever is left of the group (normally nothing: the supervisor clears
    /// it before it exits) and waits until it is gone.
    pub(crate) async fn kill_group(&mut self) {
        // Once the supervisor is reaped and its group empty, the group's number is free for
        // the kernel to hand out again: signal it only while a member is still there.
        if !self.group_alive() {
            let _ = timeout(KILL_WAIT, self.inner.wait()).await;
            return;
        }
        let deadline = Instant::now() + KILL_WAIT;
        self.signal_group(Signal::SIGKILL);
        let _ = timeout(KILL_WAIT, self.inner.wait()).await;
        while self.group_alive() {
            if Instant::now() >= deadline {
                note!("anylock: warning: processes of the command's group survive SIGKILL");
                return;
            }
            self.signal_group(Signal::SIGKILL);
            sleep(Duration::from_millis(20)).await;
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

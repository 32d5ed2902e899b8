//! The supervisor: a re-exec of `anylock` that leads the command's process group, so the
//! group dies with `anylock`, even by SIGKILL.
//!
//! `anylock run` starts `anylock __supervise PARENT GRACE_MS LEFTOVERS -- CMD...` as the
//! leader of a new process group. The supervisor asks the kernel for SIGUSR1 when its
//! parent dies (`PR_SET_PDEATHSIG`), checks that the parent is still the one that started
//! it (it may have died before the request, the classic race), and starts the command in
//! its own group. Whenever it wakes (a signal, a child, every 100 ms) and finds its parent
//! gone, it SIGKILLs the whole group, itself included: no process of the group runs
//! once nobody refreshes the lease. When the command exits, it deals with what the command
//! left in the group (`--leftovers`) and exits with the command's code (128+N for a
//! signal N).

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::prctl;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, getppid};
use tokio::time::{Instant, sleep};

use crate::cli::Leftovers;
use crate::signals::Signals;
use crate::{exit, group};

/// The hidden first argument that makes `anylock` a supervisor.
pub(crate) const ARG: &str = "__supervise";

/// What the supervisor is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) parent: Pid,
    pub(crate) grace: Duration,
    pub(crate) leftovers: Leftovers,
    pub(crate) command: Vec<OsString>,
}

impl Plan {
    /// The arguments after [`ARG`].
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            self.parent.to_string().into(),
            self.grace.as_millis().to_string().into(),
            self.leftovers.as_str().into(),
            "--".into(),
        ];
        args.extend(self.command.iter().cloned());
        args
    }

    /// Parses what [`to_args`](Plan::to_args) wrote.
    pub(crate) fn from_args(mut args: impl Iterator<Item = OsString>) -> Option<Self> {
        let mut next = || args.next()?.into_string().ok();
        let parent = Pid::from_raw(next()?.parse().ok()?);
        let grace = Duration::from_millis(next()?.parse().ok()?);
        let leftovers = Leftovers::from_str(&next()?)?;
        (next()? == "--").then_some(())?;
        let command: Vec<OsString> = args.collect();
        (!command.is_empty()).then_some(Self {
            parent,
            grace,
            leftovers,
            command,
        })
    }
}

/// Runs the supervisor; `args` follow [`ARG`].
pub(crate) fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let Some(plan) = Plan::from_args(args) else {
        note!("anylock: {ARG} is internal to `anylock run`");
        return ExitCode::from(exit::USAGE);
    };
    // `anylock run` starts the supervisor as the leader of a new process group, the group
    // it later clears. Run by hand inside someone else's group, it would kill its caller.
    if getpgrp() != getpid() {
        note!("anylock: {ARG} is internal to `anylock run`");
        return ExitCode::from(exit::USAGE);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => ExitCode::from(runtime.block_on(supervise(&plan))),
        Err(err) => {
            note!("anylock: cannot start the supervisor: {err}");
            ExitCode::from(exit::FAILED)
        }
    }
}

async fn supervise(plan: &Plan) -> u8 {
    // SIGUSR1 is the kernel's word that the parent died; anylock never forwards it.
    let Ok(mut signals) = Signals::install(&[Signal::SIGUSR1, Signal::SIGCHLD]) else {
        return exit::FAILED;
    };
    // Orphans of the command are re-parented here, so that they are reaped.
    if prctl::set_pdeathsig(Signal::SIGUSR1).is_err() || prctl::set_child_subreaper(true).is_err() {
        return exit::FAILED;
    }
    if getppid() != plan.parent {
        return exit::FAILED; // anylock died before it could be watched: run nothing
    }
    let command = match spawn(&plan.command) {
        Ok(pid) => pid,
        Err(code) => return code,
    };
    // Only now are the signals forwarded to the group handled here (so that they do not end
    // the supervisor): one that arrived before the spawn ended the supervisor (anylock then
    // exits 128+N and nothing ran); one after it reached the command too. The kernel
    // decides which, so none is lost and none is doubled.
    let forwarded = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];
    if signals.add(&forwarded).is_err() {
        let _ = killpg(getpgrp(), Signal::SIGKILL);
        return exit::FAILED;
    }
    let code = loop {
        if let Some(code) = reap(plan, Some(command)) {
            break code;
        }
        wake(&mut signals).await;
    };
    clear_leftovers(plan, &mut signals).await;
    code
}

/// Starts the command in this process's group; on failure, the exit code to return.
fn spawn(command: &[OsString]) -> Result<Pid, u8> {
    let (program, args) = command.split_first().ok_or(exit::USAGE)?;
    match std::process::Command::new(program).args(args).spawn() {
        // Reaped by `reap` through waitpid, not by std.
        Ok(spawned) => Ok(Pid::from_raw(spawned.id() as i32)),
        Err(err) => {
            note!("anylock: cannot run {}: {err}", program.to_string_lossy());
            Err(exit::spawn_error_code(&err))
        }
    }
}

/// Kills the whole group if the parent is gone; reaps every exited child. Returns the
/// command's exit code once it has exited.
fn reap(plan: &Plan, command: Option<Pid>) -> Option<u8> {
    if getppid() != plan.parent {
        let _ = killpg(getpgrp(), Signal::SIGKILL); // this process included
        std::process::exit(i32::from(exit::LOST));
    }
    let mut code = None;
    loop {
        let (pid, exited) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, status)) => (pid, (status & 0xff) as u8),
            Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, 128 + signal as u8),
            // No child left to reap (ECHILD) or none has exited yet.
            Ok(WaitStatus::StillAlive) | Err(_) => return code,
            Ok(_) => continue,
        };
        if Some(pid) == command {
            code = Some(exited);
        }
    }
}

/// Waits for a signal, a child's exit, or 100 ms.
async fn wake(signals: &mut Signals) {
    tokio::select! {
        _ = signals.next() => {}
        () = sleep(Duration::from_millis(100)) => {}
    }
}

/// Once the command has exited: waits until the rest of the group is gone (`wait`), or
/// sends it SIGTERM and SIGKILLs what is left after the grace (`kill`).
async fn clear_leftovers(plan: &Plan, signals: &mut Signals) {
    let me = getpid();
    let others = || group::members(getpgrp(), Some(me));
    if others().is_empty() {
        return;
    }
    let deadline = match plan.leftovers {
        Leftovers::Wait => None,
        Leftovers::Kill => {
            let _ = killpg(getpgrp(), Signal::SIGTERM); // handled here, so not fatal
            Some(Instant::now() + plan.grace)
        }
    };
    loop {
        reap(plan, None);
        let left = others();
        if left.is_empty() {
            return;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            for pid in left {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        wake(signals).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_survives_its_arguments() {
        let plan = Plan {
            parent: Pid::from_raw(4242),
            grace: Duration::from_millis(1500),
            leftovers: Leftovers::Wait,
            command: vec!["sh".into(), "-c".into(), "echo -- x".into()],
        };
        assert_eq!(Plan::from_args(plan.to_args().into_iter()), Some(plan));
        let bad: [&[&str]; 4] = [
            &[],
            &["x", "1", "kill", "--", "true"],
            &["1", "1", "kill", "true"],
            &["1", "1", "kill", "--"],
        ];
        for args in bad {
            let args = args.iter().map(OsString::from);
            assert_eq!(Plan::from_args(args), None);
        }
    }
}

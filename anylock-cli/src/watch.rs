//! Watching the command while the lease is held: forwarding signals, following `anylock`'s
//! own stops (Ctrl-Z) with the command's group, stopping the group when the lock is lost,
//! releasing at the end.

use std::time::Duration;

use lockcore::{Clock, ErrorKind, LockGuard, LostReason};
use nix::sys::signal::{Signal, raise};
use tokio::time::Instant;

use crate::child::{self, Child};
use crate::cli::RunArgs;
use crate::exit;
use crate::signals::Signals;
use crate::watchdog::Watchdog;

/// The signals `anylock run` handles once it holds the lock.
pub(crate) const SIGNALS: [Signal; 5] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGTSTP,
    Signal::SIGCONT,
];

/// What ended one round of supervision.
enum Event {
    Exited(std::io::Result<std::process::ExitStatus>),
    Lost(LostReason),
    Signal(Signal),
}

/// Runs the command under `guard` until it exits or the lock is lost; returns the exit
/// code. `signals` must handle [`SIGNALS`]. If the command exits before `hold_until`, the
/// lease is left to expire then instead of being released (`--hold-at-least`). Every
/// deadline is judged on `clock`, the guard's, which counts a machine suspend.
pub(crate) async fn supervise(
    guard: LockGuard,
    args: &RunArgs,
    grace: Duration,
    hold_until: Option<Instant>,
    mut signals: Signals,
    clock: &Clock,
) -> u8 {
    let mut child = match start(&guard, args, grace) {
        Ok(child) => child,
        Err(err) => {
            note!("anylock: cannot start the command's supervisor: {err}");
            release(guard, &args.name).await;
            return exit::FAILED;
        }
    };
    // The watchdog kills the group at the lease's deadline even if this loop is late; it
    // is dropped before the supervisor could be reaped and the lease released.
    let deadline = guard.deadline();
    let mut watchdog = Some(Watchdog::start(child.group(), deadline.clone()));
    loop {
        let reason = match next_event(&mut child, &guard, &mut signals).await {
            Event::Signal(sig) => match on_signal(&child, &guard, sig) {
                Ok(()) => continue,
                Err(reason) => reason,
            },
            Event::Lost(reason) => reason,
            Event::Exited(status) => {
                let fired = watchdog.take().is_some_and(Watchdog::stop);
                if !fired {
                    return finish(child, guard, &args.name, status, hold_until, clock).await;
                }
                LostReason::ValidityExpired
            }
        };
        let ending = Ending {
            name: &args.name,
            reason: &reason,
            // What the lease had left by its last deadline, lost or not.
            grace: effective_grace(grace, &reason, deadline.left()),
            hold_until,
            clock,
        };
        return stop_on_loss(child, guard, ending, watchdog).await;
    }
}

async fn next_event(child: &mut Child, guard: &LockGuard, signals: &mut Signals) -> Event {
    tokio::select! {
        status = child.wait() => Event::Exited(status),
        reason = guard.lost() => Event::Lost(reason),
        sig = signals.next() => Event::Signal(sig),
    }
}

/// Starts the command with the lock's name and fence token in its environment, and
/// [`BACKEND_ENV`] with its secrets redacted.
fn start(guard: &LockGuard, args: &RunArgs, grace: Duration) -> std::io::Result<Child> {
    let mut env = vec![("ANYLOCK_NAME", args.name.clone())];
    if let Some(token) = guard.fence_token() {
        env.push(("ANYLOCK_FENCE_TOKEN", token.to_string()));
    }
    if let Some(redacted) = redacted_backend_env() {
        env.push((BACKEND_ENV, redacted));
    }
    Child::spawn(&args.command, &env, grace, args.leftovers)
}

/// The variable that names the backend; the command inherits it.
const BACKEND_ENV: &str = "ANYLOCK_BACKEND";

/// `ANYLOCK_BACKEND` with passwords and secret parameters replaced by `***`, when it holds
/// any: the locked command (and everything it starts, logs or uploads) must not learn the
/// lock service's credentials. A nested `anylock` in the command then fails to
/// authenticate, loudly, rather than silently using another backend; give it its own
/// credentials through a config file (`ANYLOCK_CONFIG`) instead.
fn redacted_backend_env() -> Option<String> {
    let url = std::env::var(BACKEND_ENV).ok()?;
    let redacted = anylock::redact(&url);
    (redacted != url).then_some(redacted)
}

/// Forwards `sig`, or follows anylock's own stop. `Err` when the lease ran out while
/// anylock was stopped.
fn on_signal(child: &Child, guard: &LockGuard, sig: Signal) -> Result<(), LostReason> {
    match sig {
        Signal::SIGTSTP => {
            // Nobody refreshes the lease while anylock is stopped, so the command must not
            // run either. SIGSTOP, because a command may ignore SIGTSTP.
            tracing::info!("stopping the command's process group, then anylock");
            child.signal_group(Signal::SIGSTOP);
            let _ = raise(Signal::SIGSTOP);
            resume(child, guard)
        }
        Signal::SIGCONT => resume(child, guard),
        _ => {
            tracing::info!(?sig, "forwarding to the command's process group");
            child.signal_group(sig);
            Ok(())
        }
    }
}

/// After anylock was stopped: the command's group continues only if the lease is still
/// valid; otherwise it stays stopped until it is killed.
fn resume(child: &Child, guard: &LockGuard) -> Result<(), LostReason> {
    if guard.is_held() {
        child.signal_group(Signal::SIGCONT);
        Ok(())
    } else {
        Err(LostReason::ValidityExpired)
    }
}

/// The grace the command gets after a loss: none when the lease is already gone (the
/// backend says someone else owns it, or its validity ran out), and never longer than the
/// lease has `left`, after which the server may grant the lock to someone else.
pub(crate) fn effective_grace(grace: Duration, reason: &LostReason, left: Duration) -> Duration {
    match reason {
        LostReason::NotOwner(_) | LostReason::ValidityExpired => Duration::ZERO,
        _ => grace.min(left),
    }
}

/// How a lost lease ends the command.
struct Ending<'a> {
    name: &'a str,
    reason: &'a LostReason,
    grace: Duration,
    hold_until: Option<Instant>,
    clock: &'a Clock,
}

async fn stop_on_loss(
    mut child: Child,
    guard: LockGuard,
    ending: Ending<'_>,
    watchdog: Option<Watchdog>,
) -> u8 {
    let Ending {
        name,
        reason,
        grace,
        hold_until,
        clock,
    } = ending;
    let how = if grace.is_zero() {
        "SIGKILL at once: the lease is gone".to_owned()
    } else {
        format!(
            "SIGTERM, SIGKILL after {}",
            humantime::format_duration(round_ms(grace))
        )
    };
    note!("anylock: lock {name} lost ({reason}); stopping the command ({how})");
    child.stop(grace, clock, watchdog).await;
    if hold_until.is_some_and(|until| until > clock.now()) {
        // `--hold-at-least`: a lease lost to failed refreshes may still be held by the
        // server; releasing it could free the lock before the time asked. Let it expire.
        let _ = guard.detach().await;
    } else {
        drop(guard);
    }
    exit::LOST
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn finish(
    mut child: Child,
    guard: LockGuard,
    name: &str,
    status: std::io::Result<std::process::ExitStatus>,
    hold_until: Option<Instant>,
    clock: &Clock,
) -> u8 {
    // The supervisor clears the group before it exits; if it was killed, do it here.
    child.kill_group().await;
    let code = match status {
        Ok(status) => child::exit_code(status),
        Err(err) => {
            note!("anylock: lost track of the command: {err}");
            exit::FAILED
        }
    };
    let left = hold_until.map(|until| until.saturating_duration_since(clock.now()));
    if let Some(left) = left.filter(|left| !left.is_zero()) {
        return leave(guard, name, left, code).await;
    }
    if release(guard, name).await {
        code
    } else {
        exit::LOST
    }
}

/// `--hold-at-least`: the command finished `left` too early; the lease is refreshed once
/// to expire `left` from now and not released. Returns the command's `code`, or 122 if
/// the lease had been lost, 125 if it could not be left held (reported either way).
async fn leave(guard: LockGuard, name: &str, left: Duration, code: u8) -> u8 {
    match guard.leave_for(left).await {
        Ok(lease) => {
            tracing::info!(lock = name, ttl = ?lease.ttl(), "left held for --hold-at-least");
            code
        }
        Err(err) => {
            note!(
                "anylock: the command finished (exit code {code}), but lock {name} could not \
                 be left held for the rest of --hold-at-least ({}): {err}",
                humantime::format_duration(round_ms(left))
            );
            if err.kind() == ErrorKind::Lost {
                exit::LOST
            } else {
                exit::FAILED
            }
        }
    }
}

/// Releases; `false` when the lease had been lost before the release (the command's work
/// may have overlapped another holder's).
async fn release(guard: LockGuard, name: &str) -> bool {
    match guard.release().await {
        Ok(()) => true,
        Err(err) if err.kind() == ErrorKind::Lost => {
            note!(
                "anylock: the command finished, but lock {name} was lost before release; \
                 its work may have overlapped another holder's"
            );
            false
        }
        Err(err) => {
            note!("anylock: warning: release failed ({err}); the lease expires by its TTL");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_never_outlasts_the_lease() {
        let s = Duration::from_secs;
        let failures = LostReason::TooManyFailures {
            failures: 3,
            last: "timeout".into(),
        };
        assert_eq!(effective_grace(s(10), &failures, s(4)), s(4));
        assert_eq!(effective_grace(s(1), &failures, s(4)), s(1));
        let failed = LostReason::RefreshFailed("denied".into());
        assert_eq!(
            effective_grace(s(10), &failed, Duration::ZERO),
            Duration::ZERO
        );
        let taken = LostReason::NotOwner("deleted".into());
        assert_eq!(effective_grace(s(10), &taken, s(4)), Duration::ZERO);
        assert_eq!(
            effective_grace(s(10), &LostReason::ValidityExpired, s(4)),
            Duration::ZERO
        );
    }
}

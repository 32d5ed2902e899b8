//! The watchdog: a thread that SIGKILLs the command's process group once the lease's
//! validity has passed on `CLOCK_BOOTTIME`, whatever the async runtime is doing.
//!
//! The supervision loop (`watch.rs`) stops the command when the guard reports the lease
//! lost, which it learns on the runtime: within [`lockcore::RESUME_CHECK`] after a machine
//! resumes from a suspend, and late if the runtime is starved. The watchdog is the
//! backstop for both: it sleeps on a timer of the clock that counts a suspend, which the
//! kernel fires as the machine resumes, and it kills from its own thread with one system
//! call. Linux only (`timerfd` on `CLOCK_BOOTTIME`); elsewhere it does nothing, and the
//! supervision loop alone stops the command.

use std::time::Duration;

use nix::unistd::Pid;

/// Kills `group` once the lease runs out; moved later with [`Watchdog::extend`].
#[derive(Debug)]
pub(crate) struct Watchdog {
    #[cfg(target_os = "linux")]
    inner: Option<linux::Inner>,
}

impl Watchdog {
    /// Starts watching: `group` is killed `left` from now unless extended. Without a
    /// timer (not Linux, or the kernel refused one) it watches nothing.
    pub(crate) fn start(group: Pid, left: Duration) -> Self {
        #[cfg(target_os = "linux")]
        {
            let inner = linux::Inner::start(group, left)
                .map_err(|err| tracing::debug!(%err, "no watchdog: cannot make a timer"))
                .ok();
            Self { inner }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (group, left);
            Self {}
        }
    }

    /// The lease is valid for `left` from now.
    pub(crate) fn extend(&self, left: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(inner) = &self.inner {
            inner.extend(left);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = left;
    }

    /// Whether the watchdog killed the group.
    pub(crate) fn fired(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.inner.as_ref().is_some_and(linux::Inner::fired)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::thread::JoinHandle;
    use std::time::Duration;

    use nix::sys::signal::{Signal, killpg};
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    use nix::unistd::Pid;

    /// Deadline value that tells the thread to end.
    const STOP: i64 = i64::MIN;

    #[derive(Debug)]
    struct Shared {
        timer: TimerFd,
        /// On `CLOCK_BOOTTIME`, in nanoseconds; [`STOP`] to end.
        deadline: AtomicI64,
        fired: AtomicBool,
        group: Pid,
    }

    #[derive(Debug)]
    pub(super) struct Inner {
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
    }

    impl Inner {
        pub(super) fn start(group: Pid, left: Duration) -> nix::Result<Self> {
            let timer = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC)?;
            let shared = Arc::new(Shared {
                timer,
                deadline: AtomicI64::new(after(left)),
                fired: AtomicBool::new(false),
                group,
            });
            let watched = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("anylock-watchdog".into())
                .spawn(move || watch(&watched))
                .map_err(|_| nix::Error::EAGAIN)?;
            Ok(Self {
                shared,
                thread: Some(thread),
            })
        }

        /// A later deadline only: the thread wakes at the one it armed and re-arms.
        pub(super) fn extend(&self, left: Duration) {
            self.shared
                .deadline
                .fetch_max(after(left), Ordering::SeqCst);
        }

        pub(super) fn fired(&self) -> bool {
            self.shared.fired.load(Ordering::SeqCst)
        }
    }

    impl Drop for Inner {
        fn drop(&mut self) {
            self.shared.deadline.store(STOP, Ordering::SeqCst);
            // A deadline in the past wakes the thread at once.
            let _ = arm(&self.shared.timer, 1);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    fn watch(shared: &Shared) {
        loop {
            let deadline = shared.deadline.load(Ordering::SeqCst);
            if deadline == STOP || arm(&shared.timer, deadline).is_err() {
                return;
            }
            if shared.timer.wait().is_err() {
                return;
            }
            let deadline = shared.deadline.load(Ordering::SeqCst);
            if deadline == STOP {
                return;
            }
            if now() >= deadline {
                shared.fired.store(true, Ordering::SeqCst);
                let _ = killpg(shared.group, Signal::SIGKILL);
                return;
            }
        }
    }

    fn arm(timer: &TimerFd, at: i64) -> nix::Result<()> {
        let at = TimeSpec::from_duration(Duration::from_nanos(u64::try_from(at).unwrap_or(1)));
        timer.set(
            Expiration::OneShot(at),
            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        )
    }

    /// `CLOCK_BOOTTIME` now, in nanoseconds.
    fn now() -> i64 {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(i64::MAX, |t| {
            t.tv_sec()
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec())
        })
    }

    fn after(left: Duration) -> i64 {
        now().saturating_add(i64::try_from(left.as_nanos()).unwrap_or(i64::MAX))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::time::Instant;

    use super::*;

    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .expect("sleep")
    }

    fn group(child: &std::process::Child) -> Pid {
        Pid::from_raw(i32::try_from(child.id()).expect("pid"))
    }

    #[test]
    fn kills_the_group_when_the_lease_runs_out() {
        let mut child = sleeper();
        let watchdog = Watchdog::start(group(&child), Duration::from_millis(100));
        let started = Instant::now();
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(started.elapsed() >= Duration::from_millis(90));
        assert!(watchdog.fired());
    }

    #[test]
    fn an_extended_lease_is_not_killed_and_a_dropped_watchdog_kills_nothing() {
        let mut child = sleeper();
        let watchdog = Watchdog::start(group(&child), Duration::from_millis(100));
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(50));
            watchdog.extend(Duration::from_millis(100));
        }
        drop(watchdog);
        std::thread::sleep(Duration::from_millis(200));
        assert!(child.try_wait().expect("try_wait").is_none(), "killed");
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}

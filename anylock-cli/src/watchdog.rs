//! The watchdog: a thread that SIGKILLs the command's process group once the lease's
//! local validity deadline has passed, whatever the async runtime is doing.
//!
//! The supervision loop (`watch.rs`) stops the command when the guard reports the lease
//! lost, which it learns on the runtime: within [`lockcore::RESUME_CHECK`] after a machine
//! resumes from a suspend, and late if the runtime is starved. The watchdog is the
//! backstop for both. It reads the guard's [`Deadline`] (on the guard's clock, which
//! counts a suspend) and sleeps until then, at most [`RECHECK`] at a time, on a timer of
//! `CLOCK_BOOTTIME`, which the kernel fires as the machine resumes; past the deadline it
//! kills from its own thread with one system call. It is stopped as soon as the command's
//! supervisor is seen to exit (the runtime reaps it then; its group id is free a moment
//! later), and before the lease is released.
//! Linux only (`timerfd`); elsewhere it does nothing, and the supervision loop alone
//! stops the command.

use lockcore::Deadline;
use nix::unistd::Pid;

/// The longest the watchdog sleeps before reading the deadline again (a refresh moves it
/// later; one that granted a shorter TTL, sooner).
#[cfg(target_os = "linux")]
const RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Kills `group` once the lease's deadline passes.
#[derive(Debug)]
pub(crate) struct Watchdog {
    #[cfg(target_os = "linux")]
    inner: Option<linux::Inner>,
}

impl Watchdog {
    /// Starts watching `deadline` for `group`. Without a timer (not Linux, or the kernel
    /// refused one) it watches nothing, and says so.
    pub(crate) fn start(group: Pid, deadline: Deadline) -> Self {
        #[cfg(target_os = "linux")]
        {
            let inner = linux::Inner::start(group, deadline)
                .map_err(|err| {
                    note!(
                        "anylock: warning: no watchdog ({err}): after a machine suspend the \
                         command is stopped within 100 ms of the resume, not at once"
                    );
                })
                .ok();
            Self { inner }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (group, deadline);
            Self {}
        }
    }

    /// Stops watching (the thread has ended when this returns); whether it killed the
    /// group.
    pub(crate) fn stop(self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.inner.is_some_and(linux::Inner::stop)
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
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::JoinHandle;
    use std::time::Duration;

    use lockcore::Deadline;
    use nix::sys::signal::{Signal, killpg};
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    use nix::unistd::Pid;

    use super::RECHECK;

    #[derive(Debug)]
    struct Shared {
        timer: TimerFd,
        deadline: Deadline,
        stop: AtomicBool,
        fired: AtomicBool,
        group: Pid,
    }

    #[derive(Debug)]
    pub(super) struct Inner {
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
    }

    impl Inner {
        pub(super) fn start(group: Pid, deadline: Deadline) -> std::io::Result<Self> {
            let timer = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC)?;
            let shared = Arc::new(Shared {
                timer,
                deadline,
                stop: AtomicBool::new(false),
                fired: AtomicBool::new(false),
                group,
            });
            let watched = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("anylock-watchdog".into())
                .spawn(move || watch(&watched))?;
            Ok(Self {
                shared,
                thread: Some(thread),
            })
        }

        pub(super) fn stop(mut self) -> bool {
            self.end();
            self.shared.fired.load(Ordering::SeqCst)
        }

        fn end(&mut self) {
            self.shared.stop.store(true, Ordering::SeqCst);
            // A deadline in the past wakes the thread at once; a thread that armed its own
            // timer after this sees `stop` before it waits.
            let _ = arm(&self.shared.timer, Duration::from_nanos(1));
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    impl Drop for Inner {
        fn drop(&mut self) {
            self.end();
        }
    }

    fn watch(shared: &Shared) {
        loop {
            // The boot clock first: the deadline below errs early, never late.
            let Some(boot) = now() else { return };
            let left = shared.deadline.left();
            if left.is_zero() {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                shared.fired.store(true, Ordering::SeqCst);
                let _ = killpg(shared.group, Signal::SIGKILL);
                return;
            }
            if arm(&shared.timer, boot + left.min(RECHECK)).is_err()
                || shared.stop.load(Ordering::SeqCst)
                || shared.timer.wait().is_err()
                || shared.stop.load(Ordering::SeqCst)
            {
                return;
            }
        }
    }

    fn arm(timer: &TimerFd, at: Duration) -> nix::Result<()> {
        let at = Expiration::OneShot(TimeSpec::from_duration(at));
        timer.set(at, TimerSetTimeFlags::TFD_TIMER_ABSTIME)
    }

    /// `CLOCK_BOOTTIME` now.
    fn now() -> Option<Duration> {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
        Some(Duration::new(
            u64::try_from(t.tv_sec()).ok()?,
            u32::try_from(t.tv_nsec()).ok()?,
        ))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use lockcore::{LockOptions, Locker, MemoryBackend};

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

    /// A lease nothing refreshes (TTL 300 ms, refreshed only by a keeper that never runs:
    /// the runtime is blocked in this thread) is killed at its deadline.
    #[test]
    fn kills_the_group_at_the_deadline_of_a_lease_nobody_refreshes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let locker = Locker::new(Arc::new(MemoryBackend::new()))
            .with_options(LockOptions::new(Duration::from_millis(300)));
        let guard = runtime.block_on(locker.acquire("job")).expect("free");
        let mut child = sleeper();
        let started = Instant::now();
        let watchdog = Watchdog::start(group(&child), guard.deadline());
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(9));
        // The deadline is 267 ms after the grant (300 ms less the 33 ms allowance): killed
        // at it, not before, and before the server could let the next holder in.
        let killed = started.elapsed();
        assert!(
            killed >= Duration::from_millis(200),
            "killed early, at {killed:?}"
        );
        assert!(
            killed < Duration::from_millis(300),
            "killed late, at {killed:?}"
        );
        assert!(watchdog.stop());
    }

    /// A refreshed lease, whatever its TTL (down to 50 ms: refreshed every 6 ms), is never
    /// killed; a dropped watchdog kills nothing.
    #[test]
    fn a_refreshed_lease_is_not_killed_and_a_dropped_watchdog_kills_nothing() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        for ttl in [50, 1000] {
            let locker = Locker::new(Arc::new(MemoryBackend::new()))
                .with_options(LockOptions::new(Duration::from_millis(ttl)));
            let guard = runtime.block_on(locker.acquire("job")).expect("free");
            let mut child = sleeper();
            let watchdog = Watchdog::start(group(&child), guard.deadline());
            std::thread::sleep(Duration::from_millis(3 * ttl.max(200)));
            assert!(!watchdog.stop(), "TTL {ttl} ms: killed while refreshed");
            runtime.block_on(guard.release()).expect("released");
            std::thread::sleep(Duration::from_millis(2 * ttl));
            assert!(child.try_wait().expect("try_wait").is_none(), "killed");
            child.kill().expect("kill");
            child.wait().expect("wait");
        }
    }
}

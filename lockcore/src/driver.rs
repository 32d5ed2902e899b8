//! The lease refresher: the task that owns a held lease's timers and backend calls.
//!
//! It alternates between an idle phase (waiting for the next refresh, the validity
//! deadline, or a command from the guard) and a refresh phase (one backend call raced
//! against the same deadline and commands). Every outcome becomes an
//! [`Event`](crate::state::Event) fed to the pure [`transition`](crate::state::transition).
//! The validity deadline is checked in both phases, so a refresh that never returns cannot
//! keep the guard Healthy past its validity.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use crate::attempt::Slot;
use crate::backend::LockBackend;
use crate::batch::Refresher;
use crate::clock::Clock;
use crate::error::{Error, ErrorKind, Result, RetryStatus};
use crate::options::LockOptions;
use crate::state::{Event, Health, LostReason, transition};
use crate::ttl::Ttl;
use crate::types::Lease;

/// State the guard reads and the driver writes.
#[derive(Debug)]
pub(crate) struct Shared {
    lease: Mutex<Lease>,
    /// On `clock`'s time line.
    validity: Mutex<Instant>,
    pub(crate) clock: Clock,
    pub(crate) cancel: CancellationToken,
}

impl Shared {
    pub(crate) fn new(lease: Lease, validity: Instant, clock: Clock) -> Self {
        Self {
            lease: Mutex::new(lease),
            validity: Mutex::new(validity),
            clock,
            cancel: CancellationToken::new(),
        }
    }

    pub(crate) fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn validity(&self) -> Instant {
        *self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, lease: Lease, validity: Instant) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = lease;
        *self.validity.lock().unwrap_or_else(PoisonError::into_inner) = validity;
    }
}

/// What the guard asks of the driver.
#[derive(Debug)]
pub(crate) enum Command {
    /// Release and report the outcome.
    Release(oneshot::Sender<Result<()>>),
    /// The guard was dropped: release best-effort.
    Abandon,
    /// Refresh once with this TTL (none: keep the TTL), detach, stop without releasing;
    /// report the lease.
    Leave(Option<Duration>, oneshot::Sender<Result<Lease>>),
}

/// The refresher task's state.
#[derive(Debug)]
pub(crate) struct Driver {
    pub(crate) backend: Arc<dyn LockBackend>,
    /// How this guard's scheduled refreshes reach the backend (alone or in batches).
    pub(crate) refresher: Refresher,
    pub(crate) shared: Arc<Shared>,
    pub(crate) options: LockOptions,
    pub(crate) health: watch::Sender<Health>,
    pub(crate) commands: mpsc::UnboundedReceiver<Command>,
    /// The owner's slot for this lock: while it lives, no other attempt by this owner for
    /// this lock starts in this process. Dropped with the driver, after the release.
    pub(crate) _slot: Slot,
}

/// What ended a phase.
enum Step {
    Refresh,
    Refreshed(Instant, Result<Lease>),
    Expired,
    Command(Option<Command>),
}

impl Driver {
    /// Runs until the lease is released, abandoned, or lost and the guard is gone.
    pub(crate) async fn run(mut self, first_refresh: Instant) {
        let mut next_refresh = first_refresh;
        loop {
            let step = self.idle(next_refresh).await;
            let step = match step {
                Step::Refresh => self.refresh().await,
                other => other,
            };
            match step {
                Step::Refreshed(sent, result) => next_refresh = self.on_refreshed(sent, result),
                Step::Expired => self.apply(Event::ValidityExpired),
                Step::Command(cmd) => return self.finish(cmd).await,
                Step::Refresh => {}
            }
            if let Health::Lost(reason) = self.current() {
                return self.after_lost(reason).await;
            }
        }
    }

    async fn idle(&mut self, next_refresh: Instant) -> Step {
        let validity = self.shared.validity();
        let clock = &self.shared.clock;
        tokio::select! {
            biased;
            cmd = self.commands.recv() => Step::Command(cmd),
            () = clock.sleep_until(validity) => Step::Expired,
            () = clock.sleep_until(next_refresh) => Step::Refresh,
        }
    }

    async fn refresh(&mut self) -> Step {
        let validity = self.shared.validity();
        let lease = self.shared.lease();
        let clock = &self.shared.clock;
        let sent = clock.now();
        let limit = sent + self.options.refresh_timeout();
        tokio::select! {
            biased;
            cmd = self.commands.recv() => Step::Command(cmd),
            () = clock.sleep_until(validity) => Step::Expired,
            result = self.refresher.refresh(&lease, self.options.refresh_interval()) => {
                Step::Refreshed(sent, result)
            }
            () = clock.sleep_until(limit) => Step::Refreshed(sent, Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!("refresh got no reply within {:?}", self.options.refresh_timeout()),
            ))),
        }
    }

    fn on_refreshed(&mut self, sent: Instant, result: Result<Lease>) -> Instant {
        let old = self.shared.lease();
        let event = match result {
            Ok(lease) if lease.token() != old.token() => Event::PermanentFailure(format!(
                "backend changed the fence token on refresh ({:?} -> {:?})",
                old.token(),
                lease.token()
            )),
            Ok(lease) => {
                let ttl = lease.ttl().get().min(self.options.ttl());
                let validity = (sent + ttl)
                    .checked_sub(self.options.drift())
                    .unwrap_or(sent);
                self.shared.update(lease, validity);
                Event::Refreshed
            }
            Err(err) => {
                let err = err.in_context(self.backend.backend_name(), old.name());
                tracing::debug!(error = %err, "lease refresh failed");
                Event::from_refresh_error(&err)
            }
        };
        self.apply(event);
        let interval = self.options.refresh_interval();
        self.refresher.schedule(sent + interval, interval)
    }

    fn current(&self) -> Health {
        self.health.borrow().clone()
    }

    fn apply(&mut self, event: Event) {
        let next = transition(&self.current(), event, self.options.max_refresh_failures());
        if next != self.current() {
            if let Health::Lost(reason) = &next {
                let name = self.shared.lease().name().clone();
                tracing::warn!(lock = %name, %reason, "lease lost");
            }
            self.health.send_replace(next);
        }
    }

    async fn finish(mut self, cmd: Option<Command>) {
        if let Some(Command::Leave(ttl, reply)) = cmd {
            return self.leave(ttl, reply).await;
        }
        let lease = self.shared.lease();
        // A starved refresher may see the command only after the validity ran out: then
        // the critical section was not protected to the end, and release says so.
        if self.shared.clock.now() >= self.shared.validity() {
            self.apply(Event::ValidityExpired);
            return self.after_lost_with(LostReason::ValidityExpired, cmd).await;
        }
        self.apply(Event::Released);
        self.shared.cancel.cancel();
        let result = self.release_bounded(&lease).await;
        match cmd {
            Some(Command::Release(reply)) => {
                let _ = reply.send(result);
            }
            // `Leave` returned above.
            Some(Command::Abandon | Command::Leave(..)) | None => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "best-effort release on drop failed");
                }
            }
        }
    }

    /// [`LockGuard::leave_for`](crate::LockGuard::leave_for): one refresh with `ttl`, raced
    /// against the validity deadline and bounded like every refresh, then the backend's
    /// [`detach`](LockBackend::detach); stops without releasing in every case.
    /// [`LockGuard::detach`](crate::LockGuard::detach): the same without the refresh.
    async fn leave(mut self, ttl: Option<Duration>, reply: oneshot::Sender<Result<Lease>>) {
        let result = self.leave_once(ttl).await;
        let name = self.shared.lease().name().clone();
        let result = result.map_err(|e| e.in_context(self.backend.backend_name(), &name));
        if result.is_ok() {
            self.apply(Event::Released);
        }
        self.shared.cancel.cancel();
        let _ = reply.send(result);
    }

    async fn leave_once(&mut self, ttl: Option<Duration>) -> Result<Lease> {
        let old = self.shared.lease();
        let validity = self.shared.validity();
        if self.shared.clock.now() >= validity {
            self.apply(Event::ValidityExpired);
            return Err(Error::lost(format!(
                "the lease was lost before it could be left: {}",
                LostReason::ValidityExpired
            )));
        }
        let lease = match ttl {
            Some(ttl) => self.refresh_with(old, validity, ttl).await?,
            None => old,
        };
        let detach = timeout(self.options.refresh_timeout(), self.backend.detach(&lease)).await;
        match detach {
            Ok(result) => result.map(|()| lease),
            Err(_) => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                "detach got no reply in time; the lease may end when this process exits",
            )),
        }
    }

    /// One refresh of `old` with `ttl`; the lease as the server set it.
    async fn refresh_with(
        &mut self,
        old: Lease,
        validity: Instant,
        ttl: Duration,
    ) -> Result<Lease> {
        let clock = self.shared.clock.clone();
        let sent = clock.now();
        let limit = sent + self.options.refresh_timeout();
        let asked = old.clone().with_ttl(Ttl::new(ttl)?);
        let result = tokio::select! {
            biased;
            () = clock.sleep_until(validity) => Err(Error::lost(format!(
                "the lease was lost while leaving it: {}",
                LostReason::ValidityExpired
            ))),
            result = self.backend.refresh(&asked) => result,
            () = clock.sleep_until(limit) => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!("refresh got no reply within {:?}", self.options.refresh_timeout()),
            )),
        };
        let lease = match result {
            Ok(lease) if lease.token() != old.token() => {
                let event = Event::PermanentFailure("backend changed the fence token".into());
                self.apply(event);
                return Err(Error::lost(
                    "the backend changed the fence token on refresh",
                ));
            }
            Ok(lease) => lease,
            Err(err) => {
                if err.kind() == ErrorKind::Lost {
                    self.apply(Event::from_refresh_error(&err));
                }
                return Err(err);
            }
        };
        if lease.ttl().get() < ttl {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "the backend set a TTL of {:?}, shorter than the {ttl:?} asked; the lease \
                     expires then",
                    lease.ttl()
                ),
            ));
        }
        let validity = (sent + lease.ttl().get())
            .checked_sub(self.options.drift())
            .unwrap_or(sent);
        self.shared.update(lease.clone(), validity);
        Ok(lease)
    }

    /// After `Lost`, never releases on the holder's behalf: the application may still be
    /// finishing a step it started while `is_held()` said yes, and releasing now would hand
    /// the lock over under it (the reliability harness caught exactly that after a client
    /// clock jump). The lease stays until the application releases or drops the guard
    /// (then a compare-and-delete, safe even if someone else holds the lock by now) or
    /// until it expires on the server.
    async fn after_lost(mut self, reason: LostReason) {
        self.shared.cancel.cancel();
        let cmd = self.commands.recv().await;
        self.after_lost_with(reason, cmd).await;
    }

    /// Answers the guard's command after `Lost`: releases only when the lease may still
    /// be ours, and tells a `release()` caller that the lease was lost.
    async fn after_lost_with(self, reason: LostReason, cmd: Option<Command>) {
        self.shared.cancel.cancel();
        let lease = self.shared.lease();
        // Leaving promises never to release: the caller wants the lease to outlive it
        // (`--hold-at-least`), and a lease that may still be held must stay so.
        let leaving = matches!(cmd, Some(Command::Leave(..)));
        let released = if reason.may_still_be_held() && !leaving {
            self.release_bounded(&lease).await
        } else {
            Ok(())
        };
        if let Err(err) = &released {
            tracing::debug!(error = %err, "release after a lost lease failed; it expires by its TTL");
        }
        let lost = |what: &str| {
            let err = Error::lost(format!("the lease was lost before {what}: {reason}"))
                .in_context(self.backend.backend_name(), lease.name());
            if matches!(reason, LostReason::TooManyFailures { .. }) {
                err.with_status(RetryStatus::Persistent)
            } else {
                err
            }
        };
        match cmd {
            Some(Command::Release(reply)) => {
                let _ = reply.send(Err(lost("release")));
            }
            Some(Command::Leave(_, reply)) => {
                let _ = reply.send(Err(lost("it could be left to expire")));
            }
            Some(Command::Abandon) | None => {}
        }
    }

    async fn release_bounded(&self, lease: &Lease) -> Result<()> {
        let limit = self.options.acquire_timeout().min(Duration::from_secs(30));
        let name = lease.name();
        match timeout(limit, self.backend.release(lease)).await {
            Ok(result) => result.map_err(|e| e.in_context(self.backend.backend_name(), name)),
            Err(_) => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!("release got no reply within {limit:?}; the lease expires by its TTL"),
            )
            .in_context(self.backend.backend_name(), name)),
        }
    }
}

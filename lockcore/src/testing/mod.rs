//! Test helpers (feature `testing`): a backend wrapper that injects scripted faults.

mod broken;

pub use broken::{Broken, Defect};

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{LockBackend, ReleaseEvents};
use crate::error::{Error, ErrorKind, Result};
use crate::guarantees::Guarantees;
use crate::name::LockName;
use crate::types::{Acquire, AcquireRequest, HolderInfo, Lease};

/// A backend operation, for scripting faults per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LockBackend::acquire`].
    Acquire,
    /// [`LockBackend::refresh`].
    Refresh,
    /// [`LockBackend::release`].
    Release,
    /// [`LockBackend::inspect`].
    Inspect,
}

/// What a faulty call does instead of (or before) reaching the inner backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Forward to the inner backend.
    Pass,
    /// Fail with this error kind without reaching the backend.
    Fail(ErrorKind),
    /// Never return (a blackholed connection).
    Hang,
    /// Forward to the backend, then report [`ErrorKind::OutcomeUnknown`] (reply lost).
    LoseReply,
    /// Forward to the backend after this delay (a slow network).
    Delay(Duration),
}

/// Wraps a backend and injects faults: a standing fault per operation, plus a script of
/// one-shot faults consumed first. Counts calls per operation.
#[derive(Debug, Clone)]
pub struct FaultyBackend {
    inner: Arc<dyn LockBackend>,
    state: Arc<Mutex<FaultState>>,
}

#[derive(Debug, Default)]
struct FaultState {
    standing: HashMap<Op, Fault>,
    script: HashMap<Op, VecDeque<Fault>>,
    calls: HashMap<Op, usize>,
    /// Calls in flight now, and the most seen at once, per operation.
    in_flight: HashMap<Op, (usize, usize)>,
    no_notifications: bool,
}

impl FaultyBackend {
    /// Wraps `inner`, passing every call through until told otherwise.
    pub fn new(inner: Arc<dyn LockBackend>) -> Self {
        Self {
            inner,
            state: Arc::default(),
        }
    }

    /// Sets the standing fault for `op`.
    pub fn set(&self, op: Op, fault: Fault) {
        self.state().standing.insert(op, fault);
    }

    /// Sets the standing fault for every operation.
    pub fn set_all(&self, fault: Fault) {
        for op in [Op::Acquire, Op::Refresh, Op::Release, Op::Inspect] {
            self.set(op, fault);
        }
    }

    /// Queues one-shot faults for `op`, consumed before the standing fault.
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) {
        self.state().script.entry(op).or_default().extend(faults);
    }

    /// Hides the inner backend's release notifications, so waiters must poll.
    pub fn disable_notifications(&self) {
        self.state().no_notifications = true;
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: Op) -> usize {
        self.state().calls.get(&op).copied().unwrap_or(0)
    }

    /// The most calls of `op` that were in flight at once.
    pub fn max_in_flight(&self, op: Op) -> usize {
        self.state().in_flight.get(&op).map_or(0, |&(_, max)| max)
    }

    fn state(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_fault(&self, op: Op) -> Fault {
        let mut state = self.state();
        *state.calls.entry(op).or_insert(0) += 1;
        if let Some(fault) = state.script.get_mut(&op).and_then(VecDeque::pop_front) {
            return fault;
        }
        state.standing.get(&op).copied().unwrap_or(Fault::Pass)
    }

    async fn run<T>(&self, op: Op, call: impl Future<Output = Result<T>>) -> Result<T> {
        let _in_flight = InFlight::enter(&self.state, op);
        match self.next_fault(op) {
            Fault::Pass => call.await,
            Fault::Fail(kind) => Err(Error::new(kind, format!("injected {kind} on {op:?}"))),
            Fault::Hang => std::future::pending().await,
            Fault::Delay(delay) => {
                tokio::time::sleep(delay).await;
                call.await
            }
            Fault::LoseReply => {
                let _ = call.await;
                Err(Error::new(
                    ErrorKind::OutcomeUnknown,
                    format!("injected lost reply on {op:?}"),
                ))
            }
        }
    }
}

/// Counts one call in flight until dropped (answered or cancelled).
struct InFlight<'a> {
    state: &'a Mutex<FaultState>,
    op: Op,
}

impl<'a> InFlight<'a> {
    fn enter(state: &'a Mutex<FaultState>, op: Op) -> Self {
        let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
        let (now, max) = guard.in_flight.entry(op).or_insert((0, 0));
        *now += 1;
        *max = (*max).max(*now);
        Self { state, op }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((now, _)) = guard.in_flight.get_mut(&self.op) {
            *now = now.saturating_sub(1);
        }
    }
}

#[async_trait]
impl LockBackend for FaultyBackend {
    fn backend_name(&self) -> &str {
        self.inner.backend_name()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.run(Op::Acquire, self.inner.acquire(request)).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.run(Op::Refresh, self.inner.refresh(lease)).await
    }
    /// One call: it draws one `Refresh` fault for the whole batch, as a cut connection
    /// fails the whole batch; a failure fails every lease alike.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let call = async { Ok(self.inner.refresh_many(leases).await) };
        match self.run(Op::Refresh, call).await {
            Ok(results) => results,
            Err(err) => err.copies(leases.len()).into_iter().map(Err).collect(),
        }
    }
    fn refresh_batch_limit(&self) -> usize {
        self.inner.refresh_batch_limit()
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.run(Op::Release, self.inner.release(lease)).await
    }
    async fn detach(&self, lease: &Lease) -> Result<()> {
        self.inner.detach(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.run(Op::Inspect, self.inner.inspect(name)).await
    }
    /// Faults as `acquire`'s (`Op::Acquire`).
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.run(Op::Acquire, self.inner.acquire_permit(request))
            .await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.run(Op::Inspect, self.inner.inspect_permits(name))
            .await
    }
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.break_lock(name).await
    }
    async fn enqueue(&self, request: &AcquireRequest) -> Result<Option<crate::QueueTicket>> {
        self.inner.enqueue(request).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<crate::HeldLock>> {
        self.run(Op::Inspect, self.inner.list(prefix)).await
    }
    async fn connection_security(&self) -> Result<Vec<crate::ConnectionSecurity>> {
        self.inner.connection_security().await
    }
    fn check_options(&self, options: &crate::LockOptions) -> Result<()> {
        self.inner.check_options(options)
    }
    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        self.inner.server_time().await
    }
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        if self.state().no_notifications {
            return Ok(None);
        }
        self.inner.subscribe(name).await
    }
}

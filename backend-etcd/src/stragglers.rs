//! Keys left on a session lease by a release or a move that did not finish.
//!
//! A lock on a lease of its own ends by its TTL whatever happens to its release. A key on
//! a session lease lives as long as the session, which the backend's other locks of that
//! TTL keep alive: a release lost to a network blip would leave the lock taken, by no
//! one, for as long as the process keeps using that TTL. So a release (or a move off the
//! session) records its key here *before* its first request and takes it off only on a
//! definite outcome; one that fails, times out, or is dropped by its caller (lockcore
//! bounds a release and a detach by its own timeouts, often shorter than etcd's request
//! timeout) leaves the key to be deleted later, on the next acquire or refresh that uses the backend's sessions,
//! by a `Txn` that deletes it only while it still has its grant's revision (create revision; a semaphore slot's mod revision) and is still on
//! the session lease (never another grant's key, never a key moved to a lease of its
//! own). A key whose `leave_for`/`detach` move failed is deleted only once the TTL it
//! was left for has run out: a lock left to outlive its holder is never freed early.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::client::EtcdClient;
use crate::requests::Pin;

/// At most this many keys are remembered; beyond it the oldest is dropped (it then lasts
/// as long as its session, as before this list existed).
const LIMIT: usize = 4096;

/// A sweep starts at most this often.
const SPACING: Duration = Duration::from_secs(1);

/// One key to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Straggler {
    key: Vec<u8>,
    /// The revision that identifies its grant (a lock key's create revision, a semaphore
    /// slot's mod revision).
    pin: Pin,
    /// The session lease it must still be bound to.
    lease: i64,
    /// Not deleted before this.
    not_before: Instant,
}

#[derive(Default)]
struct State {
    keys: Vec<Straggler>,
    sweeping: bool,
    last_sweep: Option<Instant>,
}

/// The keys of one backend (and its clones) waiting to be deleted.
pub(crate) struct Stragglers {
    client: Arc<EtcdClient>,
    state: Arc<Mutex<State>>,
}

impl Stragglers {
    pub(crate) fn new(client: Arc<EtcdClient>) -> Self {
        Self {
            client,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// A release or move of `key` (its grant identified by `pin`, on session lease `lease`)
    /// about to be sent. Unless [`Pending::settled`] is called (a definite answer), its
    /// drop (a failed call, or one dropped by its caller) records the key for deletion
    /// once `not_before` has passed. Calls in flight are not in the list, so they cost it
    /// nothing and can never push a recorded failure out of it.
    pub(crate) fn pending(
        &self,
        key: Vec<u8>,
        pin: Pin,
        lease: i64,
        not_before: Instant,
    ) -> Pending {
        Pending {
            state: Arc::clone(&self.state),
            straggler: Some(Straggler {
                key,
                pin,
                lease,
                not_before,
            }),
        }
    }

    /// Session lease `lease` is gone: so are its keys.
    pub(crate) fn forget_lease(&self, lease: i64) {
        self.state().keys.retain(|s| s.lease != lease);
    }

    /// Starts deleting the keys that are due, in a task of their own, unless a sweep runs
    /// or ran less than [`SPACING`] ago, or nothing is due. Keys whose delete fails (or
    /// that a dropped task never got to) stay for the next sweep.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut state = self.state();
        if state.sweeping
            || state.last_sweep.is_some_and(|at| now < at + SPACING)
            || !state.keys.iter().any(|s| s.not_before <= now)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        state.sweeping = true;
        state.last_sweep = Some(now);
        let (due, later) = std::mem::take(&mut state.keys)
            .into_iter()
            .partition(|s| s.not_before <= now);
        state.keys = later;
        drop(state);
        let mut sweep = Sweep {
            left: due,
            state: Arc::clone(&self.state),
        };
        let client = Arc::clone(&self.client);
        runtime.spawn(async move {
            let mut failed = Vec::new();
            while let Some(straggler) = sweep.left.pop() {
                let deleted = client
                    .delete_pinned_on(&straggler.key, straggler.pin, straggler.lease)
                    .await;
                match deleted {
                    Ok(()) => {}
                    Err(err) if err.is_temporary() => {
                        tracing::debug!(error = %err, "deleting a lock key left by a failed release failed; retrying later");
                        failed.push(straggler);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "deleting a lock key left by a failed release was refused; it lasts as long as its session");
                    }
                }
            }
            sweep.left.append(&mut failed);
        });
    }
}

/// A release or move in flight (see [`Stragglers::pending`]).
pub(crate) struct Pending {
    state: Arc<Mutex<State>>,
    straggler: Option<Straggler>,
}

impl Pending {
    /// The call had a definite answer: nothing to delete later.
    pub(crate) fn settled(mut self) {
        self.straggler = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(straggler) = self.straggler.take() else {
            return;
        };
        let mut state = lock(&self.state);
        if state.keys.contains(&straggler) {
            return;
        }
        if state.keys.len() >= LIMIT {
            state.keys.remove(0);
            tracing::warn!(
                "more than {LIMIT} etcd lock keys wait for a delete that failed; the oldest \
                 is left to its session's expiry"
            );
        }
        state.keys.push(straggler);
    }
}

/// A running sweep: puts back what it did not delete and lets the next sweep start, also
/// when its task is dropped halfway.
struct Sweep {
    left: Vec<Straggler>,
    state: Arc<Mutex<State>>,
}

impl Drop for Sweep {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.keys.append(&mut self.left);
        state.sweeping = false;
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(state: &Arc<Mutex<State>>, revision: i64) -> Pending {
        Pending {
            state: Arc::clone(state),
            straggler: Some(Straggler {
                key: b"k".to_vec(),
                pin: Pin::Created(revision),
                lease: 1,
                not_before: Instant::now(),
            }),
        }
    }

    /// A release that failed is recorded; a burst of releases in flight, more than the
    /// list holds, all answered, never pushes it out (the third review's finding: when
    /// calls were recorded before they were sent, 4,096 good releases evicted it).
    #[test]
    fn calls_in_flight_never_push_a_recorded_failure_out() {
        let state = Arc::<Mutex<State>>::default();
        drop(pending(&state, 1));
        let in_flight: Vec<Pending> = (2..=i64::try_from(LIMIT).expect("small") + 10)
            .map(|revision| pending(&state, revision))
            .collect();
        assert_eq!(lock(&state).keys.len(), 1, "calls in flight are not listed");
        in_flight.into_iter().for_each(Pending::settled);
        let keys = &lock(&state).keys;
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].pin, Pin::Created(1));
    }

    /// A call dropped without an answer is recorded once, however often it is dropped.
    #[test]
    fn a_dropped_call_is_recorded_once() {
        let state = Arc::<Mutex<State>>::default();
        let first = pending(&state, 7);
        let same = Pending {
            state: Arc::clone(&state),
            straggler: first.straggler.clone(),
        };
        drop(first);
        drop(same);
        assert_eq!(lock(&state).keys.len(), 1);
    }
}

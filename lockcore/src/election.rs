//! Leader election on the lease machinery: [`Election`], [`Leadership`], [`Leader`],
//! [`Observer`].
//!
//! A candidate leads while it holds the election's lock: campaigning is a waiting
//! acquire, leadership is a [`LockGuard`] (refreshed by the locker's keeper, with the same
//! health states; a lost lease ends leadership with the same `Lost` signal), resigning is a
//! release, and the term is the grant's fencing token, which rises with every term on
//! backends that fence. Observers read the holder, woken by release notifications where the
//! backend sends them and polling otherwise.

use std::fmt;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;

use crate::backend::ReleaseEvents;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::identity::Identity;
use crate::locker::Locker;
use crate::name::LockName;
use crate::note::Note;
use crate::options::{LockOptions, WaitMode};
use crate::state::LostReason;
use crate::types::{FenceToken, HolderInfo};

/// How often an [`Observer`] reads the leader when nothing wakes it sooner.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(500);

/// The least time between two reads of an [`Observer`], however often it is woken.
const MIN_READ_GAP: Duration = Duration::from_millis(10);

/// An election of one leader among the candidates that campaign for `name` (a lock name:
/// the election is that lock, and [`Locker::inspect`] shows its leader too).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
/// use std::sync::Arc;
/// use lockcore::{Locker, MemoryBackend, Note};
/// let locker = Locker::new(Arc::new(MemoryBackend::new()));
/// let election = locker.election("scheduler")?;
/// let mut observer = election.observe();
/// let leadership = election.campaign(Some(Note::new("node-1")?)).await?;
/// let leader = observer.next().await?.expect("a leader");
/// assert_eq!(leader.value().map(|v| v.as_str()), Some("node-1"));
/// assert_eq!(leader.term(), leadership.term());
/// leadership.resign().await?;
/// assert!(observer.next().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    locker: Locker,
    name: LockName,
    interval: Duration,
}

impl Locker {
    /// The election `name`, run with this locker's options and identity.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn election(&self, name: impl AsRef<str>) -> Result<Election> {
        Ok(Election {
            locker: self.clone(),
            name: self.lock_name(name)?,
            interval: DEFAULT_OBSERVE_INTERVAL,
        })
    }
}

impl Election {
    /// The election's (lock) name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Sets how often observers read the leader when no notification wakes them
    /// (default [`DEFAULT_OBSERVE_INTERVAL`]; at least 10 ms).
    #[must_use]
    pub fn with_observe_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Campaigns until elected, as the locker's options wait (by default for ever), with
    /// `value` stored for observers (a [`Note`]: host, address, run URL).
    ///
    /// # Errors
    /// As [`Locker::acquire_with`]: `Timeout` when the wait runs out, `Held` in
    /// `TryOnce` mode, the backend's errors.
    ///
    /// # Cancel safety
    /// As [`Locker::acquire_with`]: dropping the future never leaves a leader that
    /// nobody holds.
    pub async fn campaign(&self, value: Option<Note>) -> Result<Leadership> {
        let options = self.options(value, self.locker.options().wait());
        let guard = self.locker.acquire_with(&self.name, &options).await?;
        Ok(Leadership { guard })
    }

    /// One attempt: `Ok(None)` when someone else leads.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), except that a held leadership is `Ok(None)`.
    pub async fn try_campaign(&self, value: Option<Note>) -> Result<Option<Leadership>> {
        let options = self.options(value, WaitMode::TryOnce);
        match self.locker.acquire_with(&self.name, &options).await {
            Ok(guard) => Ok(Some(Leadership { guard })),
            Err(err) if err.kind() == crate::ErrorKind::Held => Ok(None),
            Err(err) => Err(err),
        }
    }

    fn options(&self, value: Option<Note>, wait: WaitMode) -> LockOptions {
        let options = self.locker.options().clone().with_wait(wait);
        match value {
            Some(value) => options.with_note(value),
            None => options,
        }
    }

    /// The leader now, `None` when nobody leads.
    ///
    /// # Errors
    /// The backend's error.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let holder = self.locker.inspect(&self.name).await?;
        Ok(holder.map(|holder| Leader { holder }))
    }

    /// An observer of this election's leaders, from now on.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            events: None,
            subscribed: false,
            highest: None,
            last_read: None,
            failed: false,
            vacant_since: None,
        }
    }
}

/// A term of leadership: the held lock, refreshed in the background.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The term: the grant's fencing token, greater than every earlier term's on backends
    /// that fence (`None` on those that do not, such as Redlock).
    pub fn term(&self) -> Option<FenceToken> {
        self.guard.fence_token()
    }

    /// `true` while the lease is held (see [`LockGuard::is_held`]): check it before acting
    /// as leader, and pass [`term`](Self::term) to what you write.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost (the lease was lost or ran out).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// The lock guard underneath, for its health channel and cancellation token.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Gives leadership up: releases the lock, so another candidate can be elected at
    /// once.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// The guard, for code that takes a [`LockGuard`].
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

/// A leader as observers see it.
#[derive(Clone, PartialEq, Eq)]
pub struct Leader {
    holder: HolderInfo,
}

impl Leader {
    /// Who leads.
    pub fn owner(&self) -> &Identity {
        self.holder.owner()
    }

    /// The term (fencing token of the leader's grant), where the backend fences.
    pub fn term(&self) -> Option<FenceToken> {
        self.holder.token()
    }

    /// When this term began, where the backend records it.
    pub fn since(&self) -> Option<SystemTime> {
        self.holder.acquired_at()
    }

    /// The value the leader campaigned with.
    pub fn value(&self) -> Option<&Note> {
        self.holder.note()
    }

    /// How long the leader's lease lasts unless refreshed, where known.
    pub fn expires_in(&self) -> Option<Duration> {
        self.holder.expires_in()
    }

    /// The lock's holder record.
    pub fn holder(&self) -> &HolderInfo {
        &self.holder
    }

    /// What tells two terms apart: the owner and its grant's token.
    fn key(&self) -> (Identity, Option<FenceToken>) {
        (self.holder.owner().clone(), self.holder.token())
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("owner", self.owner())
            .field("term", &self.term())
            .field("value", &self.value())
            .finish_non_exhaustive()
    }
}

/// Reports each change of an election's leader (a new term, or nobody leading).
///
/// It reads the leader when the backend notifies a release (while someone leads) and every
/// observe interval otherwise; after a leader goes, it reads again at gaps growing from
/// 10 ms to the interval (no backend notifies a grant, and a waiting candidate usually
/// takes over at once). So it reports every term that lasts longer than the observe
/// interval; terms shorter than it may be skipped. Where the backend fences, a term older
/// than one already reported is never reported. Without fencing (Redlock) a term is told
/// apart by its owner only, so a new term of the same identity is not reported. Use it to
/// follow who leads, not to count terms.
pub struct Observer {
    election: Election,
    /// The last reported state: `None` before the first report.
    last: Option<Option<(Identity, Option<FenceToken>)>>,
    events: Option<ReleaseEvents>,
    subscribed: bool,
    /// The highest term reported so far (a vacancy in between does not forget it).
    highest: Option<FenceToken>,
    /// When the last read of the leader started.
    last_read: Option<tokio::time::Instant>,
    /// The last call returned an error: the next one reads no sooner than an observe
    /// interval after that failed read.
    failed: bool,
    /// When a vacancy after a leader was first read: until someone leads again, reads
    /// follow it at growing gaps (10 ms, then the time since, up to the interval).
    vacant_since: Option<tokio::time::Instant>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name)
            .field("notified", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The leader once it differs from the last one reported (the first call reports the
    /// current state at once): `Some` for a new term, `None` when nobody leads.
    ///
    /// # Errors
    /// The backend's error reading the leader; the observer can be called again, and that
    /// call reads no sooner than one observe interval after the failed read (so a loop
    /// over `next()` or [`into_stream`](Self::into_stream) never spins on a failing
    /// backend, and a caller that waited on its own waits no more).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call reports nothing and loses nothing.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        if self.failed {
            // An interval from the failed read, not from this call: a caller that waited
            // on its own already let the backend rest. Cleared only once waited out, so a
            // call dropped during the wait does not shorten it (the review: 200 reads of a
            // failing backend in 1 s when every call was cancelled after 5 ms).
            if let Some(last) = self.last_read {
                tokio::time::sleep_until(last + self.election.interval).await;
            }
            self.failed = false;
        }
        loop {
            if !self.subscribed {
                let backend = self.election.locker.backend();
                // Marked only once the call is done: a call dropped here subscribes again.
                let events = backend.subscribe(&self.election.name).await;
                self.subscribed = true;
                // Without notifications (or when subscribing fails) it polls.
                self.events = events.ok().flatten();
            }
            // Reads start at least this far apart, whatever wakes the observer and however
            // often a caller drops `next()` and calls it again (a wake long after the last
            // read reads at once).
            if let Some(last) = self.last_read {
                tokio::time::sleep_until(last + MIN_READ_GAP).await;
            }
            self.last_read = Some(tokio::time::Instant::now());
            let leader = match self.election.leader().await {
                Ok(leader) => leader,
                Err(err) => {
                    self.failed = true;
                    return Err(err);
                }
            };
            let key = leader.as_ref().map(Leader::key);
            if self.last.as_ref() != Some(&key) && !self.is_older(&key) {
                self.vacant_since = match &key {
                    Some((_, term)) => {
                        self.highest = self.highest.max(*term);
                        None
                    }
                    // A leader just went: a waiting candidate usually takes over within
                    // milliseconds, and no backend notifies a grant.
                    None if matches!(self.last, Some(Some(_))) => self.last_read,
                    None => None,
                };
                self.last = Some(key);
                return Ok(leader);
            }
            let interval = self.election.interval;
            let leading = matches!(self.last, Some(Some(_)));
            match self.events.as_mut() {
                // A release matters only while someone leads: with nobody leading, a
                // backend may report the name free at once (the embedded one does), so
                // the observer polls then.
                Some(events) if leading => {
                    let woke = tokio::time::timeout(interval, events.next()).await;
                    if let Ok(None) = woke {
                        // The stream ended (connection gone): poll from now on.
                        self.events = None;
                    }
                }
                _ => tokio::time::sleep(self.poll_gap(interval)).await,
            }
        }
    }

    /// The changes as a never-ending [`Stream`](futures_core::Stream): each item is what
    /// [`next`](Self::next) returns (an error is an item too; the stream goes on after it,
    /// one observe interval later). The stream is not `Unpin`: pin it (`Box::pin`,
    /// `std::pin::pin!`) to call `StreamExt::next` on it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use lockcore::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(Arc::new(MemoryBackend::new()));
    /// let election = locker.election("scheduler")?;
    /// let mut changes = Box::pin(election.observe().into_stream());
    /// assert!(changes.next().await.expect("endless")?.is_none()); // nobody leads yet
    /// let leadership = election.campaign(None).await?;
    /// let leader = changes.next().await.expect("endless")?.expect("a leader");
    /// assert_eq!(leader.term(), leadership.term());
    /// # Ok(()) }
    /// ```
    pub fn into_stream(self) -> impl futures_core::Stream<Item = Result<Option<Leader>>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
    }

    /// How long to wait before the next polled read: the interval, except soon after a
    /// leader went, when the gap grows from 10 ms with the time since the vacancy was
    /// read (about twice the gap each read: 10, 20, 40 ms ...), so a successor is
    /// reported within about the time it took to take over, at a few reads per vacancy.
    fn poll_gap(&self, interval: Duration) -> Duration {
        match self.vacant_since {
            Some(since) => since.elapsed().clamp(MIN_READ_GAP, interval),
            None => interval,
        }
    }

    /// Whether `key` is a term older than one already reported (a stale read): never
    /// reported, so terms are reported in order, across vacancies too.
    fn is_older(&self, key: &Option<(Identity, Option<FenceToken>)>) -> bool {
        match (self.highest, key) {
            (Some(highest), Some((_, Some(term)))) => *term < highest,
            _ => false,
        }
    }
}

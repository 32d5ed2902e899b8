//! Waking waiters when a lease ends, by the kernel: an inotify watch on the holders
//! directory (Linux; elsewhere waiters poll).
//!
//! A release clears the lease row, then removes the holder's liveness file
//! (`<db>.holders/<key>`), so the deletion of the file a row names means that lease just
//! ended (a break removes the broken holder's file too). One thread per backend handle
//! (`connect`; its clones share it), started by the first waiter that finds the lock held
//! and gone a second after the last, waits in `poll(2)` on the watch and passes the names of
//! deleted files to the waiters; it needs nothing from the async runtime. A lock found free
//! never opens a watch.
//!
//! Each waiter's stream remembers the liveness keys of the holders it waits for; when one
//! of those files goes it wakes the waiter at once (the row was cleared before the file
//! went, unless the lease was taken over or detached: then the waiter's attempt finds it
//! held); when events were missed, or a holder's row named no file, it reads the rows
//! again and wakes the waiter only if the name is free now.
//!
//! A name is a lock and a semaphore at once, and `subscribe` does not say which its
//! waiter wants: the name is free when the lock is free *and* the semaphore has a place,
//! and the keys waited for are the lock holder's (when held) and every permit holder's
//! (when the semaphore is full). So a permit's release wakes a permit waiter, a release
//! of the lock wakes a lock waiter, and a waiter of one may be woken for the other
//! (spuriously: its attempt finds it held and waits again). The one case this misses: a
//! waiter whose own kind came free while the other kind of the same name is busy is not
//! woken by a read, only by the next of those deletions or its backoff.
//! Deletions of other files (other locks' holders, and the file a contender creates and
//! removes on every refused attempt) never wake it, so waiters cannot wake each other in a
//! loop. A holder that dies leaves its file behind (only its kernel lock goes): the next
//! attempt's liveness probe finds that, within the waiter's backoff, as before.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::stream;
use lockcore::{LockName, ReleaseEvents};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::broadcast;

/// How many deletions a slow waiter may fall behind before it is told it lagged.
const BACKLOG: usize = 1024;
/// How often the thread looks whether anyone still listens (milliseconds).
const IDLE_CHECK_MS: u16 = 1000;

/// What a read of the name's rows found, for the wake-up filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A new owner's grant would go through now, of the lock and of a permit (free,
    /// expired, an earlier boot's; the semaphore has a place).
    Free,
    /// Held: the keys of the liveness files of the holders to wait for, and whether some
    /// such holder's row names no file (then any deletion makes the waiter read again).
    Held {
        keys: HashSet<String>,
        unnamed: bool,
    },
}

/// Reads the name's rows (the backend does).
pub(crate) trait ReadHolder: Clone + Send + Sync + 'static {
    /// The holders of `name` now; `None` when the read failed.
    fn holder(&self, name: &LockName) -> impl Future<Output = Option<Holder>> + Send;
}

/// The watch on one holders directory, shared by a backend's clones.
#[derive(Debug, Clone)]
pub(crate) struct Watcher {
    dir: PathBuf,
    /// The running thread's sender; `None` when no thread runs.
    deleted: Arc<Mutex<Option<Sender>>>,
}

/// A deleted file's name, or `None` when the kernel's event queue overflowed (anything may
/// have been deleted).
type Deleted = Option<Arc<OsString>>;
type Sender = broadcast::Sender<Deleted>;

impl Watcher {
    /// A watcher of `dir`; nothing runs until the first [`subscribe`](Self::subscribe).
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            deleted: Arc::default(),
        }
    }

    /// A stream that yields when `name`'s current lease ends (see the module docs). The
    /// watch is set up when the stream is first polled (the waiter found the lock held);
    /// if it cannot be (inotify limits), the stream ends and the waiter polls.
    pub(crate) fn subscribe<R: ReadHolder>(&self, name: LockName, reader: R) -> ReleaseEvents {
        let state = (self.clone(), None, name, reader);
        Box::pin(stream::unfold(state, |mut state| async move {
            let (watcher, listening, name, reader) = &mut state;
            if listening.is_none() {
                match watcher.listen() {
                    Ok(deleted) => *listening = Some(deleted),
                    Err(err) => {
                        tracing::debug!(error = %err, "no inotify watch; waiters poll");
                        return None;
                    }
                }
            }
            let deleted = listening.as_mut()?;
            // Whom to wait for, read after we listen: no deletion is missed in between.
            // A failed read is no news: wait for the next deletion and read again.
            let mut holders = match reader.holder(name).await {
                Some(Holder::Free) => return Some(((), state)),
                Some(held) => Some(held),
                None => None,
            };
            loop {
                let gone = match deleted.recv().await {
                    Ok(file) => file,
                    // Fell behind: the holder's file may be among the missed ones.
                    Err(broadcast::error::RecvError::Lagged(_)) => None,
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                match (&holders, gone) {
                    // A holder's file went: its lease ended (a release or a break clears
                    // the row before it removes the file), or, rarely, the row names it no
                    // more (a takeover, a detach). Wake the waiter without reading the row
                    // first: its attempt reads and decides, a statement sooner; after a
                    // takeover or a detach it finds the name held and waits again, and this
                    // stream then reads the new holders.
                    (Some(Holder::Held { keys, .. }), Some(file))
                        if file.to_str().is_some_and(|file| keys.contains(file)) =>
                    {
                        return Some(((), state));
                    }
                    // Another file: not a holder's we wait for.
                    (Some(Holder::Held { unnamed: false, .. }), Some(_)) => {}
                    // A holder without a file, or events were missed, or the last read
                    // failed: read again; only a free name wakes the waiter.
                    _ => match reader.holder(name).await {
                        Some(Holder::Free) => return Some(((), state)),
                        now => holders = now,
                    },
                }
            }
        }))
    }

    /// A receiver of deleted file names, starting the thread if none runs.
    fn listen(&self) -> io::Result<broadcast::Receiver<Deleted>> {
        let mut slot = self.deleted.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = slot.as_ref() {
            return Ok(sender.subscribe());
        }
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(&self.dir, AddWatchFlags::IN_DELETE)?;
        let (sender, receiver) = broadcast::channel(BACKLOG);
        let shared = Arc::clone(&self.deleted);
        std::thread::Builder::new()
            .name("anylock-local-wake".into())
            .spawn(move || watch(&inotify, &shared))?;
        *slot = Some(sender);
        Ok(receiver)
    }
}

/// The thread: passes on every deletion until nobody listens, then ends. It ends too when
/// the watch is gone (the directory removed or unmounted) or an error other than an
/// interruption comes: the waiters' streams then end (they poll), and the next waiter
/// builds a new watch. It clears the slot under its lock, so a new waiter never joins a
/// thread that is ending.
fn watch(inotify: &Inotify, shared: &Mutex<Option<Sender>>) {
    let gone =
        AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_UNMOUNT;
    loop {
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, IDLE_CHECK_MS);
        let mut slot = shared.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = slot.as_ref() else { return };
        let events = match ready {
            _ if sender.receiver_count() == 0 => None,
            Ok(0) | Err(Errno::EINTR) => Some(Vec::new()),
            Ok(_) => match inotify.read_events() {
                Ok(events) => Some(events),
                Err(Errno::EAGAIN | Errno::EINTR) => Some(Vec::new()),
                Err(_) => None,
            },
            Err(_) => None,
        };
        let Some(events) = events.filter(|e| !e.iter().any(|e| e.mask.intersects(gone))) else {
            *slot = None;
            return;
        };
        for event in events {
            let deleted = match event.name {
                Some(name) => Some(Arc::new(name)),
                None if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) => None,
                None => continue,
            };
            let _ = sender.send(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Held by the file `key` in `dir` while that file exists (a release clears the row
    /// before it removes the file).
    #[derive(Clone)]
    struct HeldBy(PathBuf, &'static str);

    impl ReadHolder for HeldBy {
        async fn holder(&self, _: &LockName) -> Option<Holder> {
            Some(match self.0.join(self.1).exists() {
                true => Holder::Held {
                    keys: HashSet::from([self.1.to_owned()]),
                    unnamed: false,
                },
                false => Holder::Free,
            })
        }
    }

    fn running(watcher: &Watcher) -> bool {
        watcher.deleted.lock().expect("lock").is_some()
    }

    #[tokio::test]
    async fn wakes_on_the_holders_file_only_and_the_thread_ends_with_its_last_waiter() {
        use futures_util::StreamExt;
        let dir = std::env::temp_dir().join(format!("anylock-wake-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("dir");
        for file in ["other", "holder"] {
            std::fs::write(dir.join(file), "").expect("file");
        }
        let watcher = Watcher::new(&dir);
        let name = LockName::new("job").expect("name");
        let mut events = watcher.subscribe(name, HeldBy(dir.clone(), "holder"));
        assert!(
            !running(&watcher),
            "no watch before the waiter finds the lock held"
        );
        let next = tokio::spawn(async move {
            let woke = events.next().await;
            (woke, events)
        });
        let start = std::time::Instant::now();
        while !running(&watcher) && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(running(&watcher), "the first poll starts the watch");
        std::fs::remove_file(dir.join("other")).expect("rm");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !next.is_finished(),
            "another file's deletion woke the waiter"
        );
        std::fs::remove_file(dir.join("holder")).expect("rm");
        let (woke, events) = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("woken")
            .expect("join");
        assert_eq!(woke, Some(()));
        drop(events);
        let start = std::time::Instant::now();
        while running(&watcher) && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!running(&watcher), "the thread outlived its last waiter");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}

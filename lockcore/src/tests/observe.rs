//! The election `Observer`: paced reads whatever the backend's wake-ups, and reports in
//! order.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures_util::stream;

use super::{bounded, ms};
use crate::{
    Acquire, AcquireRequest, Guarantees, HolderInfo, Lease, LockBackend, LockName, Locker,
    MemoryBackend, ReleaseEvents, Result,
};

/// A memory backend whose release stream wakes at once, for ever (the embedded backend's
/// stream does that while the name is free), and which counts `inspect` calls.
#[derive(Debug, Default)]
struct EagerWake {
    memory: MemoryBackend,
    inspects: AtomicUsize,
}

#[async_trait]
impl LockBackend for EagerWake {
    fn backend_name(&self) -> &str {
        "eager"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inspects.fetch_add(1, Ordering::SeqCst);
        self.memory.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
    async fn subscribe(&self, _: &LockName) -> Result<Option<ReleaseEvents>> {
        Ok(Some(Box::pin(stream::repeat(()))))
    }
}

#[test]
fn an_observer_paces_its_reads_whatever_wakes_it() {
    bounded(|| async {
        let backend = Arc::new(EagerWake::default());
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(100));
        let mut observer = election.observe();
        assert!(observer.next().await.expect("read").is_none());
        // Nobody leads: polled every 100 ms, not spun on the eager wake-ups.
        let waiting = tokio::spawn(async move { observer.next().await });
        tokio::time::sleep(ms(1000)).await;
        let reads = backend.inspects.load(Ordering::SeqCst);
        assert!(reads <= 12, "{reads} reads in 1 s with a 100 ms interval");
        let leadership = election
            .try_campaign(None)
            .await
            .expect("call")
            .expect("leads");
        let seen = waiting
            .await
            .expect("task")
            .expect("read")
            .expect("a leader");
        assert_eq!(seen.term(), leadership.term());
        // Someone leads: woken at once, still at most one read per 10 ms.
        let mut observer = election.observe();
        observer.next().await.expect("read");
        let before = backend.inspects.load(Ordering::SeqCst);
        let waiting = tokio::spawn(async move { observer.next().await });
        tokio::time::sleep(ms(1000)).await;
        let reads = backend.inspects.load(Ordering::SeqCst) - before;
        assert!(
            reads <= 101,
            "{reads} reads in 1 s while woken without pause"
        );
        leadership.resign().await.expect("resign");
        let vacancy = waiting.await.expect("task").expect("read");
        assert!(vacancy.is_none());
    });
}

/// Reads scripted holders, one per `inspect` (the last one for ever after).
#[derive(Debug)]
struct Scripted {
    memory: MemoryBackend,
    holders: std::sync::Mutex<Vec<Option<HolderInfo>>>,
}

#[async_trait]
impl LockBackend for Scripted {
    fn backend_name(&self) -> &str {
        "scripted"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, _: &LockName) -> Result<Option<HolderInfo>> {
        let mut holders = self.holders.lock().expect("lock");
        Ok(if holders.len() > 1 {
            holders.remove(0)
        } else {
            holders[0].clone()
        })
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
}

/// `owner` leading in term `t`, as a scripted read.
fn term(owner: &str, t: u64) -> Option<HolderInfo> {
    let owner = crate::Identity::named(owner).expect("id");
    Some(HolderInfo::new(owner).with_token(crate::FenceToken::new(t)))
}

/// The terms the first `reports` changes of an observer over `holders` name (`None`: no
/// leader).
async fn terms_reported(holders: Vec<Option<HolderInfo>>, reports: usize) -> Vec<Option<u64>> {
    let backend = Arc::new(Scripted {
        memory: MemoryBackend::new(),
        holders: std::sync::Mutex::new(holders),
    });
    let election =
        (Locker::new(backend).election("e").expect("name")).with_observe_interval(ms(10));
    let mut observer = election.observe();
    let mut seen = Vec::with_capacity(reports);
    for _ in 0..reports {
        let leader = observer.next().await.expect("read");
        seen.push(leader.and_then(|l| l.term()).map(crate::FenceToken::get));
    }
    seen
}

#[test]
fn an_observer_never_reports_a_term_older_than_one_it_reported() {
    bounded(|| async {
        // A stale read after a vacancy shows an older term (3 after 5).
        let holders = vec![term("a", 5), None, term("old", 3), term("b", 7)];
        let seen = terms_reported(holders, 3).await;
        assert_eq!(seen, [Some(5), None, Some(7)], "term 3 came after term 5");
    });
}

/// A memory backend whose release stream wakes only when the test says.
#[derive(Debug)]
struct WakeOnCue {
    memory: MemoryBackend,
    cue: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<()>>>,
}

#[async_trait]
impl LockBackend for WakeOnCue {
    fn backend_name(&self) -> &str {
        "cue"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.memory.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
    async fn subscribe(&self, _: &LockName) -> Result<Option<ReleaseEvents>> {
        let Some(cue) = self.cue.lock().expect("lock").take() else {
            return Ok(None);
        };
        Ok(Some(Box::pin(stream::unfold(cue, |mut cue| async move {
            cue.recv().await.map(|()| ((), cue))
        }))))
    }
}

/// A wake long after the last read reads at once: the 10 ms pacing counts from the last
/// read, not from the wake (which made every notified report 10 ms late, as the failover
/// benchmark's observer lag showed).
#[test]
fn a_wake_long_after_the_last_read_reads_at_once() {
    bounded(|| async {
        let (cue, wakes) = tokio::sync::mpsc::unbounded_channel();
        let backend = Arc::new(WakeOnCue {
            memory: MemoryBackend::new(),
            cue: std::sync::Mutex::new(Some(wakes)),
        });
        let locker = Locker::new(backend);
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(60_000));
        let first = election.campaign(None).await.expect("campaign");
        let mut observer = election.observe();
        assert!(observer.next().await.expect("read").is_some());
        let waiting = tokio::spawn(async move { observer.next().await });
        tokio::time::sleep(ms(500)).await;
        first.resign().await.expect("resign");
        let woken = tokio::time::Instant::now();
        cue.send(()).expect("the observer listens");
        let vacancy = waiting.await.expect("task").expect("read");
        assert!(vacancy.is_none(), "the resignation is reported");
        let lag = woken.elapsed();
        assert!(lag < ms(1), "reported {lag:?} after the wake");
    });
}

/// A backend whose first `failures` reads fail.
#[derive(Debug, Default)]
struct Failing {
    memory: MemoryBackend,
    inspects: AtomicUsize,
    /// `0`: every read fails.
    failures: usize,
}

#[async_trait]
impl LockBackend for Failing {
    fn backend_name(&self) -> &str {
        "failing"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let read = self.inspects.fetch_add(1, Ordering::SeqCst);
        if self.failures == 0 || read < self.failures {
            return Err(crate::Error::unavailable("down"));
        }
        self.memory.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
}

/// After an error the next read waits an observe interval: a stream of a failing
/// backend's errors is paced, not a spin (the review: 100,000 errors in 236 ms, and a
/// current-thread runtime that never got control back).
#[test]
fn an_observer_waits_an_interval_after_an_error() {
    bounded(|| async {
        use futures_util::StreamExt;
        let backend = Arc::new(Failing::default());
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(100));
        let mut errors = Box::pin(election.observe().into_stream());
        let started = tokio::time::Instant::now();
        for _ in 0..5 {
            let item = errors.next().await.expect("endless");
            assert!(item.is_err());
        }
        assert!(started.elapsed() >= ms(400), "{:?}", started.elapsed());
        assert_eq!(backend.inspects.load(Ordering::SeqCst), 5);
    });
}

/// After a leader goes, the observer reads again soon (10 ms, then gaps that grow with
/// the time since the vacancy), not an observe interval later: no backend notifies a
/// grant, and a waiting candidate usually takes over within milliseconds (the failover
/// benchmark's `local:` observers lagged the new leader by the whole 500 ms interval).
#[test]
fn a_successor_soon_after_a_vacancy_is_reported_soon() {
    bounded(|| async {
        let locker = Locker::new(Arc::new(MemoryBackend::new()));
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(10_000));
        let first = election.campaign(None).await.expect("campaign");
        let mut observer = election.observe();
        assert!(observer.next().await.expect("read").is_some());
        first.resign().await.expect("resign");
        assert!(
            observer.next().await.expect("read").is_none(),
            "the vacancy"
        );
        let waiting = tokio::spawn(async move { observer.next().await });
        tokio::time::sleep(ms(200)).await;
        let second = election.campaign(None).await.expect("campaign");
        let granted = tokio::time::Instant::now();
        let seen = waiting
            .await
            .expect("task")
            .expect("read")
            .expect("a leader");
        assert_eq!(seen.term(), second.term());
        let lag = granted.elapsed();
        // Reads at 10, 20, 40, 80, 160, 320 ms after the vacancy: the 320 ms one sees it.
        assert!(lag <= ms(200), "reported {lag:?} after the grant");
        second.resign().await.expect("resign");
    });
}

/// A vacancy that lasts is polled at the interval again: the quick reads after a
/// leader goes are a handful, not a spin.
#[test]
fn a_long_vacancy_is_polled_at_the_interval() {
    bounded(|| async {
        let backend = Arc::new(EagerWake::default());
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(1_000));
        let first = election.campaign(None).await.expect("campaign");
        let mut observer = election.observe();
        assert!(observer.next().await.expect("read").is_some());
        first.resign().await.expect("resign");
        assert!(
            observer.next().await.expect("read").is_none(),
            "the vacancy"
        );
        let before = backend.inspects.load(Ordering::SeqCst);
        let waiting = tokio::spawn(async move { observer.next().await });
        tokio::time::sleep(ms(10_000)).await;
        let reads = backend.inspects.load(Ordering::SeqCst) - before;
        // 10, 20, 40 ... 640 ms (7 reads), then one a second: 7 + 9 at most.
        assert!(reads <= 17, "{reads} reads in a 10 s vacancy");
        assert!(
            reads >= 10,
            "{reads} reads in a 10 s vacancy with a 1 s interval"
        );
        waiting.abort();
    });
}

/// The wait after an error counts from the failed read, not from the next call: a caller
/// that backed off on its own is not made to wait an interval more (the review: 10 s of
/// the caller's own wait, then 500 ms more).
#[test]
fn the_wait_after_an_error_counts_from_the_failed_read() {
    bounded(|| async {
        let backend = Arc::new(Failing {
            failures: 1,
            ..Failing::default()
        });
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(500));
        let mut observer = election.observe();
        assert!(observer.next().await.is_err());
        tokio::time::sleep(ms(10_000)).await;
        let called = tokio::time::Instant::now();
        assert!(observer.next().await.expect("read").is_none());
        assert!(called.elapsed() < ms(1), "waited {:?}", called.elapsed());
        // Called at once instead, it waits out the interval from the failed read.
        let mut observer = election.observe();
        backend.inspects.store(0, Ordering::SeqCst);
        let failed = tokio::time::Instant::now();
        assert!(observer.next().await.is_err());
        tokio::time::sleep(ms(200)).await;
        assert!(observer.next().await.expect("read").is_none());
        assert_eq!(failed.elapsed(), ms(500));
    });
}

/// A leader read again after a vacancy is reported again, same term and all: the vacancy
/// read was what the backend said (a GCS lease read as stale whose late refresh then
/// landed, an etcd lease whose TTL read came back empty), and the observer reports who
/// leads now rather than hide a leader. Terms never go backwards; a term can repeat
/// only across a vacancy.
#[test]
fn a_leader_read_again_after_a_vacancy_is_reported_again() {
    bounded(|| async {
        let holders = vec![term("a", 5), None, term("a", 5), term("b", 7)];
        let seen = terms_reported(holders, 4).await;
        assert_eq!(seen, [Some(5), None, Some(5), Some(7)]);
    });
}

/// A call dropped during the wait after an error does not shorten it: the wait counts from
/// the failed read and is cleared only once waited out (the review: 200 reads of a failing
/// backend in 1 s when every call was cancelled after 5 ms).
#[test]
fn a_dropped_call_does_not_shorten_the_wait_after_an_error() {
    bounded(|| async {
        let backend = Arc::new(Failing::default());
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(500));
        let mut observer = election.observe();
        let started = tokio::time::Instant::now();
        while started.elapsed() < ms(1_000) {
            tokio::select! {
                _ = observer.next() => {}
                () = tokio::time::sleep(ms(5)) => {}
            }
        }
        let reads = backend.inspects.load(Ordering::SeqCst);
        // At 0, 500 and 1000 ms at most.
        assert!(reads <= 3, "{reads} reads of a failing backend in 1 s");
    });
}

/// Reads start at least 10 ms apart across calls too: a caller that drops `next()` every
/// millisecond and calls it again does not read every millisecond.
#[test]
fn reads_are_paced_across_dropped_calls() {
    bounded(|| async {
        let backend = Arc::new(EagerWake::default());
        let locker = Locker::new(backend.clone());
        let election = (locker.election("e").expect("name")).with_observe_interval(ms(500));
        let _leading = election.campaign(None).await.expect("campaign");
        let mut observer = election.observe();
        assert!(observer.next().await.expect("read").is_some());
        let before = backend.inspects.load(Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        while started.elapsed() < ms(1_000) {
            tokio::select! {
                _ = observer.next() => {}
                () = tokio::time::sleep(ms(1)) => {}
            }
        }
        let reads = backend.inspects.load(Ordering::SeqCst) - before;
        assert!(
            reads <= 101,
            "{reads} reads in 1 s of calls dropped after 1 ms"
        );
    });
}

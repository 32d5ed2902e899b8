//! What a batched refresh costs in SQLite statements (issue #16): one per batch, whatever
//! the batch's size, counted from sqlx's own log of every statement it runs (the
//! `sqlx::query` events), not from anything this crate reports about itself.
//!
//! The counter is the process's tracing subscriber; the tests take turns (`SERIAL`).

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::TempDb;
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The summaries (first words) of the statements sqlx ran, in order.
static STATEMENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Held by each test while it counts.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Installs the counter (once) and takes this test's turn.
async fn counting() -> tokio::sync::MutexGuard<'static, ()> {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(Statements).expect("the only subscriber");
    });
    SERIAL.lock().await
}

/// Records every `sqlx::query` event and nothing else.
struct Statements;

struct Summary(Option<String>);

impl Visit for Summary {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.0.is_none() {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl Subscriber for Statements {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut summary = Summary(None);
        event.record(&mut summary);
        let summary = summary.0.unwrap_or_else(|| "?".to_owned());
        STATEMENTS.lock().expect("lock").push(summary);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The statements run by `during`.
async fn statements_of<T>(during: impl Future<Output = T>) -> (T, Vec<String>) {
    STATEMENTS.lock().expect("lock").clear();
    let out = during.await;
    let ran = std::mem::take(&mut *STATEMENTS.lock().expect("lock"));
    (out, ran)
}

async fn grant(backend: &impl LockBackend, name: &str) -> Lease {
    let request = AcquireRequest::new(
        LockName::new(name).expect("valid name"),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(60)).expect("valid TTL"),
    );
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("{name} unexpectedly held"),
    }
}

/// A full batch is one statement, as is a batch of one; a batch twice the limit and one
/// more is three; and every lease of them is refreshed (one released lease among them
/// is `Lost`, alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_statement_whatever_its_size() {
    let _turn = counting().await;
    let db = TempDb::new();
    let backend = db.open().await;
    let limit = backend.refresh_batch_limit();
    let mut leases = Vec::new();
    for i in 0..limit * 2 + 1 {
        leases.push(grant(&backend, &format!("job-{i} \"quoted\" \\ é")).await);
    }
    let gone = leases.len() / 2;
    backend.release(&leases[gone]).await.expect("release");

    let (results, ran) = statements_of(backend.refresh_many(&leases[..1])).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert_eq!(ran.len(), 1, "a batch of one: {ran:?}");

    let (results, ran) = statements_of(backend.refresh_many(&leases[..limit])).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(ran.len(), 1, "a full batch: {} statements", ran.len());

    let (results, ran) = statements_of(backend.refresh_many(&leases)).await;
    assert_eq!(
        ran.len(),
        3,
        "{} leases: {} statements",
        leases.len(),
        ran.len()
    );
    for (i, result) in results.iter().enumerate() {
        match result {
            Err(err) if i == gone => assert_eq!(err.kind(), lockcore::ErrorKind::Lost),
            Ok(lease) => assert_eq!(lease.grant(), leases[i].grant()),
            other => panic!("lease {i}: {other:?}"),
        }
    }
    assert!(ran.iter().all(|s| s.starts_with("UPDATE")), "{ran:?}");
}

/// A notified handoff costs two statements from the release on: the release's `UPDATE`
/// and the waiter's grant. The waiter, woken by its holder's file going, does not read the
/// row first (its attempt does), and the wake-up is the holder's file, not a poll.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_handoff_is_two_statements() {
    use lockcore::{Backoff, Jitter, LockOptions, Locker, WaitMode};
    let _turn = counting().await;
    let db = TempDb::new();
    let minute = Duration::from_secs(60);
    let holder = Locker::new(std::sync::Arc::new(db.open().await));
    let waiter = Locker::new(std::sync::Arc::new(db.open().await)).with_options(
        LockOptions::new(Duration::from_secs(30))
            .with_backoff(Backoff::new(minute, minute).with_jitter(Jitter::None))
            .with_wait(WaitMode::Timeout(Duration::from_secs(120))),
    );
    let guard = holder.acquire("handoff").await.expect("free");
    let task = tokio::spawn(async move { waiter.acquire("handoff").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (next, ran) = statements_of(async {
        guard.release().await.expect("release");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("woken (the backoff is a minute)")
            .expect("join")
            .expect("acquired")
    })
    .await;
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(
        ran[0].starts_with("UPDATE") && ran[1].starts_with("INSERT"),
        "{ran:?}"
    );
    next.release().await.expect("release");
}

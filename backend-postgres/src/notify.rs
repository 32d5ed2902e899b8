//! Release notifications: one `LISTEN` connection per backend, fanned out to waiters.
//!
//! `release` runs `pg_notify(channel, name)` in the same statement that clears the lease,
//! so the notification is sent exactly when the release commits. A background task holds
//! a dedicated connection (sqlx [`PgListener`]) that `LISTEN`s on the channel and forwards
//! each payload (a lock name) to every subscriber; each subscriber's stream keeps only its
//! own name.
//!
//! When a listening connection is lost, the task wakes every subscriber once (a release may
//! have been missed), reconnects with bounded, jittered backoff, and wakes them once more
//! when it listens again. Failed reconnection attempts wake nobody: while the listener is
//! down, waiters simply keep their own bounded polling.
//! A keepalive query every [`KEEPALIVE`] notices a connection that died silently.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream;
use lockcore::{Backoff, LockName, ReleaseEvents};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// How often an idle listener checks that its connection still answers.
pub const KEEPALIVE: Duration = Duration::from_secs(10);
/// Reconnection backoff: first delay and cap (full jitter).
const RECONNECT: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Events buffered per subscriber before it lags (a lagging subscriber just wakes).
const BUFFER: usize = 1024;

/// What the listener task reports.
#[derive(Debug, Clone)]
enum Event {
    /// `NOTIFY` with this lock name arrived.
    Released(Arc<str>),
    /// The connection dropped or came back: releases may have been missed.
    Gap,
}

/// The listener: started by the first subscription, stopped when the backend is dropped.
#[derive(Debug)]
pub(crate) struct Notifier {
    connect: PgConnectOptions,
    channel: String,
    timeout: Duration,
    events: broadcast::Sender<Event>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Notifier {
    pub(crate) fn new(connect: PgConnectOptions, channel: String, timeout: Duration) -> Self {
        Self {
            connect,
            channel,
            timeout,
            events: broadcast::channel(BUFFER).0,
            task: Mutex::new(None),
        }
    }

    /// A stream that yields after every release of `name` published from now on, and
    /// whenever the listener lost or regained its connection. It ends only when the
    /// backend is dropped.
    pub(crate) fn subscribe(&self, name: &LockName) -> ReleaseEvents {
        // Subscribe before starting the task, so its first "listening" wake is not missed.
        let rx = self.events.subscribe();
        self.start();
        let name: Arc<str> = Arc::from(name.as_str());
        Box::pin(stream::unfold((rx, name), |(mut rx, name)| async move {
            loop {
                match rx.recv().await {
                    Ok(Event::Released(released)) if released != name => continue,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Some(((), (rx, name)));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }))
    }

    fn start(&self) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let listen = Listen {
            pool: PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(self.timeout)
                .connect_lazy_with(self.connect.clone()),
            channel: self.channel.clone(),
            timeout: self.timeout,
            events: self.events.clone(),
        };
        *task = Some(tokio::spawn(listen.run()));
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// The background task's state.
struct Listen {
    pool: PgPool,
    channel: String,
    timeout: Duration,
    events: broadcast::Sender<Event>,
}

impl Listen {
    /// Listens until aborted, reconnecting after every loss.
    async fn run(self) {
        let backoff = Backoff::new(RECONNECT.0, RECONNECT.1);
        let mut failures = 0u32;
        loop {
            let mut listening = false;
            let outcome = self.session(&mut listening).await;
            if listening {
                // Releases may go unseen from now until the next LISTEN: wake everyone.
                let _ = self.events.send(Event::Gap);
                failures = 0;
            }
            match outcome {
                Ok(()) => tracing::debug!(channel = %self.channel, "LISTEN connection lost"),
                Err(err) => tracing::debug!(
                    channel = %self.channel,
                    error = %err,
                    "LISTEN connection failed"
                ),
            }
            tokio::time::sleep(backoff.delay(failures, rand::random())).await;
            failures = failures.saturating_add(1);
        }
    }

    /// One connection's life: connect, `LISTEN`, forward notifications until it is lost.
    /// Sets `listening` once the `LISTEN` took effect.
    async fn session(&self, listening: &mut bool) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        listener.listen(&self.channel).await?;
        *listening = true;
        // Anything released before the LISTEN took effect is unknown: wake everyone once.
        let _ = self.events.send(Event::Gap);
        loop {
            let next = tokio::select! {
                received = listener.try_recv() => Some(received),
                () = tokio::time::sleep(KEEPALIVE) => None,
            };
            match next {
                Some(received) => match received? {
                    Some(note) => {
                        let _ = self.events.send(Event::Released(note.payload().into()));
                    }
                    None => return Ok(()),
                },
                None => self.keepalive(&mut listener).await?,
            }
        }
    }

    /// A trivial query on the listening connection; notifications that arrive meanwhile
    /// are buffered by sqlx and delivered by the next `try_recv`.
    async fn keepalive(&self, listener: &mut PgListener) -> Result<(), sqlx::Error> {
        let ping = sqlx::query("SELECT 1").persistent(false).execute(listener);
        match timeout(self.timeout, ping).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "keepalive query got no answer",
            ))),
        }
    }
}

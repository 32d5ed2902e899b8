//! Release notifications: one shared pub/sub connection per server, fanned out per channel.
//!
//! The first waiter on a lock name costs one `SUBSCRIBE` round trip on a connection opened
//! once per backend; later waiters on the same name cost none. When the last waiter's
//! stream is dropped, the channel stays subscribed for [`LINGER`] (so a process that waits
//! on the same name again and again pays nothing), then is unsubscribed in the background.
//! When the connection drops, every stream ends, which tells lockcore's acquire loop to
//! fall back to polling; the next `subscribe` opens a new connection.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::{StreamExt, stream};
use lockcore::{ReleaseEvents, Result};
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::error::{Call, map_error, timed_out};
use crate::link::Connector;

/// Notifications buffered per waiter; a waiter that lags just gets one spurious wake-up.
const CAPACITY: usize = 16;
/// How long a channel nobody listens to stays subscribed before it is unsubscribed.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

type Routes = Mutex<HashMap<String, broadcast::Sender<()>>>;

fn routes(routes: &Routes) -> MutexGuard<'_, HashMap<String, broadcast::Sender<()>>> {
    routes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared subscriber of one server.
pub(crate) struct Notifier {
    connector: Arc<Connector>,
    label: Arc<str>,
    timeout: Duration,
    connect_timeout: Duration,
    hub: tokio::sync::Mutex<Option<Hub>>,
    generations: AtomicU64,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("url", &self.label)
            .finish_non_exhaustive()
    }
}

/// One live pub/sub connection: the command side, and the task routing its messages.
struct Hub {
    sink: PubSubSink,
    routes: Arc<Routes>,
    dispatch: JoinHandle<()>,
    generation: u64,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.dispatch.abort();
        // Dropping the senders ends every waiter's stream: they fall back to polling.
        routes(&self.routes).clear();
    }
}

impl Notifier {
    pub(crate) fn new(
        connector: Arc<Connector>,
        label: Arc<str>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            connector,
            label,
            timeout,
            connect_timeout,
            hub: tokio::sync::Mutex::new(None),
            generations: AtomicU64::new(0),
        }
    }

    /// A stream that yields after every publish on `channel` from now on.
    ///
    /// Returns once the server has confirmed the subscription, so no later release is missed.
    pub(crate) async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<ReleaseEvents> {
        let mut slot = self.hub.lock().await;
        if slot.as_ref().is_some_and(|hub| hub.dispatch.is_finished()) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.open().await?);
        }
        let Some(hub) = slot.as_mut() else {
            unreachable!("the hub was just opened");
        };
        let existing = routes(&hub.routes).get(channel).map(|tx| tx.subscribe());
        let mut unconfirmed = None;
        let receiver = existing.unwrap_or_else(|| {
            let (tx, receiver) = broadcast::channel(CAPACITY);
            unconfirmed = Some(Unconfirmed {
                routes: Arc::clone(&hub.routes),
                channel: channel.to_owned(),
                tx: tx.clone(),
                armed: true,
            });
            routes(&hub.routes).insert(channel.to_owned(), tx);
            receiver
        });
        // Built before the await below: if this future is dropped while the SUBSCRIBE is in
        // flight, the guard still unsubscribes the channel.
        let subscription = Subscription {
            receiver: Some(receiver),
            notifier: Arc::downgrade(self),
            channel: channel.to_owned(),
            generation: hub.generation,
        };
        if let Some(unconfirmed) = unconfirmed {
            let confirmed = tokio::time::timeout(self.timeout, hub.sink.subscribe(channel));
            if let Err(err) = self.settle(Call::Subscribe, confirmed.await) {
                *slot = None;
                return Err(err);
            }
            unconfirmed.confirmed();
        }
        Ok(events(subscription))
    }

    async fn open(&self) -> Result<Hub> {
        let connect = tokio::time::timeout(self.connect_timeout, self.connector.pubsub());
        let pubsub = match connect.await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(err)) => return Err(map_error(&err, Call::Subscribe, &self.label)),
            Err(_) => {
                return Err(timed_out(
                    Call::Subscribe,
                    &self.label,
                    self.connect_timeout,
                ));
            }
        };
        let (sink, stream) = pubsub.split();
        let routes = Arc::new(Routes::default());
        let dispatch = tokio::spawn(dispatch(stream, Arc::clone(&routes)));
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        Ok(Hub {
            sink,
            routes,
            dispatch,
            generation,
        })
    }

    /// After [`LINGER`], unsubscribes `channel` if nobody listens any more, or nothing
    /// routes it (and the connection is the same).
    async fn unsubscribe(&self, channel: &str, generation: u64) {
        tokio::time::sleep(LINGER).await;
        let mut slot = self.hub.lock().await;
        let Some(hub) = slot.as_mut().filter(|hub| hub.generation == generation) else {
            return;
        };
        let idle = {
            let mut routes = routes(&hub.routes);
            // No route at all: a SUBSCRIBE cut off in flight took its route out (see
            // `Unconfirmed`) but may have reached the server; unsubscribing is harmless.
            let idle = routes
                .get(channel)
                .is_none_or(|tx| tx.receiver_count() == 0);
            if idle {
                routes.remove(channel);
            }
            idle
        };
        if idle {
            let done = tokio::time::timeout(self.timeout, hub.sink.unsubscribe(channel)).await;
            if let Err(err) = self.settle(Call::Unsubscribe, done) {
                tracing::debug!(error = %err, "unsubscribe failed; reconnecting on next use");
                *slot = None;
            }
        }
    }

    fn settle(
        &self,
        call: Call,
        outcome: std::result::Result<redis::RedisResult<()>, tokio::time::error::Elapsed>,
    ) -> Result<()> {
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(map_error(&err, call, &self.label)),
            Err(_) => Err(timed_out(call, &self.label, self.timeout)),
        }
    }
}

/// A channel's route whose `SUBSCRIBE` the server has not confirmed yet. Dropped before
/// [`confirmed`](Self::confirmed) (the subscribing future was dropped mid-flight, still
/// holding the hub's lock), it takes the route out again, so the next waiter on the channel
/// sends a `SUBSCRIBE` of its own and waits for the confirmation, instead of sharing a
/// route the server may never have been told about.
struct Unconfirmed {
    routes: Arc<Routes>,
    channel: String,
    tx: broadcast::Sender<()>,
    armed: bool,
}

impl Unconfirmed {
    fn confirmed(mut self) {
        self.armed = false;
    }
}

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut routes = routes(&self.routes);
        if routes
            .get(&self.channel)
            .is_some_and(|tx| tx.same_channel(&self.tx))
        {
            routes.remove(&self.channel);
        }
    }
}

/// Routes each message to its channel's waiters until the connection ends.
async fn dispatch(mut stream: PubSubStream, table: Arc<Routes>) {
    while let Some(message) = stream.next().await {
        if let Some(tx) = routes(&table).get(message.get_channel_name()) {
            // No receivers left is fine: the unsubscribe is on its way.
            let _ = tx.send(());
        }
    }
    routes(&table).clear();
}

/// One waiter's subscription; unsubscribes the channel when the last waiter leaves.
struct Subscription {
    receiver: Option<broadcast::Receiver<()>>,
    notifier: Weak<Notifier>,
    channel: String,
    generation: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Drop our receiver first, so the count the unsubscribe task reads excludes it.
        self.receiver = None;
        let Some(notifier) = self.notifier.upgrade() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let channel = std::mem::take(&mut self.channel);
        let generation = self.generation;
        runtime.spawn(async move { notifier.unsubscribe(&channel, generation).await });
    }
}

fn events(subscription: Subscription) -> ReleaseEvents {
    Box::pin(stream::unfold(subscription, |mut sub| async move {
        let receiver = sub.receiver.as_mut()?;
        match receiver.recv().await {
            Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => Some(((), sub)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }))
}

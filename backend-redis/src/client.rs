//! Wire calls: one server's connection and the script calls (the scripts are in
//! [`scripts`](crate::scripts), their replies decoded by [`replies`](crate::replies), client
//! errors mapped by [`error`](crate::error)).
//!
//! Every lock operation is one `EVALSHA` (one round trip); a batch of refreshes is one
//! pipeline of them (one round trip). The `redis` crate's
//! [`redis::Script`] answers `NOSCRIPT` (after a `SCRIPT FLUSH` or a server restart) by
//! loading the script and sending the `EVALSHA` again, so only that rare call takes three
//! round trips.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{ConnectionSecurity, ReleaseEvents, Result, TlsDetails, Transport};
use redis::{RedisError, Script, Value};

use crate::error::{Call, Refusal, is_refusal, malformed, map_error, refusal_of, timed_out};
use crate::keys::{Found, LockKeys};
use crate::link::Link;
use crate::node_url::NodeUrl;
use crate::notify::Notifier;
use crate::permit_scripts::PERMIT_SCRIPTS;
use crate::pipeline::{Batch, Queue, bad_load, is_sha_of, run_all};
use crate::replies::{
    AcquireReply, RefreshReply, decode_acquire, decode_found, decode_refresh, time_from_reply,
};
use crate::scripts::{ACQUIRE, BREAK, INSPECT, REFRESH, RELEASE};

/// How many leases one refresh pipeline carries (`refresh_batch_limit` of both backends).
///
/// 1,000 refresh calls are about 370 KB of request and 4.4 KB of reply, and take the
/// server 2.3–4 ms (measured in `docs/redis.md`, "Batched refresh"), well inside
/// Redlock's per-node timeout of 50 ms (batches sent together wait longer:
/// [`wait_limit`](crate::pipeline::wait_limit)); 10,000 held leases then refresh in 10
/// round trips per interval (0.1 % of one per lease). Larger pipelines save little more
/// and put more leases behind one timeout.
pub(crate) const REFRESH_BATCH_LIMIT: usize = 1000;

/// One lease to extend: its keys, the value the lock key must still hold, the new TTL.
#[derive(Debug)]
pub(crate) struct RefreshItem<'a> {
    pub(crate) keys: LockKeys,
    pub(crate) value: &'a str,
    pub(crate) ttl_ms: u64,
}

impl RefreshItem<'_> {
    /// Adds this lease's refresh script call to `batch`.
    pub(crate) fn push_to(&self, batch: &mut Batch) {
        (batch
            .call(&REFRESH)
            .key(self.keys.lock())
            .key(self.keys.note()))
        .arg(self.value)
        .arg(self.ttl_ms);
    }
}

/// One Redis server: a reconnecting multiplexed connection with per-call timeouts, and a
/// shared pub/sub connection for release notifications.
#[derive(Clone)]
pub(crate) struct Node {
    link: Link,
    notifier: Arc<Notifier>,
    label: Arc<str>,
    url: Arc<NodeUrl>,
    timeout: Duration,
    connect_timeout: Duration,
    /// Script calls sent and not yet answered (or given up on) on the connections of
    /// every node of one backend: they share one client thread and one machine.
    queue: Queue,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("url", &self.label)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node that connects on first use. Each call waits at most `timeout` for its reply;
    /// a script call longer while other scripts are in flight on `queue` (shared by the
    /// backend's nodes; [`wait_limit`](crate::pipeline::wait_limit)). A broken connection
    /// is re-established once per failing call (no retry loop here). Must run inside a
    /// Tokio runtime.
    pub(crate) fn lazy(
        url: &NodeUrl,
        timeout: Duration,
        connect_timeout: Duration,
        queue: Queue,
    ) -> Result<Self> {
        let label: Arc<str> = Arc::from(url.redacted());
        let connector = Arc::new(url.connector(connect_timeout)?);
        let link = Link::lazy(Arc::clone(&connector));
        let notifier = Notifier::new(connector, Arc::clone(&label), timeout, connect_timeout);
        Ok(Self {
            link,
            notifier: Arc::new(notifier),
            label,
            url: Arc::new(url.clone()),
            timeout,
            connect_timeout,
            queue,
        })
    }

    /// What this node's connections use: TLS (verification from the URL, version and
    /// cipher from one probe handshake, left out when the probe fails) or plaintext, and the
    /// ACL user from `ACL WHOAMI` (the URL's user when the server does not answer it).
    pub(crate) async fn security(&self) -> ConnectionSecurity {
        // Asked first: a node that does not answer (down, or refusing our TLS or
        // credentials) has no transport or identity to report, whatever the URL asks for.
        let user = match self.whoami().await {
            Ok(Some(user)) => user,
            // Connected and authenticated, but not allowed to ask who we are.
            Ok(None) => self.url.user(),
            Err(err) => {
                tracing::debug!(node = %self.label, error = %err, "ACL WHOAMI failed");
                return ConnectionSecurity::new(
                    self.url.endpoint(),
                    Transport::NotConnected(err.message().to_owned()),
                );
            }
        };
        let transport = match self.url.tls_material() {
            Some(material) => Transport::Tls(self.probe(material).await),
            None => Transport::Plaintext,
        };
        let how = if self.url.has_password() {
            "password"
        } else {
            "no password"
        };
        ConnectionSecurity::new(self.url.endpoint(), transport)
            .with_identity(format!("user \"{user}\" ({how})"))
    }

    async fn probe(&self, material: &anylock_tls::TlsMaterial) -> TlsDetails {
        let verification = self.url.verification();
        let details = TlsDetails::new(verification, material.client().is_some())
            .with_roots(anylock_tls::roots_description(material));
        let host = self.url.host();
        let probed = match anylock_tls::client_config(material, verification) {
            Ok(config) => {
                let preamble = anylock_tls::Preamble::None;
                let limit = self.connect_timeout;
                anylock_tls::probe(&host, self.url.port(), &host, config, preamble, limit).await
            }
            Err(err) => Err(err),
        };
        match probed {
            Ok(negotiated) => {
                details.with_negotiated(Some(negotiated.version), Some(negotiated.cipher))
            }
            Err(err) => {
                tracing::debug!(node = %self.label, error = %err, "TLS probe failed");
                details
            }
        }
    }

    /// `ACL WHOAMI`: the user this connection authenticated as; `None` when the ACL
    /// forbids asking (the connection works and is authenticated).
    async fn whoami(&self) -> Result<Option<String>> {
        let mut conn = self.link.clone();
        let mut whoami = redis::cmd("ACL");
        whoami.arg("WHOAMI");
        let reply = tokio::time::timeout(self.timeout, whoami.query_async::<String>(&mut conn));
        match reply.await {
            Ok(Ok(user)) => Ok(Some(user)),
            Ok(Err(err)) if refusal_of(&err) == Some(Refusal::Acl) => Ok(None),
            Ok(Err(err)) => Err(map_error(&err, Call::Ping, &self.label)),
            Err(_) => Err(timed_out(Call::Ping, &self.label, self.timeout)),
        }
    }

    /// The node's URL, password redacted.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// One `PING`: proves the server is reachable and accepts our credentials. It usually
    /// opens the connection too (TCP, TLS handshake, `AUTH`), so it may take the connect
    /// timeout plus the per-call timeout: a Redlock node's 50 ms alone is too short for a
    /// TLS handshake on a busy machine.
    ///
    /// Then loads every script (`SCRIPT LOAD`, one pipelined round trip, within the same
    /// limit), so the first lock call is one `EVALSHA` rather than `EVALSHA`, `NOSCRIPT`,
    /// `SCRIPT LOAD` and `EVALSHA` again: three round trips and a compile that a Redlock
    /// node's 50 ms can miss over TLS on a busy machine. Best effort: a refusal or timeout
    /// leaves the scripts to load on first use, as after a `SCRIPT FLUSH`.
    ///
    /// A reply no Redis server gives (`PING` answered with anything but `PONG`, a `SCRIPT
    /// LOAD` answered with anything but the script's SHA1) is a `Protocol` error: the
    /// server is not Redis, and nothing it says can be trusted.
    pub(crate) async fn ping(&self) -> Result<()> {
        let mut conn = self.link.clone();
        let ping = redis::cmd("PING");
        let limit = self.connect_timeout + self.timeout;
        let started = tokio::time::Instant::now();
        let reply = tokio::time::timeout(limit, ping.query_async::<Value>(&mut conn)).await;
        match reply {
            Ok(Ok(pong)) if is_pong(&pong) => {}
            Ok(Ok(other)) => return Err(not_redis(Call::Ping, &self.label, "PING", &other)),
            Ok(Err(err)) => return Err(map_error(&err, Call::Ping, &self.label)),
            Err(_) => return Err(timed_out(Call::Ping, &self.label, limit)),
        }
        let scripts: Vec<&Script> = (crate::scripts::ALL.iter().chain(&PERMIT_SCRIPTS))
            .map(|script| -> &Script { script })
            .collect();
        let mut load = redis::pipe();
        for script in &scripts {
            load.load_script(script);
        }
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, load.query_async::<Vec<Value>>(&mut conn)).await {
            Ok(Ok(shas)) => {
                let all = shas.len() == scripts.len()
                    && shas.iter().zip(&scripts).all(|(sha, s)| is_sha_of(sha, s));
                if !all {
                    return Err(bad_load(Call::Ping, &self.label));
                }
            }
            Ok(Err(err)) if refusal_of(&err).is_some() || is_refusal(&err) => {
                tracing::debug!(node = %self.label, %err, "scripts not preloaded");
            }
            Ok(Err(err)) => return Err(map_error(&err, Call::Ping, &self.label)),
            Err(_) => tracing::debug!(node = %self.label, "scripts not preloaded in time"),
        }
        Ok(())
    }

    /// One `TIME`: the server's clock, as seconds and microseconds since the Unix epoch.
    pub(crate) async fn time(&self) -> Result<std::time::SystemTime> {
        let mut conn = self.link.clone();
        let time = redis::cmd("TIME");
        let reply = tokio::time::timeout(self.timeout, time.query_async::<(u64, u64)>(&mut conn));
        match reply.await {
            Ok(Ok((secs, micros))) => {
                time_from_reply(secs, micros).ok_or_else(|| malformed(Call::Time, &self.label))
            }
            Ok(Err(err)) => Err(map_error(&err, Call::Time, &self.label)),
            Err(_) => Err(timed_out(Call::Time, &self.label, self.timeout)),
        }
    }

    /// `CONFIG GET pattern`. The outer error is a broken connection or a timeout; the inner
    /// one is the server refusing the command (an ACL without `CONFIG`, a renamed command).
    pub(crate) async fn config_get(
        &self,
        pattern: &str,
    ) -> Result<std::result::Result<Value, RedisError>> {
        let mut conn = self.link.clone();
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg(pattern);
        let reply = tokio::time::timeout(self.timeout, get.query_async::<Value>(&mut conn));
        match reply.await {
            Ok(Ok(value)) => Ok(Ok(value)),
            Ok(Err(err)) if is_refusal(&err) => Ok(Err(err)),
            Ok(Err(err)) => Err(map_error(&err, Call::Config, &self.label)),
            Err(_) => Err(timed_out(Call::Config, &self.label, self.timeout)),
        }
    }

    /// Runs the acquire script. `fenced` adds the fence counter (single instance); `note`
    /// is stored with the grant (`""` for none).
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        fenced: bool,
        ttl_ms: u64,
        owner: &str,
        suffix: &str,
        note: &str,
    ) -> Result<AcquireReply> {
        let mut batch = Batch::default();
        let invocation = batch.call(&ACQUIRE);
        invocation.key(keys.lock()).key(keys.note());
        if fenced {
            invocation.key(keys.fence());
        }
        invocation.arg(ttl_ms).arg(owner).arg(suffix).arg(note);
        let reply = self.run(Call::Acquire, &batch).await?;
        decode_acquire(reply).ok_or_else(|| malformed(Call::Acquire, &self.label))
    }

    /// Runs the refresh script for every item in one pipeline ([`run_batch`](Self::run_batch)):
    /// `PEXPIRE` the lock and note keys where the lock key still holds the item's value.
    /// One result per item, in order, decoded as one call would be.
    pub(crate) async fn refresh_many(
        &self,
        items: &[RefreshItem<'_>],
    ) -> Vec<Result<RefreshReply>> {
        let mut batch = Batch::default();
        for item in items {
            item.push_to(&mut batch);
        }
        (self.run_batch(Call::Refresh, &batch).await.into_iter())
            .map(|reply| {
                decode_refresh(reply?).ok_or_else(|| malformed(Call::Refresh, &self.label))
            })
            .collect()
    }

    /// Runs every script call of `batch` in one pipeline (one round trip; one `EVALSHA`
    /// each; the calls may be of different scripts). Calls answered `NOSCRIPT` (after a
    /// `SCRIPT FLUSH` or a restart) are sent again behind a `SCRIPT LOAD` of their scripts
    /// in a second pipeline, as a single call would load and retry ([`run_all`]). Both
    /// together wait at most the per-call timeout plus an allowance per script in flight on
    /// the backend's connections, this batch's included
    /// ([`wait_limit`](crate::pipeline::wait_limit)): the per-call timeout alone fails full
    /// batches sent together on a busy machine.
    ///
    /// One reply per call, in order: a call the server refused (a `WRONGTYPE` on a planted
    /// key) fails alone; a failure of the whole pipeline (connection, timeout, a reply count
    /// that does not match) fails every call with the error one call would get (for a
    /// writing `call`: `OutcomeUnknown` unless the connection was refused), never `Lost`.
    /// When only the `NOSCRIPT` retry fails, the calls the first pipeline answered keep
    /// their answers.
    pub(crate) async fn run_batch(&self, call: Call, batch: &Batch) -> Vec<Result<Value>> {
        if batch.is_empty() {
            return Vec::new();
        }
        // Built before the clock starts: the limit bounds the wait for the server.
        let pipe = batch.pipeline();
        let queued = self.queue.enqueue(batch.len());
        let mut conn = self.link.clone();
        let within = (&queued, self.timeout);
        run_all(&mut conn, call, &self.label, batch, &pipe, within).await
    }

    /// Runs the release script; `true` when our key was deleted (and waiters notified).
    pub(crate) async fn release(&self, keys: &LockKeys, value: &str) -> Result<bool> {
        let mut batch = Batch::default();
        let invocation = batch.call(&RELEASE);
        invocation
            .key(keys.lock())
            .key(keys.note())
            .arg(value)
            .arg(keys.channel());
        match self.run(Call::Release, &batch).await? {
            Value::Int(n) => Ok(n == 1),
            _ => Err(malformed(Call::Release, &self.label)),
        }
    }

    /// Reads the stored value, its `PTTL` and note; `None` when the key does not exist.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> Result<Option<Found>> {
        let mut batch = Batch::default();
        let invocation = batch.call(&INSPECT);
        invocation.key(keys.lock()).key(keys.note());
        let reply = self.run(Call::Inspect, &batch).await?;
        decode_found(reply).ok_or_else(|| malformed(Call::Inspect, &self.label))
    }

    /// Deletes whatever grant holds `keys` and notifies waiters; the removed value, its
    /// `PTTL` and note, or `None` when the key did not exist.
    pub(crate) async fn break_lock(&self, keys: &LockKeys) -> Result<Option<Found>> {
        let mut batch = Batch::default();
        let invocation = batch.call(&BREAK);
        invocation
            .key(keys.lock())
            .key(keys.note())
            .arg(keys.channel());
        let reply = self.run(Call::Break, &batch).await?;
        decode_found(reply).ok_or_else(|| malformed(Call::Break, &self.label))
    }

    /// One command bounded by the per-call timeout.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        call: Call,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        let mut conn = self.link.clone();
        let reply = tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await;
        match reply {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(map_error(&err, call, &self.label)),
            Err(_) => Err(timed_out(call, &self.label, self.timeout)),
        }
    }

    /// Subscribes to the release channel of `keys`.
    pub(crate) async fn subscribe(&self, keys: &LockKeys) -> Result<ReleaseEvents> {
        self.notifier.subscribe(keys.channel()).await
    }

    /// The one script call of `batch`: [`run_batch`](Self::run_batch) of one (one
    /// `EVALSHA`; after `NOSCRIPT`, one more round trip with `SCRIPT LOAD`, its reply
    /// checked), bounded by the per-call timeout plus the allowance for the scripts in
    /// flight with it ([`wait_limit`](crate::pipeline::wait_limit)): an acquire or release
    /// sent during a burst of refresh batches waits for them too.
    pub(crate) async fn run(&self, call: Call, batch: &Batch) -> Result<Value> {
        let mut replies = self.run_batch(call, batch).await;
        match (replies.pop(), replies.is_empty()) {
            (Some(reply), true) => reply,
            _ => Err(malformed(call, &self.label)),
        }
    }
}

/// Whether a `PING` reply is Redis's: `+PONG` (a bulk `PONG` from a proxy too).
fn is_pong(reply: &Value) -> bool {
    match reply {
        Value::SimpleString(pong) => pong == "PONG",
        Value::BulkString(pong) => pong == b"PONG",
        _ => false,
    }
}

/// The error for a reply no Redis server gives to `command`, naming only its type (the
/// text comes from the server and is not shown).
pub(crate) fn not_redis(call: Call, label: &str, command: &str, reply: &Value) -> lockcore::Error {
    let kind = match reply {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) | Value::VerbatimString { .. } => {
            "another string"
        }
        Value::Array(_) | Value::Set(_) | Value::Map(_) => "a collection",
        Value::Okay => "OK",
        _ => "another kind of value",
    };
    lockcore::Error::new(
        lockcore::ErrorKind::Protocol,
        format!("{call} on {label}: {command} answered {kind}; is this a Redis server?"),
    )
}

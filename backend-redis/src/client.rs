//! Wire calls: one server's connection, the script calls (the scripts are in
//! [`scripts`](crate::scripts)), and the one table that maps Redis client errors to
//! lockcore error kinds.
//!
//! Every lock operation is one `EVALSHA` (one round trip). The `redis` crate's
//! [`redis::Script`] answers `NOSCRIPT` (after a `SCRIPT FLUSH` or a server restart) by
//! loading the script and sending the `EVALSHA` again, so only that rare call takes three
//! round trips.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    ConnectionSecurity, Error, ErrorKind, LockName, ReleaseEvents, Result, TlsDetails, Transport,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, ScriptInvocation, Value};

use crate::keys::{self, Found, LockKeys};
use crate::node_url::NodeUrl;
use crate::notify::Notifier;
use crate::scripts::{ACQUIRE, BREAK, INSPECT, READ_MANY, REFRESH, RELEASE};

/// How many keys one `SCAN` call of a listing asks the server to look at (a hint; the
/// server may return somewhat more or fewer matches per page).
pub(crate) const SCAN_COUNT: usize = 500;

/// Which call failed; decides whether a lost reply leaves the outcome unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Connect,
    Ping,
    Time,
    Config,
    Acquire,
    Refresh,
    Release,
    Inspect,
    List,
    Break,
    Subscribe,
    Unsubscribe,
}

impl Call {
    /// Whether the call writes: a timeout or dropped connection may have applied it.
    fn writes(self) -> bool {
        matches!(
            self,
            Self::Acquire | Self::Refresh | Self::Release | Self::Break
        )
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "connect",
            Self::Ping => "ping",
            Self::Time => "server time",
            Self::Config => "memory settings check",
            Self::Acquire => "acquire",
            Self::Refresh => "refresh",
            Self::Release => "release",
            Self::Inspect => "inspect",
            Self::List => "list",
            Self::Break => "break",
            Self::Subscribe => "subscribe",
            Self::Unsubscribe => "unsubscribe",
        })
    }
}

/// The error kind for a Redis client error: the one mapping table of this crate.
///
/// The retry status follows from the kind: `Unavailable` and `OutcomeUnknown` are
/// temporary, everything else permanent.
fn classify(err: &RedisError, call: Call) -> ErrorKind {
    use redis::ErrorKind as K;
    use redis::ServerErrorKind as S;
    match err.kind() {
        K::AuthenticationFailed | K::Server(S::NoPerm) => ErrorKind::PermissionDenied,
        K::InvalidClientConfig | K::RESP3NotSupported | K::Client => ErrorKind::Config,
        // A Redis Cluster answered: point the URL at one node (or use the hash-tagged keys
        // with a cluster-aware proxy).
        K::Server(S::Moved | S::Ask | S::CrossSlot) => ErrorKind::Config,
        K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly) => {
            ErrorKind::Unavailable
        }
        // Flushed again between SCRIPT LOAD and EVALSHA: the next attempt reloads.
        K::Server(S::NoScript) => ErrorKind::Unavailable,
        K::Io if err.is_connection_refusal() => ErrorKind::Unavailable,
        K::Io if call.writes() => ErrorKind::OutcomeUnknown,
        K::Io => ErrorKind::Unavailable,
        K::Extension => match err.code() {
            Some("NOAUTH" | "WRONGPASS" | "NOPERM") => ErrorKind::PermissionDenied,
            Some("OOM" | "BUSY" | "LOADING" | "MASTERDOWN") => ErrorKind::Unavailable,
            _ => ErrorKind::Protocol,
        },
        _ => ErrorKind::Protocol,
    }
}

/// Maps a Redis client error to a lockcore error naming the call and the (redacted) node.
///
/// A TLS failure anywhere in the error's source chain (the `redis` crate keeps rustls's
/// error inside its I/O error) is worded by [`anylock_tls::diagnose`]; rejected credentials
/// and ACL refusals name the user and the fix. None of these contain the password: the
/// node label is redacted and Redis never echoes it.
pub(crate) fn map_error(err: &RedisError, call: Call, node: &str) -> Error {
    let (kind, message) = match tls_failure(err) {
        Some(tls) => (tls.kind(), format!("{call} on {node}: {}", tls.message())),
        None => (classify(err, call), explain(err, call, node)),
    };
    Error::new(kind, message)
        .with_backend("redis")
        .with_source(err.clone())
}

/// A TLS failure in `err`, worded by [`anylock_tls::diagnose`]. The `redis` crate keeps
/// the I/O error that carries rustls's error behind an `Arc<dyn Error>`, whose `source()`
/// skips the I/O error itself, so the chain is looked through that `Arc` too.
fn tls_failure(err: &RedisError) -> Option<Error> {
    if let Some(found) = anylock_tls::diagnose(err) {
        return Some(found);
    }
    let shared = std::error::Error::source(err)?
        .downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()?;
    let inner: &(dyn std::error::Error + 'static) = &**shared;
    anylock_tls::diagnose(inner)
}

/// The message for a client error: what the server refused and what to do about it.
fn explain(err: &RedisError, call: Call, node: &str) -> String {
    let user = || user_of(node);
    match refusal_of(err) {
        Some(Refusal::Credentials) => format!(
            "{call} on {node}: authentication failed for user \"{}\": the server refused the \
             user name and password ({err}); check both in the URL (a wrong password, an \
             unknown or disabled ACL user, or `requirepass` set with no password given)",
            user()
        ),
        Some(Refusal::Acl) => format!(
            "{call} on {node}: the ACL permission is missing: user \"{}\" may not run this \
             ({err}); grant the commands, keys and channels anylock uses (the least-privilege \
             `ACL SETUSER` recipe in docs/tls-and-auth.md, section \"Redis and Redlock\")",
            user()
        ),
        None => format!("{call} on {node}: {err}"),
    }
}

/// What kind of refusal a server error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `WRONGPASS`, `NOAUTH`, or the client's own authentication failure.
    Credentials,
    /// `NOPERM`: the ACL user lacks a command, key or channel.
    Acl,
}

fn refusal_of(err: &RedisError) -> Option<Refusal> {
    use redis::ErrorKind as K;
    match (err.kind(), err.code()) {
        (K::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => {
            Some(Refusal::Credentials)
        }
        (K::Server(redis::ServerErrorKind::NoPerm), _) | (_, Some("NOPERM")) => Some(Refusal::Acl),
        _ => None,
    }
}

/// The ACL user named in a (redacted) node URL; `default` without one.
fn user_of(node: &str) -> String {
    let user = url::Url::parse(node)
        .ok()
        .map(|url| url.username().to_owned())
        .unwrap_or_default();
    match user.as_str() {
        "" => "default".to_owned(),
        _ => crate::node_url::percent_decoded(&user),
    }
}

/// The error for a call that got no reply in time.
pub(crate) fn timed_out(call: Call, node: &str, limit: Duration) -> Error {
    let kind = if call.writes() {
        ErrorKind::OutcomeUnknown
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("{call} on {node}: no reply within {limit:?}")).with_backend("redis")
}

fn malformed(call: Call, node: &str) -> Error {
    Error::new(
        ErrorKind::Protocol,
        format!("{call} on {node}: unexpected script reply"),
    )
    .with_backend("redis")
}

/// What the acquire script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours; the stored value.
    Granted(String),
    /// Someone else holds it: their value, `PTTL` and note.
    Held(Found),
}

/// What the refresh script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RefreshReply {
    Extended,
    Missing,
    /// Another grant holds the key: its value.
    Changed(String),
}

/// One Redis server: a reconnecting multiplexed connection with per-call timeouts, and a
/// shared pub/sub connection for release notifications.
#[derive(Clone)]
pub(crate) struct Node {
    manager: ConnectionManager,
    notifier: Arc<Notifier>,
    label: Arc<str>,
    url: Arc<NodeUrl>,
    timeout: Duration,
    connect_timeout: Duration,
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
    /// a broken connection is re-established once per failing call (no retry loop here).
    /// Must run inside a Tokio runtime.
    pub(crate) fn lazy(
        url: &NodeUrl,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let label: Arc<str> = Arc::from(url.redacted());
        if url.is_tls() {
            install_tls_provider();
        }
        let client = url.client()?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout));
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|err| map_error(&err, Call::Connect, &label))?;
        let notifier = Notifier::new(client, Arc::clone(&label), timeout, connect_timeout);
        Ok(Self {
            manager,
            notifier: Arc::new(notifier),
            label,
            url: Arc::new(url.clone()),
            timeout,
            connect_timeout,
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
        let mut conn = self.manager.clone();
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
    pub(crate) async fn ping(&self) -> Result<()> {
        let mut conn = self.manager.clone();
        let ping = redis::cmd("PING");
        let limit = self.connect_timeout + self.timeout;
        let started = tokio::time::Instant::now();
        let reply = tokio::time::timeout(limit, ping.query_async::<Value>(&mut conn)).await;
        match reply {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => return Err(map_error(&err, Call::Ping, &self.label)),
            Err(_) => return Err(timed_out(Call::Ping, &self.label, limit)),
        }
        let mut load = redis::pipe();
        for lua in crate::scripts::ALL_LUA {
            load.cmd("SCRIPT").arg("LOAD").arg(lua);
        }
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, load.query_async::<Vec<String>>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::debug!(node = %self.label, %err, "scripts not preloaded"),
            Err(_) => tracing::debug!(node = %self.label, "scripts not preloaded in time"),
        }
        Ok(())
    }

    /// One `TIME`: the server's clock, as seconds and microseconds since the Unix epoch.
    pub(crate) async fn time(&self) -> Result<std::time::SystemTime> {
        let mut conn = self.manager.clone();
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
        let mut conn = self.manager.clone();
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
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation.key(keys.lock()).key(keys.note());
        if fenced {
            invocation.key(keys.fence());
        }
        invocation.arg(ttl_ms).arg(owner).arg(suffix).arg(note);
        let reply = self.run(Call::Acquire, &invocation).await?;
        decode_acquire(reply).ok_or_else(|| malformed(Call::Acquire, &self.label))
    }

    /// Runs the refresh script: `PEXPIRE ttl_ms` if the key still holds `value`.
    pub(crate) async fn refresh(
        &self,
        keys: &LockKeys,
        value: &str,
        ttl_ms: u64,
    ) -> Result<RefreshReply> {
        let mut invocation = REFRESH.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.note())
            .arg(value)
            .arg(ttl_ms);
        match self.run(Call::Refresh, &invocation).await? {
            Value::Int(1) => Ok(RefreshReply::Extended),
            Value::Int(0) => Ok(RefreshReply::Missing),
            other => text(&other)
                .map(RefreshReply::Changed)
                .ok_or_else(|| malformed(Call::Refresh, &self.label)),
        }
    }

    /// Runs the release script; `true` when our key was deleted (and waiters notified).
    pub(crate) async fn release(&self, keys: &LockKeys, value: &str) -> Result<bool> {
        let mut invocation = RELEASE.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.note())
            .arg(value)
            .arg(keys.channel());
        match self.run(Call::Release, &invocation).await? {
            Value::Int(n) => Ok(n == 1),
            _ => Err(malformed(Call::Release, &self.label)),
        }
    }

    /// Reads the stored value, its `PTTL` and note; `None` when the key does not exist.
    pub(crate) async fn inspect(&self, keys: &LockKeys) -> Result<Option<Found>> {
        let mut invocation = INSPECT.prepare_invoke();
        invocation.key(keys.lock()).key(keys.note());
        let reply = self.run(Call::Inspect, &invocation).await?;
        decode_found(reply).ok_or_else(|| malformed(Call::Inspect, &self.label))
    }

    /// Deletes whatever grant holds `keys` and notifies waiters; the removed value, its
    /// `PTTL` and note, or `None` when the key did not exist.
    pub(crate) async fn break_lock(&self, keys: &LockKeys) -> Result<Option<Found>> {
        let mut invocation = BREAK.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.note())
            .arg(keys.channel());
        let reply = self.run(Call::Break, &invocation).await?;
        decode_found(reply).ok_or_else(|| malformed(Call::Break, &self.label))
    }

    /// Every lock held on this node under the key prefix `prefix` whose name starts with
    /// `name_prefix`, in no particular order (names may repeat: `SCAN` may return a key
    /// twice). Pages through `SCAN cursor MATCH pattern COUNT` ([`SCAN_COUNT`]), each page
    /// followed by one read-only script call that reads the candidates' values, `PTTL`s and
    /// notes; keys gone by then, fence, note and foreign keys are left out.
    pub(crate) async fn list(
        &self,
        prefix: &str,
        name_prefix: &str,
    ) -> Result<Vec<(LockName, Found)>> {
        let pattern = keys::lock_pattern(prefix, name_prefix);
        let mut held = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, found): (u64, Vec<Vec<u8>>) = self.query(Call::List, &scan).await?;
            let names: Vec<LockName> = found
                .iter()
                .filter_map(|key| keys::name_of_lock_key(prefix, name_prefix, key))
                .collect();
            if !names.is_empty() {
                let mut invocation = READ_MANY.prepare_invoke();
                for name in &names {
                    let keys = LockKeys::new(prefix, name);
                    invocation.key(keys.lock()).key(keys.note());
                }
                let reply = self.run(Call::List, &invocation).await?;
                let read = decode_many(reply, names.len())
                    .ok_or_else(|| malformed(Call::List, &self.label))?;
                held.extend(
                    names
                        .into_iter()
                        .zip(read)
                        .filter_map(|(name, found)| Some((name, found?))),
                );
            }
            if next == 0 {
                return Ok(held);
            }
            cursor = next;
        }
    }

    /// One command bounded by the per-call timeout.
    async fn query<T: redis::FromRedisValue>(&self, call: Call, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.manager.clone();
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

    /// One `EVALSHA` bounded by the per-call timeout (plus `SCRIPT LOAD` after `NOSCRIPT`).
    async fn run(&self, call: Call, invocation: &ScriptInvocation<'_>) -> Result<Value> {
        let mut conn = self.manager.clone();
        let reply = tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn)).await;
        match reply {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(map_error(&err, call, &self.label)),
            Err(_) => Err(timed_out(call, &self.label, self.timeout)),
        }
    }
}

/// Whether the server answered the command with an error reply (rather than the
/// connection failing).
fn is_refusal(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// The server clock from a `TIME` reply (seconds and microseconds since the Unix epoch);
/// `None` when no `SystemTime` can hold it.
pub(crate) fn time_from_reply(secs: u64, micros: u64) -> Option<std::time::SystemTime> {
    std::time::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))?
        .checked_add(Duration::from_micros(micros))
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `false` (nil) → `Some(None)`; `{value, pttl, note}` → `Some(Some(..))` (a missing or
/// unreadable note is none); anything else → `None`.
pub(crate) fn decode_found(reply: Value) -> Option<Option<Found>> {
    match reply {
        Value::Nil | Value::Boolean(false) => Some(None),
        Value::Array(items) => match items.as_slice() {
            [value, Value::Int(pttl), rest @ ..] => Some(Some(Found::new(
                text(value)?,
                *pttl,
                rest.first().map(note_text).unwrap_or_default(),
            ))),
            _ => None,
        },
        _ => None,
    }
}

/// A note as the server returned it: bytes that are not UTF-8 are decoded lossily
/// ([`lockcore::Note::from_stored`] then cleans and caps it); anything else is no note.
fn note_text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    }
}

/// The reply of the read-many script: one entry per candidate, `None` for a key that is
/// gone or not a lock (a value that is not UTF-8 too: not one this crate wrote, and
/// `inspect` could not read it either). `None` overall when the reply has the wrong shape.
pub(crate) fn decode_many(reply: Value, expected: usize) -> Option<Vec<Option<Found>>> {
    let Value::Array(items) = reply else {
        return None;
    };
    if items.len() != expected {
        return None;
    }
    Some(
        items
            .into_iter()
            .map(|item| decode_found(item).flatten())
            .collect(),
    )
}

pub(crate) fn decode_acquire(reply: Value) -> Option<AcquireReply> {
    let Value::Array(items) = reply else {
        return None;
    };
    match items.as_slice() {
        [Value::Int(1), value] => Some(AcquireReply::Granted(text(value)?)),
        [Value::Int(0), value, Value::Int(pttl), rest @ ..] => {
            Some(AcquireReply::Held(Found::new(
                text(value)?,
                *pttl,
                rest.first().map(note_text).unwrap_or_default(),
            )))
        }
        _ => None,
    }
}

/// Makes ring the process's rustls provider unless the application chose one.
#[cfg(feature = "tls")]
fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: some provider is then in place.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls"))]
fn install_tls_provider() {}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn lost_replies_of_writes_are_outcome_unknown() {
        let reset = io(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset, Call::Acquire), ErrorKind::OutcomeUnknown);
        assert_eq!(classify(&reset, Call::Release), ErrorKind::OutcomeUnknown);
        assert_eq!(classify(&reset, Call::Inspect), ErrorKind::Unavailable);
        let refused = io(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&refused, Call::Acquire), ErrorKind::Unavailable);
        let late = timed_out(Call::Refresh, "redis://h:1", Duration::from_millis(5));
        assert_eq!(late.kind(), ErrorKind::OutcomeUnknown);
        assert!(late.is_temporary());
        let late = timed_out(Call::Ping, "redis://h:1", Duration::from_millis(5));
        assert_eq!(late.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn server_errors_map_to_kinds() {
        let cases = [
            (
                redis::ErrorKind::AuthenticationFailed,
                ErrorKind::PermissionDenied,
            ),
            (redis::ErrorKind::InvalidClientConfig, ErrorKind::Config),
            (redis::ErrorKind::Parse, ErrorKind::Protocol),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
                ErrorKind::Unavailable,
            ),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
                ErrorKind::Config,
            ),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                ErrorKind::Protocol,
            ),
        ];
        for (redis_kind, expected) in cases {
            let err = RedisError::from((redis_kind, "test"));
            assert_eq!(classify(&err, Call::Acquire), expected, "{redis_kind:?}");
        }
        let err = map_error(
            &RedisError::from((redis::ErrorKind::AuthenticationFailed, "nope")),
            Call::Ping,
            "redis://u:***@h:1",
        );
        assert_eq!(err.backend(), Some("redis"));
        assert!(!err.is_temporary());
    }

    /// Rejected credentials and ACL refusals name the user (percent-decoded) and the fix,
    /// never the password (the label is redacted).
    #[test]
    fn refusals_name_the_user_and_the_fix() {
        let label = "rediss://app%40team:***@h:1/0";
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "nope"));
        let err = map_error(&auth, Call::Ping, label);
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(
            err.message()
                .contains("authentication failed for user \"app@team\""),
            "{err}"
        );
        let noperm = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "no permissions to run the 'evalsha' command",
        ));
        let err = map_error(&noperm, Call::Acquire, "redis://h:1");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.message().contains("user \"default\""), "{err}");
        assert!(err.message().contains("ACL SETUSER"), "{err}");
    }

    #[test]
    fn replies_decode() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            decode_acquire(Value::Array(vec![Value::Int(1), bulk("v")])),
            Some(AcquireReply::Granted("v".into()))
        );
        assert_eq!(
            decode_acquire(Value::Array(vec![Value::Int(0), bulk("w"), Value::Int(-1)])),
            Some(AcquireReply::Held(Found::new("w", -1, "")))
        );
        assert_eq!(
            decode_acquire(Value::Array(vec![
                Value::Int(0),
                bulk("w"),
                Value::Int(5),
                Value::BulkString(b"n\xffote".to_vec())
            ])),
            Some(AcquireReply::Held(Found::new("w", 5, "n\u{fffd}ote")))
        );
        let many = Value::Array(vec![
            Value::Boolean(false),
            Value::Array(vec![bulk("v"), Value::Int(9), bulk("hi")]),
            Value::Array(vec![Value::BulkString(vec![0xff]), Value::Int(9), bulk("")]),
        ]);
        assert_eq!(
            decode_many(many.clone(), 3),
            Some(vec![None, Some(Found::new("v", 9, "hi")), None])
        );
        assert_eq!(decode_many(many, 2), None);
        assert_eq!(decode_acquire(Value::Int(1)), None);
        assert_eq!(decode_acquire(Value::Array(vec![Value::Int(2)])), None);
    }
}

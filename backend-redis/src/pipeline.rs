//! How long a script call may wait on a node's connection, and a pipeline of script calls
//! ([`Batch`]) with its `NOSCRIPT` retry (used by [`Node`](crate::client::Node) for
//! batched refresh).
//!
//! Every call on a node shares one multiplexed connection to one single-threaded server,
//! and every node of a backend shares the client thread that encodes the requests and
//! reads the replies. A call sent along with full refresh batches (the `Locker` sends
//! every batch due at once: 10,000 leases are 10 batches of 1,000 scripts to each of 5
//! Redlock nodes) waits for much of that work first. A call's wait is therefore bounded by
//! the per-call timeout plus an allowance per script in flight on the backend's
//! connections, its own included ([`wait_limit`]).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::Result;
use redis::{RedisError, RedisResult, Script, ScriptInvocation, Value};
use tokio::time::Instant;

use crate::error::{Call, map_error, timed_out};
use crate::link::Link;

/// The wait allowed per script in flight on a backend's connections, on top of the
/// per-call timeout. A server spends 2.3–4 µs per refresh script; 5 and 10 full batches
/// sent at once to 5 nodes (25,000 and 50,000 scripts) all came back within 160–240 and
/// 310–450 ms on a busy 2-core machine (the 5 nodes, the client's debug build and other
/// builds; `docs/redis.md`, "Bursts"): 6–9 µs per script in flight, so 25 µs leaves a
/// margin of about 3. Safe however long: Redlock's validity subtracts the time a quorum
/// took, and a single instance's lease is its TTL from the server's own expiry.
pub(crate) const SCRIPT_ALLOWANCE: Duration = Duration::from_micros(25);

/// How long a call may wait for its reply when `scripts` scripts (its own included) are
/// in flight on the backend's connections: the per-call `timeout`, which covers one
/// script, plus [`SCRIPT_ALLOWANCE`] for each further one. A call alone waits `timeout`.
pub(crate) fn wait_limit(timeout: Duration, scripts: usize) -> Duration {
    let scripts = u32::try_from(scripts.saturating_sub(1)).unwrap_or(u32::MAX);
    timeout.saturating_add(SCRIPT_ALLOWANCE.saturating_mul(scripts))
}

/// The script calls sent on a backend's connections (every node's) and not yet answered
/// or given up on; clones share the count.
#[derive(Clone, Debug, Default)]
pub(crate) struct Queue(Arc<AtomicUsize>);

impl Queue {
    /// Counts `scripts` more until the returned guard is dropped.
    pub(crate) fn enqueue(&self, scripts: usize) -> Queued {
        self.0.fetch_add(scripts, Ordering::Relaxed);
        Queued {
            queue: Arc::clone(&self.0),
            scripts,
            started: Instant::now(),
        }
    }
}

/// Scripts counted in a [`Queue`] while their call waits; uncounted when it ends or is
/// dropped.
#[derive(Debug)]
pub(crate) struct Queued {
    queue: Arc<AtomicUsize>,
    scripts: usize,
    started: Instant,
}

impl Queued {
    /// How long these scripts may wait, from when they were counted: [`wait_limit`] for the
    /// scripts in flight now (these included).
    pub(crate) fn limit(&self, timeout: Duration) -> Duration {
        let in_flight = self.queue.load(Ordering::Relaxed).max(self.scripts);
        wait_limit(timeout, in_flight)
    }

    /// Waits for `call` until [`limit`](Self::limit) has passed since these scripts were
    /// counted. The limit is read again when it runs out, so scripts sent after these
    /// (whose encoding and replies take the same client thread and servers) extend it
    /// while they are in flight. `Err` with the limit that ran out.
    pub(crate) async fn within<F: Future>(
        &self,
        timeout: Duration,
        call: F,
    ) -> std::result::Result<F::Output, Duration> {
        let mut call = pin!(call);
        loop {
            let limit = self.limit(timeout);
            let deadline = self.started + limit;
            if Instant::now() >= deadline {
                return Err(limit);
            }
            if let Ok(output) = tokio::time::timeout_at(deadline, call.as_mut()).await {
                return Ok(output);
            }
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.fetch_sub(self.scripts, Ordering::Relaxed);
    }
}

/// Script calls to send in one pipeline, each with its script (for the `SCRIPT LOAD`
/// after `NOSCRIPT`); one batch may mix scripts.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    scripts: Vec<&'static Script>,
    invocations: Vec<ScriptInvocation<'static>>,
}

impl Batch {
    /// Adds a call of `script`; its keys and arguments go on the returned invocation.
    pub(crate) fn call(&mut self, script: &'static Script) -> &mut ScriptInvocation<'static> {
        let at = self.invocations.len();
        self.scripts.push(script);
        self.invocations.push(script.prepare_invoke());
        &mut self.invocations[at]
    }

    /// How many calls.
    pub(crate) fn len(&self) -> usize {
        self.invocations.len()
    }

    /// Whether it has no call.
    pub(crate) fn is_empty(&self) -> bool {
        self.invocations.is_empty()
    }

    /// The pipeline of every call (`EVALSHA` each), with `ignore_errors`, so each call
    /// gets its own reply or error.
    pub(crate) fn pipeline(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for invocation in &self.invocations {
            pipe.invoke_script(invocation);
        }
        pipe
    }
}

/// Sends `pipe` ([`Batch::pipeline`]: every call of `batch`, which may mix scripts), then
/// the calls answered `NOSCRIPT` again behind one `SCRIPT LOAD` per script they need, in
/// one more pipeline (a failed load is the error of its script's calls, as for
/// [`ScriptInvocation::invoke_async`]), both within the limit of `queued` (these calls,
/// counted) for the per-call `timeout`. Each call's reply, in order, errors mapped for
/// `call` on node `label`:
/// when the first pipeline fails as a whole (or does not answer once per call, or not in
/// time) every call has its error; when the retry does, only the retried ones.
pub(crate) async fn run_all(
    conn: &mut Link,
    call: Call,
    label: &str,
    batch: &Batch,
    pipe: &redis::Pipeline,
    (queued, timeout): (&Queued, Duration),
) -> Vec<Result<Value>> {
    let (scripts, invocations) = (&batch.scripts, &batch.invocations);
    let first = queued.within(timeout, pipelined(pipe, conn, invocations.len()));
    let first = first.await;
    let first = match first {
        Ok(Ok(replies)) => replies,
        Ok(Err(err)) => return failed_all(map_error(&err, call, label), invocations.len()),
        Err(limit) => return failed_all(timed_out(call, label, limit), invocations.len()),
    };
    let unloaded: Vec<usize> = (first.iter().enumerate())
        .filter(|(_, reply)| matches!(reply, Err(err) if err.kind() == NO_SCRIPT))
        .map(|(at, _)| at)
        .collect();
    let mapped = |reply: RedisResult<Value>| reply.map_err(|err| map_error(&err, call, label));
    let mut replies: Vec<Result<Value>> = first.into_iter().map(mapped).collect();
    if unloaded.is_empty() {
        return replies;
    }
    let loads = scripts_of(scripts, &unloaded);
    let mut retry = redis::pipe();
    retry.ignore_errors();
    for script in &loads {
        retry.load_script(script);
    }
    for &at in &unloaded {
        retry.invoke_script(&invocations[at]);
    }
    let expected = unloaded.len() + loads.len();
    let retried = queued.within(timeout, pipelined(&retry, conn, expected));
    let retried = retried.await;
    let retried = match retried {
        Ok(Ok(retried)) => Ok(retried),
        // The first pipeline's answers stand: only the retried calls are in doubt.
        Ok(Err(err)) => Err(map_error(&err, call, label)),
        Err(limit) => Err(timed_out(call, label, limit)),
    };
    let mut retried = match retried {
        Ok(retried) => retried,
        Err(err) => {
            let copies = err.copies(unloaded.len());
            for (at, err) in unloaded.into_iter().zip(copies) {
                replies[at] = Err(err);
            }
            return replies;
        }
    };
    let invoked = retried.split_off(loads.len());
    for (at, reply) in unloaded.into_iter().zip(invoked) {
        let load = loads
            .iter()
            .position(|s| s.get_hash() == scripts[at].get_hash());
        replies[at] = match load.map(|i| (&retried[i], loads[i])) {
            Some((Err(err), _)) => Err(map_error(err, call, label)),
            Some((Ok(sha), script)) if !is_sha_of(sha, script) => Err(bad_load(call, label)),
            _ => mapped(reply),
        };
    }
    replies
}

/// Whether a `SCRIPT LOAD` reply is `script`'s SHA1, as Redis answers it: a bulk string
/// of 40 lowercase hex digits.
pub(crate) fn is_sha_of(reply: &Value, script: &Script) -> bool {
    matches!(reply, Value::BulkString(sha) if sha.as_slice() == script.get_hash().as_bytes())
}

/// The error for a `SCRIPT LOAD` that did not answer the script's SHA1.
pub(crate) fn bad_load(call: Call, label: &str) -> lockcore::Error {
    lockcore::Error::new(
        lockcore::ErrorKind::Protocol,
        format!(
            "{call} on {label}: SCRIPT LOAD did not answer the script's SHA1; is this a \
             Redis server?"
        ),
    )
}

/// The scripts of the calls at `at`, each once, in the order first needed.
fn scripts_of(scripts: &[&'static Script], at: &[usize]) -> Vec<&'static Script> {
    let mut distinct: Vec<&'static Script> = Vec::new();
    for script in at.iter().map(|&i| scripts[i]) {
        if !distinct.iter().any(|s| s.get_hash() == script.get_hash()) {
            distinct.push(script);
        }
    }
    distinct
}

/// `err` for each of `n` calls that failed together.
fn failed_all(err: lockcore::Error, n: usize) -> Vec<Result<Value>> {
    err.copies(n).into_iter().map(Err).collect()
}

/// The server's answer to a script that is not loaded.
const NO_SCRIPT: redis::ErrorKind = redis::ErrorKind::Server(redis::ServerErrorKind::NoScript);

/// Sends `pipe` (built with `ignore_errors`) and checks it answered `expected` replies.
async fn pipelined(
    pipe: &redis::Pipeline,
    conn: &mut Link,
    expected: usize,
) -> RedisResult<Vec<RedisResult<Value>>> {
    let replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
    if replies.len() == expected {
        return Ok(replies);
    }
    // Unreadable: the writes may have applied, like a reply lost with the connection.
    let message = format!("{} replies to {expected} pipelined calls", replies.len());
    Err(RedisError::from(std::io::Error::other(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_with_the_scripts_queued() {
        let timeout = Duration::from_millis(50);
        assert_eq!(wait_limit(timeout, 1), timeout, "a call alone");
        assert_eq!(wait_limit(timeout, 1_000), Duration::from_micros(74_975));
        assert_eq!(wait_limit(timeout, 25_001), Duration::from_millis(675));
        let most = timeout + SCRIPT_ALLOWANCE * u32::MAX;
        assert_eq!(wait_limit(timeout, usize::MAX), most);
    }

    #[test]
    fn a_queue_counts_scripts_until_their_call_ends() {
        let queue = Queue::default();
        let timeout = Duration::from_millis(50);
        let first = queue.enqueue(1_000);
        assert_eq!(first.limit(timeout), wait_limit(timeout, 1_000));
        let behind = queue.clone().enqueue(1_000);
        assert_eq!(
            behind.limit(timeout),
            wait_limit(timeout, 2_000),
            "waits for the first"
        );
        assert_eq!(
            first.limit(timeout),
            wait_limit(timeout, 2_000),
            "and the first for it"
        );
        drop(behind);
        assert_eq!(first.limit(timeout), wait_limit(timeout, 1_000));
        drop(first);
        assert_eq!(queue.enqueue(1).limit(timeout), timeout, "alone again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_longer_while_scripts_sent_after_it_are_in_flight() {
        let queue = Queue::default();
        let timeout = Duration::from_millis(50);
        let alone = queue.enqueue(1);
        let never = std::future::pending::<()>();
        assert_eq!(alone.within(timeout, never).await, Err(timeout));
        drop(alone);
        let first = queue.enqueue(1);
        let late = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let later = queue.enqueue(4_000);
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(later);
        };
        // Would time out at 50 ms, but by then 4,000 scripts sent after it are in flight.
        let done = tokio::time::sleep(Duration::from_millis(120));
        let (waited, ()) = tokio::join!(first.within(timeout, done), late);
        assert_eq!(waited, Ok(()));
        let never = std::future::pending::<()>();
        let late = first.within(timeout, never).await;
        assert_eq!(late, Err(timeout), "the limit shrank with the queue");
    }
}

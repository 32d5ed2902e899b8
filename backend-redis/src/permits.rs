//! Semaphores on one Redis server ([`RedisBackend`](crate::RedisBackend)'s permits): one
//! script call per operation ([`permit_scripts`](crate::permit_scripts)), keys from
//! [`PermitKeys`], replies decoded into leases and holders.
//!
//! A permit's lease is marked with [`Lease::with_permits`]; its opaque grant is the member
//! of the permit set (the lock value's format), so refresh and release act on exactly that
//! grant, as a lock's do on the lock key's value.

use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, HolderInfo, Lease, LockName, Note, Result,
    limit_conflict,
};
use redis::Value;

use crate::client::Node;
use crate::error::{Call, malformed};
use crate::keys::{self, Found, PermitKeys, StoredValue};
use crate::permit_scripts::{ACQUIRE_PERMIT, INSPECT_PERMITS, REFRESH_PERMIT, RELEASE_PERMIT};
use crate::pipeline::Batch;
use crate::replies::{AcquireReply, decode_acquire, decode_found};

/// What the acquire-permit script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PermitReply {
    /// Granted, granted or held, as for a lock.
    Decided(AcquireReply),
    /// A live permit was taken with this other limit.
    Conflict(u32),
}

/// `{2, limit}` a limit conflict, else the lock's `{1, value}` / `{0, value, ms, note}`.
pub(crate) fn decode_permit_acquire(reply: Value) -> Option<PermitReply> {
    if let Value::Array(items) = &reply
        && let [Value::Int(2), limit] = items.as_slice()
    {
        let limit = crate::replies::text(limit)?.parse().ok()?;
        return Some(PermitReply::Conflict(limit));
    }
    decode_acquire(reply).map(PermitReply::Decided)
}

/// What the refresh-permit script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitRefresh {
    Extended,
    /// Released, or replaced by a retake of its owner.
    Gone,
    /// Expired on the server's clock (not yet dropped).
    Expired,
}

/// `1` extended, `0` gone, `-1` expired.
pub(crate) fn decode_permit_refresh(reply: &Value) -> Option<PermitRefresh> {
    match reply {
        Value::Int(1) => Some(PermitRefresh::Extended),
        Value::Int(0) => Some(PermitRefresh::Gone),
        Value::Int(-1) => Some(PermitRefresh::Expired),
        _ => None,
    }
}

/// The inspect-permits reply: `{value, remaining ms, note}` per live permit. `None` when
/// the reply, or any entry, has the wrong shape.
pub(crate) fn decode_permits(reply: Value) -> Option<Vec<Found>> {
    let Value::Array(items) = reply else {
        return None;
    };
    items.into_iter().map(|item| decode_found(item)?).collect()
}

/// Live permits, earliest grant first: by fence token (tokens rise with every grant),
/// then by when the grant was made; values this crate did not write come last.
pub(crate) fn by_grant(mut found: Vec<Found>) -> Vec<HolderInfo> {
    found.sort_by_key(|f| match StoredValue::parse(&f.value) {
        Some(v) => (0, v.token, v.acquired_ms),
        None => (1, 0, 0),
    });
    found.iter().map(keys::holder_info).collect()
}

/// One attempt at a permit of `request.name` (see
/// [`LockBackend::acquire_permit`](lockcore::LockBackend::acquire_permit)).
pub(crate) async fn acquire(
    node: &Node,
    prefix: &str,
    request: &AcquireRequest,
) -> Result<Acquire> {
    let Some(limit) = request.permits else {
        return Err(Error::invalid_input(
            "a permit request without a number of permits",
        ));
    };
    let name = &request.name;
    let keys = PermitKeys::new(prefix, name);
    let suffix = keys::value_suffix(&keys::new_nonce(), &request.owner);
    let note = request.note.as_ref().map_or("", Note::as_str);
    let mut batch = Batch::default();
    let invocation = batch.call(&ACQUIRE_PERMIT);
    (invocation
        .key(keys.permits())
        .key(keys.info())
        .key(keys.fence()))
    .arg(request.ttl.as_millis())
    .arg(request.owner.as_str())
    .arg(&suffix)
    .arg(limit.get())
    .arg(note);
    let reply = node.run(Call::Acquire, &batch).await?;
    let reply =
        decode_permit_acquire(reply).ok_or_else(|| malformed(Call::Acquire, node.label()))?;
    match reply {
        PermitReply::Decided(AcquireReply::Granted(value)) => {
            let token = StoredValue::parse(&value).and_then(|v| v.fence_token());
            let token = token.ok_or_else(|| {
                Error::new(ErrorKind::Protocol, "the permit carries no fence token")
            })?;
            let lease = Lease::new(name.clone(), request.owner.clone(), request.ttl, value);
            Ok(Acquire::Acquired(
                lease.with_token(token).with_permits(limit),
            ))
        }
        PermitReply::Decided(AcquireReply::Held(found)) => {
            Ok(Acquire::Held(keys::holder_info(&found)))
        }
        PermitReply::Conflict(held) => Err(limit_conflict(name.as_str(), held, limit.get())),
    }
}

/// Adds the refresh-permit call of `lease` to `batch`.
pub(crate) fn push_refresh(batch: &mut Batch, prefix: &str, lease: &Lease) {
    let keys = PermitKeys::new(prefix, lease.name());
    (batch
        .call(&REFRESH_PERMIT)
        .key(keys.permits())
        .key(keys.info()))
    .arg(lease.grant())
    .arg(lease.ttl().as_millis());
}

/// The result of refreshing the permit `lease`, from its script reply.
pub(crate) fn refreshed(lease: &Lease, reply: &Value, node: &Node) -> Result<Lease> {
    match decode_permit_refresh(reply) {
        Some(PermitRefresh::Extended) => Ok(lease.clone()),
        Some(PermitRefresh::Gone) => Err(Error::lost(
            "the permit was released or replaced by a newer grant of its owner",
        )),
        Some(PermitRefresh::Expired) => Err(Error::lost("the permit expired")),
        None => Err(malformed(Call::Refresh, node.label())),
    }
}

/// Releases exactly the permit `lease` (a stale one frees nothing) and wakes waiters.
pub(crate) async fn release(node: &Node, prefix: &str, lease: &Lease) -> Result<()> {
    let keys = PermitKeys::new(prefix, lease.name());
    let mut batch = Batch::default();
    let invocation = batch.call(&RELEASE_PERMIT);
    (invocation.key(keys.permits()).key(keys.info()))
        .arg(lease.grant())
        .arg(keys.channel());
    match node.run(Call::Release, &batch).await? {
        Value::Int(1) => Ok(()),
        Value::Int(0) => {
            tracing::debug!(semaphore = %lease.name(), "release: the permit was already gone");
            Ok(())
        }
        _ => Err(malformed(Call::Release, node.label())),
    }
}

/// The live permits of `name`, earliest grant first.
pub(crate) async fn inspect(node: &Node, prefix: &str, name: &LockName) -> Result<Vec<HolderInfo>> {
    let keys = PermitKeys::new(prefix, name);
    let mut batch = Batch::default();
    let invocation = batch.call(&INSPECT_PERMITS);
    invocation.key(keys.permits()).key(keys.info());
    let reply = node.run(Call::Inspect, &batch).await?;
    let found = decode_permits(reply).ok_or_else(|| malformed(Call::Inspect, node.label()))?;
    Ok(by_grant(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn permit_replies_decode() {
        let conflict = Value::Array(vec![Value::Int(2), bulk("3")]);
        assert_eq!(
            decode_permit_acquire(conflict),
            Some(PermitReply::Conflict(3))
        );
        let granted = Value::Array(vec![Value::Int(1), bulk("7:1:ab:o")]);
        assert_eq!(
            decode_permit_acquire(granted),
            Some(PermitReply::Decided(AcquireReply::Granted(
                "7:1:ab:o".into()
            )))
        );
        let held = Value::Array(vec![
            Value::Int(0),
            bulk("7:1:ab:o"),
            Value::Int(90),
            bulk("n"),
        ]);
        assert_eq!(
            decode_permit_acquire(held),
            Some(PermitReply::Decided(AcquireReply::Held(Found::new(
                "7:1:ab:o", 90, "n"
            ))))
        );
        for bad in [
            Value::Array(vec![Value::Int(2), bulk("x")]),
            Value::Array(vec![Value::Int(2), bulk("99999999999")]),
            Value::Int(1),
            Value::Nil,
        ] {
            assert_eq!(decode_permit_acquire(bad.clone()), None, "{bad:?}");
        }
        assert_eq!(
            decode_permit_refresh(&Value::Int(1)),
            Some(PermitRefresh::Extended)
        );
        assert_eq!(
            decode_permit_refresh(&Value::Int(0)),
            Some(PermitRefresh::Gone)
        );
        assert_eq!(
            decode_permit_refresh(&Value::Int(-1)),
            Some(PermitRefresh::Expired)
        );
        assert_eq!(decode_permit_refresh(&Value::Int(2)), None);
        assert_eq!(decode_permit_refresh(&bulk("1")), None);
    }

    #[test]
    fn permits_list_by_grant_and_refuse_bad_shapes() {
        let entry = |v: &str, ms: i64| Value::Array(vec![bulk(v), Value::Int(ms), bulk("")]);
        let reply = Value::Array(vec![
            entry("9:5:ab:late", 10),
            entry("foreign", 1),
            entry("3:9:ab:early", 500),
        ]);
        let holders = by_grant(decode_permits(reply).expect("decodes"));
        let owners: Vec<&str> = holders.iter().map(|h| h.owner().as_str()).collect();
        assert_eq!(owners[..2], ["early", "late"]);
        assert!(owners[2].contains("foreign"), "{owners:?}");
        assert_eq!(decode_permits(Value::Array(vec![])), Some(vec![]));
        assert_eq!(decode_permits(Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(decode_permits(Value::Nil), None);
    }
}

//! What the server's replies mean: the script replies decoded into this crate's types,
//! pure functions with no I/O (property-tested in `prop_tests.rs`).

use std::time::Duration;

use redis::Value;

use crate::keys::Found;

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

/// The server clock from a `TIME` reply (seconds and microseconds since the Unix epoch);
/// `None` when no `SystemTime` can hold it.
pub(crate) fn time_from_reply(secs: u64, micros: u64) -> Option<std::time::SystemTime> {
    std::time::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))?
        .checked_add(Duration::from_micros(micros))
}

/// A string reply taken by value: its bytes become the `String` without a copy.
pub(crate) fn into_text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
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

/// The refresh script's reply: `1` extended, `0` missing, else the value now stored.
pub(crate) fn decode_refresh(reply: Value) -> Option<RefreshReply> {
    match reply {
        Value::Int(1) => Some(RefreshReply::Extended),
        Value::Int(0) => Some(RefreshReply::Missing),
        other => into_text(other).map(RefreshReply::Changed),
    }
}

/// `{1, value}` granted; `{0, value, pttl, note?}` held. The value is moved out of the
/// reply, not copied (this runs on every acquire).
pub(crate) fn decode_acquire(reply: Value) -> Option<AcquireReply> {
    let Value::Array(items) = reply else {
        return None;
    };
    let mut items = items.into_iter();
    let (status, value) = (items.next()?, items.next()?);
    match status {
        Value::Int(1) if items.len() == 0 => Some(AcquireReply::Granted(into_text(value)?)),
        Value::Int(0) => {
            let Value::Int(pttl) = items.next()? else {
                return None;
            };
            let note = items.next().as_ref().map(note_text).unwrap_or_default();
            Some(AcquireReply::Held(Found::new(
                into_text(value)?,
                pttl,
                note,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(decode_refresh(Value::Int(1)), Some(RefreshReply::Extended));
        assert_eq!(decode_refresh(Value::Int(0)), Some(RefreshReply::Missing));
        assert_eq!(
            decode_refresh(bulk("0:1:ab:rival")),
            Some(RefreshReply::Changed("0:1:ab:rival".into()))
        );
        assert_eq!(decode_refresh(Value::Int(2)), None);
        assert_eq!(decode_refresh(Value::Nil), None);
        assert_eq!(decode_acquire(Value::Array(vec![Value::Int(2)])), None);
    }
}

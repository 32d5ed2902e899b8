//! `serde::Serialize` for the values people and tools read (the `serde` feature).
//!
//! The shapes are the ones `anylock status --json`, `list --json` and `guarantees --json`
//! print: names, identities, notes and tokens as plain values; durations as whole
//! milliseconds (`expires_in_ms`); wall-clock times as RFC 3339 with milliseconds; enums as
//! lowercase words; unknown fields left out rather than `null`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::guarantees::{
    Durability, ExpiryClock, Fairness, Fencing, Guarantees, Semaphores, Waiting,
};
use crate::identity::Identity;
use crate::name::LockName;
use crate::note::Note;
use crate::types::HeldLock;
use crate::types::{FenceToken, HolderInfo};

macro_rules! as_str {
    ($($ty:ty),*) => {$(
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    )*};
}
as_str!(LockName, Identity, Note);

impl Serialize for FenceToken {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.get())
    }
}

/// RFC 3339 with milliseconds, or `None` outside 1970..=9999 (which humantime cannot
/// print, and a foreign value decoded by a backend can hold).
fn rfc3339(t: SystemTime) -> Option<String> {
    const END_OF_9999: Duration = Duration::from_secs(253_402_300_800);
    let since = t.duration_since(UNIX_EPOCH).ok()?;
    (since < END_OF_9999).then(|| humantime::format_rfc3339_millis(t).to_string())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The holder's fields into an open map: `owner`, then each known one of `acquired_at`,
/// `expires_in_ms`, `fence_token`, `note`.
fn holder_fields<M: SerializeMap>(map: &mut M, holder: &HolderInfo) -> Result<(), M::Error> {
    map.serialize_entry("owner", holder.owner())?;
    if let Some(at) = holder.acquired_at().and_then(rfc3339) {
        map.serialize_entry("acquired_at", &at)?;
    }
    if let Some(left) = holder.expires_in() {
        map.serialize_entry("expires_in_ms", &millis(left))?;
    }
    if let Some(token) = holder.token() {
        map.serialize_entry("fence_token", &token)?;
    }
    if let Some(note) = holder.note() {
        map.serialize_entry("note", note)?;
    }
    Ok(())
}

/// `{"owner", "acquired_at", "expires_in_ms", "fence_token", "note"}`, unknown ones left
/// out.
impl Serialize for HolderInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        holder_fields(&mut map, self)?;
        map.end()
    }
}

/// `{"name", "held": true, …the holder's fields}`: the shape of `anylock status --json`.
impl Serialize for HeldLock {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", self.name())?;
        map.serialize_entry("held", &true)?;
        holder_fields(&mut map, self.holder())?;
        map.end()
    }
}

/// Every field, enums as lowercase words (`exclusion` as its sentence).
impl Serialize for Guarantees {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(9))?;
        map.serialize_entry("exclusion", &self.exclusion.to_string())?;
        map.serialize_entry(
            "fencing",
            match self.fencing {
                Fencing::Monotonic => "monotonic",
                Fencing::None => "none",
            },
        )?;
        map.serialize_entry(
            "expiry_clock",
            match self.expiry_clock {
                ExpiryClock::Server => "server",
                ExpiryClock::Client => "client",
            },
        )?;
        map.serialize_entry(
            "waiting",
            match self.waiting {
                Waiting::Notified => "notified",
                Waiting::Polled => "polled",
            },
        )?;
        map.serialize_entry(
            "fairness",
            match self.fairness {
                Fairness::Fifo => "fifo",
                Fairness::None => "none",
            },
        )?;
        map.serialize_entry("same_owner_retake", &self.same_owner_retake)?;
        map.serialize_entry(
            "durability",
            match self.durability {
                Durability::SurvivesRestart => "survives_restart",
                Durability::LostOnRestart => "lost_on_restart",
            },
        )?;
        map.serialize_entry("listing", &self.listing)?;
        match self.semaphores {
            Semaphores::Supported => map.serialize_entry("semaphores", &true)?,
            Semaphores::Unsupported(why) => {
                map.serialize_entry("semaphores", &false)?;
                map.serialize_entry("semaphores_unsupported_because", why)?;
            }
        }
        map.serialize_entry("notes", self.notes)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockBackend, MemoryBackend};

    #[test]
    fn holders_serialize_with_unknown_fields_left_out() {
        let bare = HolderInfo::new(Identity::named("run-1").expect("id"));
        assert_eq!(
            serde_json::to_value(&bare).expect("json"),
            serde_json::json!({ "owner": "~owner/run-1" })
        );
        let full = bare
            .with_acquired_at(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123))
            .with_expires_in(Duration::from_micros(2_500_900))
            .with_token(FenceToken::new(7))
            .with_note(Some(Note::new("https://ci.example/1").expect("note")));
        let held = HeldLock::new(LockName::new("deploy").expect("name"), full);
        assert_eq!(
            serde_json::to_value(&held).expect("json"),
            serde_json::json!({
                "name": "deploy", "held": true, "owner": "~owner/run-1",
                "acquired_at": "2023-11-14T22:13:20.123Z", "expires_in_ms": 2500,
                "fence_token": 7, "note": "https://ci.example/1",
            })
        );
    }

    #[test]
    fn times_humantime_cannot_print_are_left_out() {
        let holder = HolderInfo::new(Identity::named("x").expect("id"))
            .with_acquired_at(UNIX_EPOCH + Duration::from_secs(300_000_000_000));
        let json = serde_json::to_value(&holder).expect("json");
        assert!(json.get("acquired_at").is_none(), "{json}");
    }

    #[test]
    fn guarantees_serialize_as_words() {
        let json = serde_json::to_value(MemoryBackend::new().guarantees()).expect("json");
        assert_eq!(json["exclusion"], "in-process");
        assert_eq!(json["fencing"], "monotonic");
        assert_eq!(json["waiting"], "notified");
        assert_eq!(json["durability"], "lost_on_restart");
        assert_eq!(json["listing"], true);
        assert_eq!(json["semaphores"], true);
    }
}

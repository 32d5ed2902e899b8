//! The lock object as GCS stores it: the fields the backend reads, the metadata it writes,
//! and the server-clock staleness rule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Error, FenceToken, HolderInfo, Identity, Note, Result};
use serde_json::{Map, Value, json};

/// Metadata key holding the owner's identity.
pub(crate) const KEY_IDENTITY: &str = "identity";
/// Metadata key holding the TTL in milliseconds (staleness is `updated + ttl_ms`).
pub(crate) const KEY_TTL_MS: &str = "ttl_ms";
/// Metadata key holding a human-readable expiry (for people; never read back).
pub(crate) const KEY_EXPIRES: &str = "expires";
/// Metadata key holding the note given at acquire; absent when there is none. Written only
/// by the create that makes the grant: a refresh's PATCH merges metadata and leaves it.
pub(crate) const KEY_NOTE: &str = "note";

/// How far the server's `Date` header must pass `updated + ttl` before an object counts as
/// stale: `Date` has one-second resolution.
pub(crate) const DATE_RESOLUTION: Duration = Duration::from_secs(1);

/// The fields of a GCS object resource that the lock uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockObject {
    pub(crate) generation: u64,
    pub(crate) metageneration: u64,
    pub(crate) updated: SystemTime,
    pub(crate) created: Option<SystemTime>,
    pub(crate) identity: Option<String>,
    pub(crate) ttl: Option<Duration>,
    /// The stored note as the server returned it (not yet cleaned).
    pub(crate) note: Option<String>,
}

impl LockObject {
    /// Parses an object resource (`generation` and `metageneration` are JSON strings).
    pub(crate) fn from_json(value: &Value) -> Result<Self> {
        let metadata = value.get("metadata").and_then(Value::as_object);
        let meta = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str);
        Ok(Self {
            generation: number(value, "generation")?,
            metageneration: number(value, "metageneration")?,
            updated: value
                .get("updated")
                .and_then(Value::as_str)
                .and_then(parse_rfc3339)
                .ok_or_else(|| protocol("the object resource has no valid `updated`"))?,
            created: value
                .get("timeCreated")
                .and_then(Value::as_str)
                .and_then(parse_rfc3339),
            identity: meta(KEY_IDENTITY).map(str::to_owned),
            ttl: meta(KEY_TTL_MS)
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
            note: meta(KEY_NOTE).map(str::to_owned),
        })
    }

    /// The grant string of a lease on this object: `generation:metageneration`.
    pub(crate) fn grant(&self) -> String {
        format!("{}:{}", self.generation, self.metageneration)
    }

    /// When the lease lapses on the server's clock; `None` when the object carries no TTL
    /// (a foreign object: it never lapses by itself).
    pub(crate) fn expires_at(&self) -> Option<SystemTime> {
        self.ttl.map(|ttl| self.updated + ttl)
    }

    /// Whether the lease has certainly lapsed at server time `date` (a `Date` header).
    pub(crate) fn is_stale(&self, date: SystemTime) -> bool {
        self.expires_at()
            .is_some_and(|expires| date > expires + DATE_RESOLUTION)
    }

    /// Whether `owner` holds this object.
    pub(crate) fn is_owned_by(&self, owner: &Identity) -> bool {
        self.identity.as_deref() == Some(owner.as_str())
    }

    /// The holder as lockcore reports it, with time left judged at server time `date`.
    pub(crate) fn holder(&self, date: Option<SystemTime>) -> HolderInfo {
        let owner = Identity::from_stored(self.identity.as_deref().unwrap_or("(unknown)"));
        let note = self.note.as_deref().and_then(Note::from_stored);
        let mut info = HolderInfo::new(owner)
            .with_token(FenceToken::new(self.generation))
            .with_note(note);
        if let Some(created) = self.created {
            info = info.with_acquired_at(created);
        }
        if let (Some(ttl), Some(date)) = (self.ttl, date) {
            info = info.with_expires_in(self.time_left(ttl, date));
        }
        info
    }

    /// Time left at server time `date`: `updated + ttl - Date`, capped at the TTL (`Date` is
    /// truncated to the second, so the difference can exceed the TTL by up to a second).
    /// Once lapsed but not yet stale (inside the `Date` margin), the time until a contender
    /// may take over instead, never 0: a waiter told 0 polls without pause until then.
    /// Zero once stale.
    fn time_left(&self, ttl: Duration, date: SystemTime) -> Duration {
        let expires = self.updated + ttl;
        if self.is_stale(date) {
            return Duration::ZERO;
        }
        match expires.duration_since(date) {
            Ok(left) if !left.is_zero() => left.min(ttl),
            _ => match (expires + DATE_RESOLUTION).duration_since(date) {
                Ok(until_stale) if !until_stale.is_zero() => until_stale,
                // `Date` must tick once more before the lock counts as stale.
                _ => DATE_RESOLUTION,
            },
        }
    }
}

/// Parses a lease grant `generation:metageneration`.
pub(crate) fn parse_grant(grant: &str) -> Result<(u64, u64)> {
    grant
        .split_once(':')
        .and_then(|(g, m)| Some((g.parse().ok()?, m.parse().ok()?)))
        .ok_or_else(|| Error::invalid_input("the lease was not issued by the GCS backend"))
}

/// The metadata map a refresh writes (PATCH merges it, keeping the note), and the grant's
/// without its note.
pub(crate) fn metadata(owner: &Identity, ttl: Duration) -> Value {
    let expires = rfc3339(SystemTime::now() + ttl);
    let mut map = Map::new();
    map.insert(KEY_IDENTITY.into(), json!(owner.as_str()));
    map.insert(KEY_TTL_MS.into(), json!(ttl.as_millis().to_string()));
    map.insert(KEY_EXPIRES.into(), json!(expires));
    Value::Object(map)
}

/// The metadata map the create of a grant writes: [`metadata`] plus the note, if any, so
/// the note is stored in the same conditional write as the grant.
pub(crate) fn grant_metadata(owner: &Identity, ttl: Duration, note: Option<&Note>) -> Value {
    let mut value = metadata(owner, ttl);
    if let (Some(note), Value::Object(map)) = (note, &mut value) {
        map.insert(KEY_NOTE.into(), json!(note.as_str()));
    }
    value
}

fn number(value: &Value, field: &str) -> Result<u64> {
    value
        .get(field)
        .and_then(|v| match v {
            Value::String(s) => s.parse().ok(),
            other => other.as_u64(),
        })
        .ok_or_else(|| protocol(format!("the object resource has no valid `{field}`")))
}

fn protocol(message: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(lockcore::ErrorKind::Protocol, message)
}

/// Parses RFC 3339 UTC timestamps as GCS and emulators write them: `Z` or `+00:00`, with
/// any number (0–9) of fraction digits.
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let text = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))?;
    let (date, time) = text.split_once(['T', 't'])?;
    let mut ymd = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (ymd.next()?.ok()?, ymd.next()?.ok()?, ymd.next()?.ok()?);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut parts = hms.splitn(3, ':').map(str::parse::<u64>);
    let (h, m, s) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    // RFC 3339 years have four digits; larger ones would overflow the day arithmetic.
    if !(0..=9999).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || h > 23
        || m > 59
        || s > 60
    {
        return None;
    }
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos: u32 = format!("{fraction:0<9}").parse().ok()?;
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Formats a time as RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if month <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        month,
        day,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn parses_any_fraction_length() {
        let base = 1_715_085_296_000;
        assert_eq!(parse_rfc3339("2024-05-07T12:34:56Z"), Some(at(base)));
        assert_eq!(
            parse_rfc3339("2024-05-07T12:34:56.7Z"),
            Some(at(base + 700))
        );
        assert_eq!(
            parse_rfc3339("2024-05-07T12:34:56.789Z"),
            Some(at(base + 789))
        );
        assert_eq!(
            parse_rfc3339("2024-05-07T12:34:56.789000+00:00"),
            Some(at(base + 789))
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00.000Z"),
            Some(at(951_782_400_000))
        );
        for bad in [
            "",
            "2024-05-07",
            "2024-13-07T00:00:00Z",
            "2024-05-07T12:34:56.x1Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_and_parses_round_trip() {
        let t = at(1_715_085_296_789);
        assert_eq!(rfc3339(t), "2024-05-07T12:34:56.789Z");
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
    }

    fn object(updated_ms: u64, ttl_ms: u64) -> LockObject {
        LockObject {
            generation: 5,
            metageneration: 1,
            updated: at(updated_ms),
            created: None,
            identity: Some("a".into()),
            ttl: Some(Duration::from_millis(ttl_ms)),
            note: None,
        }
    }

    #[test]
    fn staleness_allows_the_date_resolution() {
        let o = object(10_000, 3_000);
        assert!(!o.is_stale(at(13_000)));
        assert!(
            !o.is_stale(at(14_000)),
            "within Date's one-second resolution"
        );
        assert!(o.is_stale(at(14_001)));
        let foreign = LockObject { ttl: None, ..o };
        assert!(!foreign.is_stale(at(u64::MAX / 2)), "no TTL never lapses");
    }

    #[test]
    fn holder_reports_time_left_on_the_server_clock() {
        let holder = object(10_000, 3_000).holder(Some(at(11_000)));
        assert_eq!(holder.expires_in(), Some(Duration::from_secs(2)));
        assert_eq!(holder.token(), Some(FenceToken::new(5)));
        assert_eq!(holder.owner().as_str(), "a");
        let truncated = object(10_500, 3_000).holder(Some(at(10_000)));
        assert_eq!(
            truncated.expires_in(),
            Some(Duration::from_secs(3)),
            "capped at the TTL"
        );
    }

    /// Issue #14 item 5: a lock past `updated + ttl` but within the `Date` margin cannot be
    /// taken over yet; reporting 0 s left made waiters poll every millisecond until it could.
    #[test]
    fn a_lapsed_lock_not_yet_stale_reports_the_time_until_takeover() {
        let o = object(10_000, 3_000);
        assert_eq!(
            o.holder(Some(at(13_400))).expires_in(),
            Some(Duration::from_millis(600))
        );
        assert!(!o.is_stale(at(14_000)));
        assert_eq!(
            o.holder(Some(at(14_000))).expires_in(),
            Some(DATE_RESOLUTION),
            "stale only once Date ticks past the margin"
        );
    }

    #[test]
    fn grants_round_trip() {
        assert_eq!(parse_grant(&object(0, 1).grant()).unwrap(), (5, 1));
        assert!(parse_grant("nonsense").is_err());
    }

    #[test]
    fn the_note_is_written_with_the_grant_and_read_back_lossily() {
        let owner = Identity::named("me").unwrap();
        let note = Note::new("ci run 42").unwrap();
        let with = grant_metadata(&owner, Duration::from_secs(3), Some(&note));
        assert_eq!(with[KEY_NOTE], "ci run 42");
        let without = grant_metadata(&owner, Duration::from_secs(3), None);
        assert!(
            without.get(KEY_NOTE).is_none(),
            "no note, no key: {without}"
        );
        assert!(
            metadata(&owner, Duration::from_secs(3))
                .get(KEY_NOTE)
                .is_none()
        );
        let stored = |note: Value| {
            let v = json!({"generation":"1","metageneration":"1",
                "updated":"2024-05-07T12:34:56.789Z","metadata":{"identity":"me","note":note}});
            LockObject::from_json(&v)
                .unwrap()
                .holder(None)
                .note()
                .cloned()
        };
        assert_eq!(stored(json!("ci run 42")), Some(note));
        assert_eq!(stored(json!("")), None, "empty is no note");
        assert_eq!(
            stored(json!("a\u{1b}[2Jb")).map(|n| n.as_str().to_owned()),
            Some("a\u{fffd}[2Jb".to_owned()),
            "control characters never reach a terminal"
        );
        // Written by the previous version: no note key at all.
        let old = json!({"generation":"1","metageneration":"1",
            "updated":"2024-05-07T12:34:56.789Z","metadata":{"identity":"me","ttl_ms":"3000"}});
        assert_eq!(
            LockObject::from_json(&old).unwrap().holder(None).note(),
            None
        );
    }

    #[test]
    fn parses_string_typed_numbers() {
        let v = json!({"generation":"17","metageneration":"2","updated":"2024-05-07T12:34:56.789Z",
            "metadata":{"identity":"me","ttl_ms":"3000"}});
        let o = LockObject::from_json(&v).unwrap();
        assert_eq!((o.generation, o.metageneration), (17, 2));
        assert_eq!(o.ttl, Some(Duration::from_secs(3)));
        assert!(LockObject::from_json(&json!({"generation":"x"})).is_err());
    }
}

//! The lock object as GCS stores it: the fields the backend reads, the metadata it writes,
//! and the server-clock staleness rule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Error, FenceToken, HolderInfo, Identity, Note, Result, Ttl};
use serde_json::{Map, Value, json};

use crate::error::protocol;

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

/// The least time left a holder is reported with. `Date` has whole seconds, so a reading
/// does not shrink within one `Date` second: a lapsing lease can read the same few
/// milliseconds on every refusal for up to 2 s, and a waiter that believes it would try
/// again every round trip. Takeover waits for `Date` to tick past the margin anyway, so
/// waking up to this much later than the reading says costs a waiter nothing it could get.
pub(crate) const LEAST_TIME_LEFT: Duration = Duration::from_millis(100);

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
    /// may take over instead, never 0 (lockcore reads 0 as expired and not yet removed, and
    /// its waiters would wake at their backoff, not at the takeover). Never below
    /// [`LEAST_TIME_LEFT`] (nor the TTL) while not stale. Zero once stale.
    fn time_left(&self, ttl: Duration, date: SystemTime) -> Duration {
        let expires = self.updated + ttl;
        if self.is_stale(date) {
            return Duration::ZERO;
        }
        let least = LEAST_TIME_LEFT.min(ttl);
        match expires.duration_since(date) {
            Ok(left) if !left.is_zero() => left.min(ttl).max(least),
            _ => match (expires + DATE_RESOLUTION).duration_since(date) {
                Ok(until_stale) if !until_stale.is_zero() => until_stale.max(least),
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
pub(crate) fn metadata(owner: &Identity, ttl: Ttl) -> Value {
    let expires = rfc3339(SystemTime::now() + ttl.get());
    let mut map = Map::new();
    map.insert(KEY_IDENTITY.into(), json!(owner.as_str()));
    map.insert(KEY_TTL_MS.into(), json!(ttl.as_millis().to_string()));
    map.insert(KEY_EXPIRES.into(), json!(expires));
    Value::Object(map)
}

/// The metadata map the create of a grant writes: [`metadata`] plus the note, if any, so
/// the note is stored in the same conditional write as the grant.
pub(crate) fn grant_metadata(owner: &Identity, ttl: Ttl, note: Option<&Note>) -> Value {
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

/// Parses RFC 3339 UTC timestamps as GCS and emulators write them:
/// `YYYY-MM-DDTHH:MM:SS` (`T` or `t`), then 0–9 fraction digits after a `.`, then `Z` or
/// `+00:00`. A leap second `:60` reads as the next minute's `:00`.
/// (humantime refuses times after 2038-01-19T03:14:07Z on 32-bit targets other than
/// Windows and wasm.)
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let body = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))?;
    let (date, time) = (body.get(..10)?, body.get(11..)?);
    let (hms, fraction) = time.split_at_checked(8)?;
    let digits = fraction.strip_prefix('.').unwrap_or(fraction);
    let fraction_ok = digits.len() <= 9
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (fraction.is_empty() || fraction.starts_with('.'));
    if !matches!(body.as_bytes()[10], b'T' | b't') || !fraction_ok {
        return None;
    }
    // humantime checks the fields and the calendar; it reads `:60` as `:59`.
    let time = humantime::parse_rfc3339(&format!("{date}T{hms}{fraction}Z")).ok()?;
    let leap = hms.ends_with(":60");
    Some(time + Duration::from_secs(u64::from(leap)))
}

/// The last instant RFC 3339 can write: 9999-12-31T23:59:59.999999999Z.
const LAST_RFC3339: Duration = Duration::new(253_402_300_799, 999_999_999);

/// Formats a time as RFC 3339 UTC with milliseconds (clamped to 1970–9999).
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let time = time.clamp(UNIX_EPOCH, UNIX_EPOCH + LAST_RFC3339);
    humantime::format_rfc3339_millis(time).to_string()
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
            "2024-05-07T12:34:56.1234567890Z",
            "2024-05-07T12:34:56z",
            "2024-05-07T12:34:56+05:30",
            "2024-05-07 12:34:56Z",
            "2024-05-07T12:34:56",
            // Not RFC 3339: the hand-written parser before humantime took these.
            "2023-02-29T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "+2024-05-07T12:34:56Z",
            "2024-5-7T1:2:3Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn parses_lowercase_t_and_leap_seconds() {
        let base = 1_715_085_296_000;
        assert_eq!(parse_rfc3339("2024-05-07t12:34:56Z"), Some(at(base)));
        assert_eq!(parse_rfc3339("2024-05-07T12:34:56.Z"), Some(at(base)));
        assert_eq!(
            parse_rfc3339("2024-05-07T12:34:56.123456789Z"),
            Some(at(base) + Duration::from_nanos(123_456_789))
        );
        assert_eq!(
            parse_rfc3339("2024-05-07T12:34:60.5Z"),
            Some(at(base + 4_500))
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn formats_and_parses_round_trip() {
        let t = at(1_715_085_296_789);
        assert_eq!(rfc3339(t), "2024-05-07T12:34:56.789Z");
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        assert_eq!(rfc3339(at(951_782_400_000)), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn formats_out_of_range_times_without_panicking() {
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339(before), "1970-01-01T00:00:00.000Z");
        let after = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(rfc3339(after), "9999-12-31T23:59:59.999Z");
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

    /// A reading below a tenth of `Date`'s second is reported as 100 ms, live or inside
    /// the margin: it does not shrink within the `Date` second, and waiters told a few
    /// milliseconds tried again every round trip for up to 2 s (review).
    #[test]
    fn a_reading_of_a_few_milliseconds_is_reported_as_the_least_time_left() {
        let o = object(10_000, 3_000);
        assert_eq!(
            o.holder(Some(at(12_994))).expires_in(),
            Some(LEAST_TIME_LEFT),
            "live, 6 ms by Date"
        );
        assert_eq!(
            o.holder(Some(at(13_994))).expires_in(),
            Some(LEAST_TIME_LEFT),
            "lapsed, 6 ms before Date's margin ends"
        );
        assert_eq!(
            o.holder(Some(at(12_800))).expires_in(),
            Some(Duration::from_millis(200)),
            "above it, as read"
        );
        let short = object(10_000, 50);
        assert_eq!(
            short.holder(Some(at(10_049))).expires_in(),
            Some(Duration::from_millis(50)),
            "never above the TTL"
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
        let ttl = Ttl::new(Duration::from_secs(3)).unwrap();
        let with = grant_metadata(&owner, ttl, Some(&note));
        assert_eq!(with[KEY_NOTE], "ci run 42");
        let without = grant_metadata(&owner, ttl, None);
        assert!(
            without.get(KEY_NOTE).is_none(),
            "no note, no key: {without}"
        );
        assert!(metadata(&owner, ttl).get(KEY_NOTE).is_none());
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

//! Property tests of the GCS reply parsing: object resources (string-typed generations,
//! RFC 3339 times, metadata), the `Date` header and lease grants. See `docs/fuzzing.md`;
//! `PROPTEST_CASES` sets the case count.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{ErrorKind, Identity};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::object::{LockObject, metadata, parse_grant, parse_rfc3339, rfc3339};

/// The last second RFC 3339 can write: 9999-12-31T23:59:59Z.
const MAX_RFC3339_SECS: u64 = 253_402_300_799;

/// Times from the epoch to the end of year 9999.
fn times() -> impl Strategy<Value = SystemTime> {
    (0..=MAX_RFC3339_SECS, 0u32..1_000_000_000)
        .prop_map(|(secs, nanos)| UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Timestamps as GCS and emulators write them, and variants with one part replaced by an
/// unusual or broken one: leap seconds, other offsets, out-of-range fields, huge or signed
/// years, long fractions.
fn timestamps() -> impl Strategy<Value = String> {
    let odd = |valid: &'static [&'static str]| {
        proptest::sample::select(valid.to_vec()).prop_map(str::to_owned)
    };
    let parts: [Box<dyn Fn() -> BoxedStrategy<String>>; 9] = [
        Box::new(move || {
            prop_oneof![
                (0u32..=9999).prop_map(|y| format!("{y:04}")),
                odd(&[
                    "10000",
                    "99999999999999999",
                    "9223372036854775807",
                    "18446744073709551616",
                    "+2024",
                    "-0001",
                    "0",
                    ""
                ]),
            ]
            .boxed()
        }),
        Box::new(move || odd(&["-00", "-13", "-1", "-+1", "-", "--12"]).boxed()),
        Box::new(move || odd(&["-00", "-32", "-31", "-30", "-29", "-1", "-+1", "-"]).boxed()),
        Box::new(move || odd(&["t", " ", "TT", "", "T+"]).boxed()),
        Box::new(move || odd(&["24", "99", "+1", "", "-1", "٣"]).boxed()),
        Box::new(move || odd(&[":60", ":99", ":", ":+1", ""]).boxed()),
        Box::new(move || odd(&[":60", ":61", ":99", ":", ":+1", ":-0"]).boxed()),
        Box::new(move || {
            prop_oneof![Just(String::new()), "\\.[0-9]{0,12}", "\\.[0-9a-z+]{1,3}"].boxed()
        }),
        Box::new(move || odd(&["z", "+00:00", "-00:00", "+05:30", "", "ZZ", "Z "]).boxed()),
    ];
    let one_odd = (times(), 0usize..9)
        .prop_flat_map(move |(time, which)| (Just(rfc3339(time)), Just(which), parts[which]()));
    prop_oneof![
        2 => times().prop_map(rfc3339),
        6 => one_odd.prop_map(|(valid, which, part)| replace_part(&valid, which, &part)),
        1 => any::<String>(),
    ]
}

/// `valid` (`YYYY-MM-DDTHH:MM:SS.mmmZ`) with part `which` (year, `-MM`, `-DD`, `T`, `HH`,
/// `:MM`, `:SS`, `.fraction`, zone) replaced by `part`.
fn replace_part(valid: &str, which: usize, part: &str) -> String {
    let ranges = [
        0..4,
        4..7,
        7..10,
        10..11,
        11..13,
        13..16,
        16..19,
        19..23,
        23..24,
    ];
    let range = ranges[which].clone();
    format!("{}{part}{}", &valid[..range.start], &valid[range.end..])
}

/// Generation-like values: JSON strings and numbers, overflowing, signed, fractional,
/// and of the wrong type.
fn numbers() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => any::<u64>().prop_map(|n| json!(n.to_string())),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<f64>().prop_map(|f| json!(f)),
        1 => proptest::sample::select(vec![
            "18446744073709551616", "-1", "1.5", "1e3", " 1", "", "0x10", "+7",
        ]).prop_map(|s| json!(s)),
        1 => Just(Value::Null),
        1 => Just(json!({"n": 1})),
    ]
}

/// Object resources: valid ones with fields replaced by odd values or removed.
fn objects() -> impl Strategy<Value = Value> {
    let ttl = prop_oneof![any::<u64>().prop_map(|n| json!(n.to_string())), numbers(),];
    let identity = prop_oneof![any::<String>().prop_map(Value::String), numbers()];
    let metadata = prop_oneof![
        4 => (identity, ttl).prop_map(|(i, t)| json!({"identity": i, "ttl_ms": t, "expires": "x"})),
        1 => Just(Value::Null),
        1 => Just(json!("not a map")),
    ];
    let time = prop_oneof![5 => timestamps().prop_map(Value::String), 1 => numbers()];
    (
        numbers(),
        numbers(),
        time.clone(),
        time,
        metadata,
        any::<u8>(),
    )
        .prop_map(
            |(generation, metageneration, updated, created, metadata, drop)| {
                let mut object = json!({
                    "generation": generation,
                    "metageneration": metageneration,
                    "updated": updated,
                    "timeCreated": created,
                    "metadata": metadata,
                });
                let fields = [
                    "generation",
                    "metageneration",
                    "updated",
                    "timeCreated",
                    "metadata",
                ];
                if let Some(field) = fields.get(usize::from(drop % 16)) {
                    object.as_object_mut().expect("object").remove(*field);
                }
                object
            },
        )
}

/// `Date` header values: valid HTTP dates, edge years, and garbage.
fn date_headers() -> impl Strategy<Value = String> {
    prop_oneof![
        times().prop_map(httpdate::fmt_http_date),
        Just("Fri, 31 Dec 9999 23:59:59 GMT".to_owned()),
        Just("Thu, 01 Jan 1970 00:00:00 GMT".to_owned()),
        Just("Sun, 06 Nov 1994 08:49:37 GMT".to_owned()),
        Just("Sunday, 06-Nov-94 08:49:37 GMT".to_owned()),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against a reply parser that panics or overflows on a malformed object
    /// resource, or reports it as anything but a Protocol error.
    #[test]
    fn prop_object_resources_parse_or_are_protocol_errors(object in objects()) {
        match LockObject::from_json(&object) {
            Ok(parsed) => {
                // Only a decimal string or a non-negative JSON integer is a generation.
                let oracle = |field: &str| match object.get(field) {
                    Some(Value::String(s)) => s.parse::<u64>().ok(),
                    Some(other) => other.as_u64(),
                    None => None,
                };
                prop_assert_eq!(Some(parsed.generation), oracle("generation"));
                prop_assert_eq!(Some(parsed.metageneration), oracle("metageneration"));
                let ttl = object.pointer("/metadata/ttl_ms").and_then(Value::as_str);
                prop_assert_eq!(parsed.ttl, ttl.and_then(|t| t.parse().ok()).map(Duration::from_millis));
                prop_assert_eq!(parse_grant(&parsed.grant()).ok(), Some((parsed.generation, parsed.metageneration)));
            }
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::Protocol, "{}", err);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against the staleness rule and the holder report panicking or overflowing
    /// `SystemTime` for any object the parser accepts and any `Date` the client accepts
    /// (parsed as `client.rs` does), and against a time left longer than the TTL.
    #[test]
    fn prop_staleness_and_holders_never_overflow(object in objects(), date in date_headers()) {
        let Ok(parsed) = LockObject::from_json(&object) else { return Ok(()) };
        let date = httpdate::parse_http_date(&date).ok();
        let expires = parsed.expires_at();
        if let Some(date) = date {
            let stale = parsed.is_stale(date);
            prop_assert!(!stale || expires.is_some_and(|e| date > e));
        }
        let holder = parsed.holder(date);
        if let (Some(left), Some(ttl)) = (holder.expires_in(), parsed.ttl) {
            prop_assert!(left <= ttl);
        }
        prop_assert_eq!(holder.acquired_at(), parsed.created);
    }

    /// Guards against the timestamp parser panicking or overflowing on any text (huge
    /// years, empty fields, signs), and accepting what RFC 3339 and GCS never write.
    #[test]
    fn prop_timestamps_parse_without_panicking(text in timestamps()) {
        if let Some(time) = parse_rfc3339(&text) {
            let secs = time.duration_since(UNIX_EPOCH).expect("after the epoch").as_secs();
            prop_assert!(secs <= MAX_RFC3339_SECS + 1, "{text:?} parsed to {secs} s");
            prop_assert!(text.ends_with('Z') || text.ends_with("+00:00"));
        }
    }

    /// Guards against the formatter and parser disagreeing: every time from 1970 to 9999
    /// written by `rfc3339` parses back to itself at millisecond precision.
    #[test]
    fn prop_timestamps_round_trip(time in times()) {
        let since = time.duration_since(UNIX_EPOCH).expect("after the epoch");
        let millis = UNIX_EPOCH + Duration::from_millis(u64::try_from(since.as_millis()).expect("fits"));
        prop_assert_eq!(parse_rfc3339(&rfc3339(time)), Some(millis));
    }

    /// Guards against the metadata written on insert and refresh not reading back (TTL
    /// and identity lost), for any TTL up to a year.
    #[test]
    fn prop_written_metadata_reads_back(ttl_ms in 10u64..=31_536_000_000, updated in times()) {
        let owner = Identity::unique();
        let object = json!({
            "generation": "7", "metageneration": "1", "updated": rfc3339(updated),
            "metadata": metadata(&owner, lockcore::Ttl::new(Duration::from_millis(ttl_ms)).expect("in range")),
        });
        let parsed = LockObject::from_json(&object).expect("our own object parses");
        prop_assert!(parsed.is_owned_by(&owner));
        prop_assert_eq!(parsed.ttl, Some(Duration::from_millis(ttl_ms)));
    }

    /// Guards against a grant parser that panics or accepts a grant it did not issue.
    #[test]
    fn prop_grants_parse_only_pairs_of_u64(
        grant in prop_oneof![(any::<u64>(), any::<u64>()).prop_map(|(g, m)| format!("{g}:{m}")), any::<String>()],
    ) {
        match parse_grant(&grant) {
            Ok((g, m)) => {
                let (a, b) = grant.split_once(':').expect("a colon");
                prop_assert_eq!((a.parse::<u64>().ok(), b.parse::<u64>().ok()), (Some(g), Some(m)));
            }
            Err(err) => prop_assert_eq!(err.kind(), ErrorKind::InvalidInput),
        }
    }
}

/// The input the timestamp property first failed on, kept as a fixed case.
#[test]
fn regression_huge_years_are_rejected() {
    assert_eq!(parse_rfc3339("99999999999999999-01-01T00:00:00.000Z"), None);
    assert_eq!(parse_rfc3339("10000-01-01T00:00:00Z"), None);
    assert!(
        parse_rfc3339("9999-12-31T23:59:60Z").is_some(),
        "leap second"
    );
}

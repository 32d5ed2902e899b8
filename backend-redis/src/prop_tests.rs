//! Property tests of every parser in this crate: node and Redlock URLs, script replies,
//! stored lock values and `TIME` replies. See `docs/fuzzing.md`; `PROPTEST_CASES` sets the
//! case count.

use std::time::{Duration, UNIX_EPOCH};

use lockcore::ErrorKind;
use proptest::prelude::*;
use redis::Value;

use crate::keys::{
    Found, LockKeys, StoredValue, glob_escape, holder_info, name_of_lock_key, owner_of,
};
use crate::redlock::quorum::{best_holder, leading_grant};
use crate::replies::{
    AcquireReply, decode_acquire, decode_found, decode_many, text, time_from_reply,
};
use crate::{RedisConfig, RedlockConfig};

/// Characters a URL treats specially, joining the chunks of generated passwords (no raw
/// `@`: with one, part of the password is a host name by the URL grammar).
const PASSWORD_SEPARATORS: &[&str] = &[
    ":", "/", "?", "#", ",", "%", "&", "=", " ", "+", "$", ";", "é", "%40", "%2F", "%zz",
];

/// Passwords for this crate's URLs (see `test_kit::prop::passwords`).
fn passwords() -> impl Strategy<Value = (Vec<String>, String)> {
    test_kit::prop::passwords(PASSWORD_SEPARATORS, form_encode)
}

fn form_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Valid URLs that `test_kit::prop::mangled` mutates.
const VALID_URLS: &[&str] = &[
    "redis://app:pw@127.0.0.1:7000/3?prefix=jobs&timeout_ms=250",
    "rediss://h:6380/0#insecure",
    "redlock://:pw@h1:1,h2:2,h3:3/1?prefix=x&timeout_ms=20",
    "redis://a:1,redis://b:2,redis://c:3",
    "redis://[::1]:6379/0?protocol=resp3",
];

/// URLs of both forms, valid and broken, each carrying a password.
fn secret_urls() -> impl Strategy<Value = (String, Vec<String>)> {
    let scheme = proptest::sample::select(vec!["redis", "rediss", "redlock", "redlocks", "http"]);
    let tail = proptest::sample::select(vec![
        "",
        "/0",
        "/notadb",
        "/0?prefix=p&timeout_ms=5",
        "/0?timeout_ms=0",
        "/0?prefix=%7Bx%7D",
        "/1?prefx=typo",
        "/0?timeout_ms=18446744073709551616",
        "#insecure",
    ]);
    (scheme, passwords(), "[a-z]{0,5}", 0usize..4, tail).prop_map(
        |(scheme, (chunks, pw), user, form, tail)| {
            let url = match form {
                0 => format!("{scheme}://{user}:{pw}@h1:6379{tail}"),
                1 => format!("{scheme}://:{pw}@h1:1,h2:2,h3:3{tail}"),
                2 => format!("redis://:{pw}@a:1{tail},redis://:{pw}@b:2{tail}"),
                _ => format!("{scheme}://{user}:{pw}@{tail}"),
            };
            (url, chunks)
        },
    )
}

/// RESP values of every shape the decoders distinguish, nested.
fn values() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(-2), any::<i64>()].prop_map(Value::Int),
        any::<Vec<u8>>().prop_map(Value::BulkString),
        stored_values().prop_map(|v| Value::BulkString(v.into_bytes())),
        any::<String>().prop_map(Value::SimpleString),
        any::<bool>().prop_map(Value::Boolean),
        any::<f64>().prop_map(Value::Double),
    ];
    let nested = leaf.clone().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Value::Map),
        ]
    });
    // The scripts' reply shapes with each element replaced by a near miss.
    let flag = prop_oneof![Just(0i64), Just(1), Just(2), Just(-1), any::<i64>()];
    let near_miss = (flag, leaf.clone(), proptest::option::of(leaf)).prop_map(|(f, v, p)| {
        let mut items = vec![Value::Int(f), v];
        items.extend(p);
        Value::Array(items)
    });
    prop_oneof![2 => nested, 1 => near_miss]
}

/// Lock values: the shape this crate writes, that shape with one field broken
/// (overflowing, signed or empty numbers, non-hex nonces), and arbitrary text.
fn stored_values() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        proptest::sample::select(vec![
            "18446744073709551616",
            "-1",
            "+1",
            "",
            "1e3",
            " 1",
            "٣",
            "99999999999999999999999",
        ])
        .prop_map(str::to_owned),
    ];
    let nonce = prop_oneof!["[0-9a-f]{32}", "[0-9a-zA-Z]{0,4}"];
    prop_oneof![
        (number.clone(), number, nonce, any::<String>())
            .prop_map(|(t, ms, nonce, owner)| format!("{t}:{ms}:{nonce}:{owner}")),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against a URL parser that panics on malformed input or reports it as
    /// anything but InvalidInput (or Config for TLS without the `tls` feature).
    #[test]
    fn prop_urls_never_panic_and_errors_are_typed(url in test_kit::prop::mangled(VALID_URLS.to_vec())) {
        for result in [
            RedisConfig::from_url(&url).map(|c| c.to_string()),
            RedlockConfig::from_url(&url).map(|c| c.to_string()),
        ] {
            if let Err(err) = result {
                prop_assert!(
                    matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Config),
                    "{url:?}: {err}"
                );
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against a password (raw or percent-encoded, in any node of either URL form)
    /// showing in an error, in `Display`, in `Debug` or in the redacted node URLs.
    #[test]
    fn prop_passwords_never_show((url, chunks) in secret_urls()) {
        let mut shown = Vec::new();
        match RedisConfig::from_url(&url) {
            Ok(c) => shown.extend([c.to_string(), format!("{c:?}"), c.redacted_url()]),
            Err(e) => shown.push(format!("{e} {e:?}")),
        }
        match RedlockConfig::from_url(&url) {
            Ok(c) => shown.extend([c.to_string(), format!("{c:?}"), c.redacted_urls().join(",")]),
            Err(e) => shown.push(format!("{e} {e:?}")),
        }
        for text in shown {
            for chunk in &chunks {
                prop_assert!(!text.contains(chunk.as_str()), "{url}: {text}");
            }
        }
    }

    /// Guards against `Display` output that does not parse back to the same settings
    /// (an unescaped prefix, a lost parameter), for single-instance and Redlock configs.
    #[test]
    fn prop_valid_configs_round_trip_through_display(
        hosts in proptest::collection::btree_set("[a-z][a-z0-9-]{0,8}", 1..6),
        port in 1u16..,
        db in proptest::option::of(0u16..16),
        prefix in "[^{}\\p{Cc}]{1,30}",
        timeout_ms in 1u64..10_000_000,
        connect_ms in 1u64..10_000_000,
        (_, pw) in passwords(),
    ) {
        let escaped = format!("{}/", crate::node_url::QUERY_SPECIAL);
        let prefix_q = lockcore::url::percent_encode(&prefix, crate::node_url::QUERY_SPECIAL);
        let pw = lockcore::url::percent_encode(&pw, &escaped);
        let db = db.map_or_else(String::new, |d| format!("/{d}"));
        let query = format!("?prefix={prefix_q}&timeout_ms={timeout_ms}&connect_timeout_ms={connect_ms}");
        let first = hosts.iter().next().expect("one host");
        let single = RedisConfig::from_url(&format!("redis://u:{pw}@{first}:{port}{db}{query}"));
        let single = single.expect("valid single URL");
        let again = RedisConfig::from_url(&single.to_string()).expect("Display parses");
        prop_assert_eq!(again.prefix(), prefix.as_str());
        prop_assert_eq!(again.timeout(), Duration::from_millis(timeout_ms));
        prop_assert_eq!(again.connect_timeout(), Duration::from_millis(connect_ms));
        prop_assert_eq!(again.redacted_url(), single.redacted_url());
        let list: Vec<String> = hosts.iter().map(|h| format!("{h}:{port}")).collect();
        let url = format!("redlock://:{pw}@{}{db}{query}", list.join(","));
        let redlock = RedlockConfig::from_url(&url).expect("valid Redlock URL");
        prop_assert_eq!(redlock.nodes(), hosts.len());
        let again = RedlockConfig::from_url(&redlock.to_string()).expect("Display parses");
        prop_assert_eq!(again.nodes(), redlock.nodes());
        prop_assert_eq!(again.prefix(), prefix.as_str());
        prop_assert_eq!(again.node_timeout(), Duration::from_millis(timeout_ms));
        prop_assert_eq!(again.redacted_urls(), redlock.redacted_urls());
    }

    /// Guards against script-reply decoders that panic on an unexpected RESP shape or
    /// accept anything but the documented replies.
    #[test]
    fn prop_script_replies_decode_only_documented_shapes(value in values()) {
        let text_of = |v: &Value| text(v);
        match decode_acquire(value.clone()) {
            Some(AcquireReply::Granted(s)) => {
                let Value::Array(items) = &value else { panic!("not an array") };
                prop_assert!(matches!(items.as_slice(), [Value::Int(1), v] if text_of(v) == Some(s.clone())));
            }
            Some(AcquireReply::Held(found)) => {
                let Value::Array(items) = &value else { panic!("not an array") };
                let shape_ok = matches!(items.as_slice(),
                    [Value::Int(0), v, Value::Int(p), ..] if text_of(v) == Some(found.value.clone()) && *p == found.pttl);
                prop_assert!(shape_ok);
                let holder = holder_info(&found);
                prop_assert_eq!(holder.expires_in(), u64::try_from(found.pttl).ok().map(|ms| Duration::from_millis(ms.max(1))));
                prop_assert!(holder.note().is_none_or(|n| n.as_str().len() <= lockcore::MAX_NOTE_LEN));
            }
            None => {}
        }
        match decode_found(value.clone()) {
            Some(None) => prop_assert!(matches!(value, Value::Nil | Value::Boolean(false))),
            Some(Some(found)) => {
                let Value::Array(items) = &value else { panic!("not an array") };
                prop_assert!(items.len() >= 2);
                let _ = (owner_of(&found.value), holder_info(&found));
            }
            None => {}
        }
        if let Some(many) = decode_many(value.clone(), 3) {
            prop_assert_eq!(many.len(), 3);
        }
        if let Some(s) = text(&value) {
            prop_assert!(matches!(value, Value::BulkString(_) | Value::SimpleString(_)));
            let _ = owner_of(&s);
        }
    }

    /// Guards against the lock-value parser panicking or overflowing on values written by
    /// other programs, accepting malformed numbers, or misreading its own format.
    #[test]
    fn prop_stored_values_parse_or_are_foreign(raw in stored_values(), pttl in any::<i64>()) {
        let holder = holder_info(&Found::new(raw.clone(), pttl, ""));
        prop_assert!(holder.note().is_none());
        match StoredValue::parse(&raw) {
            Some(value) => {
                let parts: Vec<&str> = raw.splitn(4, ':').collect();
                for (part, parsed) in [(parts[0], value.token), (parts[1], value.acquired_ms)] {
                    prop_assert!(!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
                    prop_assert_eq!(part.parse::<u64>(), Ok(parsed));
                }
                prop_assert!(!parts[2].is_empty() && parts[2].bytes().all(|b| b.is_ascii_hexdigit()));
                prop_assert_eq!(holder.owner().as_str(), value.owner);
                prop_assert_eq!(
                    holder.acquired_at(),
                    Some(UNIX_EPOCH + Duration::from_millis(value.acquired_ms))
                );
                prop_assert_eq!(owner_of(&raw), value.owner);
            }
            None => prop_assert!(holder.owner().as_str().starts_with("<foreign value")),
        }
    }

    /// Guards against the Redlock refusal summary panicking on any mix of values and PTTLs
    /// seen on the nodes (negative, huge, foreign).
    #[test]
    fn prop_redlock_refusals_summarise(seen in proptest::collection::vec((stored_values(), any::<i64>(), ".{0,8}"), 0..7)) {
        let seen: Vec<Found> = seen.into_iter().map(|(v, p, n)| Found::new(v, p, n)).collect();
        let (leader, count) = leading_grant(&seen);
        prop_assert!(count <= seen.len());
        prop_assert_eq!(count == 0, seen.is_empty());
        if count > 0 {
            prop_assert!(seen.iter().any(|f| f.value == leader));
        }
        prop_assert_eq!(best_holder(&seen).is_some(), !seen.is_empty());
    }

    /// Guards against listing keys decoded to the wrong name (names may hold `}`, `:` and
    /// glob characters), fence and note keys taken for locks, and glob escaping that loses
    /// a character.
    #[test]
    fn prop_lock_keys_decode_to_their_names(name in "[a-z{}:*?\\[\\]\\\\ü]{1,12}", cut in 0usize..13) {
        let lock_name = lockcore::LockName::new(&name).expect("valid");
        let keys = LockKeys::new("p:x", &lock_name);
        let head: String = name.chars().take(cut).collect();
        prop_assert_eq!(name_of_lock_key("p:x", &head, keys.lock().as_bytes()), Some(lock_name));
        prop_assert_eq!(name_of_lock_key("p:x", "", keys.fence().as_bytes()), None);
        prop_assert_eq!(name_of_lock_key("p:x", "", keys.note().as_bytes()), None);
        let escaped = glob_escape(&name);
        let unescaped: String = escaped.replace("\\\\", "\u{0}").replace('\\', "").replace('\u{0}', "\\");
        prop_assert_eq!(unescaped, name);
    }

    /// Guards against a `TIME` reply (any two integers) overflowing `SystemTime`.
    #[test]
    fn prop_time_replies_never_overflow(
        secs in prop_oneof![0u64..4_000_000_000, any::<u64>()],
        micros in prop_oneof![0u64..1_000_000, any::<u64>()],
    ) {
        if let Some(time) = time_from_reply(secs, micros) {
            let since = time.duration_since(UNIX_EPOCH).expect("after the epoch");
            prop_assert_eq!(since, Duration::from_secs(secs) + Duration::from_micros(micros));
        }
    }
}

/// The inputs the properties first failed on, kept as fixed cases.
#[test]
fn regression_time_overflow_and_node_lists() {
    assert_eq!(time_from_reply(u64::MAX, 0), None);
    let list = "redis://:AaAA0aAa&Aaaa000A@a:1/0,redis://:AaAA0aAa&Aaaa000A@b:2/0";
    let err = RedisConfig::from_url(list).expect_err("a node list");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(!format!("{err:?}").contains("Aaaa000A"), "{err:?}");
}

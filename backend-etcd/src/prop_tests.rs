//! Property tests of this crate's parsers: `etcd://` URLs, the values and keys other
//! tools (`etcdctl lock`, Go's `concurrency.Mutex`, people with `etcdctl put`) leave
//! under a lock's prefix, and lease grants. See `docs/fuzzing.md`; `PROPTEST_CASES` sets
//! the case count.

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{ErrorKind, Identity, Lease, LockName, Ttl};
use proptest::prelude::*;

use crate::EtcdConfig;
use crate::backend::{Grant, parse_grant};
use crate::keys::{Layout, decode_value, is_owned_by, range_end};

/// Characters a URL treats specially, joining the chunks of generated passwords (no raw
/// `@`: with one, part of the password is a host name by the URL grammar).
const PASSWORD_SEPARATORS: &[&str] = &[
    ":", "/", "?", "#", ",", "%", "&", "=", " ", "+", "$", ";", "é", "%40", "%2F", "%zz", "%C3%28",
    "[",
];

/// Passwords for this crate's URLs (see `test_kit::prop::passwords`).
fn passwords() -> impl Strategy<Value = (Vec<String>, String)> {
    test_kit::prop::passwords(PASSWORD_SEPARATORS, encode)
}

/// Valid URLs that `test_kit::prop::mangled` mutates.
const VALID_URLS: &[&str] = &[
    "etcds://u%40corp:p%3Ass@h:1/x?timeout=250ms&connect_timeout=2&ca=/etc/ca.pem",
    "etcd://root:hunter2@h1,h2:2380/locks?timeout=2s",
    "etcd://h1:2379,h2,[::1]:2380",
    "etcd://h?tls=true&cert=/c&key=/k",
];

/// Percent-encodes everything but unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// URLs of both schemes with a password, over valid and broken host lists and options.
fn secret_urls() -> impl Strategy<Value = (String, Vec<String>)> {
    let scheme = proptest::sample::select(vec!["etcd", "etcds", "ETCD", "redis"]);
    let hosts = proptest::sample::select(vec![
        "h1",
        "h1:2379,h2:2380",
        "[::1]:2379",
        "h:99999",
        "h1,,h2",
        "[::1",
        "",
    ]);
    let tail = proptest::sample::select(vec![
        "",
        "/locks",
        "/a%20b/?timeout=250ms",
        "?tls=maybe",
        "?timeout=5h",
        "?colour=blue",
        "/%zz",
        "?ca=/etc/ca.pem&connect_timeout=18446744073709551615m",
    ]);
    (scheme, passwords(), "[a-z]{0,5}", hosts, tail).prop_map(
        |(scheme, (chunks, pw), user, hosts, tail)| {
            (format!("{scheme}://{user}:{pw}@{hosts}{tail}"), chunks)
        },
    )
}

/// Values found under a lock prefix: empty (etcdctl, Go), anylock's JSON, JSON with
/// wrong types, overflowing or negative times, and arbitrary bytes.
fn stored_values() -> impl Strategy<Value = Vec<u8>> {
    let time = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        proptest::sample::select(vec![
            "18446744073709551616",
            "-1",
            "1e3",
            "1.5",
            "null",
            "\"123\"",
            "[]",
            "99999999999999999999999999",
        ])
        .prop_map(str::to_owned),
    ];
    let owner = prop_oneof![
        any::<String>().prop_map(|s| serde_json::Value::String(s).to_string()),
        proptest::sample::select(vec!["1", "null", "{}", "[\"a\"]", "\"\\ud800\""])
            .prop_map(str::to_owned),
    ];
    prop_oneof![
        Just(Vec::new()),
        (owner.clone(), time.clone())
            .prop_map(|(o, t)| format!("{{\"owner\":{o},\"acquired_unix_ms\":{t}}}").into_bytes()),
        // With anylock's format mark: the times are read (and must not overflow).
        (owner.clone(), time).prop_map(|(o, t)| {
            format!("{{\"owner\":{o},\"acquired_unix_ms\":{t},\"anylock\":1}}").into_bytes()
        }),
        owner
            .clone()
            .prop_map(|o| format!("{{\"owner\":{o},\"extra\":1}}").into_bytes()),
        (
            owner,
            any::<String>(),
            proptest::sample::select(vec!["1", "null", "[]", "\"\""])
        )
            .prop_map(|(o, n, odd)| {
                let note = serde_json::Value::String(n).to_string();
                let note = if o.len() % 2 == 0 {
                    note
                } else {
                    odd.to_owned()
                };
                format!("{{\"owner\":{o},\"note\":{note}}}").into_bytes()
            }),
        any::<Vec<u8>>(),
        any::<String>().prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against the URL parser panicking (percent-decoding at the end of the text,
    /// bracketed hosts, overflowing durations) or reporting anything but InvalidInput (or
    /// Config, for TLS parameters on a plaintext URL).
    #[test]
    fn prop_urls_never_panic_and_errors_are_typed(url in test_kit::prop::mangled(VALID_URLS.to_vec())) {
        match EtcdConfig::from_url(&url) {
            Ok(config) => {
                prop_assert!(!config.endpoints().is_empty());
                prop_assert!(config.prefix().is_empty() || config.prefix().ends_with('/'));
            }
            Err(err) => {
                let tls_on_plaintext = err.kind() == ErrorKind::Config && err.message().contains("TLS");
                prop_assert!(err.kind() == ErrorKind::InvalidInput || tls_on_plaintext, "{:?}: {}", url, err);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against a password (raw or percent-encoded, with any character a URL
    /// treats specially) showing in an error, in `Display` or in `Debug`.
    #[test]
    fn prop_passwords_never_show((url, chunks) in secret_urls()) {
        let shown = match EtcdConfig::from_url(&url) {
            Ok(c) => format!("{c} {c:?}"),
            Err(e) => format!("{e} {e:?}"),
        };
        for chunk in &chunks {
            prop_assert!(!shown.contains(chunk.as_str()), "{url}: {shown}");
        }
    }

    /// Guards against `Display` output that does not parse back to the same config (user
    /// names, prefixes and paths shown without percent-encoding).
    #[test]
    fn prop_display_round_trips(
        user in proptest::option::of(any::<String>()),
        (_, password) in passwords(),
        hosts in proptest::collection::vec(("[a-z][a-z0-9.-]{0,8}", proptest::option::of(any::<u16>())), 1..4),
        prefix in any::<String>(),
        timeout_ms in proptest::option::of(1u64..10_000_000),
        ca in proptest::option::of(any::<String>()),
        tls in any::<bool>(),
    ) {
        let hosts: Vec<String> = hosts
            .iter()
            .map(|(h, p)| p.map_or_else(|| h.clone(), |p| format!("{h}:{p}")))
            .collect();
        let mut url = format!("{}://", if tls { "etcds" } else { "etcd" });
        if let Some(user) = &user {
            url.push_str(&format!("{}:{}@", encode(user), encode(&password)));
        }
        url.push_str(&format!("{}/{}?", hosts.join(","), encode(&prefix)));
        if let Some(ms) = timeout_ms {
            url.push_str(&format!("timeout={ms}ms&"));
        }
        // TLS files go on TLS URLs only (a plaintext one refuses them), and are paths.
        if let Some(ca) = ca.as_ref().filter(|ca| tls && !ca.is_empty()) {
            url.push_str(&format!("ca={}&", encode(ca)));
        }
        let config = EtcdConfig::from_url(&url).expect("valid URL");
        let shown = config.to_string().replace(":***@", &format!(":{}@", encode(&password)));
        let again = EtcdConfig::from_url(&shown);
        prop_assert_eq!(again.as_ref().ok(), Some(&config), "{} shown as {}: {:?}", url, shown, again);
    }

    /// Guards against values written by other tools (empty, foreign JSON, overflowing or
    /// negative times, invalid UTF-8) panicking or overflowing the holder's time, and
    /// against foreign values being mistaken for ours.
    #[test]
    fn prop_stored_values_decode_without_panicking(value in stored_values(), lease in any::<i64>()) {
        let stored = decode_value(&value, lease);
        let (owner, at) = (stored.owner, stored.acquired_at);
        if let Some(note) = &stored.note {
            prop_assert!(!note.as_str().is_empty());
            prop_assert!(note.as_str().len() <= lockcore::MAX_NOTE_LEN);
            prop_assert!(!note.as_str().chars().any(char::is_control), "{note:?}");
        }
        if crate::keys::decode_marked(&value).is_none() {
            prop_assert_eq!(owner.as_str(), format!("etcd-lease/{lease:x}"));
            prop_assert!(at.is_none());
        }
        if let Some(at) = at {
            prop_assert!(at >= UNIX_EPOCH);
        }
        prop_assert!(!is_owned_by(&value, &Identity::unique()));
        if is_owned_by(&value, &owner) {
            prop_assert_ne!(owner.as_str(), String::from_utf8_lossy(&value), "raw value taken as ours");
        }
    }

    /// Guards against lock-key prefixes that overlap (a name's keys inside another
    /// name's range, as unescaped `/` would cause) and range ends that do not bound them.
    #[test]
    fn prop_lock_prefixes_are_disjoint(
        prefix in prop_oneof![Just(String::new()), "[a-z%/]{1,6}/"],
        (a, b) in "[a%/b2F]{1,8}".prop_flat_map(|a| {
            // Pairs an unescaped layout would confuse: `/` against its escape `%2F`.
            let escaped = a.replace('/', "%2F");
            let unescaped = a.replace("%2F", "/");
            (Just(a), prop_oneof![Just(escaped), Just(unescaped), "[a%/b2F]{1,8}"])
        }),
        lease in 0i64..,
    ) {
        let layout = Layout::new(&prefix);
        let (na, nb) = (LockName::new(&a).expect("valid"), LockName::new(&b).expect("valid"));
        let (pa, pb) = (layout.lock_prefix(&na), layout.lock_prefix(&nb));
        let key = layout.key(&na, lease);
        prop_assert!(key.starts_with(&pa));
        prop_assert!(key.as_slice() < range_end(&pa).as_slice());
        if a != b {
            prop_assert!(!key.starts_with(&pb), "{a:?} inside {b:?}");
        }
    }

    /// Guards against a listing range that misses a lock under the prefix or takes in
    /// one outside it (an escape that is not prefix-free), and keys that do not map back
    /// to their lock's name.
    #[test]
    fn prop_listing_prefixes_match_exactly_the_names_under_them(
        layout_prefix in prop_oneof![Just(String::new()), "[a-z%/]{1,6}/"],
        (name, prefix) in r"[a%/_*?\\\[2F5é]{1,8}".prop_flat_map(|name| {
            // Half the time a true prefix of the name (cut at a character boundary),
            // else any short string: both sides of the equivalence get exercised.
            let cuts: Vec<usize> = name.char_indices().map(|(i, _)| i).chain([name.len()]).collect();
            let cut = proptest::sample::select(cuts).prop_map({
                let name = name.clone();
                move |at| name[..at].to_owned()
            });
            (Just(name), prop_oneof![cut, r"[a%/_*?\\\[2F5é]{0,4}"])
        }),
        lease in 0i64..,
    ) {
        let layout = Layout::new(&layout_prefix);
        let lock = LockName::new(&name).expect("valid");
        let key = layout.key(&lock, lease);
        let range = layout.list_prefix(&prefix);
        prop_assert_eq!(key.starts_with(&range), name.starts_with(&prefix), "{} under {}", name, prefix);
        prop_assert_eq!(layout.lock_of(&key), Some(lock));
    }

    /// Guards against the range end of any byte prefix (0xff bytes included) panicking or
    /// failing to bound the prefix's keys.
    #[test]
    fn prop_range_end_bounds_every_key(
        prefix in proptest::collection::vec(prop_oneof![Just(0u8), Just(0xfe), Just(0xff), any::<u8>()], 0..6),
        suffix in any::<Vec<u8>>(),
    ) {
        let end = range_end(&prefix);
        let key = [prefix.as_slice(), suffix.as_slice()].concat();
        if let Some(cut) = prefix.iter().rposition(|b| *b < 0xff) {
            prop_assert!(key < end);
            prop_assert!(prefix < end);
            // Tight: the first key after the prefix's range is the end itself.
            let mut first_after = prefix[..=cut].to_vec();
            first_after[cut] += 1;
            prop_assert_eq!(end, first_after);
        } else {
            prop_assert_eq!(end, vec![0]);
        }
    }

    /// Guards against a grant parser that panics, rejects its own grants, or accepts
    /// foreign ones; and a TTL conversion that overflows.
    #[test]
    fn prop_grants_round_trip_and_ttls_convert(
        lease in 0i64..,
        rev in any::<i64>(),
        foreign in any::<String>(),
        ttl in prop_oneof![any::<u64>().prop_map(Duration::from_nanos), Just(Duration::MAX), Just(Duration::ZERO)],
    ) {
        let name = LockName::new("n").expect("valid");
        let second = Ttl::new(Duration::from_secs(1)).expect("valid");
        let ours = Lease::new(name.clone(), Identity::unique(), second, format!("{lease:x}:{rev}"));
        prop_assert_eq!(parse_grant(&ours).ok().map(|g| (g.lease, g.revision, g.session)), Some((lease, rev, false)));
        let shared = Grant::on_session(lease, rev, format!("{lease:x}-{rev}"));
        prop_assert_eq!(Grant::parse(&shared.encode()).ok(), Some(shared.clone()));
        let moved = shared.moved_to(lease / 2, rev / 2);
        prop_assert_eq!(Grant::parse(&moved.encode()).ok(), Some(moved));
        // A permit's grant, on its session and moved, reads back with its lease's count.
        let permits = lockcore::Permits::new(lockcore::MAX_PERMITS).expect("valid");
        let index = u32::try_from(lease % i64::from(permits.get())).expect("small");
        let permit = Grant::permit_on_session(lease, rev, index, permits.get());
        let moved = permit.moved_to(lease / 2, rev / 2);
        for grant in [permit, moved] {
            let on = Lease::new(name.clone(), Identity::unique(), second, grant.encode())
                .with_permits(permits);
            prop_assert_eq!(parse_grant(&on).ok(), Some(grant));
        }
        let other = Lease::new(name, Identity::unique(), second, foreign.as_str());
        if let Err(err) = parse_grant(&other) {
            prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
        // The lease etcd is asked for never ends before the holder thinks it does.
        if let Ok(ttl) = Ttl::new(ttl) {
            let secs = u64::try_from(ttl.as_secs()).expect("positive");
            prop_assert!(Duration::from_secs(secs) >= ttl.get());
        }
    }
}

/// The inputs the properties first failed on, kept as fixed cases.
#[test]
fn regression_raw_passwords_display_and_ttls() {
    let err = EtcdConfig::from_url("etcd://:aa00AaA0/@127.0.0.1:1/x").expect_err("bad host");
    assert!(!format!("{err:?}").contains("aa00AaA0"), "{err:?}");
    let config = EtcdConfig::from_url("etcd://%25:pw@a/").expect("valid");
    let shown = config.to_string().replace("***", "pw");
    assert_eq!(EtcdConfig::from_url(&shown).ok(), Some(config));
}

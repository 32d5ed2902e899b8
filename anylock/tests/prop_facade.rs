//! Property tests of the facade's input handling: backend URL dispatch and redaction, and
//! the TOML `Config`. See `docs/fuzzing.md`; `PROPTEST_CASES` sets the case count.
//!
//! `connect` is only ever called with URLs that must fail before any I/O, and with
//! loopback hosts only, so a parser that wrongly accepts one stays on this machine.

use std::error::Error as _;
use std::time::Duration;

use anylock::{BackendUrl, Config, SCHEMES, redact};
use lockcore::{Error, ErrorKind, WaitMode};
use proptest::prelude::*;
use test_kit::prop::config;

/// Every scheme the crate docs list, the TLS variants included.
const DOCUMENTED: &[&str] = &[
    "local",
    "memory",
    "redis",
    "rediss",
    "redlock",
    "redlocks",
    "postgres",
    "postgresql",
    "etcd",
    "etcds",
    "gs",
];

/// A password: random 8-character chunks (the markers searched for in output) joined by
/// characters that URLs treat specially, written raw or percent-encoded.
#[derive(Debug, Clone)]
struct Password {
    chunks: Vec<String>,
    text: String,
}

impl Password {
    /// The first chunk found in `shown`, if any: a (partial) leak.
    fn leaked_in(&self, shown: &str) -> Option<&str> {
        self.chunks
            .iter()
            .find(|c| shown.contains(c.as_str()))
            .map(String::as_str)
    }
}

fn percent_encode(text: &str) -> String {
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

/// Passwords; with `raw_at` false a raw `@` never appears (it could make the rest of the
/// password a host name, which `connect` would then look up).
fn passwords(raw_at: bool) -> impl Strategy<Value = Password> {
    let chunk = "[A-Za-z0-9]{8}";
    let mut specials = vec![
        ":", "/", "?", "#", ",", "%", "&", "=", " ", "+", "!", "$", "'", "(", "*", ";", "[", "]",
        "é", "%2F", "%40", "%zz",
    ];
    if raw_at {
        specials.push("@");
    }
    let separator = prop_oneof![
        Just(String::new()),
        proptest::sample::select(specials).prop_map(str::to_owned),
    ];
    (
        proptest::collection::vec((chunk, separator), 1..4),
        any::<bool>(),
    )
        .prop_map(|(parts, encode)| {
            let chunks: Vec<String> = parts.iter().map(|(c, _)| c.clone()).collect();
            let raw: String = parts.iter().map(|(c, s)| format!("{c}{s}")).collect();
            let text = if encode { percent_encode(&raw) } else { raw };
            Password { chunks, text }
        })
}

/// Stands for the first query parameter of every generated URL (before any password in the
/// query, so a raw `#` in the password cannot push it into the fragment).
const FIRST: &str = "FIRST=1";

/// A URL of any documented scheme (plus unknown ones) carrying `password` in one of the
/// places URLs carry secrets.
fn secret_urls(
    hosts: &'static [&'static str],
    raw_at: bool,
) -> impl Strategy<Value = (String, Password)> {
    let schemes = proptest::sample::select(
        DOCUMENTED
            .iter()
            .copied()
            .chain(["mongodb", "http", "consul"])
            .collect::<Vec<_>>(),
    );
    let key = proptest::sample::select(vec!["password", "PASSWORD", "token", "secret", "key"]);
    (
        schemes,
        passwords(raw_at),
        proptest::sample::select(hosts.to_vec()),
        "[a-z]{0,6}",
        0usize..6,
        key,
    )
        .prop_map(|(scheme, password, host, user, form, key)| {
            let pw = &password.text;
            // In a query a raw `&` starts the next parameter: it must be encoded there.
            let qpw = pw.replace('&', "%26");
            let url = match form {
                0 => format!("{scheme}://{user}:{pw}@{host}:1/x?{FIRST}"),
                1 => format!("{scheme}://:{pw}@{host}?{FIRST}"),
                2 => format!("{scheme}://{user}:{pw}@{host}:1,{host}:2,{host}:3/p?{FIRST}&a=b"),
                3 => format!("{scheme}://u:{pw}@{host}:1,u:{pw}@{host}:2/p?{FIRST}"),
                4 => format!("{scheme}://{host}/p?{FIRST}&a=1&{key}={qpw}&b=2"),
                _ => format!("{scheme}://{user}:{pw}@{host}:1/x?{FIRST}&{key}={qpw}"),
            };
            (url, password)
        })
}

/// Everything a person or a log could see of an error: `Display`, `Debug`, sources.
fn shown(err: &Error) -> String {
    let mut text = format!("{err} | {err:?}");
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(&format!(" | {inner}"));
        source = inner.source();
    }
    text
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// The error `connect` must return for `url`.
fn connect_err(url: &str) -> Error {
    match block_on(anylock::connect(url)) {
        Ok(backend) => panic!("{url}: connected to {}", backend.backend_name()),
        Err(err) => err,
    }
}

/// A parameter each backend rejects before it opens any connection.
fn rejected_param(scheme: &str) -> &'static str {
    match scheme {
        "postgres" | "postgresql" => "pool_size=zz",
        "etcd" | "etcds" => "timeout=zz",
        "gs" => "timeout_ms=zz",
        _ => "zz_unknown=1",
    }
}

/// TOML documents: valid ones, each randomly mutated (a byte deleted, replaced or
/// inserted, a line duplicated), and arbitrary text.
fn toml_documents() -> impl Strategy<Value = (String, Password)> {
    prop_oneof![
        2 => valid_toml(),
        6 => (valid_toml(), any::<prop::sample::Index>(), 0u8..5, any::<char>())
            .prop_map(|((doc, password), at, how, ch)| (mutate(&doc, at, how, ch), password)),
        1 => (any::<String>(), passwords(true)),
    ]
}

/// `backend`, `ttl` and `wait` set, the backend URL holding a password.
fn valid_toml() -> impl Strategy<Value = (String, Password)> {
    (passwords(true), "[0-9]{1,4}(ms|s|m|h)", any::<bool>()).prop_map(|(password, ttl, forever)| {
        let wait = if forever { "forever" } else { "5s" };
        let pw = password.text.replace('\\', "\\\\").replace('"', "\\\"");
        let doc =
            format!("backend = \"redis://:{pw}@h:1/0\"\nttl = \"{ttl}\"\nwait = \"{wait}\"\n");
        (doc, password)
    })
}

/// One edit of `doc` at a random place: delete, replace or insert a character (often one
/// that matters to TOML), or duplicate a line.
fn mutate(doc: &str, at: prop::sample::Index, how: u8, ch: char) -> String {
    let mut chars: Vec<char> = doc.chars().collect();
    let i = at.index(chars.len());
    match how {
        0 => {
            chars.remove(i);
        }
        1 => chars[i] = ch,
        2 => chars.insert(i, ch),
        3 => chars.insert(i, ['"', '=', '[', '\n', '\\', '#'][(ch as usize) % 6]),
        _ => {
            let mut lines: Vec<&str> = doc.lines().collect();
            let line = lines[i % lines.len()];
            lines.insert(i % lines.len(), line);
            return lines.join("\n");
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(config())]

    /// Guards against a password (raw or percent-encoded, in the user info of any host or
    /// a secret query parameter) surviving `redact`, `BackendUrl`'s `Display`/`Debug` or
    /// `Config`'s `Debug`, and against redaction that is not idempotent.
    #[test]
    fn prop_redaction_hides_every_password((url, password) in secret_urls(&["h", "10.0.0.1", "[::1]", "db.example"], true)) {
        let backend = BackendUrl::new(url.as_str());
        let config = Config::with_backend(url.as_str());
        for shown in [
            redact(&url),
            backend.to_string(),
            format!("{backend:?}"),
            format!("{config:?}"),
        ] {
            prop_assert!(password.leaked_in(&shown).is_none(), "{url} shown as {shown}");
        }
        prop_assert_eq!(redact(&redact(&url)), redact(&url));
    }

    /// Guards against `redact` panicking on arbitrary text (slicing at a non-boundary) or
    /// altering URLs that carry no secret.
    #[test]
    fn prop_redaction_never_panics_and_keeps_secret_free_urls(
        text in any::<String>(),
        scheme in "[a-z]{1,8}",
        host in "[a-z0-9.-]{1,12}(:[0-9]{1,5})?",
        path in "(/[a-z0-9._~-]{0,8}){0,3}",
    ) {
        let _ = redact(&text);
        let _ = BackendUrl::new(text.as_str()).scheme();
        let plain = format!("{scheme}://{host}{path}?prefix=x&timeout_ms=5");
        prop_assert_eq!(redact(&plain), plain);
    }

    /// Guards against a scheme lookup that panics, keeps case, or disagrees with where the
    /// URL's first `:` is.
    #[test]
    fn prop_scheme_is_the_lowercased_text_before_the_first_colon(text in any::<String>()) {
        let url = BackendUrl::new(text.as_str());
        let expected = text
            .trim()
            .split_once(':')
            .map_or_else(String::new, |(s, _)| s.to_ascii_lowercase());
        prop_assert_eq!(url.scheme(), expected);
        prop_assert_eq!(url.expose(), text.trim());
    }

    /// Guards against `connect` accepting an unknown scheme, reporting it as anything but
    /// InvalidInput, or echoing the password while naming the known schemes.
    #[test]
    fn prop_unknown_schemes_are_invalid_input_without_secrets(
        (url, password) in secret_urls(&["127.0.0.1"], true),
        scheme in "[a-z][a-z0-9+.-]{0,10}",
    ) {
        prop_assume!(!DOCUMENTED.contains(&scheme.as_str()));
        let url = match url.split_once("://") {
            Some((_, rest)) => format!("{scheme}://{rest}"),
            None => url,
        };
        let err = connect_err(&url);
        prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let text = shown(&err);
        prop_assert!(text.contains("local, redis, rediss"), "{text}");
        prop_assert!(password.leaked_in(&text).is_none(), "{url}: {text}");
    }

    /// Guards against a documented scheme that the facade does not dispatch, a backend
    /// that does not accept its scheme in any letter case, and a backend URL error that is
    /// untyped, empty or shows the password. Each URL carries a parameter its backend
    /// rejects, so nothing is ever connected to.
    #[test]
    fn prop_backend_url_errors_are_typed_and_hide_secrets(
        (url, password) in secret_urls(&["127.0.0.1"], false),
        scheme in proptest::sample::select(DOCUMENTED[2..].to_vec()),
        upper in proptest::collection::vec(any::<bool>(), 10),
    ) {
        let Some((_, rest)) = url.split_once("://") else { unreachable!() };
        let lower = format!("{scheme}://{rest}").replacen(FIRST, rejected_param(scheme), 1);
        let mixed: String = scheme
            .chars()
            .zip(upper.iter().cycle())
            .map(|(c, up)| if *up { c.to_ascii_uppercase() } else { c })
            .collect();
        let mixed = format!("{mixed}{}", &lower[scheme.len()..]);
        let err = connect_err(&lower);
        prop_assert!(
            matches!(err.kind(), ErrorKind::InvalidInput | ErrorKind::Config),
            "{lower}: {err}"
        );
        prop_assert!(!err.message().is_empty());
        prop_assert!(!err.message().contains("unknown backend URL"), "{lower}: {err}");
        let text = shown(&err);
        prop_assert!(password.leaked_in(&text).is_none(), "{lower}: {text}");
        let again = connect_err(&mixed);
        prop_assert_eq!(again.kind(), err.kind(), "{} vs {}", again, err);
        prop_assert_eq!(again.message(), err.message());
    }

    /// Guards against the TOML loader panicking, returning anything but a Config error, or
    /// quoting the backend URL's password in its message; and against `Config`'s `Debug`
    /// showing it after a successful parse.
    #[test]
    fn prop_toml_config_errors_are_typed_and_hide_secrets((doc, password) in toml_documents()) {
        match Config::from_toml(&doc) {
            // A mutation may remove the `:` or `@` around the password: then it is no
            // longer one, and only an intact `:password@` must be hidden.
            Ok(config) if config.backend.as_ref().is_some_and(|b| b.contains(&format!(":{}@", password.text))) => {
                let debug = format!("{config:?}");
                prop_assert!(password.leaked_in(&debug).is_none(), "{debug}");
            }
            Ok(_) => {}
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::Config);
                prop_assert!(!err.message().is_empty());
                let text = shown(&err);
                prop_assert!(password.leaked_in(&text).is_none(), "{doc:?}: {text}");
            }
        }
    }

    /// Guards against values that do not survive TOML (escapes, quotes, unicode in the
    /// backend) and durations that do not read back as written (humantime text or bare
    /// seconds): writing a config as TOML and parsing it gives the same config.
    #[test]
    fn prop_toml_config_round_trips(
        backend in proptest::option::of(any::<String>()),
        ttl_ms in proptest::option::of(10u64..10_000_000),
        wait_ms in proptest::option::of(proptest::option::of(0u64..10_000_000)),
        grace_s in proptest::option::of(0u32..100_000),
    ) {
        let human = |ms: u64| toml::Value::String(
            humantime::format_duration(Duration::from_millis(ms)).to_string(),
        );
        let mut table = toml::Table::new();
        if let Some(backend) = &backend {
            table.insert("backend".to_owned(), toml::Value::String(backend.clone()));
        }
        if let Some(ms) = ttl_ms {
            table.insert("ttl".to_owned(), human(ms));
        }
        match wait_ms {
            Some(Some(ms)) => drop(table.insert("wait".to_owned(), human(ms))),
            Some(None) => drop(table.insert("wait".to_owned(), "forever".into())),
            None => {}
        }
        if let Some(secs) = grace_s {
            table.insert("grace".to_owned(), toml::Value::Integer(secs.into()));
        }
        let text = toml::to_string(&table).expect("serializable");
        let parsed = Config::from_toml(&text).expect("round trip");
        let expected = Config {
            backend,
            ttl: ttl_ms.map(|ms| lockcore::Ttl::new(Duration::from_millis(ms)).expect("in range")),
            wait: wait_ms.map(|w| w.map_or(WaitMode::Forever, |ms| WaitMode::Timeout(Duration::from_millis(ms)))),
            grace: grace_s.map(|s| Duration::from_secs(s.into())),
        };
        prop_assert_eq!(parsed, expected);
    }
}

#[test]
fn every_documented_scheme_is_known_to_the_facade() {
    for scheme in DOCUMENTED {
        assert!(
            SCHEMES.iter().any(|s| s.scheme == *scheme),
            "{scheme}: is documented but not in anylock::SCHEMES"
        );
    }
}

/// The inputs the properties first failed on, kept as fixed cases.
#[test]
fn regression_raw_passwords_and_scheme_case() {
    for url in [
        "local://:aAA0aaAA/@h:1/x",
        "redis://:0AAa0A00/@h:1/0",
        "a://127.0.0.1/p?a=1&password=0aA0Aa0A&b=2",
    ] {
        for secret in ["aAA0aaAA", "0AAa0A00", "0aA0Aa0A"] {
            assert!(!redact(url).contains(secret), "{url} -> {}", redact(url));
        }
    }
    let lower = connect_err("redlock://127.0.0.1:1/x?zz_unknown=1");
    let upper = connect_err("REDLOCK://127.0.0.1:1/x?zz_unknown=1");
    assert_eq!(lower.message(), upper.message());
}

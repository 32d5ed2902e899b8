//! Property tests of this crate's parsers: `postgres://` URLs and their parameters, table
//! and channel names, SQLSTATE codes from the server and lease grants. See
//! `docs/fuzzing.md`; `PROPTEST_CASES` sets the case count.

use std::time::Duration;

use lockcore::{ErrorKind, Identity, Lease, LockName};
use proptest::prelude::*;

use crate::PostgresConfig;
use crate::backend::grant_token;
use crate::error::classify_sqlstate;
use crate::names::{MAX_IDENTIFIER_LEN, MAX_TABLE_LEN, quote_identifier};

/// Characters a URL treats specially, joining the chunks of generated passwords (no raw
/// `@`: with one, part of the password is a host name by the URL grammar).
const PASSWORD_SEPARATORS: &[&str] = &[
    ":", "/", "?", "#", ",", "%", "=", " ", "+", "$", ";", "é", "%40", "%2F", "%zz", "%C3%28",
    "%00",
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
    "postgres://app:pa%40ss@db.example:6543/locks?sslmode=require&pool_size=3",
    "postgresql://localhost/db?schema=s&table=t&timeout_ms=250&create_schema=false",
    "postgres://[::1]:5432/db?prepared_statements=off&channel=c",
];

/// Query tails: valid and invalid values of anylock's and sqlx's parameters.
fn tails() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        "",
        "?sslmode=require",
        "?sslmode=sometimes",
        "?pool_size=-1",
        "?pool_size=4294967296",
        "?pool_size=18446744073709551616",
        "?timeout_ms=soon",
        "?timeout_ms=18446744073709551615",
        "?create_schema=maybe",
        "?schema=My%20Schema&table=t&channel=c",
        "?schema=%FF",
        "?port=notaport",
        "?options=-c%20x%3Dy",
        "?application_name=a%00b",
    ])
}

/// URLs carrying a password in the user info or a `password` parameter.
fn secret_urls() -> impl Strategy<Value = (String, Vec<String>)> {
    let scheme = proptest::sample::select(vec!["postgres", "postgresql", "mysql"]);
    (scheme, passwords(), "[a-z]{0,5}", 0usize..4, tails()).prop_map(
        |(scheme, (chunks, pw), user, form, tail)| {
            let query_pw: String = url::form_urlencoded::byte_serialize(pw.as_bytes()).collect();
            let sep = if tail.is_empty() { '?' } else { '&' };
            let url = match form {
                0 => format!("{scheme}://{user}:{pw}@db.example:5432/app{tail}"),
                1 => format!("{scheme}://{user}:{pw}@db.example:notaport/app{tail}"),
                2 => format!("{scheme}://db.example/app{tail}{sep}password={query_pw}"),
                _ => format!("{scheme}://{user}:{pw}@/app{tail}"),
            };
            (url, chunks)
        },
    )
}

/// Identifiers: ordinary, multibyte near the byte limits, with control characters.
fn identifiers() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_][a-z0-9_]{0,20}",
        any::<String>(),
        "[éü€😀a-z\"' ;]{10,70}",
        (0usize..80).prop_map(|n| "x".repeat(n)),
        Just("pg_catalog".to_owned()),
    ]
}

fn valid_identifier(name: &str, max: usize) -> bool {
    !name.is_empty() && name.len() <= max && !name.chars().any(char::is_control)
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against the URL parser (ours and sqlx's behind it) panicking on malformed
    /// input, or reporting it as anything but InvalidInput with a message.
    #[test]
    fn prop_urls_never_panic_and_errors_are_typed(url in test_kit::prop::mangled(VALID_URLS.to_vec())) {
        if let Err(err) = PostgresConfig::from_url(&url) {
            prop_assert_eq!(err.kind(), ErrorKind::InvalidInput, "{:?}: {}", url, err);
            prop_assert!(!err.message().is_empty());
        }
    }

    /// Guards against a password (user info or `password` parameter, main or LISTEN URL)
    /// showing in an error, in `Display`, in `Debug` or in the redacted URL.
    #[test]
    fn prop_passwords_never_show((url, chunks) in secret_urls()) {
        let base = PostgresConfig::from_url("postgres://h/db").expect("valid");
        let mut shown = Vec::new();
        for result in [PostgresConfig::from_url(&url), base.with_listen_url(&url)] {
            match result {
                Ok(c) => shown.extend([c.to_string(), format!("{c:?}"), c.redacted_url().to_owned()]),
                Err(e) => {
                    prop_assert_eq!(e.kind(), ErrorKind::InvalidInput);
                    shown.push(format!("{e} {e:?}"));
                }
            }
        }
        for text in shown {
            for chunk in &chunks {
                prop_assert!(!text.contains(chunk.as_str()), "{url}: {text}");
            }
        }
    }

    /// Guards against a redacted URL that no longer parses to the same settings (anylock's
    /// own parameters lost or mangled by the redaction).
    #[test]
    fn prop_redacted_urls_parse_to_the_same_settings(
        (_, pw) in passwords(),
        schema in any::<String>(),
        table in "[^\\p{Cc}]{1,20}",
        pool in 1u32..,
        timeout_ms in 1u64..,
        flags in (any::<bool>(), any::<bool>()),
    ) {
        // `+` is literal in a query (lockcore::url::Query): escape every reserved character.
        let enc = |s: &str| lockcore::url::percent_encode(s, " !\"#$&'()*+,/:;<=>?@[\\]^`{|}");
        let url = format!(
            "postgres://app:{}@db:5432/app?schema={}&table={}&pool_size={pool}&timeout_ms={timeout_ms}\
             &create_schema={}&prepared_statements={}&sslmode=require",
            enc(&pw), enc(&schema), enc(&table), flags.0, flags.1
        );
        let config = PostgresConfig::from_url(&url).expect("valid URL");
        let again = PostgresConfig::from_url(config.redacted_url()).expect("redacted URL parses");
        prop_assert_eq!(again.schema(), schema.as_str());
        prop_assert_eq!(again.table(), table.as_str());
        prop_assert_eq!(again.pool_size(), pool);
        prop_assert_eq!(again.timeout(), Duration::from_millis(timeout_ms));
        prop_assert_eq!((again.create_schema(), again.prepared_statements()), flags);
        prop_assert_eq!(again.channel(), config.channel());
        prop_assert_eq!(again.redacted_url(), config.redacted_url());
    }

    /// Guards against name validation that panics or accepts what the server would
    /// reject, and a default channel that is cut inside a character or past 63 bytes.
    #[test]
    fn prop_names_validate_and_channels_fit(
        schema in identifiers(),
        table in identifiers(),
        channel in proptest::option::of(identifiers()),
    ) {
        let mut config = PostgresConfig::from_url("postgres://h/db")
            .expect("valid")
            .with_schema(schema.as_str())
            .with_table(table.as_str());
        if let Some(channel) = &channel {
            config = config.with_channel(channel.as_str());
        }
        let derived = config.channel();
        if channel.is_none() {
            prop_assert!(derived.len() <= MAX_IDENTIFIER_LEN);
            let full = format!("anylock:{schema}.{table}");
            prop_assert!(full.starts_with(&derived));
        }
        let valid = valid_identifier(&schema, MAX_IDENTIFIER_LEN)
            && !schema.starts_with("pg_")
            && valid_identifier(&table, MAX_TABLE_LEN)
            && valid_identifier(&derived, MAX_IDENTIFIER_LEN);
        match config.validate() {
            Ok(()) => prop_assert!(valid),
            Err(err) => {
                prop_assert!(!valid, "{err}");
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
            }
        }
        let quoted = quote_identifier(&schema);
        let inner = &quoted[1..quoted.len() - 1];
        prop_assert_eq!(inner.replace("\"\"", "\""), schema.clone());
        prop_assert!(!inner.replace("\"\"", "").contains('"'));
    }

    /// Guards against the SQLSTATE table panicking on codes a server (or a proxy) sends
    /// that are short, long, non-ASCII or unknown: each maps to some kind and status.
    #[test]
    fn prop_sqlstates_always_classify(
        code in prop_oneof!["[0-9A-Z]{5}", any::<String>(), "[é0-9]{0,3}"],
    ) {
        let (kind, _) = classify_sqlstate(&code);
        if code.len() != 5 || !code.is_ascii() {
            prop_assert!(matches!(kind, ErrorKind::Protocol | ErrorKind::Unavailable | ErrorKind::InvalidInput));
        }
    }

    /// Guards against a lease grant parser that panics, or accepts a grant it did not
    /// issue (anything but a decimal i64).
    #[test]
    fn prop_grants_parse_only_tokens(
        grant in prop_oneof![
            any::<i64>().prop_map(|t| t.to_string()),
            (any::<i64>(), proptest::sample::select(vec!["x", "+", " ", "0x", "-", "", "1:"]))
                .prop_map(|(t, p)| format!("{p}{t}")),
            any::<String>(),
            Just("9223372036854775808".to_owned()),
        ],
    ) {
        let name = LockName::new("n").expect("valid");
        let lease = Lease::new(name, Identity::unique(), lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"), grant.as_str());
        match grant_token(&lease) {
            Ok(token) => prop_assert_eq!(token.to_string().parse::<i64>(), grant.parse::<i64>()),
            Err(err) => {
                prop_assert!(grant.parse::<i64>().is_err());
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
            }
        }
    }
}

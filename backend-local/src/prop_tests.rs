//! Property tests of this crate's parsers: `local:` URLs and liveness keys.
//! See `docs/fuzzing.md`; `PROPTEST_CASES` sets the case count.

use std::path::Path;

use lockcore::ErrorKind;
use proptest::prelude::*;

use crate::LocalConfig;
use crate::liveness::is_key;

/// Backend URLs of other schemes, some carrying a password (marked by `SECRETxx`).
fn other_urls() -> impl Strategy<Value = (String, String)> {
    (
        proptest::sample::select(vec![
            "redis", "postgres", "etcd", "LOCAL", "Local", "locale",
        ]),
        "[A-Za-z0-9]{8}",
        proptest::sample::select(vec!["://u:", "://:", ":", "://", ""]),
    )
        .prop_map(|(scheme, marker, sep)| {
            (
                format!("{scheme}{sep}SECRET{marker}@h:1/x"),
                format!("SECRET{marker}"),
            )
        })
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against a `local:` parser that panics, reports another scheme as anything
    /// but InvalidInput, or echoes the rest of the URL (a password) in its error.
    #[test]
    fn prop_local_urls_parse_or_fail_without_echo((url, secret) in other_urls(), text in any::<String>()) {
        for input in [url.as_str(), text.as_str()] {
            match LocalConfig::from_url(input) {
                Ok(_) => prop_assert!(input.starts_with("local:")),
                Err(err) => {
                    prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
                    prop_assert!(!err.message().is_empty());
                    let shown = format!("{err} {err:?}");
                    prop_assert!(!shown.contains(&secret), "{input}: {shown}");
                }
            }
        }
    }

    /// Guards against `Display` output that does not parse back to the same database path
    /// (any path: one that starts with `//`, or holds `?`, `%` or `#`, which a URL
    /// escapes), or to other options.
    #[test]
    fn prop_local_display_round_trips(
        path in "[^\0]{1,40}",
        slashes in any::<bool>(),
        shared_fs in any::<bool>(),
    ) {
        let path = if slashes { format!("//{path}") } else { path };
        let config = LocalConfig::new(&path).with_shared_filesystem(shared_fs);
        let again = LocalConfig::from_url(&config.to_string()).expect("Display parses");
        prop_assert_eq!(again.path(), Path::new(&path));
        prop_assert_eq!(again, config);
    }

    /// Guards against a liveness key from the database (which anyone who can write the
    /// file controls) being used as a path: only our own 32-hex-digit keys are opened.
    #[test]
    fn prop_only_our_own_liveness_keys_are_accepted(key in any::<String>()) {
        if is_key(&key) {
            prop_assert_eq!(key.len(), 32);
            prop_assert!(!key.contains('/') && !key.contains('.'));
        }
    }
}

/// The inputs the properties first failed on, kept as fixed cases.
#[test]
fn regression_no_echo_and_double_slash_paths() {
    let err = LocalConfig::from_url("redis://u:SECRETaaaA0AA0@h:1/x").expect_err("not local");
    assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
    let config = LocalConfig::from_url("local:////").expect("valid");
    let again = LocalConfig::from_url(&config.to_string()).expect("parses");
    assert_eq!(again.path(), Path::new("//"));
}

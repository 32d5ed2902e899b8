//! Property tests of `gs://` URL parsing through the public API. See `docs/fuzzing.md`;
//! `PROPTEST_CASES` sets the case count.

use backend_gcs::GcsConfig;
use lockcore::ErrorKind;
use proptest::prelude::*;

/// Valid URLs that `test_kit::prop::mangled` mutates.
const VALID_URLS: &[&str] = &[
    "gs://locks-1/app/?endpoint=http://127.0.0.1:4443&timeout_ms=250",
    "gs://bucket",
    "gs://b.c_d-e/a%20b/?timeout_ms=18446744073709551615",
    "gs://bucket/p?endpoint=127.0.0.1:1",
];

/// A secret: an 8-character marker with URL-special characters around it.
fn secrets() -> impl Strategy<Value = (String, String)> {
    (
        "[A-Za-z0-9]{8}",
        proptest::sample::select(vec!["", "/", "?", "&", "%zz", "é", "."]),
    )
        .prop_map(|(marker, sep)| (marker.clone(), format!("{marker}{sep}")))
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against the URL parser panicking (percent-decoding, empty parts) or reporting
    /// a bad URL as anything but InvalidInput with a message.
    #[test]
    fn prop_gcs_urls_never_panic_and_errors_are_typed(url in test_kit::prop::mangled(VALID_URLS.to_vec())) {
        match GcsConfig::from_url(&url) {
            Ok(config) => {
                let again = GcsConfig::from_url(&config.to_string());
                prop_assert!(again.is_ok(), "{} shown as {}", url, config);
            }
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput, "{:?}: {}", url, err);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against an access token showing in `Debug` or `Display`.
    #[test]
    fn prop_gcs_tokens_never_show((marker, token) in secrets(), url in test_kit::prop::mangled(VALID_URLS.to_vec())) {
        if let Ok(config) = GcsConfig::from_url(&url) {
            let config = config.with_access_token(token);
            let shown = format!("{config} {config:?}");
            prop_assert!(!shown.contains(&marker), "{shown}");
        }
    }
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against user info written into a `gs://` URL (by habit from other schemes,
    /// or in the endpoint) showing in errors, `Display` or `Debug`.
    ///
    /// Found by this property and fixed: the bucket-name error echoed
    /// `gs://u:PASSWORD@bucket`'s bucket part, and an endpoint with user info showed in
    /// `Display` and `Debug`. Both are refused now without echoing.
    #[test]
    fn prop_gcs_url_errors_hide_user_info((marker, pw) in secrets(), form in 0u8..2) {
        let url = match form {
            0 => format!("gs://u:{pw}@bucket/p"),
            _ => format!("gs://bucket/p?endpoint=http://u:{pw}@127.0.0.1:1"),
        };
        let shown = match GcsConfig::from_url(&url) {
            Ok(c) => format!("{c} {c:?}"),
            Err(e) => format!("{e} {e:?}"),
        };
        prop_assert!(!shown.contains(&marker), "{url}: {shown}");
    }
}

//! Property tests of this crate's parsers: `local:` URLs and `/proc/<pid>/stat` lines.
//! See `docs/fuzzing.md`; `PROPTEST_CASES` sets the case count.

use std::path::Path;

use lockcore::ErrorKind;
use proptest::prelude::*;

use crate::LocalConfig;
use crate::host::parse_stat;

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

/// `/proc/<pid>/stat` lines: well-formed with awkward command names, cut short, or
/// arbitrary text.
fn stat_lines() -> impl Strategy<Value = String> {
    let well_formed = (
        any::<u32>(),
        "[^\n]{0,20}",
        any::<char>(),
        proptest::collection::vec(any::<i64>(), 0..25),
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            Just("18446744073709551616".to_owned()),
            Just("-1".to_owned())
        ],
    )
        .prop_map(|(pid, comm, state, fields, start)| {
            let mut fields: Vec<String> = fields.iter().map(i64::to_string).collect();
            if fields.len() >= 19 {
                fields[18] = start;
            }
            format!("{pid} ({comm}) {state} {}", fields.join(" "))
        });
    prop_oneof![3 => well_formed, 1 => any::<String>()]
}

proptest! {
    #![proptest_config(conformance::prop::config())]

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

    /// Guards against `Display` output that does not parse back to the same database path.
    #[test]
    fn prop_local_display_round_trips(path in "[^\0]{1,40}", slashes in any::<bool>()) {
        let url = if slashes { format!("local://{path}") } else { format!("local:{path}") };
        let config = LocalConfig::from_url(&url).expect("valid");
        let again = LocalConfig::from_url(&config.to_string()).expect("Display parses");
        prop_assert_eq!(again.path(), config.path());
        prop_assert!(config.path() != Path::new(""));
    }

    /// Guards against the stat parser panicking (slicing after the last `)`, short lines,
    /// overflowing start times) on any text `/proc` could hold.
    #[test]
    fn prop_stat_lines_parse_without_panicking(line in stat_lines()) {
        if let Some((_, start)) = parse_stat(&line) {
            let rest = &line[line.rfind(')').expect("a ')'") + 1..];
            let field = rest.split_whitespace().nth(19).expect("field 22");
            prop_assert_eq!(field.parse::<u64>().ok(), Some(start));
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

//! Property tests of the CLI's input handling: duration arguments and config values, and
//! the display of whatever holder a backend reports. See `docs/fuzzing.md`;
//! `PROPTEST_CASES` sets the case count.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anylock::Config;
use clap::Parser;
use lockcore::{ErrorKind, FenceToken, HolderInfo, Identity};
use proptest::prelude::*;

use crate::cli::{Cli, Command};

/// Duration texts: humantime's forms, overflowing numbers, odd units, and garbage.
fn durations() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,6} ?(ns|us|ms|s|m|h|d|w|M|y|sec|min|hours|days)",
        "[0-9]{1,3}m ?[0-9]{1,3}s",
        "[0-9]{15,30}(ns|s|y)",
        "[0-9]{1,3}(\\.[0-9]{1,3})?(s|xs|)",
        Just("forever".to_owned()),
        Just("-5s".to_owned()),
        Just("18446744073709551616s".to_owned()),
        Just("584942417355y".to_owned()),
        any::<String>(),
    ]
}

/// Times a backend may report: ordinary, far future (past year 9999), before the epoch.
fn times() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        (0u64..4_000_000_000).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s)),
        any::<u64>().prop_map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        (0u64..1 << 40).prop_map(|s| UNIX_EPOCH - Duration::from_secs(s)),
        Just(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
    ]
}

/// Holders as any backend may report them, from any stored identity.
fn holders() -> impl Strategy<Value = HolderInfo> {
    (
        any::<String>(),
        proptest::option::of(times()),
        proptest::option::of(prop_oneof![
            any::<u64>().prop_map(Duration::from_millis),
            Just(Duration::MAX)
        ]),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(owner, at, left, token)| {
            let mut holder = HolderInfo::new(Identity::from_stored(owner));
            if let Some(at) = at {
                holder = holder.with_acquired_at(at);
            }
            if let Some(left) = left {
                holder = holder.with_expires_in(left);
            }
            if let Some(token) = token {
                holder = holder.with_token(FenceToken::new(token));
            }
            holder
        })
}

fn run_args(ttl: Option<&str>, wait: Option<&str>) -> Result<crate::cli::RunArgs, clap::Error> {
    let mut argv = vec!["anylock", "run", "job"];
    if let Some(ttl) = ttl {
        argv.extend(["--ttl", ttl]);
    }
    if let Some(wait) = wait {
        argv.extend(["--wait", wait]);
    }
    argv.extend(["--", "true"]);
    let cli = Cli::try_parse_from(argv)?;
    match cli.command {
        Command::Run(args) => Ok(args),
        _ => unreachable!("a run command"),
    }
}

proptest! {
    #![proptest_config(test_kit::prop::config())]

    /// Guards against `--ttl`/`--wait` parsing that panics or overflows, and options built
    /// from them that are not checked (InvalidInput) before any backend is touched.
    #[test]
    fn prop_duration_arguments_parse_or_are_usage_errors(ttl in durations(), wait in durations()) {
        match run_args(Some(&ttl), Some(&wait)) {
            Ok(args) => {
                if let Err(err) = crate::run::options(&args, &Config::default()) {
                    prop_assert_eq!(err.kind(), ErrorKind::InvalidInput, "{}", err);
                    prop_assert!(!err.message().is_empty());
                }
            }
            // Any clap error is a usage error (exit code 2); a value starting with `-` may
            // read as an option (`-v`, `--help`), which clap reports as it sees fit.
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
    }

    /// Guards against config-file durations (`ttl`, `wait`) that panic, or fail as
    /// anything but Config (unparseable, at load) or InvalidInput (out of range).
    #[test]
    fn prop_config_durations_are_typed_errors(ttl in proptest::option::of(durations()), wait in proptest::option::of(durations())) {
        let args = run_args(None, None).expect("valid arguments");
        // A JSON string literal is a TOML basic string (its escapes are TOML's too).
        let mut text = String::new();
        for (key, value) in [("ttl", &ttl), ("wait", &wait)] {
            if let Some(value) = value {
                let quoted = serde_json::to_string(value).expect("serializable");
                text.push_str(&format!("{key} = {quoted}\n"));
            }
        }
        let config = match Config::from_toml(&text) {
            Ok(config) => config,
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::Config, "{}", err);
                prop_assert!(!err.message().is_empty());
                return Ok(());
            }
        };
        match crate::run::options(&args, &config) {
            Ok(options) => prop_assert!(options.validate().is_ok()),
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput, "{}", err);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against `status`, `break` and the waiting line panicking on a holder a
    /// backend decoded from a foreign value: times past year 9999 or before 1970 (which
    /// humantime refuses to format), huge TTLs, any identity.
    #[test]
    fn prop_any_holder_can_be_shown(holder in holders(), name in any::<String>()) {
        let line = crate::run::describe_wait(&name, &holder);
        prop_assert!(line.starts_with("waiting for "));
        let text = crate::admin::describe(&name, &holder);
        prop_assert!(text.contains(" is held by "));
    }
}

/// The input the holder property first failed on, kept as a fixed case.
#[test]
fn regression_holders_past_year_9999() {
    let at = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    let holder = HolderInfo::new(Identity::from_stored("")).with_acquired_at(at);
    assert!(crate::admin::describe("x", &holder).contains("<after 9999-12-31>"));
    let before = HolderInfo::new(Identity::from_stored(""))
        .with_acquired_at(UNIX_EPOCH - Duration::from_secs(1));
    assert!(crate::run::describe_wait("x", &before).contains("<before 1970-01-01>"));
}

//! Property tests of lockcore's input validation: lock names, identity task suffixes,
//! lock options and backoff. See `docs/fuzzing.md`; `PROPTEST_CASES` sets the case count.

use std::time::Duration;

use lockcore::{
    Backoff, ErrorKind, Identity, Jitter, LockName, LockOptions, MAX_NAME_LEN, MAX_TASK_LEN,
    MAX_TTL, MIN_TTL, WaitMode,
};
use proptest::prelude::*;
use test_kit::prop::config;

/// Names that reach every check: printable text, text near the byte limit in multibyte
/// characters, and text with one control character spliced in.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9/._-]{1,40}",
        ("[éü€😀a-z]{120,140}", 0usize..=3).prop_map(|(s, n)| s.repeat(n + 1)),
        ("[a-z]{0,20}", any::<char>(), "[a-z]{0,20}").prop_map(|(a, c, b)| format!("{a}{c}{b}")),
        (0usize..=MAX_NAME_LEN + 2).prop_map(|n| "x".repeat(n)),
    ]
}

/// Durations from zero to `Duration::MAX`, weighted towards the validation boundaries.
fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(MIN_TTL),
        Just(MAX_TTL),
        (0u64..=120_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn waits() -> impl Strategy<Value = WaitMode> {
    prop_oneof![
        Just(WaitMode::TryOnce),
        Just(WaitMode::Forever),
        durations().prop_map(WaitMode::Timeout),
    ]
}

fn jitters() -> impl Strategy<Value = Jitter> {
    prop_oneof![Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::None)]
}

/// Units for `Backoff::delay`: in range, out of range, infinite and NaN.
fn units() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0f64..1.0,
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(1.0),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Guards against a name validator that panics (byte slicing inside a multibyte
    /// character), accepts what it documents as invalid, or mangles a valid name.
    #[test]
    fn prop_lock_names_are_accepted_exactly_when_valid(name in names()) {
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && !name.chars().any(char::is_control);
        match LockName::new(&name) {
            Ok(parsed) => {
                prop_assert!(valid, "accepted {name:?}");
                prop_assert_eq!(parsed.as_str(), name.as_str());
                prop_assert_eq!(parsed.to_string(), name.clone());
                prop_assert_eq!(LockName::new(parsed.as_str()).ok(), Some(parsed));
            }
            Err(err) => {
                prop_assert!(!valid, "rejected valid {name:?}: {err}");
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against a task-suffix validator that panics or lets control characters or
    /// oversized suffixes into stored identities.
    #[test]
    fn prop_identity_task_suffixes_are_validated(task in names()) {
        let valid = !task.is_empty()
            && task.len() <= MAX_TASK_LEN
            && !task.chars().any(char::is_control);
        match Identity::for_task(&task) {
            Ok(id) => {
                prop_assert!(valid, "accepted {task:?}");
                let suffix = format!("/{task}");
                prop_assert!(id.as_str().ends_with(&suffix));
                prop_assert!(id.as_str().starts_with(id.host_pid()));
            }
            Err(err) => {
                prop_assert!(!valid, "rejected valid {task:?}: {err}");
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against `host_pid` slicing a stored identity (foreign values included) at a
    /// non-boundary or returning something that is not a prefix of it.
    #[test]
    fn prop_host_pid_of_any_stored_identity_is_a_prefix(stored in any::<String>()) {
        let id = Identity::from_stored(stored.as_str());
        prop_assert!(stored.starts_with(id.host_pid()));
        prop_assert!(id.host_pid().matches('/').count() <= 1);
    }

    /// Guards against option validation that overflows (`Duration::MAX` TTLs, intervals
    /// times failure counts), panics, or accepts a combination its contract rejects.
    #[test]
    fn prop_lock_options_validate_without_panicking(
        ttl in prop_oneof![3 => (10u64..600_000).prop_map(Duration::from_millis), 1 => durations()],
        refresh in prop_oneof![Just(None), (1u64..100_000).prop_map(|ms| Some(Duration::from_millis(ms))), durations().prop_map(Some)],
        failures in prop_oneof![3 => 1u32..=10, 1 => 0u32..=(lockcore::MAX_REFRESH_FAILURES + 1), 1 => any::<u32>()],
        drift in prop_oneof![2 => Just(None), 1 => durations().prop_map(Some)],
        attempt in proptest::option::of(durations()),
        wait in waits(),
        backoff in prop_oneof![
            2 => Just((Duration::from_millis(20), Duration::from_secs(1), Jitter::Full)),
            1 => (durations(), durations(), jitters()),
        ],
    ) {
        let mut options = LockOptions::new(ttl)
            .with_max_refresh_failures(failures)
            .with_wait(wait)
            .with_backoff(Backoff::new(backoff.0, backoff.1).with_jitter(backoff.2));
        if let Some(refresh) = refresh {
            options = options.with_refresh_interval(refresh);
        }
        if let Some(drift) = drift {
            options = options.with_drift(drift);
        }
        if let Some(attempt) = attempt {
            options = options.with_attempt_timeout(attempt);
        }
        // The accessors never panic, whatever was set.
        let _ = (options.drift(), options.acquire_timeout(), options.refresh_timeout());
        match options.validate() {
            Ok(()) => {
                prop_assert!((MIN_TTL..=MAX_TTL).contains(&options.ttl()));
                let interval = options.refresh_interval();
                prop_assert!(!interval.is_zero());
                prop_assert!(interval.saturating_mul(failures) <= options.ttl() / 2);
                prop_assert!(options.drift() < options.ttl() / 2);
                prop_assert!(options.refresh_timeout() <= interval);
                prop_assert!(!options.refresh_timeout().is_zero());
                prop_assert!(options.backoff().validate().is_ok());
            }
            Err(err) => {
                prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
                prop_assert!(!err.message().is_empty());
            }
        }
    }

    /// Guards against a backoff delay that panics (a NaN or infinite jitter draw reaching
    /// `Duration::mul_f64`, `base × 2^attempt` overflowing) or exceeds its cap.
    #[test]
    fn prop_backoff_delay_never_panics_and_respects_the_cap(
        base in durations(),
        cap in durations(),
        jitter in jitters(),
        attempt in any::<u32>(),
        unit in units(),
    ) {
        let backoff = Backoff::new(base, cap).with_jitter(jitter);
        let delay = backoff.delay(attempt, unit);
        prop_assert!(delay <= cap, "{delay:?} > cap {cap:?}");
        if let Err(err) = backoff.validate() {
            prop_assert_eq!(err.kind(), ErrorKind::InvalidInput);
            prop_assert!(!err.message().is_empty());
        }
    }
}

/// The inputs the backoff property first failed on, kept as fixed cases.
#[test]
fn regression_backoff_nan_and_near_max_delays() {
    let zero = Backoff::new(Duration::ZERO, Duration::ZERO);
    assert_eq!(zero.delay(0, f64::NAN), Duration::ZERO);
    let huge = Backoff::new(Duration::new(8_589_934_591, 999_999_524), Duration::MAX);
    // A unit past 1 counts as 1: the delay is the ceiling (saturated at `Duration::MAX`),
    // computed without panicking.
    let delay = huge.delay(31, f64::INFINITY);
    assert!(delay > Duration::from_secs(u64::MAX / 2), "{delay:?}");
}

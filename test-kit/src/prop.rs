//! Shared proptest strategies for the property tests of every crate's parsers (see
//! `docs/fuzzing.md`): the runner config, passwords whose pieces can be searched for in
//! output, and mutations of valid inputs that reach past a parser's first check.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The default config (256 cases, or `PROPTEST_CASES`), without regression files: a
/// failing input is kept as a plain `regression_*` test instead.
pub fn config() -> Config {
    Config {
        failure_persistence: None,
        ..Config::default()
    }
}

/// A password: random 8-character chunks (the markers to search for in output) joined by
/// `separators` (characters a URL treats specially), raw or passed through `encode`.
/// Yields the chunks and the password text.
pub fn passwords(
    separators: &'static [&'static str],
    encode: fn(&str) -> String,
) -> impl Strategy<Value = (Vec<String>, String)> {
    let separator = prop_oneof![Just(""), proptest::sample::select(separators)];
    (
        proptest::collection::vec(("[A-Za-z0-9]{8}", separator), 1..4),
        any::<bool>(),
    )
        .prop_map(move |(parts, encoded)| {
            let chunks = parts.iter().map(|(c, _)| c.clone()).collect();
            let raw: String = parts.iter().map(|(c, s)| format!("{c}{s}")).collect();
            (chunks, if encoded { encode(&raw) } else { raw })
        })
}

/// Arbitrary text, and `valid` inputs with one character deleted, replaced or inserted.
pub fn mangled(valid: Vec<&'static str>) -> impl Strategy<Value = String> {
    let valid = proptest::sample::select(valid);
    prop_oneof![
        any::<String>(),
        (valid, any::<prop::sample::Index>(), 0u8..3, any::<char>()).prop_map(
            |(text, at, how, ch)| {
                let mut chars: Vec<char> = text.chars().collect();
                let i = at.index(chars.len());
                match how {
                    0 => drop(chars.remove(i)),
                    1 => chars[i] = ch,
                    _ => chars.insert(i, ch),
                }
                chars.into_iter().collect()
            }
        ),
    ]
}

#[cfg(test)]
mod tests {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use super::*;

    #[test]
    fn mangled_inputs_differ_from_the_valid_one_by_at_most_one_character() {
        let mut runner = TestRunner::deterministic();
        let strategy = mangled(vec!["redis://h:1/0"]);
        let mut near = 0;
        for _ in 0..200 {
            let text = strategy.new_tree(&mut runner).expect("tree").current();
            let len = text.chars().count();
            if text.starts_with("redis") && (12..=14).contains(&len) {
                near += 1;
            }
        }
        assert!(
            near > 50,
            "only {near} of 200 were mutations of the valid input"
        );
    }

    #[test]
    fn passwords_contain_their_chunks() {
        let mut runner = TestRunner::deterministic();
        let strategy = passwords(&[":", "/"], |s| s.replace(':', "%3A"));
        for _ in 0..100 {
            let (chunks, text) = strategy.new_tree(&mut runner).expect("tree").current();
            assert!(
                chunks.iter().all(|c| text.contains(c.as_str())),
                "{chunks:?} {text}"
            );
        }
    }
}

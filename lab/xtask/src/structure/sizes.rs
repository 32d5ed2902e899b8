//! The file-size rule: no `.rs` file under a crate's `src/` over [`LIMIT`] lines, test-only
//! files (`tests/` directories, `tests.rs`, `*_tests.rs`) and generated code excepted.

use std::path::Path;

/// The most lines a non-test source file may have.
pub(crate) const LIMIT: usize = 500;

/// Generated code, relative to the workspace root, that the rule does not cover.
const GENERATED: &str = "etcd-proto/src/generated";

/// Whether the rule covers `path` (relative to the workspace root).
pub(crate) fn is_checked(path: &Path) -> bool {
    let is_rs = path.extension().is_some_and(|e| e == "rs");
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let test_file = name == "tests.rs" || name.ends_with("_tests.rs");
    let in_tests_dir = path
        .parent()
        .is_some_and(|dir| dir.iter().any(|part| part == "tests"));
    is_rs && !test_file && !in_tests_dir && !path.starts_with(GENERATED)
}

/// The number of lines of `text`, as `wc -l` counts them for a file ending in a newline.
pub(crate) fn lines(text: &str) -> usize {
    text.lines().count()
}

/// The report line for a file over the limit, or `None`.
pub(crate) fn check(path: &Path, text: &str) -> Option<String> {
    let n = lines(text);
    (is_checked(path) && n > LIMIT)
        .then(|| format!("{}: {n} lines (limit {LIMIT})", path.display()))
}

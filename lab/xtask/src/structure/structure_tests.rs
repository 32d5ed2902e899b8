//! Tests of the `structure` checks on small inline crates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Report, check_imports, sizes};

/// The circles found in a crate made of `(path under src/, source)` pairs.
fn circles(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, text)| (PathBuf::from(path), (*text).to_owned()))
        .collect();
    let mut report = Report::default();
    check_imports("demo", &files, &mut report);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report
        .circles
        .iter()
        .map(|c| c.lines().next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn two_sibling_files_that_use_each_other_are_a_circle() {
    let found = circles(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "b.rs",
            "pub struct B;\nfn f() { let _ = crate::a::A::new(); }\n",
        ),
    ]);
    assert_eq!(found, ["demo: a -> b -> a (members: a, b)"]);
}

#[test]
fn a_use_tree_and_super_paths_make_edges() {
    let found = circles(&[
        ("lib.rs", "mod net;\n"),
        ("net/mod.rs", "mod a;\nmod b;\n"),
        (
            "net/a.rs",
            "use crate::{net::b::{self}, other};\nfn f() { b::g() }\n",
        ),
        ("net/b.rs", "fn g() { super::a::f() }\n"),
    ]);
    assert_eq!(
        found,
        ["demo: net::a -> net::b -> net::a (members: net::a, net::b)"]
    );
}

#[test]
fn names_from_the_root_resolve_through_its_reexports() {
    let found = circles(&[
        (
            "lib.rs",
            "mod error;\nmod name;\npub use error::Error;\npub use name::{Name, Other};\n",
        ),
        ("error.rs", "pub struct Error(crate::Name);\n"),
        (
            "name.rs",
            "pub struct Name;\nfn f() -> Result<(), crate::Error> { Ok(()) }\n",
        ),
    ]);
    assert_eq!(
        found,
        ["demo: error -> name -> error (members: error, name)"]
    );
}

#[test]
fn glob_reexports_in_a_mod_rs_resolve_too() {
    let found = circles(&[
        ("lib.rs", "mod kinds;\nmod user;\n"),
        ("kinds/mod.rs", "mod one;\npub use one::*;\n"),
        (
            "kinds/one.rs",
            "pub struct One;\nfn f() { crate::user::g() }\n",
        ),
        ("user.rs", "use crate::kinds::One;\npub fn g() {}\n"),
    ]);
    assert_eq!(
        found,
        ["demo: kinds::one -> user -> kinds::one (members: kinds::one, user)"]
    );
}

#[test]
fn imports_under_cfg_test_are_ignored() {
    let found = circles(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "b.rs",
            "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n\
             #[cfg(test)]\nuse crate::a::A;\nimpl B {\n    #[cfg(test)]\n    fn t() { crate::a::A; }\n}\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn test_only_files_are_not_in_the_graph() {
    let found = circles(&[
        ("lib.rs", "mod a;\n#[cfg(test)]\nmod a_tests;\n"),
        ("a.rs", "pub fn f() { crate::a_tests::g() }\n"),
        ("a_tests.rs", "pub fn g() { crate::a::f() }\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_parent_that_only_declares_or_reexports_its_child_is_no_circle() {
    let found = circles(&[
        (
            "lib.rs",
            "mod error;\npub use error::Error;\npub const LIMIT: u32 = 3;\n",
        ),
        (
            "error.rs",
            "pub struct Error;\nfn f() -> u32 { crate::LIMIT }\n",
        ),
        ("bin/tool.rs", "mod cmd;\nfn main() {}\n"),
        ("bin/tool/cmd.rs", "fn g() { super::main() }\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_parent_that_uses_its_child_that_uses_it_back_is_a_circle() {
    let found = circles(&[
        (
            "lib.rs",
            "mod error;\npub use error::Error;\npub const LIMIT: u32 = 3;\n\
             pub fn open() -> Result<(), Error> { Ok(()) }\n",
        ),
        (
            "error.rs",
            "pub struct Error;\nfn f() -> u32 { crate::LIMIT }\n",
        ),
    ]);
    assert_eq!(
        found,
        ["demo: crate -> error -> crate (members: crate, error)"]
    );
}

#[test]
fn paths_inside_macros_count() {
    let found = circles(&[
        ("main.rs", "mod a;\nmod b;\nfn main() {}\n"),
        ("a.rs", "fn f() { println!(\"{}\", crate::b::NAME); }\n"),
        (
            "b.rs",
            "pub const NAME: &str = \"b\";\nfn g() { assert!(super::a::f() == ()); }\n",
        ),
    ]);
    assert_eq!(found, ["demo: a -> b -> a (members: a, b)"]);
}

#[test]
fn the_shortest_cycle_of_a_larger_component_is_shown() {
    let found = circles(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::X;\n"),
        ("b.rs", "use crate::c::Y;\npub struct X;\n"),
        (
            "c.rs",
            "use crate::a::Z;\nuse crate::b::X;\npub struct Y;\n",
        ),
    ]);
    assert_eq!(found, ["demo: b -> c -> b (members: a, b, c)"]);
}

#[test]
fn the_size_rule_skips_tests_and_generated_code() {
    let long = "fn f() {}\n".repeat(501);
    let short = "fn f() {}\n".repeat(500);
    let checked = |path: &str, text: &str| sizes::check(Path::new(path), text);
    assert_eq!(
        checked("demo/src/big.rs", &long).as_deref(),
        Some("demo/src/big.rs: 501 lines (limit 500)")
    );
    assert_eq!(checked("demo/src/ok.rs", &short), None);
    for exempt in [
        "demo/src/tests/acquire.rs",
        "demo/src/tests/mod.rs",
        "demo/src/queue_tests.rs",
        "demo/src/checker/tests.rs",
        "demo/src/tests.rs",
        "etcd-proto/src/generated/etcdserverpb.rs",
    ] {
        assert_eq!(checked(exempt, &long), None, "{exempt}");
    }
    assert_eq!(
        checked("demo/src/contests.rs", &long).as_deref(),
        Some("demo/src/contests.rs: 501 lines (limit 500)")
    );
}

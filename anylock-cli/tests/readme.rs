//! The README's guarantees table is the one `anylock guarantees` generates.

const BEGIN: &str = "<!-- guarantees:begin -->\n";
const END: &str = "<!-- guarantees:end -->";

#[test]
fn the_readme_guarantees_table_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let start = readme.find(BEGIN).expect("begin marker") + BEGIN.len();
    let end = readme.find(END).expect("end marker");
    let generated = anylock::guarantees_markdown(&anylock::compiled_guarantees());
    if std::env::var_os("ANYLOCK_BLESS").is_some() {
        let updated = format!("{}{generated}{}", &readme[..start], &readme[end..]);
        std::fs::write(path, updated).expect("rewrite README.md");
        return;
    }
    assert_eq!(
        &readme[start..end],
        generated,
        "README.md's guarantees table is stale: run `ANYLOCK_BLESS=1 cargo test -p anylock-cli --test readme`"
    );
}

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

/// Public text cites its sources by author and title (docs/references.md), never by the
/// numbers of the project's private source folder ("seed" and a three-digit number), which
/// mean nothing to a reader (issue #15). Scans every `.rs`, `.md`, `.toml` and `.sh` file
/// and everything under `scripts/`, also across a line break inside a comment.
#[test]
fn public_text_cites_no_seed_numbers() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut found = Vec::new();
    scan(root, root, &mut found);
    assert!(
        found.is_empty(),
        "cite the document by author and title (docs/references.md), not its seed number:\n{}",
        found.join("\n")
    );
}

const SKIPPED_DIRS: &[&str] = &["target", ".git", "etcd-proto", ".servers", "node_modules"];

fn scan(root: &std::path::Path, dir: &std::path::Path, found: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name) {
                scan(root, &path, found);
            }
            continue;
        }
        let relative = path.strip_prefix(root).unwrap_or(&path);
        let in_scripts = relative.starts_with("scripts");
        let text_ext = [".rs", ".md", ".toml", ".sh"]
            .iter()
            .any(|e| name.ends_with(e));
        if !(text_ext || in_scripts) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in seed_citations(&text) {
            found.push(format!("{}:{line}", relative.display()));
        }
    }
}

/// The 1-based lines where "seed" or "seeds" is followed, after blanks (and comment markers
/// when the words are split across lines), by "00" and a digit.
fn seed_citations(text: &str) -> Vec<usize> {
    let lower = text.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut lines = Vec::new();
    for (at, _) in lower.match_indices("seed") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let mut i = at + 4;
        if bytes.get(i) == Some(&b's') {
            i += 1;
        }
        let start = i;
        while bytes.get(i).is_some_and(|b| b" \t\r\n/!#*".contains(b)) {
            i += 1;
        }
        let gap = &lower[start..i];
        let separated = i > start && (gap.contains('\n') || !gap.contains(['/', '!', '#', '*']));
        let number = bytes
            .get(i..i + 3)
            .is_some_and(|d| d.starts_with(b"00") && d[2].is_ascii_digit());
        if separated && number {
            lines.push(lower[..at].matches('\n').count() + 1);
        }
    }
    lines
}

#[test]
fn the_seed_citation_scan_finds_split_and_plain_citations() {
    let n = |s: &str| format!("{s}{}", "ed");
    let se = n("se");
    assert_eq!(seed_citations(&format!("a ({se} 003)\n")), [1]);
    assert_eq!(
        seed_citations(&format!("x\n/// Guards against {se}\n/// 000's locks\n")),
        [2]
    );
    assert_eq!(seed_citations(&format!("{}s 000 and 003", n("Se"))), [1]);
    assert!(
        seed_citations(&format!(
            "outputs for {se} 0; jitter_{se} 001; {se}s its counter"
        ))
        .is_empty()
    );
}

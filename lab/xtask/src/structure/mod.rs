//! `structure`: checks the workspace's file rules. Every file under a member's `src/`
//! stays within [`sizes::LIMIT`] lines (tests and generated code excepted), and no two
//! files of one crate import each other, directly or around a circle
//! ([`imports`] says what counts as an import).

mod graph;
mod imports;
mod modules;
mod sizes;
#[cfg(test)]
mod structure_tests;

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

/// The report on one workspace: one line per finding.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Files over the line limit.
    pub(crate) sizes: Vec<String>,
    /// Import circles, each with its edges' evidence on the following lines.
    pub(crate) circles: Vec<String>,
    /// Files that do not parse.
    pub(crate) errors: Vec<String>,
}

/// Checks the workspace at `root` and prints the findings and a summary.
///
/// # Errors
/// An unreadable `Cargo.toml` or source directory.
pub(crate) fn run(root: &Path) -> Result<bool, Box<dyn Error>> {
    let mut report = Report::default();
    for member in members(root)? {
        let files = read_sources(root, &member)?;
        for (path, text) in &files {
            report.sizes.extend(sizes::check(
                &Path::new(&member).join("src").join(path),
                text,
            ));
        }
        check_imports(&member, &files, &mut report);
    }
    for line in report.sizes.iter().chain(&report.circles) {
        println!("{line}");
    }
    for line in &report.errors {
        println!("parse error: {line}");
    }
    let clean = report.sizes.is_empty() && report.circles.is_empty() && report.errors.is_empty();
    if clean {
        println!(
            "structure: ok (no file over {} lines, no import circle)",
            sizes::LIMIT
        );
    } else {
        println!(
            "structure: {} file(s) over {} lines, {} import circle(s), {} parse error(s)",
            report.sizes.len(),
            sizes::LIMIT,
            report.circles.len(),
            report.errors.len()
        );
    }
    Ok(clean)
}

/// The workspace members listed in the root `Cargo.toml`.
fn members(root: &Path) -> Result<Vec<String>, Box<dyn Error>> {
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))?.parse()?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .ok_or("Cargo.toml has no [workspace] members")?;
    Ok(members
        .iter()
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect())
}

/// Every `.rs` file under `<member>/src`, by path relative to that directory.
fn read_sources(root: &Path, member: &str) -> Result<BTreeMap<PathBuf, String>, Box<dyn Error>> {
    let src = root.join(member).join("src");
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)?;
                files.insert(path.strip_prefix(&src)?.to_path_buf(), text);
            }
        }
    }
    Ok(files)
}

/// Adds the import circles of each crate root among `files` to `report`.
pub(crate) fn check_imports(member: &str, files: &BTreeMap<PathBuf, String>, report: &mut Report) {
    let roots = modules::roots(files);
    let has_lib = roots.iter().any(|r| r == Path::new("lib.rs"));
    for root in &roots {
        let (tree, errors) = modules::tree(files, root);
        report
            .errors
            .extend(errors.into_iter().map(|e| format!("{member}/src/{e}")));
        let label = if root == Path::new("lib.rs") || (root == Path::new("main.rs") && !has_lib) {
            member.to_owned()
        } else {
            format!("{member} ({})", root.display())
        };
        let edges = imports::edges(&tree);
        let graph = graph::graph(tree.modules.len(), edges.keys().copied());
        for mut component in graph::components(&graph) {
            component.sort_by_key(|&m| tree.name(m));
            let cycle = graph::shortest_cycle(&graph, &component);
            let names =
                |nodes: &[usize]| -> Vec<String> { nodes.iter().map(|&m| tree.name(m)).collect() };
            let mut text = format!(
                "{label}: {} (members: {})",
                names(&cycle).join(" -> "),
                names(&component).join(", ")
            );
            for pair in cycle.windows(2) {
                let via = &edges[&(pair[0], pair[1])];
                let file = tree.modules[pair[0]].file.display();
                text.push_str(&format!(
                    "\n    {} -> {}: `{via}` in {member}/src/{file}",
                    tree.name(pair[0]),
                    tree.name(pair[1])
                ));
            }
            report.circles.push(text);
        }
    }
}

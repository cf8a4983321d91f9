//! docs/architecture.md cannot rot silently: every path it names exists, every function its
//! tables name is defined in the file of that row (or in the file a "`f` in `path`" names),
//! and its crate table says what each `Cargo.toml` says.
//!
//! It lives in kedge-protocol, the workspace's lightest crate, so that it costs nothing to
//! run; it reads files only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DOC: &str = "docs/architecture.md";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn doc() -> String {
    std::fs::read_to_string(root().join(DOC)).expect("docs/architecture.md")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_default()
}

/// The text of every `` `code span` `` (fenced blocks hold none of interest: they are
/// dropped first).
fn spans(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.extend(line.split('`').skip(1).step_by(2));
        }
    }
    out
}

/// Whether a code span names a file or folder of the repository: no spaces, and a folder
/// (`core/`) or a file with a known extension.
fn is_path(span: &str) -> bool {
    const EXTENSIONS: [&str; 6] = ["rs", "md", "toml", "yaml", "proto", "json"];
    !span.contains(char::is_whitespace)
        && !span.contains("::")
        && (span.ends_with('/')
            || span
                .rsplit_once('.')
                .is_some_and(|(_, ext)| EXTENSIONS.contains(&ext)))
}

/// Whether `file` defines `name` (a function, type or constant).
fn defines(file: &str, name: &str) -> bool {
    let text = read(file);
    ["fn", "struct", "enum", "trait", "const", "type"]
        .iter()
        .any(|kind| {
            text.match_indices(&format!("{kind} {name}"))
                .any(|(at, hit)| {
                    let next = text[at + hit.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
        })
}

fn is_ident(span: &str) -> bool {
    !span.is_empty()
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn report(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{DOC} is out of date:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn every_path_exists() {
    let doc = doc();
    let mut problems = Vec::new();
    let mut paths: BTreeSet<String> = spans(&doc)
        .into_iter()
        .filter(|s| is_path(s))
        .map(str::to_owned)
        .collect();
    // Markdown links, relative to docs/.
    for link in doc.split("](").skip(1) {
        let target = link.split(')').next().unwrap_or_default();
        let target = target.split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") {
            paths.insert(format!("docs/{target}"));
        }
    }
    assert!(paths.len() > 20, "the doc names its files: {paths:?}");
    for path in paths {
        if !root().join(&path).exists() {
            problems.push(format!("`{path}` does not exist"));
        }
    }
    report(problems);
}

#[test]
fn every_function_is_in_its_file() {
    let doc = doc();
    let mut problems = Vec::new();
    let mut checked = 0;
    for line in doc.lines() {
        // Table rows `| hop | `file` | `function` | prose |`.
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 5 && cells[1].parse::<u32>().is_ok() {
            let file = cells[2].trim_matches('`');
            let function = cells[3].trim_matches('`');
            if is_path(file) && is_ident(function) {
                checked += 1;
                if !defines(file, function) {
                    problems.push(format!("`{file}` defines no `{function}`"));
                }
            }
        }
        // "`function` in `path`" anywhere.
        for pair in line.split("` in `").collect::<Vec<_>>().windows(2) {
            let function = pair[0].rsplit('`').next().unwrap_or_default();
            let file = pair[1].split('`').next().unwrap_or_default();
            if is_ident(function) && is_path(file) {
                checked += 1;
                let name = function.rsplit("::").next().unwrap_or_default();
                if !defines(file, name) {
                    problems.push(format!("`{file}` defines no `{name}`"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "the doc names its functions ({checked} checked)"
    );
    report(problems);
}

/// The kedge crates a `Cargo.toml` section depends on, by short name (`core`, `net`, ...).
fn kedge_deps(manifest: &str, section: &str) -> BTreeSet<String> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != section)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.strip_prefix("kedge-"))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .map(str::to_owned)
        .collect()
}

fn listed(cell: &str) -> BTreeSet<String> {
    cell.split(',')
        .map(str::trim)
        .filter(|c| *c != "none" && !c.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn crate_table_matches_the_manifests() {
    let doc = doc();
    let mut problems = Vec::new();
    let mut described = BTreeSet::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 6 || !cells[1].starts_with("`kedge-") {
            continue;
        }
        let name = cells[1].trim_matches('`');
        let dir = cells[2].trim_matches('`').trim_end_matches('/');
        described.insert(dir.to_owned());
        let manifest = read(&format!("{dir}/Cargo.toml"));
        if !manifest.contains(&format!("name = \"{name}\"")) {
            problems.push(format!("`{dir}/Cargo.toml` is not the package `{name}`"));
        }
        for (section, cell) in [
            ("[dependencies]", cells[3]),
            ("[dev-dependencies]", cells[4]),
        ] {
            let code = kedge_deps(&manifest, section);
            // A crate's normal dependencies are there for its tests too.
            let code = if section == "[dev-dependencies]" {
                let normal = kedge_deps(&manifest, "[dependencies]");
                code.difference(&normal).cloned().collect()
            } else {
                code
            };
            if listed(cell) != code {
                problems.push(format!(
                    "`{name}` {section}: the doc says {cell:?}, {dir}/Cargo.toml {code:?}"
                ));
            }
        }
    }
    let workspace = read("Cargo.toml");
    let members: BTreeSet<String> = workspace
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("workspace members")
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    if described != members {
        problems.push(format!(
            "the crate table lists {described:?}, the workspace {members:?}"
        ));
    }
    report(problems);
}

//! The modules of each crate import each other without a circle (issue 28): a module that
//! reaches back into one that uses it stops being one piece with one purpose. Between crates
//! Cargo forbids circles; within one nothing does but this test.
//!
//! The graph is read from the source: every `crate::a::b` or `super::a` path, and every
//! `use crate::{a, b::c}` group, outside `// comments` and the `#[cfg(test)]` code, counts as
//! an edge to the longest module it names. A module using its own ancestors is not an edge
//! (a child always may).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every crate of the workspace with the modules it must have (so that a moved `src` does
/// not make the check vacuous).
const CRATES: [(&str, &[&str]); 7] = [
    ("protocol", &["message", "codec"]),
    ("scaler-api", &[]),
    ("net", &["identity", "pki"]),
    (
        "core",
        &[
            "validate",
            "validate::dsj",
            "dsj::scaling",
            "crd::conditions",
        ],
    ),
    ("hub", &["controller", "fleet", "server::session"]),
    ("member-agent", &["session", "executor"]),
    ("sim", &["cluster", "keda::grpc", "sim"]),
];

#[test]
fn no_crate_has_an_import_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace");
    let mut circles = Vec::new();
    for (krate, expected) in CRATES {
        let src = workspace.join(krate).join("src");
        let graph = module_graph(&read_modules(&src, &src));
        for module in expected {
            assert!(
                graph.contains_key(*module),
                "{krate}/src has no module {module}"
            );
        }
        if let Some(circle) = find_circle(&graph) {
            circles.push(format!("{krate}/src: {}", circle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_back_edge_is_found_and_named() {
    let modules = BTreeMap::from([
        ("a".to_string(), "use crate::b::Thing;".to_string()),
        ("b".to_string(), "fn f() { crate::c::g() }".to_string()),
        (
            "c".to_string(),
            "// crate::a::x in a comment\nuse crate::{d, a::{X, Y}};".to_string(),
        ),
        ("d".to_string(), "use super::d::e::F;".to_string()),
        (
            "d::e".to_string(),
            "use super::G; use crate::d::H;".to_string(),
        ),
    ]);
    let graph = module_graph(&modules);
    assert_eq!(graph["d"], BTreeSet::from(["d::e".to_string()]));
    assert!(
        graph["d::e"].is_empty(),
        "a child using its parent is no edge"
    );
    assert_eq!(find_circle(&graph).unwrap(), ["a", "b", "c", "a"]);

    let mut declared = modules.clone();
    declared.insert(
        "c".into(),
        "#[cfg(test)]\nmod tests;\nuse crate::a::X;".into(),
    );
    assert!(
        find_circle(&module_graph(&declared)).is_some(),
        "code after a `mod tests;` declaration counts"
    );

    let mut without = modules;
    without.insert(
        "c".into(),
        "// crate::a::x\n#[cfg(test)]\nuse crate::a::X;".into(),
    );
    assert_eq!(find_circle(&module_graph(&without)), None);
}

/// Module path (`keda::grpc`, `controllers` for `controllers/mod.rs`) → its source.
fn read_modules(root: &Path, dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("a crate's src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(read_modules(root, &path));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path
            .strip_prefix(root)
            .expect("a file under src")
            .with_extension("");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        out.insert(parts.join("::"), text);
    }
    out
}

/// The source without `//` comments and test code: a `#[cfg(test)]` item that is one line
/// (`mod tests;`) goes alone; any other (the `mod tests { … }` at the end) ends the code.
fn code_only(text: &str) -> String {
    let mut code = Vec::new();
    let mut lines = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default());
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            code.push(line);
            continue;
        }
        match lines.find(|l| !l.trim().is_empty()) {
            Some(item) if item.trim_end().ends_with(';') => continue,
            _ => break,
        }
    }
    code.join("\n")
}

/// Edges from each module to the modules its paths name, outside comments and tests.
fn module_graph(modules: &BTreeMap<String, String>) -> Graph {
    let mut graph = Graph::new();
    for (name, code) in modules {
        let own: Vec<&str> = name.split("::").filter(|s| !s.is_empty()).collect();
        let parent = &own[..own.len().saturating_sub(1)];
        let mut edges = BTreeSet::new();
        for (base, path) in paths(&code_only(code)) {
            let mut segs: Vec<&str> = if base == "super" {
                parent.to_vec()
            } else {
                Vec::new()
            };
            segs.extend(path.split("::").filter(|s| !s.is_empty()));
            let target = (1..=segs.len())
                .rev()
                .map(|k| segs[..k].join("::"))
                .find(|m| modules.contains_key(m));
            if let Some(target) = target {
                let ancestor = target == *name || name.starts_with(&format!("{target}::"));
                if !ancestor {
                    edges.insert(target);
                }
            }
        }
        graph.insert(name.clone(), edges);
    }
    graph
}

/// Every `crate::…`/`super::…` path of lower-case segments, and each item of a
/// `use crate::{…}`/`use super::{…}` group (its first segment), with its base.
fn paths(code: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for base in ["crate", "super"] {
        let prefix = format!("{base}::");
        for (i, _) in code.match_indices(&prefix) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &code[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let first = item.trim().split("::").next().unwrap_or_default();
                    if first.starts_with(|c: char| c.is_ascii_lowercase()) {
                        out.push((base, first.to_string()));
                    }
                }
                continue;
            }
            let path: String = rest
                .chars()
                .take_while(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == ':'
                })
                .collect();
            out.push((base, path));
        }
    }
    out
}

/// A circle as the modules along it, the first repeated at the end; `None` without one.
fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        graph: &'a Graph,
        node: &'a str,
        done: &mut BTreeSet<&'a str>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut circle: Vec<String> = stack[at..].iter().map(|n| n.to_string()).collect();
            circle.push(node.to_string());
            return Some(circle);
        }
        if !done.insert(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(graph, next, done, stack) {
                return Some(circle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut done, &mut Vec::new()))
}

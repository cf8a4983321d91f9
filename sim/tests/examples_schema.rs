//! Every kedge object we ship or document (deploy/examples, the `kubectl kedge simulate`
//! scenarios, the YAML in docs/ and README.md) passes the shipped CRD schema as kedge-sim
//! (and kube-apiserver) validates it, and names no field the schema does not declare: a
//! manifest of ours that kubectl's default `--validate=strict` refuses is a bug in it.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The openAPIV3Schema of each shipped CRD, by kind.
fn schemas() -> Vec<(String, Value)> {
    let dir = root().join("deploy/crds");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/crds") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read CRD");
        let crd: Value = serde_yaml::from_str(&text).expect("CRD YAML");
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .expect("kind")
            .to_string();
        out.push((
            kind,
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone(),
        ));
    }
    out
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        // After an error the document stream does not advance: stop there.
        .map_while(|d| Value::deserialize(d).ok())
        .filter(|v| v.is_object())
        .collect()
}

/// The ```yaml blocks of a Markdown file.
fn markdown_yaml(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```yaml") || l.starts_with("```yml") => {
                current = Some(String::new())
            }
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

fn check(
    schemas: &[(String, Value)],
    at: &str,
    obj: &Value,
    problems: &mut Vec<String>,
    checked: &mut usize,
) {
    let Some(kind) = obj.get("kind").and_then(Value::as_str) else {
        return;
    };
    let Some((_, schema)) = schemas.iter().find(|(k, _)| k == kind) else {
        return;
    };
    *checked += 1;
    let mut pruned = obj.clone();
    for unknown in kedge_sim::schema::prune(schema, &mut pruned) {
        problems.push(format!("{at}: {kind}: unknown field {unknown:?}"));
    }
    let mut full = pruned.clone();
    // Scenario files carry only the spec; status is written by the hub.
    if full.get("metadata").is_none() {
        full["metadata"] = serde_json::json!({"name": "x"});
    }
    for e in kedge_sim::schema::validate(schema, &full) {
        problems.push(format!("{at}: {kind}: {}", e.message()));
    }
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

#[test]
fn shipped_and_documented_objects_pass_the_schema() {
    let schemas = schemas();
    let (mut problems, mut checked) = (Vec::new(), 0);
    let mut yaml = Vec::new();
    files(&root().join("deploy/examples"), "yaml", &mut yaml);
    for path in &yaml {
        let text = std::fs::read_to_string(path).expect("read example");
        for doc in yaml_docs(&text) {
            let mut obj = doc.clone();
            // A simulate scenario: the object's kind and spec beside `members` and `steps`.
            if let Some(map) = obj.as_object_mut() {
                for scenario_key in ["members", "steps", "interval", "scenario", "rounds"] {
                    map.remove(scenario_key);
                }
            }
            check(
                &schemas,
                &path.display().to_string(),
                &obj,
                &mut problems,
                &mut checked,
            );
        }
    }
    let mut md = Vec::new();
    files(&root().join("docs"), "md", &mut md);
    md.push(root().join("README.md"));
    for path in &md {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for block in markdown_yaml(&text) {
            for doc in yaml_docs(&block) {
                check(
                    &schemas,
                    &path.display().to_string(),
                    &doc,
                    &mut problems,
                    &mut checked,
                );
            }
        }
    }
    assert!(checked >= 10, "only {checked} objects found");
    assert!(problems.is_empty(), "{problems:#?}");
}

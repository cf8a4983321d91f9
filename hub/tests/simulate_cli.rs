//! `kubectl-kedge simulate` as a user runs it: the real binary on every shipped example and
//! on invalid scenarios.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/simulate")
}

fn kedge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-kedge"))
        .args(args)
        .output()
        .expect("kubectl-kedge runs")
}

fn simulate(path: &Path, output: &str) -> Output {
    let path = path.to_str().expect("utf-8 path");
    kedge(&["simulate", "-f", path, "-o", output])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    let out = simulate(path, "json");
    assert!(out.status.success(), "{}: {}", path.display(), stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn every_shipped_example_runs_in_both_formats() {
    let mut count = 0;
    for entry in std::fs::read_dir(examples()).expect("examples dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        count += 1;
        let report = json(&path);
        let object = report.as_object().expect("top level is an object");
        assert_eq!(
            object.keys().collect::<Vec<_>>(),
            ["steps"],
            "{}",
            path.display()
        );
        let steps = object["steps"].as_array().expect("steps is a list");
        assert!(!steps.is_empty());
        let dso = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("dso"));
        for step in steps {
            if dso {
                assert!(
                    step["replicas"].is_u64() && step["desired"].is_object(),
                    "{step}"
                );
            } else {
                assert!(
                    step["desiredJobs"].is_u64() && step["create"].is_object(),
                    "{step}"
                );
            }
        }
        let table = simulate(&path, "table");
        assert!(table.status.success(), "{}", stderr(&table));
        assert!(stdout(&table).starts_with("STEP"), "{}", stdout(&table));
        assert_eq!(
            stdout(&table)
                .lines()
                .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
                .count(),
            steps.len()
        );
    }
    assert!(count >= 6, "expected the shipped examples, found {count}");
}

#[test]
fn weights_example_numbers() {
    let report = json(&examples().join("dso-weights.yaml"));
    assert_eq!(
        report["steps"][0]["desired"],
        serde_json::json!({"member-cluster-1": 2, "member-cluster-2": 3})
    );
    assert_eq!(report["steps"][0]["replicas"], 5);
}

#[test]
fn failover_example_numbers() {
    let report = json(&examples().join("dsj-priority-failover.yaml"));
    assert_eq!(report["steps"][0]["create"]["member-primary"], 3);
    assert_eq!(report["steps"][3]["create"]["member-failover"], 3);
    assert_eq!(report["steps"][3]["taints"]["member-primary"], "hard");
}

#[test]
fn default_output_is_the_table() {
    let path = examples().join("dso-tiers.yaml");
    let out = kedge(&["simulate", "-f", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("CLOUD"), "{}", stdout(&out));
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kedge-simulate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write scenario");
    path
}

#[test]
fn invalid_scenarios_fail_naming_the_field() {
    let cases = [
        (
            "bad-weight.yaml",
            "kind: DistributedScaledObject\nspec:\n  memberClusters: [{name: a}, {name: b}, {name: c, weight: -1}]\n  scaledObjectSpec: {scaleTargetRef: {name: web}}\nmembers: [{name: a}]\nsteps: [{replicas: 3}]\n",
            "spec.memberClusters[2].weight: must be >= 0",
        ),
        (
            "bad-strategy.yaml",
            "kind: DistributedScaledJob\nspec:\n  clusterScheduling: {strategy: random}\n  scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, triggers: [{type: rabbitmq, name: q}]}\nmembers: [{name: a}]\nsteps: [{metrics: {q: {value: 1, target: 1}}}]\n",
            "spec.clusterScheduling.strategy: unknown strategy \"random\"",
        ),
        (
            "bad-member.yaml",
            "kind: DistributedScaledObject\nspec: {scaledObjectSpec: {scaleTargetRef: {name: web}}}\nmembers: [{name: a}]\nsteps: [{replicas: 1, members: [{name: z, state: Ready}]}]\n",
            "steps[0].members[0].name: unknown member \"z\"",
        ),
        (
            "bad-value.yaml",
            "kind: DistributedScaledObject\nspec:\n  scaledObjectSpec:\n    scaleTargetRef: {name: web}\n    triggers: [{type: prometheus, metricType: Value}]\nmembers: [{name: a}]\nsteps: [{replicas: 1}]\n",
            "spec.scaledObjectSpec.triggers[0].metricType: Value is not supported",
        ),
        ("bad-yaml.yaml", "kind: [unclosed", "scenario:"),
    ];
    for (name, text, expected) in cases {
        let path = scratch(name, text);
        let out = simulate(&path, "json");
        assert!(!out.status.success(), "{name} should fail");
        assert!(stdout(&out).is_empty(), "{name}: nothing on stdout");
        assert!(
            stderr(&out).contains(expected),
            "{name}: {:?} should contain {expected:?}",
            stderr(&out)
        );
    }
    let missing = kedge(&["simulate", "-f", "/nonexistent/scenario.yaml"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("cannot read /nonexistent/scenario.yaml"),
        "{}",
        stderr(&missing)
    );
    let bad_format = kedge(&["simulate", "-f", "x.yaml", "-o", "xml"]);
    assert!(!bad_format.status.success());
    assert!(
        stderr(&bad_format).contains("xml"),
        "{}",
        stderr(&bad_format)
    );
}

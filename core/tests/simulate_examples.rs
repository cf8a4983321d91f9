//! The shipped example scenarios run through the simulator with the expected decisions, and
//! invalid scenarios fail with messages naming the field.

use std::path::PathBuf;

use kedge_core::simulate::{render_table, simulate};
use serde_json::{Value, json};

fn example(name: &str) -> (Value, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/examples/simulate")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("example exists");
    let report = simulate(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let json = serde_json::to_value(&report).expect("report serializes");
    (json, render_table(&report))
}

fn column(report: &Value, key: &str) -> Vec<Value> {
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s[key].clone())
        .collect()
}

#[test]
fn every_shipped_example_runs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/simulate");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).expect("examples dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("readable");
            let report = simulate(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let json = serde_json::to_value(&report).expect("serializes");
            let keys: Vec<&String> = json.as_object().expect("object").keys().collect();
            assert_eq!(keys, ["steps"], "report is exactly {{\"steps\": [...]}}");
            seen += 1;
        }
    }
    assert!(seen >= 6, "found {seen} examples");
}

#[test]
fn dso_weights() {
    let (r, table) = example("dso-weights.yaml");
    assert_eq!(
        column(&r, "desired"),
        vec![
            json!({"member-cluster-1": 2, "member-cluster-2": 3}),
            json!({"member-cluster-1": 4, "member-cluster-2": 6}),
            json!({"member-cluster-1": 1, "member-cluster-2": 2}),
            json!({"member-cluster-1": 4, "member-cluster-2": 6}),
        ]
    );
    assert_eq!(
        column(&r, "replicas"),
        vec![json!(5), json!(10), json!(3), json!(40)]
    );
    assert_eq!(column(&r, "total")[3], json!(10));
    assert!(
        table.starts_with("STEP  REPLICAS  TOTAL  MEMBER-CLUSTER-1"),
        "{table}"
    );
}

#[test]
fn dso_failover_and_fail_back() {
    let (r, table) = example("dso-failover.yaml");
    let eu2: Vec<Value> = column(&r, "desired")
        .iter()
        .map(|d| d["eu-2"].clone())
        .collect();
    let eu1: Vec<Value> = column(&r, "desired")
        .iter()
        .map(|d| d["eu-1"].clone())
        .collect();
    assert_eq!(eu2, [4, 4, 4, 0, 2, 4, 4].map(|v| json!(v)));
    assert_eq!(eu1, [4, 4, 4, 6, 5, 4, 4].map(|v| json!(v)));
    assert_eq!(column(&r, "moved"), [0, 0, 0, 0, 2, 2, 0].map(|v| json!(v)));
    assert_eq!(r["steps"][3]["reasons"]["eu-2"], json!("unreachable"));
    assert!(
        table.contains("eu-2: unreachable longer than gracePeriod"),
        "{table}"
    );
}

#[test]
fn dso_tiers() {
    let (r, _) = example("dso-tiers.yaml");
    assert_eq!(
        column(&r, "desired"),
        vec![
            json!({"idc-1": 3, "idc-2": 2, "cloud": 0}),
            json!({"idc-1": 4, "idc-2": 2, "cloud": 4}),
            json!({"idc-1": 4, "idc-2": 2, "cloud": 1}),
            json!({"idc-1": 2, "idc-2": 2, "cloud": 0}),
        ]
    );
}

#[test]
fn dso_unschedulable_migration() {
    let (r, _) = example("dso-unschedulable.yaml");
    assert_eq!(
        column(&r, "desired"),
        vec![
            json!({"a": 2, "b": 2, "c": 2}),
            json!({"a": 3, "b": 3, "c": 0})
        ]
    );
}

#[test]
fn dsj_weighted_round_robin() {
    let (r, _) = example("dsj-weighted-round-robin.yaml");
    assert_eq!(
        column(&r, "desiredJobs"),
        [10, 13, 15, 20].map(|v| json!(v))
    );
    let create = column(&r, "create");
    assert_eq!(
        create[0],
        json!({"member-cluster-1": 4, "member-cluster-2": 6})
    );
    // Across all polls 20 Jobs split exactly 8:12.
    let total = |name: &str| {
        create
            .iter()
            .map(|c| c[name].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert_eq!(
        (total("member-cluster-1"), total("member-cluster-2")),
        (8, 12)
    );
}

#[test]
fn dsj_priority_failover() {
    let (r, table) = example("dsj-priority-failover.yaml");
    assert_eq!(
        column(&r, "create"),
        vec![
            json!({"member-primary": 3, "member-failover": 0}),
            json!({"member-primary": 0, "member-failover": 0}),
            json!({"member-primary": 0, "member-failover": 0}),
            json!({"member-primary": 0, "member-failover": 3}),
            json!({"member-primary": 0, "member-failover": 2}),
        ]
    );
    assert_eq!(r["steps"][3]["taints"]["member-primary"], json!("hard"));
    assert_eq!(r["steps"][3]["deleted"]["member-primary"], json!(3));
    assert!(table.contains("HARD"), "{table}");
}

fn error_of(yaml: &str) -> String {
    simulate(yaml).expect_err("scenario is invalid").to_string()
}

const DSO_SPEC: &str = "spec: {scaledObjectSpec: {scaleTargetRef: {name: web}}}";

#[test]
fn invalid_scenarios_name_the_field() {
    let cases = [
        (
            "kind: Deployment\nspec: {}\nmembers: []\nsteps: []",
            "kind: unknown kind \"Deployment\"",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a, state: Sleeping}}]\nsteps: [{{replicas: 1}}]"
            ),
            "members[0].state: unknown state \"Sleeping\"",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a, unreachableFor: forever}}]\nsteps: [{{replicas: 1}}]"
            ),
            "members[0].unreachableFor: cannot parse duration",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a}}, {{name: a}}]\nsteps: [{{replicas: 1}}]"
            ),
            "members[1].name: duplicate member",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a}}]\nsteps: [{{}}]"
            ),
            "steps[0].replicas: required",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a}}]\nsteps: [{{replicas: 1, members: [{{name: b}}]}}]"
            ),
            "steps[0].members[0].name: unknown member \"b\"",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a, runningJobs: 2}}]\nsteps: [{{replicas: 1}}]"
            ),
            "members[0].runningJobs: not a field of a DistributedScaledObject member",
        ),
        (
            "kind: DistributedScaledObject\nspec: {memberClusters: [{name: a, weight: -1}], scaledObjectSpec: {scaleTargetRef: {name: web}}}\nmembers: [{name: a}]\nsteps: [{replicas: 1}]",
            "spec.memberClusters[0].weight: must be >= 0",
        ),
        (
            "kind: DistributedScaledJob\nspec: {scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, triggers: [{type: rabbitmq, name: q}]}}\nmembers: [{name: a}]\nsteps: [{metrics: {queue: {value: 1, target: 1}}}]",
            "steps[0].metrics.queue: no trigger named \"queue\"",
        ),
        (
            "kind: DistributedScaledJob\nspec: {scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, triggers: [{type: rabbitmq, name: q}]}}\nmembers: [{name: a}]\nsteps: [{metrics: {q: {value: 1, target: 0}}}]",
            "steps[0].metrics.q.target: must be a number > 0",
        ),
        (
            "kind: DistributedScaledJob\nspec: {scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}}}\nmembers: [{name: a}]\nsteps: [{}]",
            "steps[0].metrics: required on the first step",
        ),
        (
            &format!(
                "kind: DistributedScaledObject\n{DSO_SPEC}\nmembers: [{{name: a, currentReplicas: -2}}]\nsteps: [{{replicas: 1}}]"
            ),
            "members[0].currentReplicas",
        ),
    ];
    for (yaml, expected) in cases {
        let err = error_of(yaml);
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
}

#[test]
fn pause_annotations_in_a_scenario() {
    let yaml = format!(
        "kind: DistributedScaledObject\nmetadata: {{annotations: {{autoscaling.keda.sh/paused: \"true\"}}}}\n{DSO_SPEC}\nmembers: [{{name: a, currentReplicas: 3}}, {{name: b, currentReplicas: 1}}]\nsteps:\n- replicas: 10\n- replicas: 10\n  annotations: {{autoscaling.keda.sh/paused-replicas: \"6\"}}\n- replicas: 10\n  annotations: {{}}"
    );
    let report = serde_json::to_value(simulate(&yaml).expect("valid")).expect("serializes");
    assert_eq!(
        column(&report, "desired"),
        vec![
            json!({"a": 3, "b": 1}),
            json!({"a": 3, "b": 3}),
            json!({"a": 5, "b": 5})
        ]
    );
    assert_eq!(
        column(&report, "paused"),
        vec![json!(true), json!(true), json!(false)]
    );
}

/// The failover example under each duplication policy, with the primary getting room back
/// at step 6 so that its stuck Jobs start.
fn failover_with(policy: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/examples/simulate/dsj-priority-failover.yaml");
    let text = std::fs::read_to_string(path)
        .expect("example exists")
        .replace(
            "duplicationPolicy: preferFailover",
            &format!("duplicationPolicy: {policy}"),
        )
        .replace("softTaintDuration: 0s", "softTaintDuration: 3m");
    let text = format!("{text}- members: [{{name: member-primary, acceptsJobs: true}}]\n");
    serde_json::to_value(simulate(&text).expect("valid scenario")).expect("serializes")
}

#[test]
fn duplication_policies() {
    let deleted =
        |r: &Value, step: usize, member: &str| r["steps"][step]["deleted"][member].clone();
    // keepAll: both kept.
    let r = failover_with("keepAll");
    assert_eq!(deleted(&r, 3, "member-primary"), json!(0));
    assert_eq!(deleted(&r, 5, "member-failover"), json!(0));
    // Soft taint only (3m window): the primary stays eligible but stuck Jobs still fail over.
    assert_eq!(r["steps"][3]["taints"]["member-primary"], json!("soft"));
    assert_eq!(r["steps"][3]["create"]["member-failover"], json!(3));
    // immediateSourceCleanup: sources deleted as soon as the replacements exist.
    let r = failover_with("immediateSourceCleanup");
    assert_eq!(deleted(&r, 3, "member-primary"), json!(3));
    // preferFailover: sources deleted once the replacements run (they start at once).
    let r = failover_with("preferFailover");
    assert_eq!(deleted(&r, 3, "member-primary"), json!(3));
    // preferSource: nothing while the sources are stuck; once they run, the replacements go.
    let r = failover_with("preferSource");
    assert_eq!(deleted(&r, 3, "member-primary"), json!(0));
    assert_eq!(deleted(&r, 5, "member-failover"), json!(3));
}

#[test]
fn dso_avoid_disruption() {
    let (r, _) = example("dso-avoid-disruption.yaml");
    assert_eq!(
        column(&r, "desired"),
        vec![
            json!({"a": 5, "b": 4, "c": 0}),
            json!({"a": 3, "b": 3, "c": 3})
        ]
    );
    assert_eq!(column(&r, "moved"), vec![json!(0), json!(3)]);
}

#[test]
fn dso_dynamic_weights() {
    let (r, _) = example("dso-dynamic-weights.yaml");
    assert_eq!(
        column(&r, "desired"),
        vec![
            json!({"small": 2, "large": 6, "medium": 4}),
            json!({"small": 3, "large": 2, "medium": 7}),
            json!({"small": 8, "large": 5, "medium": 17}),
        ]
    );
}

#[test]
fn dsj_round_robin_taints() {
    let (r, _) = example("dsj-weighted-round-robin-taints.yaml");
    assert_eq!(
        column(&r, "create"),
        vec![
            json!({"healthy": 3, "broken": 3}),
            json!({"healthy": 2, "broken": 1}),
            json!({"healthy": 1, "broken": 0}),
        ]
    );
    assert_eq!(
        column(&r, "taints"),
        vec![
            json!({"healthy": "none", "broken": "none"}),
            json!({"healthy": "none", "broken": "soft"}),
            json!({"healthy": "none", "broken": "hard"}),
        ]
    );
    assert_eq!(r["steps"][0]["failedCreates"]["broken"], json!(3));
    // The hub learns of the refused creates at its next poll: Degraded from step 2 on, and
    // Ready all along since the healthy member takes its Jobs.
    let degraded: Vec<(Value, Value)> = column(&r, "conditions")
        .iter()
        .map(|c| {
            let d = c
                .as_array()
                .expect("conditions")
                .iter()
                .find(|c| c["type"] == "Degraded")
                .expect("Degraded");
            (d["status"].clone(), d["reason"].clone())
        })
        .collect();
    assert_eq!(
        degraded,
        [
            ("False", "NoFailures"),
            ("True", "JobCreateFailed"),
            ("True", "JobCreateFailed")
        ]
        .map(|(s, r)| (json!(s), json!(r)))
    );
    let reasons = |step: usize| -> Vec<Value> {
        r["steps"][step]["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["reason"].clone())
            .collect()
    };
    assert_eq!(reasons(0), [json!("JobsCreated")]);
    assert_eq!(reasons(1), [json!("JobCreateFailed"), json!("JobsCreated")]);
    let failed = &r["steps"][2]["events"][0];
    assert_eq!(failed["type"], json!("Warning"));
    assert!(
        failed["note"]
            .as_str()
            .is_some_and(|n| n.starts_with("creating Jobs in broken failed")
                && n.ends_with("taint now Hard")),
        "{failed}"
    );
}

#[test]
fn dsj_events_of_a_failover() {
    let (r, table) = example("dsj-priority-failover.yaml");
    let step4: Vec<(Value, Value)> = r["steps"][3]["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| (e["type"].clone(), e["reason"].clone()))
        .collect();
    let count = |reason: &str| step4.iter().filter(|(_, r)| r == reason).count();
    assert_eq!(count("Failover"), 3, "{step4:?}");
    assert_eq!(count("JobCleanedUp"), 3, "{step4:?}");
    assert_eq!(count("JobStuck"), 3, "{step4:?}");
    assert!(
        step4.contains(&(json!("Warning"), json!("TaintChanged"))),
        "{step4:?}"
    );
    // The hub's order: its creates and deletes, then what `outcome` says.
    assert_eq!(step4[0].1, json!("Failover"));
    assert!(
        table.contains("* step 4: Warning TaintChanged: member-primary: taint Hard"),
        "{table}"
    );
    assert!(table.starts_with("STEP  DESIRED  CREATE"), "{table}");
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.ends_with("UNPLACED  READY  DEGRADED"))
    );
}

#[test]
fn dsj_no_eligible_member_is_not_ready() {
    let yaml = r#"
kind: DistributedScaledJob
spec:
  memberClusters: [{name: a}]
  scaledJobSpec:
    jobTargetRef: {template: {spec: {containers: [{name: c, image: busybox}]}}}
    triggers: [{type: rabbitmq, name: q}]
members: [{name: a, state: Unreachable}]
steps:
- metrics: {q: {value: 2, target: 1}}
- members: [{name: a, state: Ready}]
"#;
    let report = serde_json::to_value(simulate(yaml).expect("runs")).expect("serializes");
    let ready = |step: usize| {
        let c = report["steps"][step]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .expect("Ready")
            .clone();
        (c["status"].clone(), c["reason"].clone())
    };
    assert_eq!(ready(0), (json!("False"), json!("NoEligibleMember")));
    assert_eq!(ready(1), (json!("True"), json!("Reconciled")));
}

#[test]
fn huge_job_counts_are_refused_not_simulated() {
    let err = error_of(
        "kind: DistributedScaledJob\nspec: {scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, maxReplicaCount: 2000000000, triggers: [{type: t, name: q}]}}\nmembers: [{name: a}]\nsteps: [{metrics: {q: {value: 1e12, target: 1}}}]",
    );
    assert_eq!(
        err,
        "spec.scaledJobSpec.maxReplicaCount: must be at most 10000, got 2000000000"
    );
    // `custom` with a negative deduction creates maxReplicaCount Jobs on every step, however
    // many run: the eleventh step would pass the simulator's bound.
    let err = error_of(&format!(
        "kind: DistributedScaledJob\nspec: {{scaledJobSpec: {{jobTargetRef: {{template: {{spec: {{containers: [{{name: c}}]}}}}}}, maxReplicaCount: 10000, scalingStrategy: {{strategy: custom, customScalingQueueLengthDeduction: -10000, customScalingRunningJobPercentage: \"0\"}}, triggers: [{{type: t, name: q}}]}}}}\nmembers: [{{name: a}}]\nsteps: [{{metrics: {{q: {{value: 10000, target: 1}}}}}}{}]",
        ", {}".repeat(10)
    ));
    assert!(
        err.starts_with("steps[10]: the simulation would track more than 100000 Jobs"),
        "{err}"
    );
    let err = error_of(
        "kind: DistributedScaledJob\nspec: {scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, triggers: [{type: t, name: q}]}}\nmembers: [{name: a, runningJobs: 4000000000}]\nsteps: [{metrics: {q: {value: 1, target: 1}}}]",
    );
    assert!(
        err.starts_with("members[0]: the simulation would track more than"),
        "{err}"
    );
}

#[test]
fn extreme_intervals_and_ages_saturate() {
    let huge = "5124095576030431h";
    let report = simulate(&format!(
        "kind: DistributedScaledObject\ninterval: {huge}\nspec: {{memberClusters: [{{name: a}}, {{name: b}}], scaledObjectSpec: {{scaleTargetRef: {{name: web}}}}}}\nmembers: [{{name: a, state: Unreachable, unreachableFor: {huge}, currentReplicas: 2}}, {{name: b}}]\nsteps: [{{replicas: 4}}, {{replicas: 4}}, {{replicas: 4}}]"
    ))
    .expect("runs");
    let json = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["steps"][2]["desired"], json!({"a": 0, "b": 4}));
    let report = simulate(&format!(
        "kind: DistributedScaledJob\ninterval: {huge}\nspec: {{scaledJobSpec: {{jobTargetRef: {{template: {{spec: {{containers: [{{name: c}}]}}}}}}, triggers: [{{type: t, name: q}}]}}}}\nmembers: [{{name: a, acceptsJobs: false, pendingJobs: 1, pendingFor: {huge}}}, {{name: b}}]\nsteps: [{{metrics: {{q: {{value: 2, target: 1}}}}}}, {{}}, {{}}]"
    ))
    .expect("runs");
    let json = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["steps"].as_array().map(Vec::len), Some(3));
}

//! Limits on user input (issue #8): the shipped CRDs carry the bounds of `validate`, and
//! validation never panics, whatever counts and durations a spec holds, and never lets a
//! value beyond the limits through to the planners.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kedge_core::crd::dsj::{
    ClusterScheduling, DsjMemberCluster, FailoverPolicy, MemberScheduling, WorkloadAffinity,
};
use kedge_core::crd::dso::{DsoMemberCluster, RebalancingPolicy};
use kedge_core::crd::keda::{
    Fallback, ScaleTargetRef, ScaledJobSpec, ScaledObjectSpec, ScalingStrategy,
};
use kedge_core::crd::{DistributedScaledJobSpec, DistributedScaledObjectSpec};
use kedge_core::duration;
use kedge_core::validate::{
    self, ClusterStrategy, MAX_DURATION, MAX_JOBS, MAX_QUEUE_LENGTH_DEDUCTION, MAX_REPLICAS,
    MAX_RUNNING_JOB_PERCENTAGE, MAX_TIER, MAX_WEIGHT, Pause, ScalingStrategyKind,
};
use proptest::prelude::*;
use serde_json::{Value, json};

/// The openAPIV3Schema of a shipped CRD, read from `deploy/crds/`.
fn shipped_schema(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crds")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("shipped CRD exists");
    let crd: Value = serde_yaml::from_str(&text).expect("shipped CRD is YAML");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The schema node of a field path such as `spec.memberClusters[].weight`.
fn node<'a>(schema: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(schema, |at, part| match part.strip_suffix("[]") {
            Some(list) => &at["properties"][list]["items"],
            None => &at["properties"][part],
        })
}

const DSO: &str = "distributedscaledobjects.kedge.dev.yaml";
const DSJ: &str = "distributedscaledjobs.kedge.dev.yaml";

#[test]
fn shipped_crds_carry_the_limits() {
    let integers = [
        (DSO, "spec.totalTargetReplicas", 0, 1_000_000),
        (DSO, "spec.memberClusters[].weight", 0, 10_000),
        (DSO, "spec.memberClusters[].tier", 0, 1_000),
        (DSO, "spec.memberClusters[].minReplicas", 0, 1_000_000),
        (DSO, "spec.memberClusters[].maxReplicas", 0, 1_000_000),
        (DSO, "spec.rebalancingPolicy.maxRebalancePercentage", 0, 100),
        (DSO, "spec.scaledObjectSpec.minReplicaCount", 0, 1_000_000),
        (DSO, "spec.scaledObjectSpec.maxReplicaCount", 0, 1_000_000),
        (DSO, "spec.scaledObjectSpec.idleReplicaCount", 0, 1_000_000),
        (DSO, "spec.scaledObjectSpec.pollingInterval", 1, 3_600),
        (DSO, "spec.scaledObjectSpec.cooldownPeriod", 0, 604_800),
        (
            DSO,
            "spec.scaledObjectSpec.initialCooldownPeriod",
            0,
            604_800,
        ),
        (
            DSO,
            "spec.scaledObjectSpec.fallback.failureThreshold",
            1,
            1_000,
        ),
        (DSO, "spec.scaledObjectSpec.fallback.replicas", 0, 1_000_000),
        (DSJ, "spec.memberClusters[].weight", 0, 10_000),
        (
            DSJ,
            "spec.clusterScheduling.workloadAffinity.size",
            0,
            10_000,
        ),
        (DSJ, "spec.scaledJobSpec.minReplicaCount", 0, 10_000),
        (DSJ, "spec.scaledJobSpec.maxReplicaCount", 0, 10_000),
        (
            DSJ,
            "spec.scaledJobSpec.successfulJobsHistoryLimit",
            0,
            10_000,
        ),
        (DSJ, "spec.scaledJobSpec.failedJobsHistoryLimit", 0, 10_000),
        (DSJ, "spec.scaledJobSpec.pollingInterval", 1, 3_600),
        (
            DSJ,
            "spec.scaledJobSpec.scalingStrategy.customScalingQueueLengthDeduction",
            -1_000_000,
            1_000_000,
        ),
    ];
    for (file, path, min, max) in integers {
        let field = node(&shipped_schema(file), path).clone();
        assert_eq!(field["type"], "integer", "{file} {path}: {field}");
        assert_eq!(
            field["minimum"].as_f64(),
            Some(f64::from(min)),
            "{file} {path}"
        );
        assert_eq!(
            field["maximum"].as_f64(),
            Some(f64::from(max)),
            "{file} {path}"
        );
    }
    let durations = [
        (DSO, "spec.rebalancingPolicy.gracePeriod"),
        (DSO, "spec.rebalancingPolicy.migrateUnschedulableAfter"),
        (DSJ, "spec.clusterScheduling.failoverPolicy.gracePeriod"),
        (
            DSJ,
            "spec.clusterScheduling.failoverPolicy.hardTaintDuration",
        ),
        (
            DSJ,
            "spec.clusterScheduling.failoverPolicy.softTaintDuration",
        ),
    ];
    for (file, path) in durations {
        let field = node(&shipped_schema(file), path).clone();
        assert_eq!(field["type"], "string", "{file} {path}: {field}");
        assert_eq!(field["maxLength"], json!(32), "{file} {path}");
        assert_eq!(field["pattern"], json!(duration::PATTERN), "{file} {path}");
    }
    for file in [DSO, DSJ] {
        let members = node(&shipped_schema(file), "spec.memberClusters").clone();
        assert_eq!(members["maxItems"], json!(1000), "{file}");
    }
}

/// Values at and just beyond every limit, and the ends of `i32`.
const EDGES: [i32; 17] = [
    i32::MIN,
    -1,
    0,
    1,
    100,
    101,
    1_000,
    1_001,
    3_600,
    3_601,
    10_000,
    10_001,
    604_800,
    604_801,
    1_000_000,
    1_000_001,
    i32::MAX,
];

/// Mostly an `ordinary` count, so that whole specs often pass and their settings are
/// checked; sometimes one at a limit, sometimes any `i32`.
fn count(ordinary: std::ops::RangeInclusive<i32>) -> impl Strategy<Value = i32> {
    prop_oneof![
        30 => ordinary,
        1 => prop::sample::select(&EDGES[..]),
        1 => any::<i32>(),
    ]
}

/// Mostly an ordinary duration; sometimes one at the limit or beyond what a `Duration`
/// holds, a well-formed one of any size, or any string.
fn duration_text() -> impl Strategy<Value = String> {
    const EDGES: [&str; 6] = [
        "0",
        "",
        "168h",
        "168h1ns",
        "5124095576030431h",
        "5124095576030432h",
    ];
    prop_oneof![
        30 => (0u32..=600).prop_map(|s| format!("{s}s")),
        1 => prop::sample::select(&EDGES[..]).prop_map(str::to_owned),
        1 => "[0-9]{1,30}(\\.[0-9]{0,12})?(ns|us|µs|ms|s|m|h)",
        1 => any::<String>(),
    ]
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let replicas = prop_oneof![
        any::<String>(),
        any::<i64>().prop_map(|n| n.to_string()),
        (0u32..=2_000_000).prop_map(|n| n.to_string()),
    ];
    prop::option::weighted(0.2, replicas).prop_map(|r| {
        r.map(|r| ("autoscaling.keda.sh/paused-replicas".to_owned(), r))
            .into_iter()
            .collect()
    })
}

prop_compose! {
    fn dso_member()(
        weight in proptest::option::of(count(1..=100)),
        tier in count(0..=3),
        min_replicas in proptest::option::of(count(0..=10)),
        max_replicas in proptest::option::of(count(10..=100)),
    ) -> DsoMemberCluster {
        DsoMemberCluster { weight, tier, min_replicas, max_replicas, ..Default::default() }
    }
}

prop_compose! {
    fn dso_spec()(
        total_target_replicas in proptest::option::of(count(0..=1_000)),
        members in proptest::collection::vec(dso_member(), 0..4),
        grace_period in proptest::option::of(duration_text()),
        migrate in proptest::option::of(duration_text()),
        max_rebalance_percentage in count(0..=100),
        periods in proptest::collection::vec(proptest::option::of(count(1..=600)), 4),
        min_replica_count in proptest::option::of(count(0..=10)),
        max_replica_count in proptest::option::of(count(10..=1_000)),
        fallback in proptest::option::of((count(1..=10), count(0..=100))),
    ) -> DistributedScaledObjectSpec {
        let member_clusters = members
            .into_iter()
            .enumerate()
            .map(|(i, m)| DsoMemberCluster { name: format!("m{i}"), ..m })
            .collect();
        DistributedScaledObjectSpec {
            total_target_replicas,
            member_clusters,
            rebalancing_policy: Some(RebalancingPolicy {
                grace_period,
                max_rebalance_percentage,
                migrate_unschedulable_after: migrate,
                ..Default::default()
            }),
            placement: None,
            scaled_object_spec: ScaledObjectSpec {
                scale_target_ref: ScaleTargetRef { name: "web".to_owned(), ..Default::default() },
                polling_interval: periods[0],
                cooldown_period: periods[1],
                initial_cooldown_period: periods[2],
                idle_replica_count: periods[3],
                min_replica_count,
                max_replica_count,
                fallback: fallback.map(|(failure_threshold, replicas)| Fallback {
                    failure_threshold,
                    replicas,
                    behavior: None,
                }),
                ..Default::default()
            },
        }
    }
}

prop_compose! {
    fn dsj_spec()(
        weights in proptest::collection::vec(proptest::option::of(count(1..=100)), 1..4),
        failover in any::<bool>(),
        size in count(0..=10),
        durations in proptest::collection::vec(proptest::option::of(duration_text()), 3),
        counts in proptest::collection::vec(proptest::option::of(count(1..=100)), 5),
        deduction in proptest::option::of(count(-10..=10)),
        percentage in proptest::option::of(prop_oneof![
            10 => (0.0..=1.0f64).prop_map(|f| f.to_string()),
            1 => any::<String>(),
            1 => any::<f64>().prop_map(|f| f.to_string()),
            1 => (-10.0..110.0f64).prop_map(|f| f.to_string()),
        ]),
    ) -> DistributedScaledJobSpec {
        let member_clusters = weights
            .into_iter()
            .enumerate()
            .map(|(i, weight)| DsjMemberCluster {
                name: format!("m{i}"),
                weight,
                scheduling: Some(MemberScheduling { priority: Some(i32::try_from(i).unwrap_or(0)) }),
                pod_overrides: None,
            })
            .collect();
        let job_target_ref = serde_json::from_value(json!({
            "template": {"spec": {"containers": [{"name": "c"}]}}
        }))
        .expect("a JobSpec");
        DistributedScaledJobSpec {
            total_target_replicas: 0,
            member_clusters,
            cluster_scheduling: Some(ClusterScheduling {
                strategy: failover.then(|| "priorityFailover".to_owned()),
                workload_affinity: Some(WorkloadAffinity { class: "a".to_owned(), size }),
                failover_policy: Some(FailoverPolicy {
                    grace_period: durations[0].clone(),
                    hard_taint_duration: durations[1].clone(),
                    soft_taint_duration: durations[2].clone(),
                    duplication_policy: None,
                }),
            }),
            scaled_job_spec: ScaledJobSpec {
                job_target_ref,
                polling_interval: counts[0],
                successful_jobs_history_limit: counts[1],
                failed_jobs_history_limit: counts[2],
                min_replica_count: counts[3],
                max_replica_count: counts[4],
                scaling_strategy: (!failover).then(|| ScalingStrategy {
                    strategy: Some("custom".to_owned()),
                    custom_scaling_queue_length_deduction: deduction,
                    custom_scaling_running_job_percentage: percentage,
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn dso_validation_never_panics_and_keeps_the_limits(
        spec in dso_spec(),
        annotations in annotations(),
    ) {
        if let Ok(s) = validate::dso(&spec, &annotations) {
            prop_assert!(s.grace_period <= MAX_DURATION);
            prop_assert!(s.migrate_unschedulable_after.is_none_or(|d| d <= MAX_DURATION));
            prop_assert!(s.min_total <= MAX_REPLICAS && s.max_total <= MAX_REPLICAS);
            prop_assert!(s.max_rebalance_percentage <= 100);
            for m in s.members.iter().flatten() {
                prop_assert!(m.weight <= MAX_WEIGHT && m.tier <= MAX_TIER);
                prop_assert!(m.min_replicas <= MAX_REPLICAS);
                prop_assert!(m.max_replicas.is_none_or(|max| max <= MAX_REPLICAS));
            }
            if let Pause::AtReplicas(n) = s.pause {
                prop_assert!(n <= MAX_REPLICAS);
            }
            let total = spec.total_target_replicas.unwrap_or(0);
            prop_assert!((0..=1_000_000).contains(&total));
        }
    }

    #[test]
    fn dsj_validation_never_panics_and_keeps_the_limits(
        spec in dsj_spec(),
        annotations in annotations(),
    ) {
        if let Ok(s) = validate::dsj(&spec, &annotations) {
            for d in [s.timing.grace_period, s.timing.hard_taint_duration, s.timing.soft_taint_duration] {
                prop_assert!(d <= MAX_DURATION);
            }
            prop_assert!(s.min_jobs <= s.max_jobs && s.max_jobs <= MAX_JOBS);
            prop_assert!(s.successful_jobs_history_limit <= MAX_JOBS);
            prop_assert!(s.failed_jobs_history_limit <= MAX_JOBS);
            for m in s.members.iter().flatten() {
                prop_assert!(m.weight <= MAX_WEIGHT);
            }
            if let ClusterStrategy::PriorityFailover { size, .. } = s.cluster_strategy {
                prop_assert!(size <= MAX_JOBS);
            }
            if let ScalingStrategyKind::Custom { deduction, running_percentage } = s.scaling {
                let bound = i64::from(MAX_QUEUE_LENGTH_DEDUCTION);
                prop_assert!((-bound..=bound).contains(&deduction));
                prop_assert!((0.0..=MAX_RUNNING_JOB_PERCENTAGE).contains(&running_percentage));
            }
        }
    }
}

/// Every `format: int32` node of a schema, with its path.
fn int32_nodes(schema: &Value, path: String, out: &mut Vec<(String, Value)>) {
    if schema["type"] == "integer" && schema["format"] == "int32" {
        out.push((path.clone(), schema.clone()));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            int32_nodes(sub, format!("{path}.{name}"), out);
        }
    }
    if schema["items"].is_object() {
        int32_nodes(&schema["items"], format!("{path}[]"), out);
    }
    if schema["additionalProperties"].is_object() {
        int32_nodes(&schema["additionalProperties"], format!("{path}{{}}"), out);
    }
}

/// Issue 26: a number beyond `int32` in an `int32` field (an HPA policy value of 3e9, a DSJ
/// total of 5e9) was stored, and the hub's typed list then failed to decode every object.
#[test]
fn every_int32_field_is_bounded_to_int32_or_tighter() {
    for file in [DSO, DSJ, "memberclusters.kedge.dev.yaml"] {
        let mut nodes = Vec::new();
        int32_nodes(&shipped_schema(file), String::new(), &mut nodes);
        assert!(nodes.is_empty() == file.starts_with("member"), "{file}");
        for (path, node) in nodes {
            let (min, max) = (node["minimum"].as_f64(), node["maximum"].as_f64());
            assert!(
                min.is_some_and(|m| m >= f64::from(i32::MIN))
                    && max.is_some_and(|m| m <= f64::from(i32::MAX)),
                "{file} {path}: {node}"
            );
        }
    }
    let behavior = "spec.scaledObjectSpec.advanced.horizontalPodAutoscalerConfig.behavior";
    let value = node(
        &shipped_schema(DSO),
        &format!("{behavior}.scaleUp.policies[].value"),
    )
    .clone();
    assert_eq!(
        (value["minimum"].as_f64(), value["maximum"].as_f64()),
        (Some(1.0), Some(2_147_483_647.0))
    );
    let total = node(&shipped_schema(DSJ), "spec.totalTargetReplicas").clone();
    assert_eq!(total["maximum"].as_f64(), Some(f64::from(MAX_REPLICAS)));
}

/// Member names are RFC 1123 labels (the identity in the agent's certificate); a
/// 5,000-character one made a child apply retry forever.
#[test]
fn member_names_and_namespaces_are_rfc1123_labels_and_targets_are_required() {
    use kedge_core::limits::{MEMBER_NAME_MAX_LENGTH, RFC1123_LABEL_PATTERN};
    for (file, path) in [
        (DSO, "spec.memberClusters[].name"),
        (DSJ, "spec.memberClusters[].name"),
        (DSO, "spec.memberClusters[].targetNamespace"),
    ] {
        let field = node(&shipped_schema(file), path).clone();
        assert_eq!(
            field["pattern"],
            json!(RFC1123_LABEL_PATTERN),
            "{file} {path}"
        );
        assert_eq!(
            field["maxLength"],
            json!(MEMBER_NAME_MAX_LENGTH),
            "{file} {path}"
        );
    }
    let so = node(&shipped_schema(DSO), "spec.scaledObjectSpec").clone();
    assert_eq!(so["required"], json!(["scaleTargetRef"]));
    assert_eq!(
        so["properties"]["scaleTargetRef"]["required"],
        json!(["name"])
    );
    assert_eq!(
        so["properties"]["scaleTargetRef"]["properties"]["name"]["minLength"],
        json!(1)
    );
    assert_eq!(
        node(&shipped_schema(DSO), "spec")["required"],
        json!(["scaledObjectSpec"])
    );
    let spec = DistributedScaledObjectSpec {
        member_clusters: vec![DsoMemberCluster {
            name: "m".repeat(5_000),
            ..Default::default()
        }],
        scaled_object_spec: ScaledObjectSpec {
            scale_target_ref: ScaleTargetRef {
                name: "web".into(),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    // Validation refuses it too, for an object stored before the schema did.
    let err = validate::dso(&spec, &BTreeMap::new()).expect_err("refused");
    assert!(
        err.to_string().contains("spec.memberClusters[0].name"),
        "{err}"
    );
    assert!(
        err.to_string().len() < 1_000,
        "the name is not echoed whole: {err}"
    );
}

/// Every value a string enum of the schema allows is one validation accepts (the DSO's
/// `Value` metric type aside, which it refuses with a reason).
#[test]
fn schema_enums_are_what_validation_accepts() {
    let dsj = shipped_schema(DSJ);
    type SpecWith = fn(&str) -> DistributedScaledJobSpec;
    let cases: [(&str, SpecWith); 4] = [
        ("spec.scaledJobSpec.scalingStrategy.strategy", |v| {
            DistributedScaledJobSpec {
                scaled_job_spec: ScaledJobSpec {
                    scaling_strategy: Some(ScalingStrategy {
                        strategy: Some(v.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }
        }),
        (
            "spec.scaledJobSpec.scalingStrategy.multipleScalersCalculation",
            |v| DistributedScaledJobSpec {
                scaled_job_spec: ScaledJobSpec {
                    scaling_strategy: Some(ScalingStrategy {
                        multiple_scalers_calculation: Some(v.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        (
            "spec.clusterScheduling.failoverPolicy.duplicationPolicy",
            |v| DistributedScaledJobSpec {
                cluster_scheduling: Some(ClusterScheduling {
                    failover_policy: Some(FailoverPolicy {
                        duplication_policy: Some(v.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ),
        ("spec.clusterScheduling.strategy", |v| {
            DistributedScaledJobSpec {
                member_clusters: vec![DsjMemberCluster {
                    name: "a".into(),
                    scheduling: Some(MemberScheduling { priority: Some(1) }),
                    ..Default::default()
                }],
                cluster_scheduling: Some(ClusterScheduling {
                    strategy: Some(v.into()),
                    workload_affinity: (v == "priorityFailover").then(|| WorkloadAffinity {
                        class: "c".into(),
                        size: 1,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }),
    ];
    for (path, spec) in cases {
        let values = node(&dsj, path)["enum"].clone();
        let values = values
            .as_array()
            .unwrap_or_else(|| panic!("{path} has an enum"));
        assert!(!values.is_empty(), "{path}");
        for v in values {
            let v = v.as_str().expect("string enum");
            let mut spec = spec(v);
            spec.scaled_job_spec.job_target_ref = serde_json::from_value(
                json!({"template": {"spec": {"containers": [{"name": "w", "image": "w"}]}}}),
            )
            .expect("job");
            if let Some(s) = &mut spec.scaled_job_spec.scaling_strategy
                && v == "custom"
            {
                s.custom_scaling_queue_length_deduction = Some(0);
                s.custom_scaling_running_job_percentage = Some("0.5".into());
            }
            let got = validate::dsj(&spec, &BTreeMap::new());
            assert!(got.is_ok(), "{path} = {v}: {got:?}");
        }
    }
}

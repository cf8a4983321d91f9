use super::*;
use crate::crd::{DistributedScaledJobSpec, DistributedScaledObjectSpec};

fn dso_spec(yaml: &str) -> DistributedScaledObjectSpec {
    serde_yaml::from_str(yaml).expect("test spec parses")
}

fn dsj_spec(yaml: &str) -> DistributedScaledJobSpec {
    serde_yaml::from_str(yaml).expect("test spec parses")
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn dso_error(yaml: &str) -> String {
    dso(&dso_spec(yaml), &BTreeMap::new())
        .expect_err("spec is invalid")
        .to_string()
}

fn dsj_error(yaml: &str) -> String {
    dsj(&dsj_spec(yaml), &BTreeMap::new())
        .expect_err("spec is invalid")
        .to_string()
}

const TARGET: &str = "scaledObjectSpec: {scaleTargetRef: {name: web}}";
const JOB: &str = "scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}}";

#[test]
fn member_names_are_rfc1123_labels_and_a_huge_one_is_shown_cut() {
    for good in ["edge-1", "a", &"x".repeat(63)] {
        assert!(crate::limits::is_member_name(good), "{good}");
    }
    for bad in ["", "Edge", "-a", "a-", "a.b", "a_b", &"x".repeat(64)] {
        assert!(!crate::limits::is_member_name(bad), "{bad}");
    }
    let huge = "y".repeat(5000);
    let spec = dso_spec(&format!("memberClusters: [{{name: {huge}}}]\n{TARGET}"));
    let e = dso(&spec, &BTreeMap::new()).unwrap_err().to_string();
    assert!(e.contains("spec.memberClusters[0].name"), "{e}");
    assert!(e.contains("RFC 1123") && e.len() < 400, "{e}");
}

#[test]
fn dso_defaults() {
    let s = dso(&dso_spec(TARGET), &BTreeMap::new()).expect("valid");
    assert_eq!(s.members, None);
    assert_eq!(s.grace_period, Duration::from_secs(60));
    assert_eq!(s.max_rebalance_percentage, 50);
    assert!(s.avoid_disruption);
    assert!(!s.dynamic_weights);
    assert_eq!((s.min_total, s.max_total), (0, 100));
    assert_eq!(s.pause, Pause::No);
}

#[test]
fn dso_field_errors_name_the_field() {
    let cases = [
        (
            "memberClusters: [{name: a}, {name: b}, {name: c, weight: -1}]",
            "spec.memberClusters[2].weight: must be >= 0, got -1",
        ),
        (
            "memberClusters: [{name: a, weight: 0}, {name: b, weight: 0}]",
            "spec.memberClusters: all weights are 0",
        ),
        (
            "memberClusters: [{name: a}, {name: a}]",
            "spec.memberClusters[1].name: duplicate member \"a\"",
        ),
        (
            "rebalancingPolicy: {gracePeriod: soon}",
            "spec.rebalancingPolicy.gracePeriod: cannot parse duration \"soon\"",
        ),
        (
            "rebalancingPolicy: {migrateUnschedulableAfter: 5x}",
            "spec.rebalancingPolicy.migrateUnschedulableAfter: cannot parse duration",
        ),
        (
            "rebalancingPolicy: {maxRebalancePercentage: 150}",
            "spec.rebalancingPolicy.maxRebalancePercentage: must be between 0 and 100",
        ),
        (
            "memberClusters: [{name: a, minReplicas: 5, maxReplicas: 2}]",
            "spec.memberClusters[0].minReplicas: 5 is greater than maxReplicas 2",
        ),
    ];
    for (members, expected) in cases {
        let err = dso_error(&format!("{members}\n{TARGET}"));
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
}

#[test]
fn dso_refuses_value_metric_type() {
    let err = dso_error(
        "scaledObjectSpec:\n  scaleTargetRef: {name: web}\n  triggers:\n  - {type: \
         prometheus, metricType: AverageValue}\n  - {type: prometheus, metricType: Value}",
    );
    assert!(
        err.starts_with("spec.scaledObjectSpec.triggers[1].metricType: Value is not supported"),
        "{err}"
    );
}

#[test]
fn a_pod_metrics_trigger_is_checked_and_leaves_auth_and_metric_type_to_the_hub() {
    let ok = "scaledObjectSpec:\n  scaleTargetRef: {name: web}\n  triggers:\n  - {type: \
              kedge-pod-metrics, metadata: {threshold: '4', metricPort: metrics}}";
    let spec: DistributedScaledObjectSpec = serde_yaml::from_str(ok).unwrap();
    assert!(dso(&spec, &BTreeMap::new()).is_ok());
    let err = dso_error(
        "scaledObjectSpec:\n  scaleTargetRef: {name: web}\n  triggers:\n  - {type: \
         kedge-pod-metrics, metricType: Utilization, authenticationRef: {name: mine}, \
         metadata: {threshold: '-1', metricPorotocol: http}}",
    );
    for expected in [
        "spec.scaledObjectSpec.triggers[0].metadata.threshold:",
        "spec.scaledObjectSpec.triggers[0].metadata.metricPorotocol: unknown key \"metricPorotocol\"; did you mean \"metricProtocol\"?",
        "spec.scaledObjectSpec.triggers[0].metricType: Utilization is not supported",
        "spec.scaledObjectSpec.triggers[0].authenticationRef: must be omitted",
    ] {
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
}

#[test]
fn pause_annotations() {
    assert_eq!(pause(&annotations(&[])), Ok(Pause::No));
    assert_eq!(
        pause(&annotations(&[(ANNOTATION_PAUSED, "true")])),
        Ok(Pause::Paused)
    );
    assert_eq!(
        pause(&annotations(&[(ANNOTATION_PAUSED, "false")])),
        Ok(Pause::No)
    );
    assert_eq!(
        pause(&annotations(&[
            (ANNOTATION_PAUSED, "true"),
            (ANNOTATION_PAUSED_REPLICAS, "3")
        ])),
        Ok(Pause::AtReplicas(3)),
        "paused-replicas takes precedence"
    );
    for bad in ["-1", "2.5", "three", ""] {
        let err = pause(&annotations(&[(ANNOTATION_PAUSED_REPLICAS, bad)]))
            .expect_err("invalid paused-replicas")
            .to_string();
        assert!(
            err.contains("autoscaling.keda.sh/paused-replicas")
                && err.contains("non-negative integer"),
            "{err}"
        );
    }
    assert!(pause(&annotations(&[(ANNOTATION_PAUSED, "maybe")])).is_err());
    assert_eq!(
        pause(&annotations(&[(ANNOTATION_PAUSED_REPLICAS, "1000000")])),
        Ok(Pause::AtReplicas(MAX_REPLICAS))
    );
    for too_large in ["1000001", "4294967296", "99999999999999999999"] {
        let err = pause(&annotations(&[(ANNOTATION_PAUSED_REPLICAS, too_large)]))
            .expect_err("paused-replicas beyond the limit")
            .to_string();
        assert_eq!(
            err,
            format!(
                "metadata.annotations[\"autoscaling.keda.sh/paused-replicas\"]: must be at \
                 most 1000000, got {too_large:?}"
            )
        );
    }
}

#[test]
fn stuck_after_the_grace_period() {
    let t = FailoverTiming::default();
    let start = std::time::SystemTime::UNIX_EPOCH;
    assert!(!t.is_stuck(start, start + Duration::from_secs(60)));
    assert!(t.is_stuck(start, start + Duration::from_secs(61)));
    assert!(
        !t.is_stuck(start + Duration::from_secs(5), start),
        "clock skew is not stuck"
    );
    let latest = crate::time::saturating_add(start, Duration::MAX);
    let earliest = crate::time::saturating_sub(start, Duration::MAX);
    let longest = FailoverTiming {
        grace_period: Duration::MAX,
        ..t
    };
    assert!(t.is_stuck(earliest, latest));
    assert!(!t.is_stuck(latest, earliest));
    assert!(!longest.is_stuck(earliest, latest));
}

#[test]
fn dsj_defaults() {
    let s = dsj(&dsj_spec(JOB), &BTreeMap::new()).expect("valid");
    assert_eq!(s.cluster_strategy, ClusterStrategy::WeightedRoundRobin);
    assert_eq!(s.scaling, ScalingStrategyKind::PendingAware);
    assert_eq!(s.multiple_scalers, MultipleScalers::Max);
    assert_eq!(s.timing, FailoverTiming::default());
    assert_eq!(s.duplication, DuplicationPolicy::KeepAll);
    assert_eq!((s.min_jobs, s.max_jobs), (0, 100));
    assert_eq!(s.successful_jobs_history_limit, 100);
    assert_eq!(
        (s.rollout, s.propagation),
        (Rollout::Replace, Propagation::Background)
    );
}

#[test]
fn dsj_field_errors_name_the_field() {
    let cases = [
        (
            "clusterScheduling: {strategy: roundRobin}",
            "spec.clusterScheduling.strategy: unknown strategy \"roundRobin\" (expected \
             weightedRoundRobin or priorityFailover)",
        ),
        (
            "clusterScheduling: {strategy: priorityFailover}\nmemberClusters: [{name: a, \
             scheduling: {priority: 1}}]",
            "spec.clusterScheduling.workloadAffinity: required with priorityFailover",
        ),
        (
            "clusterScheduling: {strategy: priorityFailover, workloadAffinity: {class: x, \
             size: 1}}\nmemberClusters: [{name: a, scheduling: {priority: 1}}, {name: b}]",
            "spec.memberClusters[1].scheduling.priority: required for every member",
        ),
        (
            "clusterScheduling: {failoverPolicy: {softTaintDuration: 3 minutes}}",
            "spec.clusterScheduling.failoverPolicy.softTaintDuration: cannot parse duration",
        ),
        (
            "clusterScheduling: {failoverPolicy: {duplicationPolicy: keepSome}}",
            "spec.clusterScheduling.failoverPolicy.duplicationPolicy: unknown policy \"keepSome\" \
             (expected keepAll, preferFailover, preferSource or immediateSourceCleanup)",
        ),
        (
            "memberClusters: [{name: a, weight: -2}]",
            "spec.memberClusters[0].weight: must be >= 0",
        ),
        (
            "memberClusters: [{name: a, weight: 0}]",
            "spec.memberClusters: all weights are 0",
        ),
        (
            "memberClusters: [{name: a, weight: 10001}]",
            "spec.memberClusters[0].weight: must be at most 10000",
        ),
    ];
    for (extra, expected) in cases {
        let err = dsj_error(&format!("{extra}\n{JOB}"));
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
    let err = dsj_error(
        "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n  \
         scalingStrategy: {strategy: fastest, multipleScalersCalculation: median}",
    );
    assert!(
        err.contains("spec.scaledJobSpec.scalingStrategy.strategy: unknown strategy \"fastest\"")
    );
    assert!(
        err.contains(
            "spec.scaledJobSpec.scalingStrategy.multipleScalersCalculation: unknown calculation \
             \"median\" (expected max, min, avg or sum)"
        ),
        "{err}"
    );
    let err = dsj_error(
        "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n  \
         rolloutStrategy: slow\n  rollout: {propagationPolicy: orphan}",
    );
    assert!(
        err.contains(
            "spec.scaledJobSpec.rolloutStrategy: unknown strategy \"slow\" (expected default or \
             gradual)"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "spec.scaledJobSpec.rollout.propagationPolicy: unknown policy \"orphan\" (expected \
             background or foreground)"
        ),
        "{err}"
    );
}

#[test]
fn dsj_cross_field_rules() {
    let err = dsj_error(
        "clusterScheduling: {strategy: priorityFailover, workloadAffinity: {class: x, size: \
         1}}\nmemberClusters: [{name: a, scheduling: {priority: 1}}]\nscaledJobSpec: \
         {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}, scalingStrategy: \
         {strategy: eager}}",
    );
    assert!(
        err.contains(
            "spec.scaledJobSpec.scalingStrategy.strategy: priorityFailover supports only \
             pendingAware"
        ),
        "{err}"
    );
    let err = dsj_error("scaledJobSpec: {jobTargetRef: {template: {}}}");
    assert!(
        err.contains(
            "spec.scaledJobSpec.jobTargetRef.template.spec.containers: at least one container"
        ),
        "{err}"
    );
    let err = dsj_error(
        "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n  \
         triggers: [{type: a, name: x}, {type: b, name: x}]",
    );
    assert!(
        err.contains("spec.scaledJobSpec.triggers[1].name: duplicate trigger \"x\""),
        "{err}"
    );
    let err = dso_error("scaledObjectSpec: {scaleTargetRef: {name: \"\"}}");
    assert!(
        err.contains("spec.scaledObjectSpec.scaleTargetRef.name: must not be empty"),
        "{err}"
    );
    let job = "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n";
    for (yaml, expected) in [
        (
            format!("{job}  triggers: [{{type: a, name: \" \"}}]"),
            "spec.scaledJobSpec.triggers[0].name: must not be empty".to_owned(),
        ),
        (
            format!(
                "{job}  triggers: [{}]",
                (0..65)
                    .map(|i| format!("{{type: t, name: t{i}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "spec.scaledJobSpec.triggers: at most 64 triggers, got 65".to_owned(),
        ),
        (
            format!("{job}clusterScheduling: {{workloadAffinity: {{class: x, size: 1}}}}"),
            "spec.clusterScheduling.workloadAffinity: only used with strategy priorityFailover"
                .to_owned(),
        ),
        (
            format!(
                "{job}clusterScheduling: {{strategy: priorityFailover, workloadAffinity: \
                 {{class: x, size: 1}}}}\nmemberClusters: [{{name: a, scheduling: \
                 {{priority: 1001}}}}]"
            ),
            "spec.memberClusters[0].scheduling.priority: must be between 0 and 1000, got 1001"
                .to_owned(),
        ),
    ] {
        let err = dsj_error(&yaml);
        assert!(err.contains(&expected), "{yaml}\n{err}");
    }
}

/// Every documented limit: `where | fragment | accepted or refused value | "ok" or the
/// first problem`. Where: `dso`/`dsj` the spec next to a valid KEDA spec, `so`/`sj`
/// inside the KEDA spec. `$` in the fragment is replaced by the value.
const LIMITS: &str = r#"
dso | totalTargetReplicas: $ | 1000000 | ok
dso | totalTargetReplicas: $ | 1000001 | spec.totalTargetReplicas: must be at most 1000000, got 1000001
dso | totalTargetReplicas: $ | -1 | spec.totalTargetReplicas: must be >= 0, got -1
dso | memberClusters: [{name: a, weight: $}] | 10000 | ok
dso | memberClusters: [{name: a, weight: $}] | 10001 | spec.memberClusters[0].weight: must be at most 10000, got 10001
dsj | memberClusters: [{name: a, weight: $}] | 10000 | ok
dsj | memberClusters: [{name: a, weight: $}] | 10001 | spec.memberClusters[0].weight: must be at most 10000, got 10001
dso | memberClusters: [{name: a, tier: $}] | 1000 | ok
dso | memberClusters: [{name: a, tier: $}] | 1001 | spec.memberClusters[0].tier: must be at most 1000, got 1001
dso | memberClusters: [{name: a, minReplicas: $}] | 1000000 | ok
dso | memberClusters: [{name: a, minReplicas: $}] | 1000001 | spec.memberClusters[0].minReplicas: must be at most 1000000, got 1000001
dso | memberClusters: [{name: a, maxReplicas: $}] | 1000000 | ok
dso | memberClusters: [{name: a, maxReplicas: $}] | 1000001 | spec.memberClusters[0].maxReplicas: must be at most 1000000, got 1000001
dso | rebalancingPolicy: {gracePeriod: $} | 168h | ok
dso | rebalancingPolicy: {gracePeriod: $} | 167h59m60.000000001s | spec.rebalancingPolicy.gracePeriod: must be at most 168h (7 days), got "167h59m60.000000001s"
dso | rebalancingPolicy: {gracePeriod: $} | 5124095576030431h | spec.rebalancingPolicy.gracePeriod: must be at most 168h (7 days), got "5124095576030431h"
dso | rebalancingPolicy: {gracePeriod: $} | 99999999999999999999999h | spec.rebalancingPolicy.gracePeriod: cannot parse duration "99999999999999999999999h"
dso | rebalancingPolicy: {migrateUnschedulableAfter: $} | 168h | ok
dso | rebalancingPolicy: {migrateUnschedulableAfter: $} | 169h | spec.rebalancingPolicy.migrateUnschedulableAfter: must be at most 168h (7 days), got "169h"
dso | rebalancingPolicy: {maxRebalancePercentage: $} | 100 | ok
dso | rebalancingPolicy: {maxRebalancePercentage: $} | 101 | spec.rebalancingPolicy.maxRebalancePercentage: must be between 0 and 100, got 101
so | minReplicaCount: $, maxReplicaCount: 1000000 | 1000000 | ok
so | minReplicaCount: $, maxReplicaCount: 1000000 | 1000001 | spec.scaledObjectSpec.minReplicaCount: must be at most 1000000, got 1000001
so | maxReplicaCount: $ | 1000000 | ok
so | maxReplicaCount: $ | 1000001 | spec.scaledObjectSpec.maxReplicaCount: must be at most 1000000, got 1000001
so | idleReplicaCount: $ | 1000000 | ok
so | idleReplicaCount: $ | 1000001 | spec.scaledObjectSpec.idleReplicaCount: must be at most 1000000, got 1000001
so | idleReplicaCount: $ | -1 | spec.scaledObjectSpec.idleReplicaCount: must be >= 0, got -1
so | fallback: {failureThreshold: 3, replicas: $} | 1000000 | ok
so | fallback: {failureThreshold: 3, replicas: $} | 1000001 | spec.scaledObjectSpec.fallback.replicas: must be at most 1000000, got 1000001
so | fallback: {failureThreshold: $, replicas: 1} | 1000 | ok
so | fallback: {failureThreshold: $, replicas: 1} | 1001 | spec.scaledObjectSpec.fallback.failureThreshold: must be between 1 and 1000, got 1001
so | fallback: {failureThreshold: $, replicas: 1} | 0 | spec.scaledObjectSpec.fallback.failureThreshold: must be between 1 and 1000, got 0
so | pollingInterval: $ | 3600 | ok
so | pollingInterval: $ | 3601 | spec.scaledObjectSpec.pollingInterval: must be between 1 and 3600, got 3601
so | pollingInterval: $ | 0 | spec.scaledObjectSpec.pollingInterval: must be between 1 and 3600, got 0
so | cooldownPeriod: $ | 604800 | ok
so | cooldownPeriod: $ | 604801 | spec.scaledObjectSpec.cooldownPeriod: must be at most 604800, got 604801
so | cooldownPeriod: $ | -1 | spec.scaledObjectSpec.cooldownPeriod: must be >= 0, got -1
so | initialCooldownPeriod: $ | 604800 | ok
so | initialCooldownPeriod: $ | 604801 | spec.scaledObjectSpec.initialCooldownPeriod: must be at most 604800, got 604801
dsj | clusterScheduling: {failoverPolicy: {gracePeriod: $}} | 168h | ok
dsj | clusterScheduling: {failoverPolicy: {gracePeriod: $}} | 168h1ns | spec.clusterScheduling.failoverPolicy.gracePeriod: must be at most 168h (7 days), got "168h1ns"
dsj | clusterScheduling: {failoverPolicy: {hardTaintDuration: $}} | 10080m | ok
dsj | clusterScheduling: {failoverPolicy: {hardTaintDuration: $}} | 10081m | spec.clusterScheduling.failoverPolicy.hardTaintDuration: must be at most 168h (7 days), got "10081m"
dsj | clusterScheduling: {failoverPolicy: {softTaintDuration: $}} | 604800s | ok
dsj | clusterScheduling: {failoverPolicy: {softTaintDuration: $}} | 604801s | spec.clusterScheduling.failoverPolicy.softTaintDuration: must be at most 168h (7 days), got "604801s"
dsj | clusterScheduling: {strategy: priorityFailover, workloadAffinity: {class: x, size: $}}, memberClusters: [{name: a, scheduling: {priority: 1}}] | 10000 | ok
dsj | clusterScheduling: {strategy: priorityFailover, workloadAffinity: {class: x, size: $}}, memberClusters: [{name: a, scheduling: {priority: 1}}] | 10001 | spec.clusterScheduling.workloadAffinity.size: must be at most 10000, got 10001
sj | maxReplicaCount: $ | 10000 | ok
sj | maxReplicaCount: $ | 10001 | spec.scaledJobSpec.maxReplicaCount: must be at most 10000, got 10001
sj | minReplicaCount: $, maxReplicaCount: 10000 | 10000 | ok
sj | minReplicaCount: $, maxReplicaCount: 10000 | 10001 | spec.scaledJobSpec.minReplicaCount: must be at most 10000, got 10001
sj | successfulJobsHistoryLimit: $ | 10000 | ok
sj | successfulJobsHistoryLimit: $ | 10001 | spec.scaledJobSpec.successfulJobsHistoryLimit: must be at most 10000, got 10001
sj | failedJobsHistoryLimit: $ | 10000 | ok
sj | failedJobsHistoryLimit: $ | 10001 | spec.scaledJobSpec.failedJobsHistoryLimit: must be at most 10000, got 10001
sj | failedJobsHistoryLimit: $ | -1 | spec.scaledJobSpec.failedJobsHistoryLimit: must be >= 0, got -1
sj | pollingInterval: $ | 3600 | ok
sj | pollingInterval: $ | 3601 | spec.scaledJobSpec.pollingInterval: must be between 1 and 3600, got 3601
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | 100 | ok
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | 0 | ok
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | 100.5 | spec.scaledJobSpec.scalingStrategy.customScalingRunningJobPercentage: must be a number between 0 and 100, got "100.5"
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | -0.1 | spec.scaledJobSpec.scalingStrategy.customScalingRunningJobPercentage: must be a number between 0 and 100, got "-0.1"
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | NaN | spec.scaledJobSpec.scalingStrategy.customScalingRunningJobPercentage: must be a number between 0 and 100, got "NaN"
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | inf | spec.scaledJobSpec.scalingStrategy.customScalingRunningJobPercentage: must be a number between 0 and 100, got "inf"
sj | scalingStrategy: {strategy: custom, customScalingRunningJobPercentage: "$"} | 1e400 | spec.scaledJobSpec.scalingStrategy.customScalingRunningJobPercentage: must be a number between 0 and 100, got "1e400"
sj | scalingStrategy: {strategy: custom, customScalingQueueLengthDeduction: $} | 1000000 | ok
sj | scalingStrategy: {strategy: custom, customScalingQueueLengthDeduction: $} | -1000000 | ok
sj | scalingStrategy: {strategy: custom, customScalingQueueLengthDeduction: $} | 1000001 | spec.scaledJobSpec.scalingStrategy.customScalingQueueLengthDeduction: must be between -1000000 and 1000000, got 1000001
sj | scalingStrategy: {strategy: custom, customScalingQueueLengthDeduction: $} | -1000001 | spec.scaledJobSpec.scalingStrategy.customScalingQueueLengthDeduction: must be between -1000000 and 1000000, got -1000001
"#;

/// Validates `fragment` placed as `at` says (see [`LIMITS`]).
fn validate_at(at: &str, fragment: &str) -> Result<()> {
    let none = BTreeMap::new();
    match at {
        "dso" => dso(&dso_spec(&format!("{{{fragment}, {TARGET}}}")), &none).map(drop),
        "so" => dso(
            &dso_spec(&format!("scaledObjectSpec: {{scaleTargetRef: {{name: web}}, {fragment}}}")),
            &none,
        )
        .map(drop),
        "dsj" => dsj(&dsj_spec(&format!("{{{fragment}, {JOB}}}")), &none).map(drop),
        "sj" => dsj(
            &dsj_spec(&format!(
                "scaledJobSpec: {{jobTargetRef: {{template: {{spec: {{containers: [{{name: c}}]}}}}}}, {fragment}}}"
            )),
            &none,
        )
        .map(drop),
        other => panic!("unknown place {other:?} in LIMITS"),
    }
}

#[test]
fn limits_accept_the_bound_and_refuse_beyond() {
    for line in LIMITS.lines().filter(|l| !l.trim().is_empty()) {
        let [at, fragment, value, expected] = line
            .split(" | ")
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or_else(|cols| panic!("4 columns expected: {cols:?}"));
        let fragment = fragment.replace('$', value);
        match (validate_at(at, &fragment), expected) {
            (Ok(()), "ok") => {}
            (Err(e), expected) if expected != "ok" => {
                let e = e.to_string();
                assert!(
                    e.starts_with(expected),
                    "{fragment}: {e:?} should start with {expected:?}"
                );
            }
            (got, _) => panic!("{at} {fragment}: got {got:?}, expected {expected}"),
        }
    }
    // The list length, for both kinds.
    let members = |n: usize| {
        let entries: Vec<String> = (0..n).map(|i| format!("{{name: m{i}}}")).collect();
        format!("memberClusters: [{}]", entries.join(", "))
    };
    for at in ["dso", "dsj"] {
        assert_eq!(validate_at(at, &members(MAX_MEMBERS)), Ok(()));
        assert_eq!(
            validate_at(at, &members(MAX_MEMBERS + 1)).map_err(|e| e.to_string()),
            Err("spec.memberClusters: must have at most 1000 entries, got 1001".to_owned())
        );
    }
}

#[test]
fn custom_percentage_that_does_not_parse_falls_back_to_basic() {
    let s = dsj(
        &dsj_spec(
            "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n  scalingStrategy: {strategy: \
             custom, customScalingRunningJobPercentage: half}",
        ),
        &BTreeMap::new(),
    )
    .expect("valid");
    assert_eq!(s.scaling, ScalingStrategyKind::Basic);
}

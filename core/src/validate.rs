//! Validation of DSO/DSJ specs and annotations into typed, defaulted settings.
//!
//! Every check names the field it refuses (`spec.memberClusters[2].weight: must be >= 0`),
//! and all problems of a spec are reported together. The planners only accept the typed
//! settings produced here, so they never see an invalid spec.

use std::collections::{BTreeMap, BTreeSet};
use std::num::IntErrorKind;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::crd::conditions::{ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS};
use crate::crd::dsj::{
    DEFAULT_FAILOVER_GRACE_PERIOD, DEFAULT_HARD_TAINT_DURATION, DEFAULT_SOFT_TAINT_DURATION,
    DistributedScaledJobSpec,
};
use crate::crd::dso::{DEFAULT_GRACE_PERIOD, DistributedScaledObjectSpec};
use crate::crd::keda::{DEFAULT_JOBS_HISTORY_LIMIT, ScaleTriggers, ScaledObjectSpec, trigger_key};
use crate::duration::{format_duration, parse_duration};
use crate::podmetrics;
use crate::time::elapsed;
use crate::{Error, Result};

pub use crate::limits::{
    MAX_COOLDOWN_PERIOD, MAX_DURATION, MAX_FAILURE_THRESHOLD, MAX_JOBS, MAX_MEMBERS,
    MAX_POLLING_INTERVAL, MAX_PRIORITY, MAX_QUEUE_LENGTH_DEDUCTION, MAX_REPLICAS,
    MAX_RUNNING_JOB_PERCENTAGE, MAX_TIER, MAX_TRIGGERS, MAX_WEIGHT,
};

/// How a resource is paused by its annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// Not paused.
    No,
    /// `autoscaling.keda.sh/paused: "true"`: nothing is changed in any member.
    Paused,
    /// `autoscaling.keda.sh/paused-replicas: N`: the total is fixed at N (DSO only); wins
    /// over `paused`.
    AtReplicas(u32),
}

/// One member of a DSO after defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsoMemberSettings {
    /// Member name.
    pub name: String,
    /// Static weight (default 1).
    pub weight: u32,
    /// Spill-over tier (default 0).
    pub tier: u32,
    /// Floor (default 0).
    pub min_replicas: u32,
    /// Ceiling (default none).
    pub max_replicas: Option<u32>,
}

/// A validated DSO spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsoSettings {
    /// Listed members in spec order; `None` means every registered member, weight 1.
    pub members: Option<Vec<DsoMemberSettings>>,
    /// `rebalancingPolicy.gracePeriod` (default 1m).
    pub grace_period: Duration,
    /// `rebalancingPolicy.maxRebalancePercentage` (default 50).
    pub max_rebalance_percentage: u32,
    /// `rebalancingPolicy.avoidDisruption` (default true).
    pub avoid_disruption: bool,
    /// `rebalancingPolicy.migrateUnschedulableAfter` (default off).
    pub migrate_unschedulable_after: Option<Duration>,
    /// `placement.dynamicWeights` (default false).
    pub dynamic_weights: bool,
    /// `scaledObjectSpec.minReplicaCount` (default 0).
    pub min_total: u32,
    /// `scaledObjectSpec.maxReplicaCount` (default 100).
    pub max_total: u32,
    /// Pause annotations.
    pub pause: Pause,
}

/// ScaledJob scaling strategy (`scalingStrategy.strategy`).
#[derive(Clone, Debug, PartialEq)]
pub enum ScalingStrategyKind {
    /// `basic` / `default`: desired - running.
    Basic,
    /// `pendingAware` (DSJ default): re-create pending Jobs elsewhere within capacity.
    PendingAware,
    /// `custom`: desired - deduction - running * percentage, capped at max.
    Custom {
        /// `customScalingQueueLengthDeduction`.
        deduction: i64,
        /// `customScalingRunningJobPercentage`.
        running_percentage: f64,
    },
    /// `accurate`: subtract pending unless over max.
    Accurate,
    /// `eager`: fill capacity up to desired.
    Eager,
}

/// `scalingStrategy.multipleScalersCalculation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultipleScalers {
    /// Largest trigger (default).
    Max,
    /// Smallest trigger.
    Min,
    /// Mean over active triggers.
    Avg,
    /// Sum over active triggers.
    Sum,
}

/// `clusterScheduling.strategy` with what it needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClusterStrategy {
    /// Smooth weighted round robin (default).
    #[default]
    WeightedRoundRobin,
    /// Highest priority not excluded by a taint.
    PriorityFailover {
        /// `workloadAffinity.class`.
        class: String,
        /// `workloadAffinity.size`.
        size: u32,
    },
}

/// `scaledJobSpec.rollout`: what an update of the DSJ does to the Jobs made from the
/// previous spec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rollout {
    /// `default`: delete them (they are re-created from the new spec), with this
    /// `propagationPolicy` for their pods.
    #[default]
    Replace,
    /// `gradual`: let them run; only new Jobs use the new spec.
    Gradual,
}

/// `scaledJobSpec.rollout.propagationPolicy`: how the pods of a Job deleted by a rollout go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    /// `background` (default): the Job goes at once, its pods after it.
    #[default]
    Background,
    /// `foreground`: the Job stays (being deleted) until its pods are gone.
    Foreground,
}

/// `failoverPolicy.duplicationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DuplicationPolicy {
    /// Keep source and failover Jobs (default).
    KeepAll,
    /// Delete the source once the failover Job is healthy.
    PreferFailover,
    /// Delete the failover Job once the source runs.
    PreferSource,
    /// Delete the source as soon as the failover Job is scheduled.
    ImmediateSourceCleanup,
}

/// Taint and stuck-Job timing of `failoverPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverTiming {
    /// Pending longer than this is stuck (default 1m).
    pub grace_period: Duration,
    /// Hard taint length (default 5m).
    pub hard_taint_duration: Duration,
    /// Escalation window (default 3m; zero = first failure is hard).
    pub soft_taint_duration: Duration,
}

impl FailoverTiming {
    /// Whether a Job pending since `pending_since` is stuck at `now`: pending for longer
    /// than the grace period.
    pub fn is_stuck(
        &self,
        pending_since: std::time::SystemTime,
        now: std::time::SystemTime,
    ) -> bool {
        elapsed(pending_since, now) > self.grace_period
    }
}

impl Default for FailoverTiming {
    fn default() -> Self {
        Self {
            grace_period: Duration::from_secs(60),
            hard_taint_duration: Duration::from_secs(300),
            soft_taint_duration: Duration::from_secs(180),
        }
    }
}

/// One member of a DSJ after defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsjMemberSettings {
    /// Member name.
    pub name: String,
    /// Weight under weightedRoundRobin (default 1).
    pub weight: u32,
    /// Priority under priorityFailover (required there).
    pub priority: Option<i32>,
}

/// A validated DSJ spec.
#[derive(Clone, Debug, PartialEq)]
pub struct DsjSettings {
    /// Listed members in spec order; `None` means every registered member, weight 1.
    pub members: Option<Vec<DsjMemberSettings>>,
    /// Cluster scheduling strategy.
    pub cluster_strategy: ClusterStrategy,
    /// Job scaling strategy.
    pub scaling: ScalingStrategyKind,
    /// How several triggers combine.
    pub multiple_scalers: MultipleScalers,
    /// `minReplicaCount` (lowered to max as KEDA does).
    pub min_jobs: u32,
    /// `maxReplicaCount` (default 100).
    pub max_jobs: u32,
    /// KEDA's `MaxReplicaCount()`, what the scaling strategies bound by:
    /// [`crate::dsj::scaling::keda_max`].
    pub strategy_max: u32,
    /// Taint timing.
    pub timing: FailoverTiming,
    /// Duplicate handling.
    pub duplication: DuplicationPolicy,
    /// `successfulJobsHistoryLimit` (default 100).
    pub successful_jobs_history_limit: u32,
    /// `failedJobsHistoryLimit` (default 100).
    pub failed_jobs_history_limit: u32,
    /// `rollout.strategy` (or the deprecated `rolloutStrategy`).
    pub rollout: Rollout,
    /// `rollout.propagationPolicy`.
    pub propagation: Propagation,
    /// Trigger keys (name, else type) in spec order.
    pub triggers: Vec<String>,
    /// Whether `autoscaling.keda.sh/paused` is set (paused-replicas means nothing for Jobs
    /// and is ignored).
    pub paused: bool,
}

/// Errors collected while validating one resource.
#[derive(Debug, Default)]
struct Problems(Vec<Error>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Error::invalid(field, message));
    }

    fn duration(&mut self, field: &str, value: Option<&str>, default: &str) -> Duration {
        let text = value.unwrap_or(default);
        match parse_duration(text) {
            Some(d) if d > MAX_DURATION => {
                self.add(
                    field,
                    format!(
                        "must be at most {} ({} days), got {text:?}",
                        format_duration(MAX_DURATION),
                        MAX_DURATION.as_secs() / 86_400
                    ),
                );
                MAX_DURATION
            }
            Some(d) => d,
            None => {
                self.add(
                    field,
                    format!("cannot parse duration {text:?} (use e.g. 30s, 1m, 1h30m)"),
                );
                Duration::ZERO
            }
        }
    }

    /// A count within `0..=max`; out of range, a problem and the nearest bound.
    fn count(&mut self, field: &str, value: i32, max: u32) -> u32 {
        match u32::try_from(value) {
            Err(_) => {
                self.add(field, format!("must be >= 0, got {value}"));
                0
            }
            Ok(n) if n > max => {
                self.add(field, format!("must be at most {max}, got {n}"));
                max
            }
            Ok(n) => n,
        }
    }

    /// A number that is not a count (seconds from 1, a signed deduction) within `range`.
    fn within(&mut self, field: &str, value: i32, range: RangeInclusive<i32>) {
        if !range.contains(&value) {
            self.add(
                field,
                format!(
                    "must be between {} and {}, got {value}",
                    range.start(),
                    range.end()
                ),
            );
        }
    }

    fn finish<T>(self, value: T) -> Result<T> {
        Error::collect(self.0).map(|()| value)
    }
}

/// Reads the pause annotations. `paused` accepts Go's boolean spellings; `paused-replicas`
/// must be an integer in `0..=MAX_REPLICAS` and wins over `paused`.
pub fn pause(annotations: &BTreeMap<String, String>) -> Result<Pause> {
    let field = |name: &str| format!("metadata.annotations[{name:?}]");
    if let Some(raw) = annotations.get(ANNOTATION_PAUSED_REPLICAS) {
        let refuse =
            |message: String| Err(Error::invalid(field(ANNOTATION_PAUSED_REPLICAS), message));
        let too_large = || refuse(format!("must be at most {MAX_REPLICAS}, got {raw:?}"));
        return match raw.trim().parse::<i64>() {
            Ok(n) if n < 0 => refuse(format!("must be a non-negative integer, got {raw:?}")),
            Ok(n) => match u32::try_from(n) {
                Ok(n) if n <= MAX_REPLICAS => Ok(Pause::AtReplicas(n)),
                _ => too_large(),
            },
            Err(e) if *e.kind() == IntErrorKind::PosOverflow => too_large(),
            Err(_) => refuse(format!("must be a non-negative integer, got {raw:?}")),
        };
    }
    match annotations.get(ANNOTATION_PAUSED).map(|v| v.trim()) {
        None => Ok(Pause::No),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(Pause::Paused),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(Pause::No),
        Some(other) => Err(Error::invalid(
            field(ANNOTATION_PAUSED),
            format!("must be \"true\" or \"false\", got {other:?}"),
        )),
    }
}

/// The length of `spec.memberClusters` and its names: not empty, no duplicates.
fn check_member_list<'a>(problems: &mut Problems, names: impl ExactSizeIterator<Item = &'a str>) {
    if names.len() > MAX_MEMBERS {
        problems.add(
            "spec.memberClusters",
            format!(
                "must have at most {MAX_MEMBERS} entries, got {}",
                names.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, name) in names.enumerate() {
        if name.is_empty() {
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                "must not be empty",
            );
        } else if !crate::limits::is_member_name(name) {
            // The schema refuses these; an object stored before it did still gets here.
            let shown: String = name.chars().take(80).collect();
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                format!(
                    "{shown:?}{} is not a member name (a lowercase RFC 1123 label of at most {} characters)",
                    if shown.len() < name.len() { "…" } else { "" },
                    crate::limits::MEMBER_NAME_MAX_LENGTH
                ),
            );
        } else if !seen.insert(name) {
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                format!("duplicate member {name:?}"),
            );
        }
    }
}

fn check_replica_bounds(problems: &mut Problems, prefix: &str, min: Option<i32>, max: Option<i32>) {
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        problems.add(
            format!("{prefix}.minReplicaCount"),
            format!("{min} is greater than maxReplicaCount {max}"),
        );
    }
}

/// Validates a DSO spec and its annotations.
pub fn dso(
    spec: &DistributedScaledObjectSpec,
    annotations: &BTreeMap<String, String>,
) -> Result<DsoSettings> {
    let mut p = Problems::default();
    let pause = pause(annotations).unwrap_or_else(|e| {
        p.0.push(e);
        Pause::No
    });
    check_member_list(&mut p, spec.member_clusters.iter().map(|m| m.name.as_str()));
    let mut members = Vec::with_capacity(spec.member_clusters.len());
    for (i, m) in spec.member_clusters.iter().enumerate() {
        let at = |f: &str| format!("spec.memberClusters[{i}].{f}");
        let weight = p.count(&at("weight"), m.weight.unwrap_or(1), MAX_WEIGHT);
        let tier = p.count(&at("tier"), m.tier, MAX_TIER);
        let min = m.min_replicas.unwrap_or(0);
        let min_replicas = p.count(&at("minReplicas"), min, MAX_REPLICAS);
        let max_replicas = m
            .max_replicas
            .map(|v| p.count(&at("maxReplicas"), v, MAX_REPLICAS));
        if let Some(max) = m.max_replicas
            && min > max
        {
            p.add(
                at("minReplicas"),
                format!("{min} is greater than maxReplicas {max}"),
            );
        }
        members.push(DsoMemberSettings {
            name: m.name.clone(),
            weight,
            tier,
            min_replicas,
            max_replicas,
        });
    }
    if !members.is_empty() && members.iter().all(|m| m.weight == 0) {
        p.add(
            "spec.memberClusters",
            "all weights are 0: at least one member needs a weight > 0",
        );
    }
    let policy = spec.rebalancing_policy.clone().unwrap_or_default();
    let grace_period = p.duration(
        "spec.rebalancingPolicy.gracePeriod",
        policy.grace_period.as_deref(),
        DEFAULT_GRACE_PERIOD,
    );
    let migrate_unschedulable_after = policy.migrate_unschedulable_after.as_deref().map(|v| {
        p.duration(
            "spec.rebalancingPolicy.migrateUnschedulableAfter",
            Some(v),
            v,
        )
    });
    let pct = policy.max_rebalance_percentage;
    if !(0..=100).contains(&pct) {
        p.add(
            "spec.rebalancingPolicy.maxRebalancePercentage",
            format!("must be between 0 and 100, got {pct}"),
        );
    }
    let so = &spec.scaled_object_spec;
    let (min_total, max_total) = check_scaled_object(&mut p, so);
    if let Some(total) = spec.total_target_replicas {
        p.count("spec.totalTargetReplicas", total, MAX_REPLICAS);
    }
    if so.scale_target_ref.name.is_empty() {
        p.add(
            "spec.scaledObjectSpec.scaleTargetRef.name",
            "must not be empty",
        );
    }
    check_dso_triggers(&mut p, &so.triggers);
    if let Some(modifiers) = so
        .advanced
        .as_ref()
        .and_then(|a| a.scaling_modifiers.as_ref())
    {
        check_metric_type(
            &mut p,
            "spec.scaledObjectSpec.advanced.scalingModifiers.metricType",
            modifiers.metric_type.as_deref(),
        );
    }
    p.finish(DsoSettings {
        members: (!members.is_empty()).then_some(members),
        grace_period,
        max_rebalance_percentage: u32::try_from(pct.clamp(0, 100)).unwrap_or(50),
        avoid_disruption: policy.avoid_disruption,
        migrate_unschedulable_after,
        dynamic_weights: spec.placement.as_ref().is_some_and(|pl| pl.dynamic_weights),
        min_total,
        max_total,
        pause,
    })
}

/// The counts and periods of the embedded ScaledObject spec; returns the total's bounds.
fn check_scaled_object(p: &mut Problems, so: &ScaledObjectSpec) -> (u32, u32) {
    let at = |f: &str| format!("spec.scaledObjectSpec.{f}");
    let min = p.count(&at("minReplicaCount"), so.min_replicas(), MAX_REPLICAS);
    let max = p.count(&at("maxReplicaCount"), so.max_replicas(), MAX_REPLICAS);
    check_replica_bounds(
        p,
        "spec.scaledObjectSpec",
        so.min_replica_count,
        so.max_replica_count,
    );
    if let Some(idle) = so.idle_replica_count {
        p.count(&at("idleReplicaCount"), idle, MAX_REPLICAS);
    }
    if let Some(interval) = so.polling_interval {
        p.within(&at("pollingInterval"), interval, 1..=MAX_POLLING_INTERVAL);
    }
    if let Some(cooldown) = so.cooldown_period {
        p.count(&at("cooldownPeriod"), cooldown, MAX_COOLDOWN_PERIOD);
    }
    if let Some(cooldown) = so.initial_cooldown_period {
        p.count(&at("initialCooldownPeriod"), cooldown, MAX_COOLDOWN_PERIOD);
    }
    if let Some(fallback) = &so.fallback {
        p.within(
            &at("fallback.failureThreshold"),
            fallback.failure_threshold,
            1..=MAX_FAILURE_THRESHOLD,
        );
        p.count(&at("fallback.replicas"), fallback.replicas, MAX_REPLICAS);
    }
    (min, max)
}

fn check_metric_type(p: &mut Problems, field: &str, metric_type: Option<&str>) {
    match metric_type {
        None | Some("AverageValue" | "Utilization") => {}
        Some("Value") => p.add(
            field,
            "Value is not supported for a DistributedScaledObject: the HPA would divide by the \
             pods its selector finds in the hub, and there are none; use AverageValue",
        ),
        Some(other) => p.add(
            field,
            format!("unknown metricType {other:?} (expected AverageValue or Utilization)"),
        ),
    }
}

fn check_dso_triggers(p: &mut Problems, triggers: &[ScaleTriggers]) {
    for (i, t) in triggers.iter().enumerate() {
        let at = |f: &str| format!("spec.scaledObjectSpec.triggers[{i}].{f}");
        if t.type_.is_empty() {
            p.add(at("type"), "must not be empty");
        }
        if t.type_ == podmetrics::TRIGGER_TYPE {
            check_pod_metrics_trigger(p, &format!("spec.scaledObjectSpec.triggers[{i}]"), t);
        } else {
            check_metric_type(p, &at("metricType"), t.metric_type.as_deref());
        }
    }
}

/// A `kedge-pod-metrics` trigger: its settings parse, and it leaves to the hub what the hub
/// manages (the metric type its scaler serves and the authentication KEDA calls it with).
fn check_pod_metrics_trigger(p: &mut Problems, at: &str, t: &ScaleTriggers) {
    if let Err(e) = podmetrics::PodMetricsTrigger::parse(at, &t.metadata) {
        match e {
            Error::Many(all) => p.0.extend(all),
            one => p.0.push(one),
        }
    }
    match t.metric_type.as_deref() {
        None | Some("AverageValue") => {}
        Some(other) => p.add(
            format!("{at}.metricType"),
            format!(
                "{other} is not supported for a {} trigger: the hub serves the fleet's per-pod \
                 average as an AverageValue metric; omit metricType",
                podmetrics::TRIGGER_TYPE
            ),
        ),
    }
    if t.authentication_ref.is_some() {
        p.add(
            format!("{at}.authenticationRef"),
            format!(
                "must be omitted for a {} trigger: the hub manages the credentials KEDA calls \
                 its scaler with",
                podmetrics::TRIGGER_TYPE
            ),
        );
    }
}

fn check_trigger_keys(p: &mut Problems, prefix: &str, triggers: &[ScaleTriggers]) -> Vec<String> {
    if triggers.len() > MAX_TRIGGERS {
        p.add(
            format!("{prefix}.triggers"),
            format!("at most {MAX_TRIGGERS} triggers, got {}", triggers.len()),
        );
    }
    let mut seen = BTreeSet::new();
    let mut keys = Vec::with_capacity(triggers.len());
    for (i, t) in triggers.iter().enumerate() {
        if t.type_.is_empty() {
            p.add(format!("{prefix}.triggers[{i}].type"), "must not be empty");
        }
        if t.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            p.add(
                format!("{prefix}.triggers[{i}].name"),
                "must not be empty (omit it to key the trigger by its type)",
            );
        }
        let key = trigger_key(t);
        if !seen.insert(key.to_owned()) {
            p.add(
                format!("{prefix}.triggers[{i}].name"),
                format!("duplicate trigger {key:?}: give each trigger a distinct name"),
            );
        }
        keys.push(key.to_owned());
    }
    keys
}

/// Parses a scaling strategy name (`scalingStrategy.strategy`).
fn scaling_strategy(p: &mut Problems, spec: &DistributedScaledJobSpec) -> ScalingStrategyKind {
    let strategy = spec
        .scaled_job_spec
        .scaling_strategy
        .clone()
        .unwrap_or_default();
    let prefix = "spec.scaledJobSpec.scalingStrategy";
    if let Some(deduction) = strategy.custom_scaling_queue_length_deduction {
        p.within(
            &format!("{prefix}.customScalingQueueLengthDeduction"),
            deduction,
            -MAX_QUEUE_LENGTH_DEDUCTION..=MAX_QUEUE_LENGTH_DEDUCTION,
        );
    }
    // The reference: a percentage that does not parse falls back to the basic strategy.
    // One that parses is a number kedge computes with, so it must be in range.
    let raw_percentage = strategy.custom_scaling_running_job_percentage.as_deref();
    let percentage = raw_percentage.map(|s| s.trim().parse::<f64>().ok());
    if let (Some(raw), Some(Some(pct))) = (raw_percentage, percentage)
        && !(0.0..=MAX_RUNNING_JOB_PERCENTAGE).contains(&pct)
    {
        p.add(
            format!("{prefix}.customScalingRunningJobPercentage"),
            format!("must be a number between 0 and {MAX_RUNNING_JOB_PERCENTAGE}, got {raw:?}"),
        );
    }
    match strategy.strategy.as_deref() {
        None | Some("pendingAware") => ScalingStrategyKind::PendingAware,
        Some("basic" | "default") => ScalingStrategyKind::Basic,
        Some("accurate") => ScalingStrategyKind::Accurate,
        Some("eager") => ScalingStrategyKind::Eager,
        Some("custom") => {
            let deduction = i64::from(strategy.custom_scaling_queue_length_deduction.unwrap_or(0));
            match percentage {
                Some(Some(pct)) => ScalingStrategyKind::Custom {
                    deduction,
                    running_percentage: pct,
                },
                // KEDA (and the reference): no percentage that parses, the default strategy.
                _ => ScalingStrategyKind::Basic,
            }
        }
        Some(other) => {
            p.add(
                "spec.scaledJobSpec.scalingStrategy.strategy",
                format!(
                    "unknown strategy {other:?} (expected one of basic, default, pendingAware, \
                     custom, accurate, eager)"
                ),
            );
            ScalingStrategyKind::PendingAware
        }
    }
}

/// Validates a DSJ spec and its annotations.
pub fn dsj(
    spec: &DistributedScaledJobSpec,
    annotations: &BTreeMap<String, String>,
) -> Result<DsjSettings> {
    let mut p = Problems::default();
    // paused-replicas has no meaning for Jobs, but an invalid value is still refused so a
    // typo does not go unnoticed.
    let paused = match pause(annotations) {
        Ok(pause) => pause != Pause::No,
        Err(e) => {
            p.0.push(e);
            false
        }
    };
    check_member_list(&mut p, spec.member_clusters.iter().map(|m| m.name.as_str()));
    let mut members = Vec::with_capacity(spec.member_clusters.len());
    for (i, m) in spec.member_clusters.iter().enumerate() {
        let weight = p.count(
            &format!("spec.memberClusters[{i}].weight"),
            m.weight.unwrap_or(1),
            MAX_WEIGHT,
        );
        members.push(DsjMemberSettings {
            name: m.name.clone(),
            weight,
            priority: m.scheduling.as_ref().and_then(|s| s.priority),
        });
        if let Some(priority) = m.scheduling.as_ref().and_then(|s| s.priority)
            && !(0..=MAX_PRIORITY).contains(&priority)
        {
            p.add(
                format!("spec.memberClusters[{i}].scheduling.priority"),
                format!("must be between 0 and {MAX_PRIORITY}, got {priority}"),
            );
        }
    }
    let scheduling = spec.cluster_scheduling.clone().unwrap_or_default();
    if scheduling.workload_affinity.is_some()
        && scheduling.strategy.as_deref() != Some("priorityFailover")
    {
        p.add(
            "spec.clusterScheduling.workloadAffinity",
            "only used with strategy priorityFailover; remove it or set the strategy",
        );
    }
    let scaling = scaling_strategy(&mut p, spec);
    let cluster_strategy = match scheduling.strategy.as_deref() {
        None | Some("weightedRoundRobin") => {
            if !members.is_empty() && members.iter().all(|m| m.weight == 0) {
                p.add(
                    "spec.memberClusters",
                    "all weights are 0: at least one member needs a weight > 0",
                );
            }
            ClusterStrategy::WeightedRoundRobin
        }
        Some("priorityFailover") => {
            if members.is_empty() {
                p.add(
                    "spec.memberClusters",
                    "priorityFailover needs every member listed with scheduling.priority",
                );
            }
            for (i, m) in members.iter().enumerate() {
                if m.priority.is_none() {
                    p.add(
                        format!("spec.memberClusters[{i}].scheduling.priority"),
                        "required for every member with priorityFailover",
                    );
                }
            }
            if scaling != ScalingStrategyKind::PendingAware {
                p.add(
                    "spec.scaledJobSpec.scalingStrategy.strategy",
                    "priorityFailover supports only pendingAware (or an omitted strategy)",
                );
            }
            match scheduling.workload_affinity {
                None => {
                    p.add(
                        "spec.clusterScheduling.workloadAffinity",
                        "required with priorityFailover",
                    );
                    ClusterStrategy::WeightedRoundRobin
                }
                Some(affinity) => {
                    if affinity.class.is_empty() {
                        p.add(
                            "spec.clusterScheduling.workloadAffinity.class",
                            "must not be empty",
                        );
                    }
                    let size = p.count(
                        "spec.clusterScheduling.workloadAffinity.size",
                        affinity.size,
                        MAX_JOBS,
                    );
                    ClusterStrategy::PriorityFailover {
                        class: affinity.class,
                        size,
                    }
                }
            }
        }
        Some(other) => {
            p.add(
                "spec.clusterScheduling.strategy",
                format!(
                    "unknown strategy {other:?} (expected weightedRoundRobin or priorityFailover)"
                ),
            );
            ClusterStrategy::WeightedRoundRobin
        }
    };
    let failover = scheduling.failover_policy.unwrap_or_default();
    let prefix = "spec.clusterScheduling.failoverPolicy";
    let timing = FailoverTiming {
        grace_period: p.duration(
            &format!("{prefix}.gracePeriod"),
            failover.grace_period.as_deref(),
            DEFAULT_FAILOVER_GRACE_PERIOD,
        ),
        hard_taint_duration: p.duration(
            &format!("{prefix}.hardTaintDuration"),
            failover.hard_taint_duration.as_deref(),
            DEFAULT_HARD_TAINT_DURATION,
        ),
        soft_taint_duration: p.duration(
            &format!("{prefix}.softTaintDuration"),
            failover.soft_taint_duration.as_deref(),
            DEFAULT_SOFT_TAINT_DURATION,
        ),
    };
    let duplication = match failover.duplication_policy.as_deref() {
        None | Some("keepAll") => DuplicationPolicy::KeepAll,
        Some("preferFailover") => DuplicationPolicy::PreferFailover,
        Some("preferSource") => DuplicationPolicy::PreferSource,
        Some("immediateSourceCleanup") => DuplicationPolicy::ImmediateSourceCleanup,
        Some(other) => {
            p.add(
                format!("{prefix}.duplicationPolicy"),
                format!(
                    "unknown policy {other:?} (expected keepAll, preferFailover, preferSource or \
                     immediateSourceCleanup)"
                ),
            );
            DuplicationPolicy::KeepAll
        }
    };
    let sj = &spec.scaled_job_spec;
    let multiple_scalers = match sj
        .scaling_strategy
        .as_ref()
        .and_then(|s| s.multiple_scalers_calculation.as_deref())
    {
        None | Some("max") => MultipleScalers::Max,
        Some("min") => MultipleScalers::Min,
        Some("avg") => MultipleScalers::Avg,
        Some("sum") => MultipleScalers::Sum,
        Some(other) => {
            p.add(
                "spec.scaledJobSpec.scalingStrategy.multipleScalersCalculation",
                format!("unknown calculation {other:?} (expected max, min, avg or sum)"),
            );
            MultipleScalers::Max
        }
    };
    // `rollout.strategy` wins over the deprecated `rolloutStrategy`, as in KEDA.
    let (rollout_field, rollout_text) =
        match sj.rollout.as_ref().and_then(|r| r.strategy.as_deref()) {
            Some(s) => ("spec.scaledJobSpec.rollout.strategy", Some(s)),
            None => (
                "spec.scaledJobSpec.rolloutStrategy",
                sj.rollout_strategy.as_deref(),
            ),
        };
    let rollout = match rollout_text {
        None | Some("default") => Rollout::Replace,
        Some("gradual") => Rollout::Gradual,
        Some(other) => {
            p.add(
                rollout_field,
                format!("unknown strategy {other:?} (expected default or gradual)"),
            );
            Rollout::Replace
        }
    };
    let propagation = match sj
        .rollout
        .as_ref()
        .and_then(|r| r.propagation_policy.as_deref())
    {
        None | Some("background") => Propagation::Background,
        Some("foreground") => Propagation::Foreground,
        Some(other) => {
            p.add(
                "spec.scaledJobSpec.rollout.propagationPolicy",
                format!("unknown policy {other:?} (expected background or foreground)"),
            );
            Propagation::Background
        }
    };
    let max_jobs = p.count(
        "spec.scaledJobSpec.maxReplicaCount",
        sj.max_replicas(),
        MAX_JOBS,
    );
    // KEDA lowers minReplicaCount to maxReplicaCount instead of refusing it.
    let min_jobs = p
        .count(
            "spec.scaledJobSpec.minReplicaCount",
            sj.min_replica_count.unwrap_or(0),
            MAX_JOBS,
        )
        .min(max_jobs);
    let successful_jobs_history_limit = p.count(
        "spec.scaledJobSpec.successfulJobsHistoryLimit",
        sj.successful_jobs_history_limit
            .unwrap_or(DEFAULT_JOBS_HISTORY_LIMIT),
        MAX_JOBS,
    );
    let failed_jobs_history_limit = p.count(
        "spec.scaledJobSpec.failedJobsHistoryLimit",
        sj.failed_jobs_history_limit
            .unwrap_or(DEFAULT_JOBS_HISTORY_LIMIT),
        MAX_JOBS,
    );
    if let Some(interval) = sj.polling_interval {
        p.within(
            "spec.scaledJobSpec.pollingInterval",
            interval,
            1..=MAX_POLLING_INTERVAL,
        );
    }
    let containers = sj
        .job_target_ref
        .template
        .spec
        .as_ref()
        .map_or(0, |pod| pod.containers.len());
    if containers == 0 {
        p.add(
            "spec.scaledJobSpec.jobTargetRef.template.spec.containers",
            "at least one container is required",
        );
    }
    let triggers = check_trigger_keys(&mut p, "spec.scaledJobSpec", &sj.triggers);
    p.finish(DsjSettings {
        members: (!members.is_empty()).then_some(members),
        cluster_strategy,
        scaling,
        multiple_scalers,
        min_jobs,
        max_jobs,
        strategy_max: crate::dsj::scaling::keda_max(
            sj.max_replica_count.map(|_| max_jobs),
            sj.min_replica_count
                .and_then(|m| u32::try_from(m).ok())
                .unwrap_or(0),
        ),
        timing,
        duplication,
        successful_jobs_history_limit,
        failed_jobs_history_limit,
        rollout,
        propagation,
        triggers,
        paused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DistributedScaledJobSpec;

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
    const JOB: &str =
        "scaledJobSpec: {jobTargetRef: {template: {spec: {containers: [{name: c}]}}}}";

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
                "spec.clusterScheduling.strategy: unknown strategy \"roundRobin\"",
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
                "spec.clusterScheduling.failoverPolicy.duplicationPolicy: unknown policy",
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
            err.contains(
                "spec.scaledJobSpec.scalingStrategy.strategy: unknown strategy \"fastest\""
            )
        );
        assert!(err.contains("spec.scaledJobSpec.scalingStrategy.multipleScalersCalculation"));
        let err = dsj_error(
            "scaledJobSpec:\n  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}\n  \
             rolloutStrategy: slow\n  rollout: {propagationPolicy: orphan}",
        );
        assert!(
            err.contains("spec.scaledJobSpec.rolloutStrategy: unknown strategy \"slow\""),
            "{err}"
        );
        assert!(
            err.contains("spec.scaledJobSpec.rollout.propagationPolicy: unknown policy \"orphan\""),
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
}

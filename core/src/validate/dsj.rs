//! A DSJ's spec and annotations into [`DsjSettings`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Result;
use crate::crd::dsj::{
    DEFAULT_FAILOVER_GRACE_PERIOD, DEFAULT_HARD_TAINT_DURATION, DEFAULT_SOFT_TAINT_DURATION,
    DistributedScaledJobSpec,
};
use crate::crd::keda::{DEFAULT_JOBS_HISTORY_LIMIT, ScaledJobSpec};
use crate::limits::{
    MAX_JOBS, MAX_POLLING_INTERVAL, MAX_PRIORITY, MAX_QUEUE_LENGTH_DEDUCTION,
    MAX_RUNNING_JOB_PERCENTAGE, MAX_WEIGHT,
};
use crate::time::elapsed;

use super::{
    MultipleScalers, Pause, Problems, ScalingStrategyKind, check_member_list, check_trigger_keys,
    pause,
};

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
    let members = members(&mut p, spec);
    let scaling = scaling_strategy(&mut p, spec);
    let cluster_strategy = cluster_strategy(&mut p, spec, &members, &scaling);
    let (timing, duplication) = failover(&mut p, spec);
    let sj = &spec.scaled_job_spec;
    let (rollout, propagation) = rollout(&mut p, sj);
    let (min_jobs, max_jobs) = job_counts(&mut p, sj);
    let history = |p: &mut Problems, field: &str, limit: Option<i32>| {
        p.count(
            &format!("spec.scaledJobSpec.{field}"),
            limit.unwrap_or(DEFAULT_JOBS_HISTORY_LIMIT),
            MAX_JOBS,
        )
    };
    let successful_jobs_history_limit = history(
        &mut p,
        "successfulJobsHistoryLimit",
        sj.successful_jobs_history_limit,
    );
    let failed_jobs_history_limit = history(
        &mut p,
        "failedJobsHistoryLimit",
        sj.failed_jobs_history_limit,
    );
    check_job_template(&mut p, sj);
    let multiple_scalers = p.choice(
        "spec.scaledJobSpec.scalingStrategy.multipleScalersCalculation",
        "calculation",
        sj.scaling_strategy
            .as_ref()
            .and_then(|s| s.multiple_scalers_calculation.as_deref()),
        MultipleScalers::Max,
        &[
            ("max", MultipleScalers::Max),
            ("min", MultipleScalers::Min),
            ("avg", MultipleScalers::Avg),
            ("sum", MultipleScalers::Sum),
        ],
    );
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

/// `memberClusters`: names, weights and priorities.
fn members(p: &mut Problems, spec: &DistributedScaledJobSpec) -> Vec<DsjMemberSettings> {
    check_member_list(p, spec.member_clusters.iter().map(|m| m.name.as_str()));
    let mut members = Vec::with_capacity(spec.member_clusters.len());
    for (i, m) in spec.member_clusters.iter().enumerate() {
        let weight = p.count(
            &format!("spec.memberClusters[{i}].weight"),
            m.weight.unwrap_or(1),
            MAX_WEIGHT,
        );
        let priority = m.scheduling.as_ref().and_then(|s| s.priority);
        if let Some(priority) = priority
            && !(0..=MAX_PRIORITY).contains(&priority)
        {
            p.add(
                format!("spec.memberClusters[{i}].scheduling.priority"),
                format!("must be between 0 and {MAX_PRIORITY}, got {priority}"),
            );
        }
        members.push(DsjMemberSettings {
            name: m.name.clone(),
            weight,
            priority,
        });
    }
    members
}

/// `clusterScheduling.strategy` and what it requires of the members and the scaling
/// strategy.
fn cluster_strategy(
    p: &mut Problems,
    spec: &DistributedScaledJobSpec,
    members: &[DsjMemberSettings],
    scaling: &ScalingStrategyKind,
) -> ClusterStrategy {
    let scheduling = spec.cluster_scheduling.clone().unwrap_or_default();
    let priority_failover = scheduling.strategy.as_deref() == Some("priorityFailover");
    if scheduling.workload_affinity.is_some() && !priority_failover {
        p.add(
            "spec.clusterScheduling.workloadAffinity",
            "only used with strategy priorityFailover; remove it or set the strategy",
        );
    }
    let priority_failover = p.choice(
        "spec.clusterScheduling.strategy",
        "strategy",
        scheduling.strategy.as_deref(),
        false,
        &[("weightedRoundRobin", false), ("priorityFailover", true)],
    );
    if !priority_failover {
        if !members.is_empty() && members.iter().all(|m| m.weight == 0) {
            p.add(
                "spec.memberClusters",
                "all weights are 0: at least one member needs a weight > 0",
            );
        }
        return ClusterStrategy::WeightedRoundRobin;
    }
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
    if *scaling != ScalingStrategyKind::PendingAware {
        p.add(
            "spec.scaledJobSpec.scalingStrategy.strategy",
            "priorityFailover supports only pendingAware (or an omitted strategy)",
        );
    }
    let Some(affinity) = scheduling.workload_affinity else {
        p.add(
            "spec.clusterScheduling.workloadAffinity",
            "required with priorityFailover",
        );
        return ClusterStrategy::WeightedRoundRobin;
    };
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

/// `clusterScheduling.failoverPolicy`: its three durations and the duplication policy.
fn failover(
    p: &mut Problems,
    spec: &DistributedScaledJobSpec,
) -> (FailoverTiming, DuplicationPolicy) {
    let failover = spec
        .cluster_scheduling
        .as_ref()
        .and_then(|s| s.failover_policy.clone())
        .unwrap_or_default();
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
    let duplication = p.choice(
        &format!("{prefix}.duplicationPolicy"),
        "policy",
        failover.duplication_policy.as_deref(),
        DuplicationPolicy::KeepAll,
        &[
            ("keepAll", DuplicationPolicy::KeepAll),
            ("preferFailover", DuplicationPolicy::PreferFailover),
            ("preferSource", DuplicationPolicy::PreferSource),
            (
                "immediateSourceCleanup",
                DuplicationPolicy::ImmediateSourceCleanup,
            ),
        ],
    );
    (timing, duplication)
}

/// `rollout` (or the deprecated `rolloutStrategy`, which `rollout.strategy` wins over, as in
/// KEDA) and its propagation policy.
fn rollout(p: &mut Problems, sj: &ScaledJobSpec) -> (Rollout, Propagation) {
    let (field, text) = match sj.rollout.as_ref().and_then(|r| r.strategy.as_deref()) {
        Some(s) => ("spec.scaledJobSpec.rollout.strategy", Some(s)),
        None => (
            "spec.scaledJobSpec.rolloutStrategy",
            sj.rollout_strategy.as_deref(),
        ),
    };
    let rollout = p.choice(
        field,
        "strategy",
        text,
        Rollout::Replace,
        &[("default", Rollout::Replace), ("gradual", Rollout::Gradual)],
    );
    let propagation = p.choice(
        "spec.scaledJobSpec.rollout.propagationPolicy",
        "policy",
        sj.rollout
            .as_ref()
            .and_then(|r| r.propagation_policy.as_deref()),
        Propagation::Background,
        &[
            ("background", Propagation::Background),
            ("foreground", Propagation::Foreground),
        ],
    );
    (rollout, propagation)
}

/// `minReplicaCount` and `maxReplicaCount` as counts; KEDA lowers the minimum to the maximum
/// instead of refusing it.
fn job_counts(p: &mut Problems, sj: &ScaledJobSpec) -> (u32, u32) {
    let max_jobs = p.count(
        "spec.scaledJobSpec.maxReplicaCount",
        sj.max_replicas(),
        MAX_JOBS,
    );
    let min_jobs = p
        .count(
            "spec.scaledJobSpec.minReplicaCount",
            sj.min_replica_count.unwrap_or(0),
            MAX_JOBS,
        )
        .min(max_jobs);
    (min_jobs, max_jobs)
}

/// `pollingInterval` within its bounds, and a Job template with at least one container.
fn check_job_template(p: &mut Problems, sj: &ScaledJobSpec) {
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
}

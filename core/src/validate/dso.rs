//! A DSO's spec and annotations into [`DsoSettings`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::crd::dso::{DEFAULT_GRACE_PERIOD, DistributedScaledObjectSpec};
use crate::crd::keda::{ScaleTriggers, ScaledObjectSpec};
use crate::limits::{
    MAX_COOLDOWN_PERIOD, MAX_FAILURE_THRESHOLD, MAX_POLLING_INTERVAL, MAX_REPLICAS, MAX_TIER,
    MAX_WEIGHT,
};
use crate::podmetrics;
use crate::{Error, Result};

use super::{Pause, Problems, check_member_list, check_replica_bounds, pause};

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

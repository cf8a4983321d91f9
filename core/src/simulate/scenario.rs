//! The scenario file of `kubectl kedge simulate`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use crate::crd::conditions::MemberPhase;
use crate::crd::{DistributedScaledJobSpec, DistributedScaledObjectSpec};
use crate::duration::parse_duration;
use crate::{Error, Result};

/// Kind string of a DSO scenario.
pub const KIND_DSO: &str = "DistributedScaledObject";
/// Kind string of a DSJ scenario.
pub const KIND_DSJ: &str = "DistributedScaledJob";

/// Optional metadata of a scenario: the resource's annotations (pause).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioMetadata {
    /// Name, for display only.
    #[serde(default)]
    pub name: Option<String>,
    /// Annotations such as `autoscaling.keda.sh/paused`.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A member as given in `members` (all fields) or in a step's `members` (overrides: only
/// the fields given change).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioMember {
    /// Member name.
    pub name: String,
    /// `Ready` (default) or `Unreachable`.
    #[serde(default)]
    pub state: Option<String>,
    /// How long it has been unreachable at this step (grows by `interval` each step).
    #[serde(default)]
    pub unreachable_for: Option<String>,
    /// DSO: replicas running there.
    #[serde(default)]
    pub current_replicas: Option<u32>,
    /// DSO: of those, replicas whose pods are unschedulable.
    #[serde(default)]
    pub unschedulable_replicas: Option<u32>,
    /// DSO: how long they have been unschedulable (grows by `interval`; default 0s).
    #[serde(default)]
    pub unschedulable_for: Option<String>,
    /// DSO: replicas of this workload the member can run in total.
    #[serde(default)]
    pub capacity_replicas: Option<u32>,
    /// DSJ: Jobs whose pods run.
    #[serde(default)]
    pub running_jobs: Option<u32>,
    /// DSJ: Jobs whose pods do not run yet.
    #[serde(default)]
    pub pending_jobs: Option<u32>,
    /// DSJ: how long those pending Jobs have been pending (default 0s).
    #[serde(default)]
    pub pending_for: Option<String>,
    /// DSJ: whether new Jobs start running (default true); `false` keeps them pending,
    /// as in a member without room.
    #[serde(default)]
    pub accepts_jobs: Option<bool>,
    /// DSJ: whether Job create calls fail there (default false).
    #[serde(default)]
    pub fail_creates: Option<bool>,
}

/// One trigger reading in a DSJ step.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepMetric {
    /// Current value (e.g. queue length).
    pub value: f64,
    /// Target average value per Job.
    pub target: f64,
}

/// One step.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    /// DSO: the fleet-wide total (`spec.totalTargetReplicas`) at this step.
    #[serde(default)]
    pub replicas: Option<u32>,
    /// DSJ: trigger name → reading; omitted = same as the previous step.
    #[serde(default)]
    pub metrics: Option<BTreeMap<String, StepMetric>>,
    /// Member fields that change from this step on.
    #[serde(default)]
    pub members: Vec<ScenarioMember>,
    /// Annotations that replace the scenario's from this step on.
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A scenario with its spec typed by kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario<S> {
    /// `DistributedScaledObject` or `DistributedScaledJob`.
    pub kind: String,
    /// Optional `apiVersion`, accepted so a resource file can be reused.
    #[serde(default)]
    pub api_version: Option<String>,
    /// Optional name and annotations.
    #[serde(default)]
    pub metadata: ScenarioMetadata,
    /// Time between steps (default `30s`).
    #[serde(default)]
    pub interval: Option<String>,
    /// The resource's spec.
    pub spec: S,
    /// The members at the start.
    pub members: Vec<ScenarioMember>,
    /// The steps, run in order.
    pub steps: Vec<Step>,
}

/// A parsed scenario of either kind.
#[derive(Clone, Debug)]
pub enum AnyScenario {
    /// A DSO scenario.
    Dso(Box<Scenario<DistributedScaledObjectSpec>>),
    /// A DSJ scenario.
    Dsj(Box<Scenario<DistributedScaledJobSpec>>),
}

#[derive(Deserialize)]
struct KindOnly {
    kind: Option<String>,
}

/// Parses a scenario from YAML (or JSON) text and checks what does not depend on the
/// spec: kind, member names and states, durations, step fields for the kind.
pub fn parse(text: &str) -> Result<AnyScenario> {
    let syntax = |e: serde_yaml::Error| Error::ScenarioSyntax(e.to_string());
    let kind: KindOnly = serde_yaml::from_str(text).map_err(syntax)?;
    let scenario = match kind.kind.as_deref() {
        Some(KIND_DSO) => AnyScenario::Dso(serde_yaml::from_str(text).map_err(syntax)?),
        Some(KIND_DSJ) => AnyScenario::Dsj(serde_yaml::from_str(text).map_err(syntax)?),
        Some(other) => {
            return Err(Error::invalid(
                "kind",
                format!("unknown kind {other:?} (expected {KIND_DSO} or {KIND_DSJ})"),
            ));
        }
        None => {
            return Err(Error::invalid(
                "kind",
                format!("required ({KIND_DSO} or {KIND_DSJ})"),
            ));
        }
    };
    match &scenario {
        AnyScenario::Dso(s) => check(s, true)?,
        AnyScenario::Dsj(s) => check(s, false)?,
    }
    Ok(scenario)
}

/// Parses a duration field of a scenario.
pub(crate) fn duration(field: &str, value: Option<&str>) -> Result<Option<Duration>> {
    value
        .map(|v| {
            parse_duration(v).ok_or_else(|| {
                Error::invalid(
                    field,
                    format!("cannot parse duration {v:?} (use e.g. 30s, 1m)"),
                )
            })
        })
        .transpose()
}

/// A member `state` a scenario may set. The planners tell Ready from every other state, so
/// `Ready` and `Unreachable` are the two a scenario needs.
pub(crate) fn member_state(state: &str) -> std::result::Result<MemberPhase, String> {
    state
        .parse::<MemberPhase>()
        .ok()
        .filter(|p| matches!(p, MemberPhase::Ready | MemberPhase::Unreachable))
        .ok_or_else(|| format!("unknown state {state:?} (expected Ready or Unreachable)"))
}

fn check_member(field: &str, m: &ScenarioMember, dso: bool, errors: &mut Vec<Error>) {
    if m.name.is_empty() {
        errors.push(Error::invalid(format!("{field}.name"), "must not be empty"));
    }
    if let Some(Err(e)) = m.state.as_deref().map(member_state) {
        errors.push(Error::invalid(format!("{field}.state"), e));
    }
    for (name, value) in [
        ("unreachableFor", &m.unreachable_for),
        ("unschedulableFor", &m.unschedulable_for),
        ("pendingFor", &m.pending_for),
    ] {
        if let Err(e) = duration(&format!("{field}.{name}"), value.as_deref()) {
            errors.push(e);
        }
    }
    let (wrong, kind) = if dso {
        (
            [
                ("runningJobs", m.running_jobs.is_some()),
                ("pendingJobs", m.pending_jobs.is_some()),
                ("pendingFor", m.pending_for.is_some()),
                ("acceptsJobs", m.accepts_jobs.is_some()),
                ("failCreates", m.fail_creates.is_some()),
            ]
            .to_vec(),
            KIND_DSO,
        )
    } else {
        (
            [
                ("currentReplicas", m.current_replicas.is_some()),
                ("unschedulableReplicas", m.unschedulable_replicas.is_some()),
                ("unschedulableFor", m.unschedulable_for.is_some()),
                ("capacityReplicas", m.capacity_replicas.is_some()),
            ]
            .to_vec(),
            KIND_DSJ,
        )
    };
    for (name, set) in wrong {
        if set {
            errors.push(Error::invalid(
                format!("{field}.{name}"),
                format!("not a field of a {kind} member"),
            ));
        }
    }
    if let (Some(current), Some(unschedulable)) = (m.current_replicas, m.unschedulable_replicas)
        && unschedulable > current
    {
        errors.push(Error::invalid(
            format!("{field}.unschedulableReplicas"),
            format!("{unschedulable} is more than currentReplicas {current}"),
        ));
    }
}

fn check<S>(s: &Scenario<S>, dso: bool) -> Result<()> {
    let mut errors = Vec::new();
    if let Err(e) = duration("interval", s.interval.as_deref()) {
        errors.push(e);
    }
    let mut names = BTreeSet::new();
    for (i, m) in s.members.iter().enumerate() {
        let field = format!("members[{i}]");
        check_member(&field, m, dso, &mut errors);
        if !names.insert(m.name.as_str()) {
            errors.push(Error::invalid(
                format!("{field}.name"),
                format!("duplicate member {:?}", m.name),
            ));
        }
    }
    if s.steps.is_empty() {
        errors.push(Error::invalid("steps", "at least one step is required"));
    }
    for (i, step) in s.steps.iter().enumerate() {
        let field = format!("steps[{i}]");
        if dso {
            if step.replicas.is_none() {
                errors.push(Error::invalid(
                    format!("{field}.replicas"),
                    "required for a DistributedScaledObject step",
                ));
            }
            if step.metrics.is_some() {
                errors.push(Error::invalid(
                    format!("{field}.metrics"),
                    "a DistributedScaledObject step sets replicas, not metrics",
                ));
            }
        } else {
            if step.replicas.is_some() {
                errors.push(Error::invalid(
                    format!("{field}.replicas"),
                    "a DistributedScaledJob step sets metrics, not replicas",
                ));
            }
            if i == 0 && step.metrics.is_none() {
                errors.push(Error::invalid(
                    format!("{field}.metrics"),
                    "required on the first step",
                ));
            }
        }
        for (j, m) in step.members.iter().enumerate() {
            let mfield = format!("{field}.members[{j}]");
            check_member(&mfield, m, dso, &mut errors);
            if !names.contains(m.name.as_str()) {
                errors.push(Error::invalid(
                    format!("{mfield}.name"),
                    format!("unknown member {:?}: list it in members first", m.name),
                ));
            }
        }
    }
    Error::collect(errors)
}

//! Running a scenario through the planners, step by step.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::scenario::{AnyScenario, Scenario, ScenarioMember, StepMetric, duration};
use crate::crd::{DistributedScaledJobSpec, DistributedScaledObjectSpec};
use crate::dsj::duplication::{DuplicateAction, JobPhase, resolve_duplicate};
use crate::dsj::scaling::TriggerMetric;
use crate::dsj::schedule::WrrState;
use crate::dsj::taint::{TaintBook, TaintEvent, TaintLevel};
use crate::dsj::{self, DsjMemberObservation, DsjPlanInput};
use crate::dso::{self, DsoPlanInput, MemberObservation, MemberState, Reason};
use crate::time::{saturating_add, saturating_sub};
use crate::validate;
use crate::{Error, Result};

/// Default time between steps.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// Result of one DSO step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DsoStepReport {
    /// The step's `replicas`.
    pub replicas: u32,
    /// The total actually distributed (after pause and min/max).
    pub total: u32,
    /// Desired replicas per member.
    pub desired: BTreeMap<String, u32>,
    /// Why, per member.
    pub reasons: BTreeMap<String, Reason>,
    /// Replicas no member could take.
    pub shortfall: u32,
    /// Replicas moved by rebalancing.
    pub moved: u32,
    /// Whether a pause annotation applied.
    pub paused: bool,
}

/// Result of one DSJ step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DsjStepReport {
    /// Desired Jobs from the metrics.
    pub desired_jobs: u32,
    /// Jobs the scaling strategy asked for.
    pub to_create: u32,
    /// Jobs to create per member.
    pub create: BTreeMap<String, u32>,
    /// Of those, replacements of stuck Jobs, per member.
    pub replacements: BTreeMap<String, u32>,
    /// Jobs no eligible member could take.
    pub unplaced: u32,
    /// Non-terminal Jobs per member before the step's creations.
    pub running: BTreeMap<String, u32>,
    /// Pending Jobs per member before the step's creations.
    pub pending: BTreeMap<String, u32>,
    /// Taint level per member at this step.
    pub taints: BTreeMap<String, TaintLevel>,
    /// Jobs deleted by the duplication policy after the step, per member.
    pub deleted: BTreeMap<String, u32>,
    /// Job creates that failed, per member.
    pub failed_creates: BTreeMap<String, u32>,
    /// Whether a pause annotation applied.
    pub paused: bool,
}

/// One step of either kind; serializes without a tag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StepReport {
    /// DSO step.
    Dso(DsoStepReport),
    /// DSJ step.
    Dsj(DsjStepReport),
}

/// The result of a simulation: serializes to exactly `{"steps": [...]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Member names in display order.
    #[serde(skip)]
    pub members: Vec<String>,
    /// One entry per scenario step.
    pub steps: Vec<StepReport>,
}

/// Parses and runs a scenario.
pub fn simulate(text: &str) -> Result<Report> {
    match super::scenario::parse(text)? {
        AnyScenario::Dso(s) => run_dso(&s),
        AnyScenario::Dsj(s) => run_dsj(&s),
    }
}

/// The simulated clock: steps start a day after the epoch so that "ago" never underflows.
fn start() -> SystemTime {
    saturating_add(SystemTime::UNIX_EPOCH, Duration::from_secs(86_400))
}

fn state(field: &str, value: Option<&str>) -> Result<Option<MemberState>> {
    match value {
        None => Ok(None),
        Some("Ready") => Ok(Some(MemberState::Ready)),
        Some("Unreachable") => Ok(Some(MemberState::Unreachable)),
        Some(other) => Err(Error::invalid(field, format!("unknown state {other:?}"))),
    }
}

/// A DSO member in the simulation, with the room it really has.
#[derive(Clone, Debug)]
struct SimDsoMember {
    obs: MemberObservation,
    /// Replicas that actually fit (inferred from reported unschedulable replicas), so
    /// that replicas sent there beyond it become unschedulable again.
    fits: Option<u32>,
}

fn apply_dso(field: &str, sim: &mut SimDsoMember, m: &ScenarioMember) -> Result<()> {
    let o = &mut sim.obs;
    if let Some(s) = state(&format!("{field}.state"), m.state.as_deref())? {
        if s == MemberState::Ready {
            o.unreachable_for = Duration::ZERO;
        }
        o.state = s;
    }
    if let Some(d) = duration(
        &format!("{field}.unreachableFor"),
        m.unreachable_for.as_deref(),
    )? {
        o.unreachable_for = d;
    }
    if let Some(v) = m.current_replicas {
        o.current_replicas = v;
    }
    if let Some(v) = m.unschedulable_replicas {
        o.unschedulable_replicas = v.min(o.current_replicas);
        sim.fits = (v > 0).then(|| o.current_replicas - o.unschedulable_replicas);
        if v == 0 {
            o.unschedulable_for = Duration::ZERO;
        }
    }
    if let Some(d) = duration(
        &format!("{field}.unschedulableFor"),
        m.unschedulable_for.as_deref(),
    )? {
        o.unschedulable_for = d;
    }
    if m.capacity_replicas.is_some() {
        o.capacity_replicas = m.capacity_replicas;
    }
    Ok(())
}

fn run_dso(s: &Scenario<DistributedScaledObjectSpec>) -> Result<Report> {
    let interval = duration("interval", s.interval.as_deref())?.unwrap_or(DEFAULT_INTERVAL);
    let mut annotations = s.metadata.annotations.clone();
    let mut members: Vec<SimDsoMember> = Vec::with_capacity(s.members.len());
    for (i, m) in s.members.iter().enumerate() {
        let mut sim = SimDsoMember {
            obs: MemberObservation::ready(m.name.clone(), 0),
            fits: None,
        };
        apply_dso(&format!("members[{i}]"), &mut sim, m)?;
        members.push(sim);
    }
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut names: Vec<String> = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        if i > 0 {
            for m in &mut members {
                if m.obs.state == MemberState::Unreachable {
                    m.obs.unreachable_for = m.obs.unreachable_for.saturating_add(interval);
                }
                if m.obs.unschedulable_replicas > 0 {
                    m.obs.unschedulable_for = m.obs.unschedulable_for.saturating_add(interval);
                }
            }
        }
        for (j, o) in step.members.iter().enumerate() {
            let field = format!("steps[{i}].members[{j}]");
            let Some(m) = members.iter_mut().find(|m| m.obs.name == o.name) else {
                return Err(Error::invalid(
                    format!("{field}.name"),
                    format!("unknown member {:?}", o.name),
                ));
            };
            apply_dso(&field, m, o)?;
        }
        if let Some(a) = &step.annotations {
            annotations = a.clone();
        }
        let settings = validate::dso(&s.spec, &annotations)?;
        let observations: Vec<MemberObservation> = members.iter().map(|m| m.obs.clone()).collect();
        let replicas = step.replicas.unwrap_or(0);
        let plan = dso::plan(&DsoPlanInput {
            settings: &settings,
            total_target_replicas: replicas,
            members: &observations,
        });
        names = plan.members.iter().map(|m| m.name.clone()).collect();
        steps.push(StepReport::Dso(DsoStepReport {
            replicas,
            total: plan.total,
            desired: plan.desired(),
            reasons: plan
                .members
                .iter()
                .map(|m| (m.name.clone(), m.reason))
                .collect(),
            shortfall: plan.shortfall,
            moved: plan.moved,
            paused: plan.paused,
        }));
        // Reachable members now run what was decided; unreachable ones keep what they ran.
        for d in &plan.members {
            if let Some(m) = members.iter_mut().find(|m| m.obs.name == d.name)
                && m.obs.state == MemberState::Ready
            {
                m.obs.current_replicas = d.desired;
                let unschedulable = m.fits.map_or(0, |f| d.desired.saturating_sub(f));
                if unschedulable == 0 {
                    m.obs.unschedulable_for = Duration::ZERO;
                }
                m.obs.unschedulable_replicas = unschedulable;
            }
        }
    }
    Ok(Report {
        members: names,
        steps,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SimPhase {
    Pending,
    Running,
}

/// One simulated Job.
#[derive(Clone, Debug)]
struct SimJob {
    id: u64,
    member: String,
    phase: SimPhase,
    pending_since: SystemTime,
    /// Stuck beyond the grace period (reported once).
    stuck: bool,
    /// Has a failover replacement.
    replaced: bool,
    /// For a failover Job: the id of the stuck source Job.
    source: Option<u64>,
}

#[derive(Clone, Debug)]
struct SimDsjMember {
    name: String,
    state: MemberState,
    accepts_jobs: bool,
    fail_creates: bool,
}

/// The simulator tracks every Job; beyond this it refuses rather than exhaust memory.
const MAX_SIMULATED_JOBS: usize = 100_000;

fn too_many_jobs(field: String) -> Error {
    Error::invalid(
        field,
        format!(
            "the simulation would track more than {MAX_SIMULATED_JOBS} Jobs; lower the Job \
             counts, the metrics or maxReplicaCount"
        ),
    )
}

fn reset_jobs(
    field: &str,
    jobs: &mut Vec<SimJob>,
    next_id: &mut u64,
    member: &str,
    running: Option<u32>,
    pending: Option<u32>,
    pending_since: SystemTime,
) -> Result<()> {
    let adding = [running, pending]
        .iter()
        .map(|n| n.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)))
        .fold(0usize, usize::saturating_add);
    if jobs.len().saturating_add(adding) > MAX_SIMULATED_JOBS {
        return Err(too_many_jobs(field.to_owned()));
    }
    if let Some(n) = running {
        jobs.retain(|j| !(j.member == member && j.phase == SimPhase::Running));
        for _ in 0..n {
            *next_id += 1;
            jobs.push(SimJob {
                id: *next_id,
                member: member.to_owned(),
                phase: SimPhase::Running,
                pending_since,
                stuck: false,
                replaced: false,
                source: None,
            });
        }
    }
    if let Some(n) = pending {
        jobs.retain(|j| !(j.member == member && j.phase == SimPhase::Pending));
        for _ in 0..n {
            *next_id += 1;
            jobs.push(SimJob {
                id: *next_id,
                member: member.to_owned(),
                phase: SimPhase::Pending,
                pending_since,
                stuck: false,
                replaced: false,
                source: None,
            });
        }
    }
    Ok(())
}

fn apply_dsj(
    field: &str,
    m: &ScenarioMember,
    member: &mut SimDsjMember,
    jobs: &mut Vec<SimJob>,
    next_id: &mut u64,
    now: SystemTime,
) -> Result<()> {
    if let Some(s) = state(&format!("{field}.state"), m.state.as_deref())? {
        member.state = s;
    }
    if let Some(v) = m.accepts_jobs {
        member.accepts_jobs = v;
    }
    if let Some(v) = m.fail_creates {
        member.fail_creates = v;
    }
    let age =
        duration(&format!("{field}.pendingFor"), m.pending_for.as_deref())?.unwrap_or_default();
    let since = saturating_sub(now, age);
    reset_jobs(
        field,
        jobs,
        next_id,
        &m.name,
        m.running_jobs,
        m.pending_jobs,
        since,
    )
}

fn phase(job: Option<&SimJob>) -> JobPhase {
    match job.map(|j| j.phase) {
        None => JobPhase::Gone,
        Some(SimPhase::Pending) => JobPhase::Pending,
        Some(SimPhase::Running) => JobPhase::Running,
    }
}

fn run_dsj(s: &Scenario<DistributedScaledJobSpec>) -> Result<Report> {
    let interval = duration("interval", s.interval.as_deref())?.unwrap_or(DEFAULT_INTERVAL);
    let mut annotations = s.metadata.annotations.clone();
    let mut now = start();
    let mut jobs: Vec<SimJob> = Vec::new();
    let mut next_id = 0u64;
    let mut members: Vec<SimDsjMember> = Vec::with_capacity(s.members.len());
    for (i, m) in s.members.iter().enumerate() {
        let mut member = SimDsjMember {
            name: m.name.clone(),
            state: MemberState::Ready,
            accepts_jobs: true,
            fail_creates: false,
        };
        apply_dsj(
            &format!("members[{i}]"),
            m,
            &mut member,
            &mut jobs,
            &mut next_id,
            now,
        )?;
        members.push(member);
    }
    let mut taints: Option<TaintBook> = None;
    let mut wrr = WrrState::default();
    let mut metrics: BTreeMap<String, TriggerMetric> = BTreeMap::new();
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut names: Vec<String> = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        if i > 0 {
            now = saturating_add(now, interval);
        }
        for (j, o) in step.members.iter().enumerate() {
            let field = format!("steps[{i}].members[{j}]");
            let Some(m) = members.iter_mut().find(|m| m.name == o.name) else {
                return Err(Error::invalid(
                    format!("{field}.name"),
                    format!("unknown member {:?}", o.name),
                ));
            };
            apply_dsj(&field, o, m, &mut jobs, &mut next_id, now)?;
        }
        if let Some(a) = &step.annotations {
            annotations = a.clone();
        }
        let settings = validate::dsj(&s.spec, &annotations)?;
        let taints = taints.get_or_insert_with(|| TaintBook::new(&settings));
        taints.reconfigure(&settings);
        if let Some(given) = &step.metrics {
            metrics = read_metrics(&format!("steps[{i}].metrics"), given, &settings.triggers)?;
        }
        let priority = |name: &str| {
            settings
                .members
                .iter()
                .flatten()
                .find(|m| m.name == name)
                .and_then(|m| m.priority)
        };
        // Jobs pending beyond the grace period are stuck. A member's failures found in one
        // reconcile count as one failure, so that a batch of Jobs stuck together does not
        // jump straight to a hard taint.
        let mut failed_members: Vec<String> = Vec::new();
        for job in &mut jobs {
            if job.phase == SimPhase::Pending
                && !job.stuck
                && settings.timing.is_stuck(job.pending_since, now)
            {
                job.stuck = true;
                if !failed_members.contains(&job.member) {
                    failed_members.push(job.member.clone());
                }
            }
        }
        for member in &failed_members {
            taints.observe(member, priority(member), TaintEvent::JobStuck, now);
        }
        let observations: Vec<DsjMemberObservation> = members
            .iter()
            .map(|m| {
                let mine = jobs.iter().filter(|j| j.member == m.name);
                DsjMemberObservation {
                    name: m.name.clone(),
                    state: m.state,
                    running_jobs: count(mine.clone()),
                    pending_jobs: count(mine.clone().filter(|j| j.phase == SimPhase::Pending)),
                    stuck_jobs: count(
                        mine.filter(|j| j.phase == SimPhase::Pending && j.stuck && !j.replaced),
                    ),
                }
            })
            .collect();
        let plan = dsj::plan(&DsjPlanInput {
            settings: &settings,
            metrics: &metrics,
            members: &observations,
            taints,
            wrr: &wrr,
            now,
        });
        wrr = plan.wrr.clone();
        names = plan.members.iter().map(|m| m.name.clone()).collect();
        let level = |name: &str| taints.level(name, priority(name), now);
        let mut report = DsjStepReport {
            desired_jobs: plan.desired_jobs,
            to_create: plan.to_create,
            create: plan.create(),
            replacements: plan
                .members
                .iter()
                .map(|m| (m.name.clone(), m.replacements))
                .collect(),
            unplaced: plan.unplaced,
            running: observations
                .iter()
                .map(|o| (o.name.clone(), o.running_jobs))
                .collect(),
            pending: observations
                .iter()
                .map(|o| (o.name.clone(), o.pending_jobs))
                .collect(),
            taints: names.iter().map(|n| (n.clone(), level(n))).collect(),
            deleted: names.iter().map(|n| (n.clone(), 0)).collect(),
            failed_creates: names.iter().map(|n| (n.clone(), 0)).collect(),
            paused: plan.paused,
        };
        let creating: usize = plan
            .members
            .iter()
            .map(|m| usize::try_from(m.create).unwrap_or(usize::MAX))
            .fold(0, usize::saturating_add);
        if jobs.len().saturating_add(creating) > MAX_SIMULATED_JOBS {
            return Err(too_many_jobs(format!("steps[{i}]")));
        }
        // The members run what was decided.
        let mut sources: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &plan.replacements {
            sources
                .entry(r.to.clone())
                .or_default()
                .push(r.from.clone());
        }
        for m in &plan.members {
            let Some(member) = members.iter().find(|x| x.name == m.name).cloned() else {
                continue;
            };
            let mut from = sources.remove(&m.name).unwrap_or_default().into_iter();
            for _ in 0..m.create {
                let source_member = from.next();
                if member.fail_creates {
                    let failed = report.failed_creates.entry(m.name.clone()).or_default();
                    if *failed == 0 {
                        taints.observe(&m.name, priority(&m.name), TaintEvent::CreateFailed, now);
                    }
                    *failed += 1;
                    continue;
                }
                let source = source_member.and_then(|src| {
                    let job = jobs.iter_mut().find(|j| {
                        j.member == src && j.phase == SimPhase::Pending && j.stuck && !j.replaced
                    })?;
                    job.replaced = true;
                    Some(job.id)
                });
                next_id += 1;
                jobs.push(SimJob {
                    id: next_id,
                    member: m.name.clone(),
                    phase: if member.accepts_jobs && member.state == MemberState::Ready {
                        SimPhase::Running
                    } else {
                        SimPhase::Pending
                    },
                    pending_since: now,
                    stuck: false,
                    replaced: false,
                    source,
                });
            }
        }
        // Pending Jobs start in members that have room again.
        for job in &mut jobs {
            if job.phase == SimPhase::Pending
                && members.iter().any(|m| {
                    m.name == job.member && m.accepts_jobs && m.state == MemberState::Ready
                })
            {
                job.phase = SimPhase::Running;
            }
        }
        // The duplication policy resolves source/failover pairs.
        let pairs: Vec<(u64, u64)> = jobs
            .iter()
            .filter_map(|j| j.source.map(|s| (s, j.id)))
            .collect();
        for (source_id, failover_id) in pairs {
            let source = jobs.iter().find(|j| j.id == source_id);
            let failover = jobs.iter().find(|j| j.id == failover_id);
            let doomed =
                match resolve_duplicate(settings.duplication, phase(source), phase(failover)) {
                    DuplicateAction::KeepBoth => None,
                    DuplicateAction::DeleteSource => source.map(|j| (j.id, j.member.clone())),
                    DuplicateAction::DeleteFailover => failover.map(|j| (j.id, j.member.clone())),
                };
            if let Some((id, member)) = doomed {
                jobs.retain(|j| j.id != id);
                *report.deleted.entry(member).or_default() += 1;
            }
        }
        taints.expire(now);
        steps.push(StepReport::Dsj(report));
    }
    Ok(Report {
        members: names,
        steps,
    })
}

fn count<'a>(jobs: impl Iterator<Item = &'a SimJob>) -> u32 {
    u32::try_from(jobs.count()).unwrap_or(u32::MAX)
}

fn read_metrics(
    field: &str,
    given: &BTreeMap<String, StepMetric>,
    triggers: &[String],
) -> Result<BTreeMap<String, TriggerMetric>> {
    let mut out = BTreeMap::new();
    for (name, m) in given {
        if !triggers.contains(name) {
            return Err(Error::invalid(
                format!("{field}.{name}"),
                format!(
                    "no trigger named {name:?} in spec.scaledJobSpec.triggers (have: {})",
                    triggers.join(", ")
                ),
            ));
        }
        if !m.value.is_finite() || m.value < 0.0 {
            return Err(Error::invalid(
                format!("{field}.{name}.value"),
                "must be a number >= 0",
            ));
        }
        if !m.target.is_finite() || m.target <= 0.0 {
            return Err(Error::invalid(
                format!("{field}.{name}.target"),
                "must be a number > 0",
            ));
        }
        out.insert(
            name.clone(),
            TriggerMetric {
                value: m.value,
                target: m.target,
            },
        );
    }
    if let Some(missing) = triggers.iter().find(|t| !given.contains_key(*t)) {
        return Err(Error::invalid(
            field,
            format!("no value for trigger {missing:?}"),
        ));
    }
    Ok(out)
}

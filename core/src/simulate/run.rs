//! Running a scenario through the planners, step by step.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::scenario::{AnyScenario, Scenario, ScenarioMember, StepMetric, duration};
use crate::crd::DistributedScaledJobStatus;
use crate::crd::conditions::MemberPhase;
use crate::crd::{DistributedScaledJobSpec, DistributedScaledObjectSpec};
use crate::dsj;
use crate::dsj::duplication::JobPhase;
use crate::dsj::metrics::Reading;
use crate::dsj::outcome::{
    OutcomeInput, create_failed_event, deletion_event, failover_event, outcome,
};
use crate::dsj::scaling::TriggerMetric;
use crate::dsj::step::{
    DsjMember, DsjState, JobView, StepInput, StepOutput, cleanup, create_failed, taint_level,
};
use crate::dsj::taint::TaintLevel;
use crate::dso::{self, DsoPlanInput, MemberObservation, Reason};
use crate::events::{Event, EventKind, fold_alike};
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
    /// The conditions the hub would write in this poll's status.
    pub conditions: Vec<ConditionReport>,
    /// The Events the hub would publish in this poll, in order.
    pub events: Vec<EventReport>,
}

/// A condition of the DSJ's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConditionReport {
    /// `Ready`, `Paused` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// Why, in one word.
    pub reason: String,
    /// Why, for people.
    pub message: String,
}

/// An Event about the DSJ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventReport {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// One of the `EVENT_*` reasons of `dsj::outcome`.
    pub reason: &'static str,
    /// What happened.
    pub note: String,
}

impl From<Event> for EventReport {
    fn from(e: Event) -> Self {
        Self {
            type_: match e.kind {
                EventKind::Normal => "Normal",
                EventKind::Warning => "Warning",
            },
            reason: e.reason,
            note: e.note,
        }
    }
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

fn state(field: &str, value: Option<&str>) -> Result<Option<MemberPhase>> {
    value
        .map(|v| super::scenario::member_state(v).map_err(|e| Error::invalid(field, e)))
        .transpose()
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
        if s == MemberPhase::Ready {
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
                if m.obs.state == MemberPhase::Unreachable {
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
                && m.obs.state == MemberPhase::Ready
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

#[derive(Clone, Debug)]
struct SimDsjMember {
    name: String,
    state: MemberPhase,
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

/// The simulated Jobs of every member, named `job-1`, `job-2`, … in creation order.
#[derive(Debug, Default)]
struct SimJobs {
    jobs: Vec<JobView>,
    next_id: u64,
}

impl SimJobs {
    fn add(&mut self, member: &str, phase: JobPhase, since: SystemTime, replaces: Option<String>) {
        self.next_id += 1;
        self.jobs.push(JobView {
            name: format!("job-{}", self.next_id),
            member: member.to_owned(),
            phase,
            pending_since: since,
            finished_at: None,
            replaces,
            template: None,
        });
    }

    /// Replaces `member`'s running and/or pending Jobs with the given numbers.
    fn reset(
        &mut self,
        field: &str,
        member: &str,
        running: Option<u32>,
        pending: Option<u32>,
        since: SystemTime,
    ) -> Result<()> {
        let adding = [running, pending]
            .iter()
            .map(|n| n.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)))
            .fold(0usize, usize::saturating_add);
        if self.jobs.len().saturating_add(adding) > MAX_SIMULATED_JOBS {
            return Err(too_many_jobs(field.to_owned()));
        }
        for (phase, n) in [(JobPhase::Running, running), (JobPhase::Pending, pending)] {
            if let Some(n) = n {
                self.jobs
                    .retain(|j| !(j.member == member && j.phase == phase));
                for _ in 0..n {
                    self.add(member, phase, since, None);
                }
            }
        }
        Ok(())
    }
}

fn apply_dsj(
    field: &str,
    m: &ScenarioMember,
    member: &mut SimDsjMember,
    jobs: &mut SimJobs,
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
    jobs.reset(field, &m.name, m.running_jobs, m.pending_jobs, since)
}

/// Runs a DSJ scenario: each step is one poll of [`dsj::step::step`] followed by
/// [`dsj::outcome::outcome`] (what the hub runs), after which the simulated members create,
/// start and delete Jobs as decided.
fn run_dsj(s: &Scenario<DistributedScaledJobSpec>) -> Result<Report> {
    let interval = duration("interval", s.interval.as_deref())?.unwrap_or(DEFAULT_INTERVAL);
    let mut annotations = s.metadata.annotations.clone();
    let mut now = start();
    let mut jobs = SimJobs::default();
    let mut members: Vec<SimDsjMember> = Vec::with_capacity(s.members.len());
    for (i, m) in s.members.iter().enumerate() {
        let mut member = SimDsjMember {
            name: m.name.clone(),
            state: MemberPhase::Ready,
            accepts_jobs: true,
            fail_creates: false,
        };
        apply_dsj(&format!("members[{i}]"), m, &mut member, &mut jobs, now)?;
        members.push(member);
    }
    let mut hub = SimHub {
        name: s.metadata.name.as_deref().unwrap_or("simulated").to_owned(),
        // As the controller reads it.
        polling: Duration::from_secs(
            u64::try_from(s.spec.scaled_job_spec.polling_interval.unwrap_or(30)).unwrap_or(30),
        ),
        state: DsjState::default(),
        previous: DistributedScaledJobStatus::default(),
        failed: Vec::new(),
    };
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
            apply_dsj(&field, o, m, &mut jobs, now)?;
        }
        if let Some(a) = &step.annotations {
            annotations = a.clone();
        }
        let settings = validate::dsj(&s.spec, &annotations)?;
        if let Some(given) = &step.metrics {
            metrics = read_metrics(&format!("steps[{i}].metrics"), given, &settings.triggers)?;
        }
        let views: Vec<DsjMember> = members
            .iter()
            .map(|m| DsjMember {
                name: m.name.clone(),
                state: m.state,
            })
            .collect();
        let poll = hub.poll(&settings, &metrics, &views, &jobs, now);
        names = poll
            .out
            .plan
            .members
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let mut report = dsj_report(&poll.out, &settings, &hub.state, &names, now);
        if u64::try_from(jobs.jobs.len())
            .unwrap_or(u64::MAX)
            .saturating_add(poll.creating)
            > MAX_SIMULATED_JOBS as u64
        {
            return Err(too_many_jobs(format!("steps[{i}]")));
        }
        let mut events = poll.events;
        let sim = Sim {
            settings: &settings,
            members: &members,
            now,
        };
        sim.create(
            &mut hub,
            poll.out.creates,
            &mut jobs,
            &mut report,
            &mut events,
        );
        sim.settle(&mut jobs, &mut report, &mut events);
        events.extend(poll.outcome_events);
        report.conditions = poll.conditions;
        report.events = published(events);
        steps.push(StepReport::Dsj(report));
    }
    Ok(Report {
        members: names,
        steps,
    })
}

/// The Events as the hub publishes them: more than a few of one reason folded into one.
fn published(events: Vec<Event>) -> Vec<EventReport> {
    fold_alike(
        events,
        |e| e.reason,
        |e| &e.note,
        |e, note| Event { note, ..e },
    )
    .into_iter()
    .map(EventReport::from)
    .collect()
}

/// The simulated members at one step.
struct Sim<'a> {
    settings: &'a validate::DsjSettings,
    members: &'a [SimDsjMember],
    now: SystemTime,
}

impl Sim<'_> {
    /// The members run what was decided: a Job runs in a Ready member that `acceptsJobs`,
    /// else it pends; a member that `failCreates` refuses each (one taint failure a poll).
    fn create(
        &self,
        hub: &mut SimHub,
        creates: Vec<dsj::step::Creates>,
        jobs: &mut SimJobs,
        report: &mut DsjStepReport,
        events: &mut Vec<Event>,
    ) {
        for creates in creates {
            let Some(member) = self.members.iter().find(|x| x.name == creates.member) else {
                continue;
            };
            let phase = if member.accepts_jobs && member.state == MemberPhase::Ready {
                JobPhase::Running
            } else {
                JobPhase::Pending
            };
            let new = (0..creates.new).map(|_| None);
            for replaces in creates.failovers.into_iter().map(Some).chain(new) {
                if member.fail_creates {
                    let failed = report
                        .failed_creates
                        .entry(member.name.clone())
                        .or_default();
                    if *failed == 0 {
                        let level =
                            create_failed(self.settings, &mut hub.state, &member.name, self.now);
                        hub.failed.push((member.name.clone(), level));
                    }
                    *failed += 1;
                    continue;
                }
                jobs.add(&member.name, phase, self.now, replaces.clone());
                if let (Some(source), Some(job)) = (replaces, jobs.jobs.last()) {
                    events.push(failover_event(&source, &job.name, &member.name));
                }
            }
        }
    }

    /// Pending Jobs start in members that have room again, then the duplication policy
    /// resolves source/failover pairs.
    fn settle(&self, jobs: &mut SimJobs, report: &mut DsjStepReport, events: &mut Vec<Event>) {
        for job in &mut jobs.jobs {
            if job.phase == JobPhase::Pending
                && self.members.iter().any(|m| {
                    m.name == job.member && m.accepts_jobs && m.state == MemberPhase::Ready
                })
            {
                job.phase = JobPhase::Running;
            }
        }
        for gone in cleanup(self.settings, &jobs.jobs) {
            jobs.jobs.retain(|j| j.name != gone.name);
            events.push(deletion_event(&gone));
            *report.deleted.entry(gone.member).or_default() += 1;
        }
    }
}

/// What the simulated hub keeps between polls.
struct SimHub {
    /// The DSJ's name (for the status selector).
    name: String,
    /// The spec's `pollingInterval`.
    polling: Duration,
    state: DsjState,
    /// The status the previous poll decided.
    previous: DistributedScaledJobStatus,
    /// Members whose creates failed in the previous poll, with the taint that gave them: the
    /// hub learns of a failed create from the agent, so at its next poll.
    failed: Vec<(String, TaintLevel)>,
}

/// What one simulated poll decided.
struct SimPoll {
    out: StepOutput,
    /// The Jobs `out` creates.
    creating: u64,
    /// Events decided before the step (creates that failed in the previous poll).
    events: Vec<Event>,
    /// Events `outcome` decided; the hub publishes them after those of its creates and
    /// deletes.
    outcome_events: Vec<Event>,
    conditions: Vec<ConditionReport>,
}

impl SimHub {
    /// One poll as the hub's DSJ controller runs it: `step`, then `outcome` on the same
    /// inputs. The scenario's metrics are read without failure; no Job is remembered only
    /// by count (the simulated hub never restarts).
    fn poll(
        &mut self,
        settings: &validate::DsjSettings,
        metrics: &BTreeMap<String, TriggerMetric>,
        members: &[DsjMember],
        jobs: &SimJobs,
        now: SystemTime,
    ) -> SimPoll {
        let failed = std::mem::take(&mut self.failed);
        let create_failures: Vec<(String, String)> = failed
            .iter()
            .map(|(m, _)| {
                (
                    m.clone(),
                    "the member refuses Job creates (failCreates)".to_owned(),
                )
            })
            .collect();
        let events = failed
            .iter()
            .zip(&create_failures)
            .map(|((m, level), (_, why))| create_failed_event(m, why, *level))
            .collect();
        let levels_before = members
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    taint_level(settings, &self.state, &m.name, now),
                )
            })
            .collect();
        let out = dsj::step::step(
            &StepInput {
                settings,
                metrics,
                members,
                jobs: &jobs.jobs,
                remembered: &[],
                failover_only: false,
                now,
            },
            &mut self.state,
        );
        let readings: BTreeMap<String, Reading> = metrics
            .iter()
            .map(|(k, m)| (k.clone(), Reading::Read(*m)))
            .collect();
        let creating = out
            .creates
            .iter()
            .map(dsj::step::Creates::total)
            .fold(0, u64::saturating_add);
        let decided = outcome(&OutcomeInput {
            previous: &self.previous,
            generation: Some(1),
            name: &self.name,
            settings,
            polling: self.polling,
            members,
            ids: &BTreeMap::new(),
            jobs: &jobs.jobs,
            remembered: &[],
            readings: &readings,
            out: &out,
            state: &self.state,
            levels_before: &levels_before,
            create_failures: &create_failures,
            next_index: i64::try_from(jobs.next_id.saturating_add(creating)).unwrap_or(i64::MAX),
            now,
        });
        let conditions = decided
            .status
            .conditions
            .iter()
            .map(|c| ConditionReport {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect();
        self.previous = decided.status;
        SimPoll {
            out,
            creating,
            events,
            outcome_events: decided.events,
            conditions,
        }
    }
}

/// The report of a DSJ step, before its creates and deletes are carried out.
fn dsj_report(
    out: &StepOutput,
    settings: &validate::DsjSettings,
    state: &DsjState,
    names: &[String],
    now: SystemTime,
) -> DsjStepReport {
    let plan = &out.plan;
    DsjStepReport {
        desired_jobs: plan.desired_jobs,
        to_create: plan.to_create,
        create: plan.create(),
        replacements: plan
            .members
            .iter()
            .map(|m| (m.name.clone(), m.replacements))
            .collect(),
        unplaced: plan.unplaced,
        running: out
            .observations
            .iter()
            .map(|o| (o.name.clone(), o.running_jobs))
            .collect(),
        pending: out
            .observations
            .iter()
            .map(|o| (o.name.clone(), o.pending_jobs))
            .collect(),
        taints: names
            .iter()
            .map(|n| (n.clone(), taint_level(settings, state, n, now)))
            .collect(),
        deleted: names.iter().map(|n| (n.clone(), 0)).collect(),
        failed_creates: names.iter().map(|n| (n.clone(), 0)).collect(),
        paused: plan.paused,
        conditions: Vec::new(),
        events: Vec::new(),
    }
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

//! What one poll of a `DistributedScaledJob` says: its status (counts, members, triggers,
//! conditions, the record a restarted hub counts from), the Events it raises, and when the
//! DSJ must be looked at again before its next poll. The hub's controller writes what this
//! decides; the decisions themselves are here, with time as a parameter, so that every rule
//! has a table test.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::duplication::JobPhase;
use super::metrics::{Reading, TriggerState};
use super::step::{
    Cleanup, Deletion, DsjMember, DsjState, JobView, Remembered, StepOutput, taint_level,
};
use super::taint::TaintLevel;
use super::{Eligibility, MemberJobs};
use crate::crd::conditions::MemberPhase;
use crate::crd::conditions::{
    CONDITION_DEGRADED, CONDITION_PAUSED, CONDITION_READY, EVENT_FAILOVER, EVENT_JOB_CLEANED_UP,
    EVENT_JOB_CREATE_FAILED, EVENT_JOB_ROLLED_OUT, EVENT_JOB_STUCK, EVENT_JOBS_CREATED,
    EVENT_METRIC_UNAVAILABLE, EVENT_TAINT_CHANGED, LABEL_DSJ, REASON_AWAITING_METRIC,
    REASON_JOB_CREATE_FAILED, REASON_JOBS_UNPLACED, REASON_METRIC_UNAVAILABLE,
    REASON_NO_ELIGIBLE_MEMBER, REASON_NO_FAILURES, REASON_PAUSED_BY_ANNOTATION, REASON_RECONCILED,
    TRIGGER_ACTIVE, TRIGGER_ERROR, TRIGGER_INACTIVE, TRIGGER_PENDING, condition,
};
use crate::crd::dsj::{DsjMemberClusterStatus, MemberJobCount, TriggerMetricStatus};
use crate::crd::{DistributedScaledJobStatus, bound_member_statuses};
use crate::events::Event;
use crate::time::to_time;
use crate::validate::{ClusterStrategy, DsjSettings, DuplicationPolicy};

/// How long a trigger new to the DSJ may fail to read before it counts as an error: KEDA
/// publishes its first value after one polling interval of its own, and its metrics adapter
/// needs a few seconds to serve a new ScaledObject.
pub fn first_reading_grace(polling: Duration) -> Duration {
    polling.saturating_add(Duration::from_secs(10))
}

/// The Warning Event of a member whose Job creates failed, with the taint it now has.
pub fn create_failed_event(member: &str, why: &str, level: TaintLevel) -> Event {
    Event::warning(
        EVENT_JOB_CREATE_FAILED,
        format!("creating Jobs in {member} failed ({why}); taint now {level:?}"),
    )
}

/// The Event of a failover Job `job` created in `member` to replace the stuck `source`.
pub fn failover_event(source: &str, job: &str, member: &str) -> Event {
    Event::normal(
        EVENT_FAILOVER,
        format!("Job {source} is stuck; {job} replaces it in {member}"),
    )
}

/// The Event of a Job deleted by the rollout, the duplication policy or the history limits.
pub fn deletion_event(d: &Deletion) -> Event {
    let (reason, why) = match d.why {
        Cleanup::Rollout => (
            EVENT_JOB_ROLLED_OUT,
            "made from an earlier spec; rollout.strategy default",
        ),
        Cleanup::Duplicate => (EVENT_JOB_CLEANED_UP, "duplicationPolicy"),
        Cleanup::History => (EVENT_JOB_CLEANED_UP, "beyond the history limit"),
    };
    Event::normal(
        reason,
        format!("deleting Job {} in {} ({why})", d.name, d.member),
    )
}

/// Everything the status of a poll is decided from.
#[derive(Clone, Copy, Debug)]
pub struct OutcomeInput<'a> {
    /// The status the previous poll left.
    pub previous: &'a DistributedScaledJobStatus,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The DSJ's name (for the selector).
    pub name: &'a str,
    /// The validated spec and annotations.
    pub settings: &'a DsjSettings,
    /// `pollingInterval`.
    pub polling: Duration,
    /// The members of the DSJ and their health.
    pub members: &'a [DsjMember],
    /// Session id of each connected member.
    pub ids: &'a BTreeMap<String, String>,
    /// Every Job the step saw.
    pub jobs: &'a [JobView],
    /// Jobs known only by count.
    pub remembered: &'a [Remembered],
    /// Trigger readings by key.
    pub readings: &'a BTreeMap<String, Reading>,
    /// What the step decided.
    pub out: &'a StepOutput,
    /// The state after the step.
    pub state: &'a DsjState,
    /// Each member's taint level before the step.
    pub levels_before: &'a BTreeMap<String, TaintLevel>,
    /// Members whose Job creates failed in this poll, with why.
    pub create_failures: &'a [(String, String)],
    /// The next Job index after this poll's creates.
    pub next_index: i64,
    /// The time of the poll.
    pub now: SystemTime,
}

/// The status and Events of one poll.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The status to write (before any create is sent).
    pub status: DistributedScaledJobStatus,
    /// Events, in order.
    pub events: Vec<Event>,
}

fn count(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The Jobs created this poll in each member.
fn created(out: &StepOutput) -> BTreeMap<&str, u64> {
    out.creates
        .iter()
        .map(|c| (c.member.as_str(), c.total()))
        .collect()
}

/// The status and Events of a poll.
pub fn outcome(i: &OutcomeInput<'_>) -> Outcome {
    let mut events = Vec::new();
    let created = created(i.out);
    let triggers = trigger_statuses(i, &mut events);
    let member_statuses = member_statuses(i, &created);
    let (mut running, mut pending) = (0u64, 0u64);
    let mut member_jobs = BTreeMap::new();
    for o in &i.out.observations {
        let new = created.get(o.name.as_str()).copied().unwrap_or(0);
        let r = u64::from(o.running_jobs).saturating_add(new);
        let p = u64::from(o.pending_jobs).saturating_add(new);
        running = running.saturating_add(r);
        pending = pending.saturating_add(p);
        if r > 0 {
            member_jobs.insert(
                o.name.clone(),
                MemberJobCount {
                    running: count(r),
                    pending: count(p),
                },
            );
        }
    }
    let mut scheduling = i.state.to_status(i.next_index);
    scheduling.member_jobs = member_jobs;

    let total: u64 = created.values().sum();
    if total > 0 {
        let spread: Vec<String> = i
            .out
            .creates
            .iter()
            .map(|c| format!("{} in {}", c.total(), c.member))
            .collect();
        events.push(Event::normal(
            EVENT_JOBS_CREATED,
            format!(
                "created {total} Job{}: {}",
                if total == 1 { "" } else { "s" },
                spread.join(", ")
            ),
        ));
    }
    for name in &i.out.newly_stuck {
        events.push(Event::warning(
            EVENT_JOB_STUCK,
            format!("Job {name} has been pending longer than the grace period"),
        ));
    }
    for m in i.members {
        let after = taint_level(i.settings, i.state, &m.name, i.now);
        if i.levels_before.get(&m.name) != Some(&after) {
            let note = format!("{}: taint {after:?}", m.name);
            events.push(if after == TaintLevel::None {
                Event::normal(EVENT_TAINT_CHANGED, note)
            } else {
                Event::warning(EVENT_TAINT_CHANGED, note)
            });
        }
    }
    let conditions = conditions(i, &triggers);
    Outcome {
        status: DistributedScaledJobStatus {
            desired_jobs: count(u64::from(i.out.plan.desired_jobs)),
            running_jobs: count(running),
            pending_jobs: count(pending),
            member_cluster_statuses: member_statuses,
            selector: Some(format!("{LABEL_DSJ}={}", i.name)),
            scalers_target_average_value: i
                .readings
                .iter()
                .filter_map(|(name, r)| match r {
                    Reading::Read(m) => Some((name.clone(), format!("{}", m.target))),
                    Reading::Failed(_) => None,
                })
                .collect(),
            trigger_metrics_status: triggers,
            cluster_strategy: Some(
                match i.settings.cluster_strategy {
                    ClusterStrategy::WeightedRoundRobin => "weightedRoundRobin",
                    ClusterStrategy::PriorityFailover { .. } => "priorityFailover",
                }
                .to_owned(),
            ),
            scheduling: Some(scheduling),
            conditions,
        },
        events,
    }
}

/// Each trigger's state. A reading that fails while the trigger is new to the DSJ (no
/// earlier state, or `Pending` for less than [`first_reading_grace`]) is `Pending`, not an
/// error: KEDA has not had the chance to publish it. Nothing is created either way.
fn trigger_statuses(i: &OutcomeInput<'_>, events: &mut Vec<Event>) -> Vec<TriggerMetricStatus> {
    let grace = first_reading_grace(i.polling);
    i.readings
        .iter()
        .map(|(name, r)| {
            let before = i
                .previous
                .trigger_metrics_status
                .iter()
                .find(|t| &t.name == name);
            let waiting_since = match before {
                None => Some(i.now),
                Some(b) if b.state == TRIGGER_PENDING => Some(
                    b.last_change_time
                        .as_ref()
                        .map_or(i.now, crate::time::from_time),
                ),
                Some(_) => None,
            };
            let state = match r.state() {
                TriggerState::Active => TRIGGER_ACTIVE,
                TriggerState::Inactive => TRIGGER_INACTIVE,
                TriggerState::Error
                    if waiting_since
                        .is_some_and(|since| crate::time::saturating_add(since, grace) > i.now) =>
                {
                    TRIGGER_PENDING
                }
                TriggerState::Error => TRIGGER_ERROR,
            };
            if state == TRIGGER_ERROR && before.is_none_or(|b| b.state != TRIGGER_ERROR) {
                events.push(Event::warning(
                    EVENT_METRIC_UNAVAILABLE,
                    format!(
                        "trigger {name} cannot be read, no Job is created: {}",
                        r.info()
                    ),
                ));
            }
            TriggerMetricStatus {
                name: name.clone(),
                state: state.to_owned(),
                info: Some(if state == TRIGGER_PENDING {
                    format!("waiting for KEDA's first value: {}", r.info())
                } else {
                    r.info()
                }),
                last_change_time: match before {
                    Some(b) if b.state == state => b.last_change_time.clone(),
                    _ => Some(to_time(i.now)),
                },
            }
        })
        .collect()
}

fn member_statuses(
    i: &OutcomeInput<'_>,
    created: &BTreeMap<&str, u64>,
) -> BTreeMap<String, DsjMemberClusterStatus> {
    let observations: BTreeMap<&str, _> = i
        .out
        .observations
        .iter()
        .map(|o| (o.name.as_str(), o))
        .collect();
    let mut statuses = BTreeMap::new();
    for m in i.members {
        let o = observations.get(m.name.as_str()).copied();
        let new = created.get(m.name.as_str()).copied().unwrap_or(0);
        let level = taint_level(i.settings, i.state, &m.name, i.now);
        let remembered = i.remembered.iter().any(|r| r.member == m.name);
        let state = m.state.as_str();
        let before = i.previous.member_cluster_statuses.get(&m.name);
        let description = member_description(m.state, level, remembered);
        // Stuck: pending past the grace period, replaced or not (a replaced one still
        // pends in its member).
        let stuck = i
            .jobs
            .iter()
            .filter(|j| {
                j.member == m.name
                    && j.phase == JobPhase::Pending
                    && i.state.stuck.contains(&j.name)
            })
            .count();
        statuses.insert(
            m.name.clone(),
            DsjMemberClusterStatus {
                description: Some(description.to_owned()),
                id: i
                    .ids
                    .get(&m.name)
                    .cloned()
                    .or_else(|| before.and_then(|b| b.id.clone())),
                running_jobs: count(
                    o.map_or(0, |o| u64::from(o.running_jobs))
                        .saturating_add(new),
                ),
                pending_jobs: count(
                    o.map_or(0, |o| u64::from(o.pending_jobs))
                        .saturating_add(new),
                ),
                stuck_jobs: count(u64::try_from(stuck).unwrap_or(u64::MAX)),
                soft_tainted: level == TaintLevel::Soft,
                hard_tainted: level == TaintLevel::Hard,
                hard_taint_scopes: i.state.hard_taint_scopes(i.settings, &m.name, i.now),
                excluded: level == TaintLevel::Hard || !m.state.is_ready(),
                last_status_change_time: match before {
                    Some(b) if b.state.as_deref() == Some(state) => {
                        b.last_status_change_time.clone()
                    }
                    _ => Some(to_time(i.now)),
                },
                state: Some(state.to_owned()),
            },
        );
    }
    bound_member_statuses(&mut statuses, |m| {
        m.state.as_deref() == Some(MemberPhase::Ready.as_str())
            && !m.soft_tainted
            && !m.hard_tainted
    });
    statuses
}

/// What `description` says of a member in a DSJ's `memberClusterStatuses`.
fn member_description(state: MemberPhase, level: TaintLevel, remembered: bool) -> &'static str {
    match (state, level) {
        (MemberPhase::Ready, TaintLevel::None) => "Cluster is healthy",
        (MemberPhase::Ready, TaintLevel::Soft) => {
            "soft-tainted: a second failure within softTaintDuration excludes it"
        }
        (MemberPhase::Ready, TaintLevel::Hard) => {
            "hard-tainted: receives no Jobs until the taint expires"
        }
        (MemberPhase::Unreachable | MemberPhase::Pending | MemberPhase::NotReported, _)
            if remembered =>
        {
            "not reported since the hub started: its Jobs are counted as last recorded"
        }
        (MemberPhase::Unreachable | MemberPhase::Pending | MemberPhase::NotReported, _) => {
            "agent not connected, or its Jobs not reported yet"
        }
        (MemberPhase::WorkloadMissing | MemberPhase::Refused | MemberPhase::Conflict, _) => {
            "the agent cannot act for this DSJ: it receives no Jobs"
        }
    }
}

/// Why each member cannot take Jobs, for a message: `member-1 unreachable, member-2
/// hard-tainted`.
fn why_not(members: &[MemberJobs]) -> String {
    let reasons: Vec<String> = members
        .iter()
        .filter_map(|m| {
            let why = match m.eligibility {
                Eligibility::Eligible | Eligibility::SoftTainted => return None,
                Eligibility::HardTainted => "hard-tainted",
                Eligibility::Unreachable => "unreachable or not reported",
                Eligibility::NotConnected => "not connected",
            };
            Some(format!("{} {why}", m.name))
        })
        .take(10)
        .collect();
    if reasons.is_empty() {
        "no member is listed or registered".to_owned()
    } else {
        reasons.join(", ")
    }
}

/// Ready, Paused and Degraded. Ready is False whenever no Job can be created where the
/// strategy wants one (a trigger that cannot be read, no eligible member, Jobs left
/// unplaced, every create refused), and Degraded is then True with the same reason, so the
/// two never contradict each other.
fn conditions(i: &OutcomeInput<'_>, triggers: &[TriggerMetricStatus]) -> Vec<Condition> {
    let not_ready = not_ready(i, &in_state(triggers, TRIGGER_ERROR));
    let p = &i.previous.conditions;
    let ready = match &not_ready {
        Some((reason, message)) => condition(
            p,
            CONDITION_READY,
            false,
            reason,
            message.clone(),
            i.generation,
            i.now,
        ),
        None => condition(
            p,
            CONDITION_READY,
            true,
            REASON_RECONCILED,
            "Jobs are planned every pollingInterval".to_owned(),
            i.generation,
            i.now,
        ),
    };
    let paused = i.settings.paused;
    let (degraded, reason, message) = degraded(i, not_ready, &in_state(triggers, TRIGGER_PENDING));
    vec![
        ready,
        condition(
            p,
            CONDITION_PAUSED,
            paused,
            if paused {
                REASON_PAUSED_BY_ANNOTATION
            } else {
                "NotPaused"
            },
            if paused {
                "autoscaling.keda.sh/paused: no new Jobs are created"
            } else {
                "Jobs are created as the triggers ask"
            }
            .to_owned(),
            i.generation,
            i.now,
        ),
        condition(
            p,
            CONDITION_DEGRADED,
            degraded,
            reason,
            message,
            i.generation,
            i.now,
        ),
    ]
}

/// The names of the triggers in `state`.
fn in_state<'t>(triggers: &'t [TriggerMetricStatus], state: &str) -> Vec<&'t str> {
    triggers
        .iter()
        .filter(|t| t.state == state)
        .map(|t| t.name.as_str())
        .collect()
}

/// The members whose creates failed in this poll, with why: `member-1: why; member-2: why`.
fn create_failures(i: &OutcomeInput<'_>) -> String {
    i.create_failures
        .iter()
        .map(|(m, why)| format!("{m}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why Ready is False (reason and message), if it is: in this order, a trigger that cannot
/// be read (`errors`), no eligible member while Jobs are wanted, Jobs left unplaced, every
/// eligible member refusing its creates.
fn not_ready(i: &OutcomeInput<'_>, errors: &[&str]) -> Option<(&'static str, String)> {
    let plan = &i.out.plan;
    let eligible: Vec<&str> = plan
        .members
        .iter()
        .filter(|m| {
            matches!(
                m.eligibility,
                Eligibility::Eligible | Eligibility::SoftTainted
            )
        })
        .map(|m| m.name.as_str())
        .collect();
    let refusing_all = !i.create_failures.is_empty()
        && eligible
            .iter()
            .all(|m| i.create_failures.iter().any(|(f, _)| f == m));
    if !errors.is_empty() {
        Some((
            REASON_METRIC_UNAVAILABLE,
            format!(
                "no Job is created while these triggers cannot be read: {}",
                errors.join(", ")
            ),
        ))
    } else if eligible.is_empty()
        && !i.settings.paused
        && (plan.desired_jobs > 0 || plan.unplaced > 0)
    {
        let why = why_not(&plan.members);
        Some((
            REASON_NO_ELIGIBLE_MEMBER,
            match plan.unplaced {
                0 => format!("no member can take Jobs ({why})"),
                1 => format!("1 Job cannot be placed: no member can take Jobs ({why})"),
                n => format!("{n} Jobs cannot be placed: no member can take Jobs ({why})"),
            },
        ))
    } else if plan.unplaced > 0 {
        Some((
            REASON_JOBS_UNPLACED,
            format!(
                "{} Job{} cannot be placed ({})",
                plan.unplaced,
                if plan.unplaced == 1 { "" } else { "s" },
                why_not(&plan.members)
            ),
        ))
    } else if refusing_all {
        Some((
            REASON_JOB_CREATE_FAILED,
            format!(
                "every member refuses the Jobs it is sent: {}",
                create_failures(i)
            ),
        ))
    } else {
        None
    }
}

/// Degraded (status, reason, message): True with Ready's reason when Ready is False
/// (`not_ready`), True when some member refused its creates, else False, saying which new
/// triggers are still `waiting` for their first value.
fn degraded(
    i: &OutcomeInput<'_>,
    not_ready: Option<(&'static str, String)>,
    waiting: &[&str],
) -> (bool, &'static str, String) {
    match (not_ready, i.create_failures.is_empty(), waiting.is_empty()) {
        (Some((reason, message)), _, _) => (true, reason, message),
        (None, false, _) => (
            true,
            REASON_JOB_CREATE_FAILED,
            format!("creating Jobs failed: {}", create_failures(i)),
        ),
        (None, true, false) => (
            false,
            REASON_AWAITING_METRIC,
            format!("waiting for KEDA's first value of {}", waiting.join(", ")),
        ),
        (None, true, true) => (
            false,
            REASON_NO_FAILURES,
            "every trigger can be read and every member takes its Jobs".to_owned(),
        ),
    }
}

/// When the DSJ must be looked at before its next poll, if ever: the moment a pending Job
/// passes the grace period, a taint's soft window or hard taint ends, or (while a
/// source/failover pair waits on a Job's phase under a policy that acts on it) one second
/// from `now`. The hub wakes the DSJ then with the last poll's metrics, so these act at
/// their own time, not at the next poll.
pub fn next_wake(
    settings: &DsjSettings,
    state: &DsjState,
    jobs: &[JobView],
    now: SystemTime,
) -> Option<SystemTime> {
    let mut wake: Option<SystemTime> = None;
    let mut at = |t: SystemTime| {
        if t > now && wake.is_none_or(|w| t < w) {
            wake = Some(t);
        }
    };
    let grace = settings.timing.grace_period;
    for j in jobs {
        if j.phase == JobPhase::Pending && !state.stuck.contains(&j.name) {
            // `is_stuck` is strict: one millisecond past the grace period.
            at(crate::time::saturating_add(
                j.pending_since,
                grace.saturating_add(Duration::from_millis(1)),
            ));
        }
    }
    for taint in state.taints.taints.values() {
        for until in [taint.soft_until, taint.hard_until].into_iter().flatten() {
            at(until);
        }
    }
    if settings.duplication != DuplicationPolicy::KeepAll {
        let active = |name: &str| {
            jobs.iter()
                .any(|j| j.name == name && matches!(j.phase, JobPhase::Pending | JobPhase::Running))
        };
        if jobs
            .iter()
            .any(|j| j.replaces.as_deref().is_some_and(active) && active(&j.name))
        {
            at(now + Duration::from_secs(1));
        }
    }
    wake
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DistributedScaledJobSpec;
    use crate::dsj::scaling::TriggerMetric;
    use crate::dsj::step::{StepInput, step};
    use crate::validate;

    fn settings(extra: &str) -> DsjSettings {
        let yaml = format!(
            "memberClusters:\n- {{name: a, weight: 1}}\n- {{name: b, weight: 1}}\n\
             scaledJobSpec:\n  maxReplicaCount: 10\n  jobTargetRef:\n    template:\n      spec:\n        \
             containers: [{{name: c, image: busybox}}]\n  triggers:\n  - {{type: rabbitmq, name: q}}\n{extra}"
        );
        let spec: DistributedScaledJobSpec = serde_yaml::from_str(&yaml).unwrap();
        validate::dsj(&spec, &BTreeMap::new()).unwrap()
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn member(name: &str, state: MemberPhase) -> DsjMember {
        DsjMember {
            name: name.into(),
            state,
        }
    }

    fn pending(name: &str, member: &str, since: u64) -> JobView {
        JobView {
            name: name.into(),
            member: member.into(),
            phase: JobPhase::Pending,
            pending_since: t(since),
            finished_at: None,
            replaces: None,
            template: None,
        }
    }

    struct Poll<'a> {
        settings: DsjSettings,
        members: Vec<DsjMember>,
        jobs: Vec<JobView>,
        remembered: Vec<Remembered>,
        readings: BTreeMap<String, Reading>,
        previous: DistributedScaledJobStatus,
        state: DsjState,
        failures: &'a [(String, String)],
    }

    fn queue(n: f64) -> BTreeMap<String, Reading> {
        BTreeMap::from([(
            "q".to_owned(),
            Reading::Read(TriggerMetric {
                value: n,
                target: 1.0,
            }),
        )])
    }

    fn poll(settings: DsjSettings, members: Vec<DsjMember>) -> Poll<'static> {
        Poll {
            settings,
            members,
            jobs: Vec::new(),
            remembered: Vec::new(),
            readings: queue(3.0),
            previous: DistributedScaledJobStatus::default(),
            state: DsjState::default(),
            failures: &[],
        }
    }

    impl Poll<'_> {
        fn run(&mut self, now: SystemTime) -> Outcome {
            let metrics = crate::dsj::metrics::usable(&self.readings);
            let levels_before = self
                .members
                .iter()
                .map(|m| {
                    (
                        m.name.clone(),
                        taint_level(&self.settings, &self.state, &m.name, now),
                    )
                })
                .collect();
            let out = step(
                &StepInput {
                    settings: &self.settings,
                    metrics: &metrics,
                    members: &self.members,
                    jobs: &self.jobs,
                    remembered: &self.remembered,
                    failover_only: false,
                    now,
                },
                &mut self.state,
            );
            let o = outcome(&OutcomeInput {
                previous: &self.previous,
                generation: Some(1),
                name: "work",
                settings: &self.settings,
                polling: Duration::from_secs(5),
                members: &self.members,
                ids: &BTreeMap::new(),
                jobs: &self.jobs,
                remembered: &self.remembered,
                readings: &self.readings,
                out: &out,
                state: &self.state,
                levels_before: &levels_before,
                create_failures: self.failures,
                next_index: 0,
                now,
            });
            self.previous = o.status.clone();
            o
        }
    }

    fn cond<'a>(s: &'a DistributedScaledJobStatus, type_: &str) -> (&'a str, &'a str) {
        let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn jobs_no_member_can_take_make_ready_false_with_the_count() {
        let mut p = poll(
            settings(""),
            vec![
                member("a", MemberPhase::Unreachable),
                member("b", MemberPhase::Unreachable),
            ],
        );
        let o = p.run(t(0));
        assert_eq!(
            cond(&o.status, "Ready"),
            ("False", REASON_NO_ELIGIBLE_MEMBER)
        );
        assert_eq!(
            cond(&o.status, "Degraded"),
            ("True", REASON_NO_ELIGIBLE_MEMBER)
        );
        let ready = &o.status.conditions[0];
        assert!(
            ready.message.starts_with("3 Jobs cannot be placed")
                && ready.message.contains("a unreachable"),
            "{}",
            ready.message
        );
        assert_eq!(o.status.desired_jobs, 3);
        // One member back: Ready.
        p.members[1].state = MemberPhase::Ready;
        let o = p.run(t(1));
        assert_eq!(cond(&o.status, "Ready"), ("True", REASON_RECONCILED));
        assert_eq!(cond(&o.status, "Degraded"), ("False", REASON_NO_FAILURES));
    }

    #[test]
    fn every_member_refusing_its_jobs_is_not_ready() {
        let failures = [
            ("a".to_owned(), "namespace default is not served".to_owned()),
            ("b".to_owned(), "namespace default is not served".to_owned()),
        ];
        let mut p = poll(
            settings(""),
            vec![
                member("a", MemberPhase::Ready),
                member("b", MemberPhase::Ready),
            ],
        );
        p.failures = &failures;
        let o = p.run(t(0));
        assert_eq!(
            cond(&o.status, "Ready"),
            ("False", REASON_JOB_CREATE_FAILED)
        );
        p.failures = &failures[..1];
        let o = p.run(t(1));
        assert_eq!(cond(&o.status, "Ready"), ("True", REASON_RECONCILED));
        assert_eq!(
            cond(&o.status, "Degraded"),
            ("True", REASON_JOB_CREATE_FAILED)
        );
    }

    #[test]
    fn a_new_trigger_waits_for_its_first_value_before_it_is_an_error() {
        let mut p = poll(settings(""), vec![member("a", MemberPhase::Ready)]);
        p.readings = BTreeMap::from([("q".to_owned(), Reading::Failed("not found".into()))]);
        let o = p.run(t(0));
        assert_eq!(o.status.trigger_metrics_status[0].state, TRIGGER_PENDING);
        assert_eq!(
            cond(&o.status, "Degraded"),
            ("False", REASON_AWAITING_METRIC)
        );
        assert_eq!(cond(&o.status, "Ready"), ("True", REASON_RECONCILED));
        assert!(o.events.is_empty(), "{:?}", o.events);
        // Still within pollingInterval (5 s) + 10 s.
        let o = p.run(t(14));
        assert_eq!(o.status.trigger_metrics_status[0].state, TRIGGER_PENDING);
        // Past it: an error, said once.
        let o = p.run(t(16));
        assert_eq!(o.status.trigger_metrics_status[0].state, "Error");
        assert_eq!(
            cond(&o.status, "Ready"),
            ("False", REASON_METRIC_UNAVAILABLE)
        );
        assert_eq!(
            cond(&o.status, "Degraded"),
            ("True", REASON_METRIC_UNAVAILABLE)
        );
        assert_eq!(o.events.len(), 1);
        assert_eq!(o.events[0].reason, EVENT_METRIC_UNAVAILABLE);
        assert!(p.run(t(17)).events.is_empty());
        // A trigger that was read before and fails later is an error at once.
        let mut q = poll(settings(""), vec![member("a", MemberPhase::Ready)]);
        q.run(t(0));
        q.readings = BTreeMap::from([("q".to_owned(), Reading::Failed("503".into()))]);
        let o = q.run(t(1));
        assert_eq!(o.status.trigger_metrics_status[0].state, "Error");
    }

    #[test]
    fn creates_are_counted_recorded_and_announced() {
        let mut p = poll(
            settings(""),
            vec![
                member("a", MemberPhase::Ready),
                member("b", MemberPhase::Ready),
            ],
        );
        p.remembered = vec![];
        let o = p.run(t(0));
        let s = &o.status;
        assert_eq!((s.running_jobs, s.pending_jobs), (3, 3));
        let record = &s.scheduling.as_ref().unwrap().member_jobs;
        let total: i32 = record.values().map(|r| r.running).sum();
        assert_eq!(total, 3, "{record:?}");
        let created: Vec<&Event> = o
            .events
            .iter()
            .filter(|e| e.reason == EVENT_JOBS_CREATED)
            .collect();
        assert_eq!(created.len(), 1);
        assert!(
            created[0].note.starts_with("created 3 Jobs: ")
                && created[0].note.contains(" in a")
                && created[0].note.contains(" in b"),
            "{}",
            created[0].note
        );
        assert_eq!(s.cluster_strategy.as_deref(), Some("weightedRoundRobin"));
        // Remembered Jobs stay in the record until their member reports.
        let mut p = poll(
            settings(""),
            vec![
                member("a", MemberPhase::Unreachable),
                member("b", MemberPhase::Ready),
            ],
        );
        p.remembered = vec![Remembered {
            member: "a".into(),
            running: 3,
            pending: 0,
        }];
        let o = p.run(t(0));
        let record = &o.status.scheduling.as_ref().unwrap().member_jobs;
        assert_eq!(record["a"].running, 3);
        assert!(o.events.iter().all(|e| e.reason != EVENT_JOBS_CREATED));
    }

    #[test]
    fn stuck_jobs_count_while_they_pend_replaced_or_not() {
        let mut p = poll(
            settings(""),
            vec![
                member("a", MemberPhase::Ready),
                member("b", MemberPhase::Ready),
            ],
        );
        p.readings = queue(1.0);
        p.jobs = vec![pending("j1", "a", 0)];
        let o = p.run(t(61));
        assert_eq!(o.status.member_cluster_statuses["a"].stuck_jobs, 1);
        // Its failover Job exists: j1 is still stuck where it pends.
        p.jobs.push(JobView {
            replaces: Some("j1".into()),
            ..pending("j2", "b", 61)
        });
        let o = p.run(t(62));
        assert_eq!(o.status.member_cluster_statuses["a"].stuck_jobs, 1);
    }

    #[test]
    fn wakes_at_the_grace_period_taint_ends_and_for_pairs() {
        let s = settings(
            "clusterScheduling: {failoverPolicy: {gracePeriod: 3s, duplicationPolicy: immediateSourceCleanup}}",
        );
        let mut state = DsjState::default();
        let jobs = vec![pending("j1", "a", 100)];
        let wake = next_wake(&s, &state, &jobs, t(101)).unwrap();
        assert_eq!(wake, t(103) + Duration::from_millis(1));
        crate::dsj::step::create_failed(&s, &mut state, "a", t(101));
        let soft_end = state
            .taints
            .taints
            .values()
            .next()
            .unwrap()
            .soft_until
            .unwrap();
        state.stuck.insert("j1".into());
        assert_eq!(next_wake(&s, &state, &jobs, t(101)), Some(soft_end));
        // A source and its failover both active: look again in a second.
        let pair = vec![
            pending("j1", "a", 100),
            JobView {
                replaces: Some("j1".into()),
                ..pending("j2", "b", 104)
            },
        ];
        let none = DsjState::default();
        let mut stuck = none.clone();
        stuck.stuck.insert("j1".into());
        assert_eq!(next_wake(&s, &stuck, &pair, t(105)), Some(t(106)));
        // Nothing to wait for: no wake.
        assert_eq!(next_wake(&s, &none, &[], t(0)), None);
    }
}

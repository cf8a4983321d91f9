//! One poll of a `DistributedScaledJob`: the rules applied beyond the formulas. Which pending
//! Jobs are stuck (each taints its member once), how many Jobs each member runs, what
//! [`plan`] decides, which stuck Job each failover Job replaces ([`step`]); a create that
//! failed ([`create_failed`]); and which Jobs the duplication policy and the history limits
//! delete ([`cleanup`]). `kubectl kedge simulate` and the hub's controller both call these,
//! so the simulator runs exactly what the hub runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use super::duplication::{DuplicateAction, JobPhase, resolve_duplicate};
use super::history::{FinishedJob, jobs_to_delete};
use super::scaling::TriggerMetric;
use super::schedule::WrrState;
use super::taint::{TaintBook, TaintEvent, TaintLevel};
use super::{DsjMemberObservation, DsjPlan, DsjPlanInput, plan};
use crate::crd::conditions::MemberPhase;
use crate::validate::{DsjSettings, Rollout};

/// One Job of the DSJ, as the agents report it (hub) or the simulator tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    /// Job name; unique within the DSJ.
    pub name: String,
    /// Member it runs in.
    pub member: String,
    /// Phase (never [`JobPhase::Gone`]: a gone Job is not in the list).
    pub phase: JobPhase,
    /// Since when it has been pending (its creation).
    pub pending_since: SystemTime,
    /// When it finished, for a succeeded or failed Job.
    pub finished_at: Option<SystemTime>,
    /// For a failover Job: the name of the stuck Job it replaces.
    pub replaces: Option<String>,
    /// The template hash it was rendered with (`kedge.dev/template`); `None` when unknown.
    pub template: Option<String>,
}

impl JobView {
    fn active(&self) -> bool {
        matches!(self.phase, JobPhase::Pending | JobPhase::Running)
    }
}

/// A member as the DSJ sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsjMember {
    /// Member name.
    pub name: String,
    /// Health.
    pub state: MemberPhase,
}

/// What one poll leaves for the next: the hub keeps it in the DSJ's status, so a hub restart
/// loses no taint and creates no Job twice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DsjState {
    /// Taints by member and scope.
    pub taints: TaintBook,
    /// Smooth weighted round-robin state.
    pub wrr: WrrState,
    /// Jobs found stuck (each taints its member once).
    pub stuck: BTreeSet<String>,
}

/// The Jobs of a member the hub has had no complete report from since it started: what the
/// DSJ's last status recorded there (`status.scheduling.memberJobs`, written before any
/// create it counts was sent). Counted as they were until the member reports, so that a
/// restarted hub creates nothing a second time for Jobs it cannot see yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Remembered {
    /// Member name.
    pub member: String,
    /// Non-terminal Jobs (includes pending).
    pub running: u32,
    /// Of those, pending.
    pub pending: u32,
}

/// Everything [`step`] decides from.
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    /// The validated spec and annotations.
    pub settings: &'a DsjSettings,
    /// Trigger readings by trigger key; a trigger of the spec that is absent here could not
    /// be read, and then nothing is created.
    pub metrics: &'a BTreeMap<String, TriggerMetric>,
    /// Every member the hub knows.
    pub members: &'a [DsjMember],
    /// Every Job of the DSJ in every member, in a stable order (oldest first).
    pub jobs: &'a [JobView],
    /// Jobs known only by count, of members that have not reported since the hub started.
    pub remembered: &'a [Remembered],
    /// A timer's tick between two polls (a grace period or taint ended): the metrics are
    /// the last poll's, so only failover Jobs for stuck ones are created, never new work.
    pub failover_only: bool,
    /// The time of the poll.
    pub now: SystemTime,
}

/// The Jobs to create in one member. Counted, not listed: `maxReplicaCount` is user input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Creates {
    /// Member to create them in.
    pub member: String,
    /// Failover Jobs: one per stuck Job (in another member) it replaces, by that Job's name.
    pub failovers: Vec<String>,
    /// Other new Jobs.
    pub new: u32,
}

impl Creates {
    /// All Jobs to create there.
    pub fn total(&self) -> u64 {
        u64::from(self.new) + u64::try_from(self.failovers.len()).unwrap_or(u64::MAX)
    }
}

/// The decisions of one poll.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    /// What the planner decided (all zero creates when a trigger is unreadable).
    pub plan: DsjPlan,
    /// Jobs per member before this poll's creates.
    pub observations: Vec<DsjMemberObservation>,
    /// Jobs to create per member (members with none left out).
    pub creates: Vec<Creates>,
    /// Jobs found stuck in this poll.
    pub newly_stuck: Vec<String>,
    /// Triggers of the spec without a reading: nothing was created because of them.
    pub unreadable: Vec<String>,
}

/// `member`'s `scheduling.priority` in the spec.
pub(crate) fn priority(settings: &DsjSettings, member: &str) -> Option<i32> {
    settings
        .members
        .iter()
        .flatten()
        .find(|m| m.name == member)
        .and_then(|m| m.priority)
}

fn count<'a>(jobs: impl Iterator<Item = &'a JobView>) -> u32 {
    u32::try_from(jobs.count()).unwrap_or(u32::MAX)
}

/// One poll: marks stuck Jobs (a member's Jobs found stuck in one poll are one failure, so a
/// batch stuck together does not jump straight to a hard taint), counts Jobs per member,
/// plans, and pairs each failover Job with the stuck Job it replaces. Updates `state`.
pub fn step(input: &StepInput<'_>, state: &mut DsjState) -> StepOutput {
    let StepInput {
        settings,
        metrics,
        members,
        jobs,
        remembered,
        failover_only,
        now,
    } = *input;
    state.taints.reconfigure(settings);
    state.taints.expire(now);
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    state.stuck.retain(|j| names.contains(j.as_str()));
    // A stuck Job is replaced while its failover Job exists (the hub counts the creates it
    // sent and no agent has reported yet as existing); a failed create leaves it waiting.
    let mut replaced: BTreeSet<String> = jobs.iter().filter_map(|j| j.replaces.clone()).collect();

    let mut newly_stuck = Vec::new();
    let mut failed_members: Vec<&str> = Vec::new();
    for job in jobs {
        if job.phase == JobPhase::Pending
            && !state.stuck.contains(&job.name)
            && settings.timing.is_stuck(job.pending_since, now)
        {
            state.stuck.insert(job.name.clone());
            newly_stuck.push(job.name.clone());
            if !failed_members.contains(&job.member.as_str()) {
                failed_members.push(&job.member);
            }
        }
    }
    for member in failed_members {
        state.taints.observe(
            member,
            priority(settings, member),
            TaintEvent::JobStuck,
            now,
        );
    }

    let waiting = |replaced: &BTreeSet<String>, j: &JobView| {
        j.phase == JobPhase::Pending && state.stuck.contains(&j.name) && !replaced.contains(&j.name)
    };
    let observations: Vec<DsjMemberObservation> = members
        .iter()
        .map(|m| {
            let mine = jobs.iter().filter(|j| j.member == m.name);
            let (running, pending) = remembered
                .iter()
                .filter(|r| r.member == m.name)
                .fold((0u32, 0u32), |(a, b), r| {
                    (a.saturating_add(r.running), b.saturating_add(r.pending))
                });
            DsjMemberObservation {
                name: m.name.clone(),
                state: m.state,
                running_jobs: count(mine.clone().filter(|j| j.active())).saturating_add(running),
                pending_jobs: count(mine.clone().filter(|j| j.phase == JobPhase::Pending))
                    .saturating_add(pending),
                stuck_jobs: count(mine.filter(|j| waiting(&replaced, j))),
            }
        })
        .collect();
    let unreadable: Vec<String> = settings
        .triggers
        .iter()
        .filter(|t| !metrics.contains_key(*t))
        .cloned()
        .collect();
    let mut plan = plan(&DsjPlanInput {
        settings,
        metrics,
        members: &observations,
        taints: &state.taints,
        wrr: &state.wrr,
        failover_only,
        now,
    });
    if !unreadable.is_empty() {
        // Never plan from a metric that could not be read: no Job is created, the round
        // robin does not advance.
        plan.to_create = 0;
        plan.unplaced = 0;
        plan.replacements.clear();
        for m in &mut plan.members {
            m.create = 0;
            m.replacements = 0;
        }
        plan.wrr = state.wrr.clone();
    }
    state.wrr = plan.wrr.clone();

    let mut sources: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &plan.replacements {
        sources.entry(&r.to).or_default().push(&r.from);
    }
    let mut creates = Vec::new();
    for m in &plan.members {
        let mut here = Creates {
            member: m.name.clone(),
            ..Creates::default()
        };
        for src in sources.remove(m.name.as_str()).unwrap_or_default() {
            if let Some(job) = jobs
                .iter()
                .find(|j| j.member == src && waiting(&replaced, j))
            {
                replaced.insert(job.name.clone());
                here.failovers.push(job.name.clone());
            }
        }
        let failovers = u32::try_from(here.failovers.len()).unwrap_or(u32::MAX);
        here.new = m.create.saturating_sub(failovers);
        if here.total() > 0 {
            creates.push(here);
        }
    }
    StepOutput {
        plan,
        observations,
        creates,
        newly_stuck,
        unreadable,
    }
}

/// Records that creating a Job in `member` failed at `now` (once per member and poll):
/// a soft, then hard taint under `weightedRoundRobin`; nothing under `priorityFailover`,
/// where create failures are transient. Returns the member's taint level.
pub fn create_failed(
    settings: &DsjSettings,
    state: &mut DsjState,
    member: &str,
    now: SystemTime,
) -> TaintLevel {
    state.taints.reconfigure(settings);
    state.taints.observe(
        member,
        priority(settings, member),
        TaintEvent::CreateFailed,
        now,
    );
    state.taints.level(member, priority(settings, member), now)
}

/// The taint level of `member` for this DSJ at `now`.
pub fn taint_level(
    settings: &DsjSettings,
    state: &DsjState,
    member: &str,
    now: SystemTime,
) -> TaintLevel {
    state.taints.level_under(
        member,
        priority(settings, member),
        &settings.cluster_strategy,
        now,
    )
}

/// Why a Job is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// The duplication policy resolved a source/failover pair.
    Duplicate,
    /// Beyond `successfulJobsHistoryLimit` or `failedJobsHistoryLimit`.
    History,
    /// Made from an earlier spec, under `rollout.strategy: default`.
    Rollout,
}

/// A Job to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deletion {
    /// Member it runs in.
    pub member: String,
    /// Job name.
    pub name: String,
    /// Why.
    pub why: Cleanup,
}

/// The Jobs an update of the DSJ leaves behind, under `rollout.strategy: default`: every
/// pending or running Job whose template hash differs from `current[member]`, the hash a Job
/// rendered now for its member would carry. KEDA deletes every Job of a ScaledJob on any
/// update; kedge deletes only those whose Job spec in that member really changed, so changing
/// `maxReplicaCount` or a trigger kills nothing. Finished Jobs are left to the history limits,
/// and a Job without a known hash is left alone. Under `gradual`, nothing.
///
/// The hub leaves these Jobs out of [`step`]'s input, so their replacements are created in the
/// same poll.
pub fn rollout(
    settings: &DsjSettings,
    jobs: &[JobView],
    current: &BTreeMap<String, String>,
) -> Vec<Deletion> {
    if settings.rollout == Rollout::Gradual {
        return Vec::new();
    }
    jobs.iter()
        .filter(|j| j.active())
        .filter(|j| {
            matches!((&j.template, current.get(&j.member)), (Some(had), Some(now)) if had != now)
        })
        .map(|j| Deletion {
            member: j.member.clone(),
            name: j.name.clone(),
            why: Cleanup::Rollout,
        })
        .collect()
}

/// The Jobs to delete: one of each source/failover pair as `duplicationPolicy` says, then
/// finished Jobs beyond the history limits (per member, most recently finished kept).
pub fn cleanup(settings: &DsjSettings, jobs: &[JobView]) -> Vec<Deletion> {
    let phase = |name: &str| {
        jobs.iter()
            .find(|j| j.name == name)
            .map_or(JobPhase::Gone, |j| j.phase)
    };
    let mut out: Vec<Deletion> = Vec::new();
    for failover in jobs {
        let Some(source) = failover.replaces.as_deref() else {
            continue;
        };
        let doomed = match resolve_duplicate(settings.duplication, phase(source), failover.phase) {
            DuplicateAction::KeepBoth => None,
            DuplicateAction::DeleteSource => jobs.iter().find(|j| j.name == source),
            DuplicateAction::DeleteFailover => Some(failover),
        };
        if let Some(job) = doomed
            && !out.iter().any(|d| d.name == job.name)
        {
            out.push(Deletion {
                member: job.member.clone(),
                name: job.name.clone(),
                why: Cleanup::Duplicate,
            });
        }
    }
    let mut finished: BTreeMap<&str, Vec<FinishedJob>> = BTreeMap::new();
    for job in jobs {
        if let (Some(at), JobPhase::Succeeded | JobPhase::Failed) = (job.finished_at, job.phase)
            && !out.iter().any(|d| d.name == job.name)
        {
            finished.entry(&job.member).or_default().push(FinishedJob {
                name: job.name.clone(),
                succeeded: job.phase == JobPhase::Succeeded,
                finished_at: at,
            });
        }
    }
    for (member, done) in finished {
        for name in jobs_to_delete(
            &done,
            settings.successful_jobs_history_limit,
            settings.failed_jobs_history_limit,
        ) {
            out.push(Deletion {
                member: member.to_owned(),
                name,
                why: Cleanup::History,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::crd::DistributedScaledJobSpec;
    use crate::validate;

    fn settings(extra: &str) -> DsjSettings {
        settings_of("- {name: a, weight: 1}\n- {name: b, weight: 1}", extra)
    }

    fn settings_of(members: &str, extra: &str) -> DsjSettings {
        let yaml = format!(
            "memberClusters:\n{members}\n\
             scaledJobSpec:\n  maxReplicaCount: 10\n  jobTargetRef:\n    template:\n      spec:\n        \
             containers: [{{name: c, image: busybox}}]\n  triggers:\n  - {{type: rabbitmq, name: q}}\n{extra}"
        );
        let spec: DistributedScaledJobSpec = serde_yaml::from_str(&yaml).unwrap();
        validate::dsj(&spec, &BTreeMap::new()).unwrap()
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(86_400 + secs)
    }

    fn job(name: &str, member: &str, phase: JobPhase, since: u64) -> JobView {
        JobView {
            name: name.into(),
            member: member.into(),
            phase,
            pending_since: t(since),
            finished_at: matches!(phase, JobPhase::Succeeded | JobPhase::Failed)
                .then(|| t(since + 1)),
            replaces: None,
            template: None,
        }
    }

    #[test]
    fn rollout_deletes_active_jobs_made_from_an_earlier_spec_unless_gradual() {
        let with = |name: &str, member: &str, phase, template: Option<&str>| JobView {
            template: template.map(str::to_owned),
            ..job(name, member, phase, 0)
        };
        let jobs = [
            with("old-running", "a", JobPhase::Running, Some("v1")),
            with("old-pending", "a", JobPhase::Pending, Some("v1")),
            with("old-done", "a", JobPhase::Succeeded, Some("v1")),
            with("new", "a", JobPhase::Running, Some("v2")),
            with("unknown", "a", JobPhase::Running, None),
            // b's Job spec did not change (its podOverrides pin what changed for a).
            with("b-same", "b", JobPhase::Running, Some("b1")),
        ];
        let current =
            BTreeMap::from([("a".to_owned(), "v2".to_owned()), ("b".into(), "b1".into())]);
        let doomed: Vec<(String, Cleanup)> = rollout(&settings(""), &jobs, &current)
            .into_iter()
            .map(|d| (d.name, d.why))
            .collect();
        assert_eq!(
            doomed,
            [
                ("old-running".to_owned(), Cleanup::Rollout),
                ("old-pending".to_owned(), Cleanup::Rollout)
            ]
        );
        let gradual = settings("  rollout: {strategy: gradual, propagationPolicy: foreground}");
        assert_eq!(
            gradual.propagation,
            crate::validate::Propagation::Foreground
        );
        assert!(rollout(&gradual, &jobs, &current).is_empty());
        // The deprecated field still means gradual; rollout.strategy wins over it.
        assert!(rollout(&settings("  rolloutStrategy: gradual"), &jobs, &current).is_empty());
        let both = settings("  rolloutStrategy: gradual\n  rollout: {strategy: default}");
        assert_eq!(rollout(&both, &jobs, &current).len(), 2);
    }

    fn members() -> Vec<DsjMember> {
        ["a", "b"]
            .iter()
            .map(|n| DsjMember {
                name: (*n).into(),
                state: MemberPhase::Ready,
            })
            .collect()
    }

    fn queue(n: f64) -> BTreeMap<String, TriggerMetric> {
        BTreeMap::from([(
            "q".to_owned(),
            TriggerMetric {
                value: n,
                target: 1.0,
            },
        )])
    }

    #[test]
    fn a_stuck_job_taints_once_and_is_replaced_in_another_member() {
        let s = settings("");
        let mut state = DsjState::default();
        let mut jobs = vec![job("j1", "a", JobPhase::Pending, 0)];
        let (metrics, members) = (queue(1.0), members());
        let poll = |now, jobs: &[JobView], state: &mut DsjState| {
            step(
                &StepInput {
                    settings: &s,
                    metrics: &metrics,
                    members: &members,
                    jobs,
                    remembered: &[],
                    failover_only: false,
                    now,
                },
                state,
            )
        };
        // Within the grace period (60s): nothing to create, nothing stuck.
        let out = poll(t(30), &jobs, &mut state);
        assert_eq!((out.creates.len(), out.newly_stuck.len()), (0, 0));
        // Past it: stuck once, soft taint, a failover Job in b replacing j1.
        let out = poll(t(61), &jobs, &mut state);
        assert_eq!(out.newly_stuck, ["j1"]);
        let failover = Creates {
            member: "b".into(),
            failovers: vec!["j1".into()],
            new: 0,
        };
        assert_eq!(out.creates, std::slice::from_ref(&failover));
        assert_eq!(taint_level(&s, &state, "a", t(61)), TaintLevel::Soft);
        // Its create failed: j1 still waits, and is replaced again, but not stuck again.
        let out = poll(t(91), &jobs, &mut state);
        assert!(out.newly_stuck.is_empty(), "{out:?}");
        assert_eq!(out.creates, [failover]);
        // The failover Job exists: nothing more.
        jobs.push(JobView {
            replaces: Some("j1".into()),
            ..job("j2", "b", JobPhase::Pending, 91)
        });
        let out = poll(t(121), &jobs, &mut state);
        assert!(
            out.newly_stuck.is_empty() && out.creates.is_empty(),
            "{out:?}"
        );
        assert_eq!(taint_level(&s, &state, "a", t(121)), TaintLevel::Soft);
    }

    /// A restarted hub that has not heard from member `a` yet counts the Jobs the last status
    /// recorded there: with 6 running in `a` and 3 in `b` at queue 9, nothing is created
    /// (without the record, 6 would be created a second time in `b`).
    #[test]
    fn remembered_jobs_are_counted_until_their_member_reports() {
        let s = settings("");
        let members = vec![
            DsjMember {
                name: "a".into(),
                state: MemberPhase::Unreachable,
            },
            DsjMember {
                name: "b".into(),
                state: MemberPhase::Ready,
            },
        ];
        let jobs: Vec<JobView> = (0..3)
            .map(|i| job(&format!("b{i}"), "b", JobPhase::Running, 0))
            .collect();
        let remembered = [Remembered {
            member: "a".into(),
            running: 6,
            pending: 1,
        }];
        let metrics = queue(9.0);
        let poll = |remembered: &[Remembered]| {
            step(
                &StepInput {
                    settings: &s,
                    metrics: &metrics,
                    members: &members,
                    jobs: &jobs,
                    remembered,
                    failover_only: false,
                    now: t(0),
                },
                &mut DsjState::default(),
            )
        };
        let out = poll(&remembered);
        assert!(out.creates.is_empty(), "{out:?}");
        assert_eq!((out.plan.running_jobs, out.plan.pending_jobs), (9, 1));
        assert_eq!(out.observations[0].running_jobs, 6);
        // Without the record the hub would create the 6 again, all in b.
        let out = poll(&[]);
        assert_eq!(out.creates.iter().map(Creates::total).sum::<u64>(), 6);
    }

    /// A tick between polls (the grace period just ended) creates the failover Job of a stuck
    /// one, and no new work from the last poll's metrics.
    #[test]
    fn a_tick_creates_failover_jobs_only() {
        let s = settings("");
        let (members, metrics) = (members(), queue(5.0));
        let jobs = vec![job("j1", "a", JobPhase::Pending, 0)];
        let out = step(
            &StepInput {
                settings: &s,
                metrics: &metrics,
                members: &members,
                jobs: &jobs,
                remembered: &[],
                failover_only: true,
                now: t(61),
            },
            &mut DsjState::default(),
        );
        assert_eq!(out.newly_stuck, ["j1"]);
        assert_eq!(
            out.creates,
            [Creates {
                member: "b".into(),
                failovers: vec!["j1".into()],
                new: 0,
            }]
        );
        // No member eligible: a tick creates nothing, and says what it could not place.
        let away: Vec<DsjMember> = members
            .iter()
            .map(|m| DsjMember {
                state: MemberPhase::Unreachable,
                ..m.clone()
            })
            .collect();
        let out = step(
            &StepInput {
                settings: &s,
                metrics: &metrics,
                members: &away,
                jobs: &[],
                remembered: &[],
                failover_only: true,
                now: t(61),
            },
            &mut DsjState::default(),
        );
        assert!(out.creates.is_empty());
        assert_eq!(out.plan.unplaced, 5);
    }

    #[test]
    fn an_unreadable_metric_creates_nothing() {
        let s = settings("");
        let mut state = DsjState::default();
        let none = BTreeMap::new();
        let members = members();
        let out = step(
            &StepInput {
                settings: &s,
                metrics: &none,
                members: &members,
                jobs: &[],
                remembered: &[],
                failover_only: false,
                now: t(0),
            },
            &mut state,
        );
        assert_eq!(out.unreadable, ["q"]);
        assert!(out.creates.is_empty());
        assert_eq!(out.plan.to_create, 0);
        assert_eq!(state.wrr, WrrState::default());
        let metrics = queue(4.0);
        let out = step(
            &StepInput {
                settings: &s,
                metrics: &metrics,
                members: &members,
                jobs: &[],
                remembered: &[],
                failover_only: false,
                now: t(0),
            },
            &mut state,
        );
        let per_member: Vec<(&str, u64)> = out
            .creates
            .iter()
            .map(|c| (c.member.as_str(), c.total()))
            .collect();
        assert_eq!(per_member, [("a", 2), ("b", 2)]);
    }

    #[test]
    fn create_failures_taint_under_round_robin_only() {
        let s = settings("");
        let mut state = DsjState::default();
        assert_eq!(create_failed(&s, &mut state, "a", t(0)), TaintLevel::Soft);
        assert_eq!(create_failed(&s, &mut state, "a", t(10)), TaintLevel::Hard);
        let p = settings_of(
            "- {name: a, scheduling: {priority: 1}}\n- {name: b, scheduling: {priority: 2}}",
            "clusterScheduling:\n  strategy: priorityFailover\n  workloadAffinity: {class: gpu, size: 1}\n",
        );
        let mut state = DsjState::default();
        assert_eq!(create_failed(&p, &mut state, "a", t(0)), TaintLevel::None);
    }

    #[test]
    fn cleanup_resolves_pairs_by_policy_and_keeps_history_limits() {
        let failover = |name: &str, member: &str, phase, source: &str| JobView {
            replaces: Some(source.into()),
            ..job(name, member, phase, 100)
        };
        let jobs = vec![
            job("src", "a", JobPhase::Pending, 0),
            failover("fo", "b", JobPhase::Running, "src"),
        ];
        for (policy, expected) in [
            ("keepAll", vec![]),
            ("immediateSourceCleanup", vec![("a", "src")]),
            ("preferFailover", vec![("a", "src")]),
            ("preferSource", vec![]),
        ] {
            let s = settings(&format!(
                "clusterScheduling: {{failoverPolicy: {{duplicationPolicy: {policy}}}}}\n"
            ));
            let got: Vec<(String, String)> = cleanup(&s, &jobs)
                .into_iter()
                .map(|d| (d.member, d.name))
                .collect();
            let expected: Vec<(String, String)> = expected
                .into_iter()
                .map(|(m, n)| (m.to_owned(), n.to_owned()))
                .collect();
            assert_eq!(got, expected, "{policy}");
        }
        // History: 1 successful and 1 failed kept per member, the most recent.
        let s = settings("  successfulJobsHistoryLimit: 1\n  failedJobsHistoryLimit: 1\n");
        let jobs = vec![
            job("ok-old", "a", JobPhase::Succeeded, 0),
            job("ok-new", "a", JobPhase::Succeeded, 50),
            job("ok-b", "b", JobPhase::Succeeded, 0),
            job("bad-old", "a", JobPhase::Failed, 0),
            job("bad-new", "a", JobPhase::Failed, 50),
            job("running", "a", JobPhase::Running, 0),
        ];
        let got: Vec<(String, Cleanup)> = cleanup(&s, &jobs)
            .into_iter()
            .map(|d| (d.name, d.why))
            .collect();
        assert_eq!(
            got,
            [
                ("bad-old".to_owned(), Cleanup::History),
                ("ok-old".to_owned(), Cleanup::History)
            ]
        );
    }
}

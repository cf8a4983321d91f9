//! Invariants of one DSJ poll, `dsj::step::step` then `dsj::outcome::outcome` as the hub's
//! controller runs them, over generated worlds: specs (every scaling strategy, both cluster
//! strategies, min/max replica counts), members (reachable or not, with taints from earlier
//! create failures), their Jobs (every phase, stuck or not) and trigger readings.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kedge_core::crd::conditions::EVENT_JOBS_CREATED;
use kedge_core::crd::conditions::MemberPhase;
use kedge_core::crd::{DistributedScaledJobSpec, DistributedScaledJobStatus};
use kedge_core::dsj::duplication::JobPhase;
use kedge_core::dsj::metrics::{Reading, usable};
use kedge_core::dsj::outcome::{Outcome, OutcomeInput, outcome};
use kedge_core::dsj::scaling::TriggerMetric;
use kedge_core::dsj::step::{
    DsjMember, DsjState, JobView, Remembered, StepInput, StepOutput, create_failed, step,
    taint_level,
};
use kedge_core::dsj::taint::TaintLevel;
use kedge_core::validate::{self, DsjSettings, ScalingStrategyKind};
use proptest::prelude::*;

/// Enough to explore the arithmetic and the taint states; the suite stays under a second.
const CASES: u32 = 2048;

const STRATEGIES: [&str; 5] = ["default", "pendingAware", "accurate", "eager", "custom"];

/// A generated world before its poll.
#[derive(Clone, Debug)]
struct World {
    strategy: usize,
    deduction: i32,
    /// Tenths: 0.0 to 1.0.
    percentage: u8,
    priority_failover: bool,
    max: Option<u32>,
    min: Option<u32>,
    calculation: usize,
    paused: bool,
    members: Vec<Member>,
    /// (value, target) of each trigger.
    readings: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
struct Member {
    reachable: bool,
    weight: u32,
    /// (phase, seconds since it was created).
    jobs: Vec<(JobPhase, u64)>,
    /// Seconds ago of each create failure (under weightedRoundRobin: soft, then hard taint).
    failures: Vec<u64>,
    /// Jobs counted from the last recorded status (a member not reported since a restart).
    remembered: Option<u32>,
}

fn phase() -> impl Strategy<Value = JobPhase> {
    prop_oneof![
        Just(JobPhase::Pending),
        Just(JobPhase::Running),
        Just(JobPhase::Succeeded),
        Just(JobPhase::Failed),
    ]
}

fn member() -> impl Strategy<Value = Member> {
    (
        prop::bool::weighted(0.8),
        1u32..5,
        prop::collection::vec((phase(), 0u64..200), 0..6),
        prop::collection::vec(0u64..400, 0..3),
        prop::option::weighted(0.1, 0u32..5),
    )
        .prop_map(|(reachable, weight, jobs, failures, remembered)| Member {
            reachable,
            weight,
            jobs,
            failures,
            remembered,
        })
}

fn world() -> impl Strategy<Value = World> {
    (
        (0usize..5, -3i32..4, 0u8..=10, any::<bool>()),
        (
            prop::option::of(0u32..30),
            prop::option::weighted(0.3, 0u32..6),
            0usize..4,
            prop::bool::weighted(0.1),
        ),
        prop::collection::vec(member(), 1..5),
        // Values and targets from 1: below 1 KEDA's per-poll bound (the queue length) is
        // below what the metric asks for, which the bound property covers as well.
        prop::collection::vec((0u32..40, 1u32..6), 1..3),
    )
        .prop_map(
            |(
                (strategy, deduction, percentage, priority_failover),
                (max, min, calculation, paused),
                members,
                readings,
            )| World {
                strategy,
                deduction,
                percentage,
                priority_failover,
                max,
                min,
                calculation,
                paused,
                members,
                readings,
            },
        )
}

/// The worlds whose second poll KEDA's arithmetic keeps from creating more: no
/// `minReplicaCount`, no `eager`, `custom` only with a running percentage of 1 and a
/// deduction of at least 0.
fn idempotent_world() -> impl Strategy<Value = World> {
    world().prop_map(|mut w| {
        w.min = None;
        match STRATEGIES[w.strategy] {
            "eager" => w.strategy = 0,
            "custom" => {
                w.percentage = 10;
                w.deduction = w.deduction.abs();
            }
            _ => {}
        }
        w
    })
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn ago(secs: u64) -> SystemTime {
    now() - Duration::from_secs(secs)
}

fn name(i: usize) -> String {
    format!("m{i}")
}

impl World {
    /// The scaling strategy: `priorityFailover` takes only `pendingAware`.
    fn strategy(&self) -> &'static str {
        if self.priority_failover {
            "pendingAware"
        } else {
            STRATEGIES[self.strategy]
        }
    }

    fn settings(&self) -> DsjSettings {
        let members: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                format!(
                    "{{name: {}, weight: {}, scheduling: {{priority: {}}}}}",
                    name(i),
                    m.weight,
                    10 * (4 - i)
                )
            })
            .collect();
        let cluster = if self.priority_failover {
            "strategy: priorityFailover, workloadAffinity: {class: c, size: 2},"
        } else {
            ""
        };
        let mut strategy = format!(
            "strategy: {}, multipleScalersCalculation: {}",
            self.strategy(),
            ["max", "min", "avg", "sum"][self.calculation]
        );
        if self.strategy() == "custom" {
            strategy.push_str(&format!(
                ", customScalingQueueLengthDeduction: {}, customScalingRunningJobPercentage: \"{}\"",
                self.deduction,
                f64::from(self.percentage) / 10.0
            ));
        }
        let counts: String = [("maxReplicaCount", self.max), ("minReplicaCount", self.min)]
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("  {k}: {v}\n")))
            .collect();
        let triggers: Vec<String> = (0..self.readings.len())
            .map(|i| format!("{{type: rabbitmq, name: t{i}}}"))
            .collect();
        let yaml = format!(
            "clusterScheduling: {{{cluster} failoverPolicy: {{gracePeriod: 60s, softTaintDuration: 3m, \
             hardTaintDuration: 5m}}}}\nmemberClusters: [{}]\nscaledJobSpec:\n{counts}  \
             jobTargetRef: {{template: {{spec: {{containers: [{{name: c, image: busybox}}]}}}}}}\n  \
             scalingStrategy: {{{strategy}}}\n  triggers: [{}]\n",
            members.join(", "),
            triggers.join(", ")
        );
        let spec: DistributedScaledJobSpec =
            serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
        let annotations = if self.paused {
            BTreeMap::from([("autoscaling.keda.sh/paused".to_owned(), "true".to_owned())])
        } else {
            BTreeMap::new()
        };
        validate::dsj(&spec, &annotations).unwrap_or_else(|e| panic!("{e}: {yaml}"))
    }

    fn readings(&self) -> BTreeMap<String, Reading> {
        self.readings
            .iter()
            .enumerate()
            .map(|(i, (value, target))| {
                (
                    format!("t{i}"),
                    Reading::Read(TriggerMetric {
                        value: f64::from(*value),
                        target: f64::from(*target),
                    }),
                )
            })
            .collect()
    }

    fn members(&self) -> Vec<DsjMember> {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| DsjMember {
                name: name(i),
                state: if m.reachable {
                    MemberPhase::Ready
                } else {
                    MemberPhase::Unreachable
                },
            })
            .collect()
    }

    fn jobs(&self) -> Vec<JobView> {
        let mut jobs = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.remembered.is_some() && !m.reachable {
                continue;
            }
            for (j, (phase, age)) in m.jobs.iter().enumerate() {
                jobs.push(JobView {
                    name: format!("{}-job-{j}", name(i)),
                    member: name(i),
                    phase: *phase,
                    pending_since: ago(*age),
                    finished_at: matches!(phase, JobPhase::Succeeded | JobPhase::Failed)
                        .then(|| ago(*age / 2)),
                    replaces: None,
                    template: None,
                });
            }
        }
        jobs.sort_by(|a, b| (a.pending_since, &a.name).cmp(&(b.pending_since, &b.name)));
        jobs
    }

    fn remembered(&self) -> Vec<Remembered> {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.reachable)
            .filter_map(|(i, m)| {
                m.remembered.map(|n| Remembered {
                    member: name(i),
                    running: n,
                    pending: 0,
                })
            })
            .collect()
    }

    /// The taint state earlier polls left: each member's create failures, oldest first.
    fn state(&self, settings: &DsjSettings) -> DsjState {
        let mut failures: Vec<(u64, usize)> = self
            .members
            .iter()
            .enumerate()
            .flat_map(|(i, m)| m.failures.iter().map(move |secs| (*secs, i)))
            .collect();
        failures.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut state = DsjState::default();
        for (secs, i) in failures {
            create_failed(settings, &mut state, &name(i), ago(secs));
        }
        state
    }
}

/// One poll as the controller runs it.
struct Poll {
    out: StepOutput,
    outcome: Outcome,
    /// Jobs counted before the poll's creates (every member, remembered ones too).
    before: u64,
    created: u64,
}

fn poll(
    settings: &DsjSettings,
    w: &World,
    jobs: &[JobView],
    state: &mut DsjState,
    previous: &DistributedScaledJobStatus,
) -> Poll {
    let members = w.members();
    let remembered = w.remembered();
    let readings = w.readings();
    let metrics = usable(&readings);
    let levels_before = members
        .iter()
        .map(|m| (m.name.clone(), taint_level(settings, state, &m.name, now())))
        .collect();
    let out = step(
        &StepInput {
            settings,
            metrics: &metrics,
            members: &members,
            jobs,
            remembered: &remembered,
            failover_only: false,
            now: now(),
        },
        state,
    );
    let outcome = outcome(&OutcomeInput {
        previous,
        generation: Some(1),
        name: "work",
        settings,
        polling: Duration::from_secs(30),
        members: &members,
        ids: &BTreeMap::new(),
        jobs,
        remembered: &remembered,
        readings: &readings,
        out: &out,
        state,
        levels_before: &levels_before,
        create_failures: &[],
        next_index: 0,
        now: now(),
    });
    let before = out
        .observations
        .iter()
        .map(|o| u64::from(o.running_jobs))
        .sum();
    let created = out.creates.iter().map(|c| c.total()).sum();
    Poll {
        out,
        outcome,
        before,
        created,
    }
}

/// The first poll's creates as the hub counts them at the next poll: sent, not reported
/// yet, so pending since they were sent.
fn with_creates(jobs: &[JobView], out: &StepOutput) -> Vec<JobView> {
    let mut next = jobs.to_vec();
    for c in &out.creates {
        let plain = (0..c.new).map(|_| None);
        for (k, replaces) in c
            .failovers
            .iter()
            .cloned()
            .map(Some)
            .chain(plain)
            .enumerate()
        {
            next.push(JobView {
                name: format!("new-{}-{k}", c.member),
                member: c.member.clone(),
                phase: JobPhase::Pending,
                pending_since: now(),
                finished_at: None,
                replaces,
                template: None,
            });
        }
    }
    next
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// KEDA's bound: Jobs after a poll never exceed `minReplicaCount` + KEDA's
    /// `MaxReplicaCount()` (that is `maxReplicaCount` when min ≤ max, min + 100 when max is
    /// unset, and twice `maxReplicaCount` when min > max, where KEDA's `MinReplicaCount()` and
    /// `MaxReplicaCount()` both return max); Jobs already beyond it get no more. `custom` subtracts only a share of the running Jobs, so
    /// KEDA bounds one poll's creates by `maxReplicaCount` instead. The status `outcome`
    /// writes counts the same Jobs.
    #[test]
    fn never_more_jobs_than_the_strategy_allows(w in world()) {
        let settings = w.settings();
        let mut state = w.state(&settings);
        let jobs = w.jobs();
        let p = poll(&settings, &w, &jobs, &mut state, &DistributedScaledJobStatus::default());
        let bound = u64::from(settings.min_jobs) + u64::from(settings.strategy_max);
        if matches!(settings.scaling, ScalingStrategyKind::Custom { .. }) {
            let per_poll = u64::from(settings.min_jobs).max(u64::from(settings.strategy_max));
            prop_assert!(p.created <= per_poll, "created {} > {per_poll}", p.created);
        } else {
            prop_assert!(
                p.created == 0 || p.before + p.created <= bound,
                "{} Jobs + {} created > {bound} ({:?})", p.before, p.created, settings.scaling
            );
        }
        prop_assert!(p.created <= u64::from(p.out.plan.to_create));
        prop_assert!(p.out.plan.desired_jobs <= settings.max_jobs);
        if settings.paused {
            prop_assert_eq!(p.created, 0);
        }
        let status = &p.outcome.status;
        prop_assert_eq!(
            u64::try_from(status.running_jobs).unwrap(),
            p.before + p.created
        );
        let announced = p.outcome.events.iter().any(|e| e.reason == EVENT_JOBS_CREATED);
        prop_assert_eq!(announced, p.created > 0);
    }

    /// No Job goes to a member that is hard-tainted (for this workload) or unreachable when
    /// the poll decides, and the status `outcome` writes says so of every member that got
    /// Jobs.
    #[test]
    fn no_job_on_a_hard_tainted_member(w in world()) {
        let settings = w.settings();
        let mut state = w.state(&settings);
        let jobs = w.jobs();
        let p = poll(&settings, &w, &jobs, &mut state, &DistributedScaledJobStatus::default());
        for c in &p.out.creates {
            prop_assert_ne!(
                taint_level(&settings, &state, &c.member, now()),
                TaintLevel::Hard,
                "{} Jobs created in hard-tainted {}", c.total(), c.member
            );
            let m = &p.outcome.status.member_cluster_statuses[&c.member];
            prop_assert!(!m.hard_tainted && !m.excluded, "{}: {m:?}", c.member);
            prop_assert!(
                w.members().iter().any(|m| m.name == c.member && m.state == MemberPhase::Ready),
                "Jobs created in unreachable {}", c.member
            );
        }
    }

    /// A second poll on an unchanged world, the first poll's creates counted as the hub
    /// counts them (pending, not reported yet), creates nothing more. Scoped to what KEDA's
    /// arithmetic makes idempotent: `eager` ("create new jobs until it hits the
    /// maxReplicaCount") and `custom` with a running percentage below 1 keep creating while
    /// the queue stays, by design; and with `minReplicaCount` KEDA first tops up to the
    /// minimum, then scales on the metric in the next poll.
    #[test]
    fn a_second_poll_on_an_unchanged_world_creates_nothing(w in idempotent_world()) {
        let settings = w.settings();
        let mut state = w.state(&settings);
        let jobs = w.jobs();
        let first = poll(&settings, &w, &jobs, &mut state, &DistributedScaledJobStatus::default());
        let after = with_creates(&jobs, &first.out);
        let second = poll(&settings, &w, &after, &mut state, &first.outcome.status);
        prop_assert_eq!(
            second.created, 0,
            "first poll created {:?}, the second {:?}", first.out.creates, second.out.creates
        );
        prop_assert!(second.outcome.events.iter().all(|e| e.reason != EVENT_JOBS_CREATED));
        prop_assert_eq!(
            u64::try_from(second.outcome.status.running_jobs).unwrap(),
            first.before + first.created
        );
    }
}

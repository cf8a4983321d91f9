//! DSJ planner: scheduling, taints and replacements, end to end through the public API.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kedge_core::crd::DistributedScaledJobSpec;
use kedge_core::crd::conditions::MemberPhase;
use kedge_core::dsj::scaling::TriggerMetric;
use kedge_core::dsj::schedule::WrrState;
use kedge_core::dsj::taint::{TaintBook, TaintEvent};
use kedge_core::dsj::{DsjMemberObservation, DsjPlan, DsjPlanInput, Eligibility, plan};
use kedge_core::validate::{self, DsjSettings};
use proptest::prelude::*;

fn settings(yaml: &str) -> DsjSettings {
    let spec: DistributedScaledJobSpec = serde_yaml::from_str(yaml).expect("spec parses");
    validate::dsj(&spec, &BTreeMap::new()).expect("spec is valid")
}

const WRR: &str = r#"
memberClusters: [{name: member-cluster-1, weight: 2}, {name: member-cluster-2, weight: 3}]
scaledJobSpec:
  jobTargetRef: {template: {spec: {containers: [{name: processor, image: myapp}]}}}
  maxReplicaCount: 20
  triggers: [{type: rabbitmq, name: rabbit}]
"#;

const FAILOVER: &str = r#"
clusterScheduling:
  strategy: priorityFailover
  workloadAffinity: {class: team-a, size: 4}
  failoverPolicy: {gracePeriod: 1m, hardTaintDuration: 5m, softTaintDuration: 3m}
memberClusters:
- {name: member-primary, scheduling: {priority: 100}}
- {name: member-failover, scheduling: {priority: 0}}
scaledJobSpec:
  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}
  triggers: [{type: rabbitmq, name: rabbit}]
"#;

fn member(name: &str, running: u32, pending: u32, stuck: u32) -> DsjMemberObservation {
    DsjMemberObservation {
        name: name.into(),
        state: MemberPhase::Ready,
        running_jobs: running,
        pending_jobs: pending,
        stuck_jobs: stuck,
    }
}

fn metric(value: f64) -> BTreeMap<String, TriggerMetric> {
    BTreeMap::from([("rabbit".to_owned(), TriggerMetric { value, target: 1.0 })])
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn run(
    s: &DsjSettings,
    value: f64,
    members: &[DsjMemberObservation],
    taints: &TaintBook,
    wrr: &WrrState,
) -> DsjPlan {
    plan(&DsjPlanInput {
        settings: s,
        metrics: &metric(value),
        members,
        taints,
        wrr,
        failover_only: false,
        now: at(100),
    })
}

#[test]
fn weighted_round_robin_splits_two_to_three() {
    let s = settings(WRR);
    let members = [
        member("member-cluster-1", 0, 0, 0),
        member("member-cluster-2", 0, 0, 0),
    ];
    let p = run(
        &s,
        10.0,
        &members,
        &TaintBook::new(&s),
        &WrrState::default(),
    );
    assert_eq!((p.desired_jobs, p.to_create), (10, 10));
    assert_eq!(
        p.create(),
        BTreeMap::from([
            ("member-cluster-1".into(), 4),
            ("member-cluster-2".into(), 6)
        ])
    );
}

#[test]
fn round_robin_state_keeps_proportions_across_polls() {
    let s = settings(WRR);
    let mut wrr = WrrState::default();
    let mut totals = [0u32; 2];
    let mut running = 0;
    // One new Job per poll: over 5 polls exactly 2 go to member 1 and 3 to member 2.
    for _ in 0..5 {
        running += 1;
        let members = [
            member("member-cluster-1", 0, 0, 0),
            member("member-cluster-2", 0, 0, 0),
        ];
        let members_running = [
            DsjMemberObservation {
                running_jobs: running - 1,
                ..members[0].clone()
            },
            members[1].clone(),
        ];
        let p = run(
            &s,
            f64::from(running),
            &members_running,
            &TaintBook::new(&s),
            &wrr,
        );
        assert_eq!(p.to_create, 1);
        for (t, m) in totals.iter_mut().zip(&p.members) {
            *t += m.create;
        }
        wrr = p.wrr;
    }
    assert_eq!(totals, [2, 3]);
}

#[test]
fn hard_taint_excludes_and_soft_taint_does_not() {
    let s = settings(WRR);
    let members = [
        member("member-cluster-1", 0, 0, 0),
        member("member-cluster-2", 0, 0, 0),
    ];
    let mut taints = TaintBook::new(&s);
    taints.observe("member-cluster-2", None, TaintEvent::CreateFailed, at(90));
    let p = run(&s, 5.0, &members, &taints, &WrrState::default());
    assert_eq!(p.members[1].eligibility, Eligibility::SoftTainted);
    assert_eq!(p.members[1].create, 3);
    taints.observe("member-cluster-2", None, TaintEvent::CreateFailed, at(95));
    let p = run(&s, 5.0, &members, &taints, &WrrState::default());
    assert_eq!(p.members[1].eligibility, Eligibility::HardTainted);
    assert_eq!(
        p.create(),
        BTreeMap::from([
            ("member-cluster-1".into(), 5),
            ("member-cluster-2".into(), 0)
        ])
    );
}

#[test]
fn priority_failover_prefers_primary_until_tainted() {
    let s = settings(FAILOVER);
    let members = [
        member("member-primary", 0, 0, 0),
        member("member-failover", 0, 0, 0),
    ];
    let p = run(&s, 3.0, &members, &TaintBook::new(&s), &WrrState::default());
    assert_eq!(
        p.create(),
        BTreeMap::from([("member-failover".into(), 0), ("member-primary".into(), 3)])
    );
    // Three Jobs stuck on the primary beyond the grace period: pendingAware re-creates
    // them, on the failover member.
    let members = [
        member("member-primary", 3, 3, 3),
        member("member-failover", 0, 0, 0),
    ];
    let p = run(&s, 3.0, &members, &TaintBook::new(&s), &WrrState::default());
    assert_eq!(p.to_create, 3);
    assert_eq!(p.members[1].create, 3);
    assert_eq!(p.members[1].replacements, 3);
    assert_eq!(p.replacements.len(), 3);
    // A stuck Job hard-taints the primary (softTaintDuration 0s): new Jobs go elsewhere.
    let s0 = settings(&FAILOVER.replace("softTaintDuration: 3m", "softTaintDuration: 0s"));
    let mut taints = TaintBook::new(&s0);
    taints.observe("member-primary", Some(100), TaintEvent::JobStuck, at(50));
    let members = [
        member("member-primary", 0, 0, 0),
        member("member-failover", 0, 0, 0),
    ];
    let p = run(&s0, 2.0, &members, &taints, &WrrState::default());
    assert_eq!(p.members[0].eligibility, Eligibility::HardTainted);
    assert_eq!(p.members[1].create, 2);
}

#[test]
fn unreachable_members_and_paused() {
    let mut s = settings(WRR);
    let mut members = [
        member("member-cluster-1", 0, 0, 0),
        member("member-cluster-2", 0, 0, 0),
    ];
    members[0].state = MemberPhase::Unreachable;
    let p = run(&s, 4.0, &members, &TaintBook::new(&s), &WrrState::default());
    assert_eq!(p.members[0].eligibility, Eligibility::Unreachable);
    assert_eq!(p.members[1].create, 4);
    members[1].state = MemberPhase::Unreachable;
    let p = run(&s, 4.0, &members, &TaintBook::new(&s), &WrrState::default());
    assert_eq!(p.unplaced, 4);
    s.paused = true;
    let p = run(&s, 4.0, &members, &TaintBook::new(&s), &WrrState::default());
    assert_eq!((p.to_create, p.paused), (0, true));
}

proptest! {
    #[test]
    fn round_robin_is_exact_over_a_full_cycle(weights in prop::collection::vec(0u32..6, 1..5), cycles in 1u32..4) {
        prop_assume!(weights.iter().any(|&w| w > 0));
        let mut wrr = WrrState::default();
        let names: Vec<String> = (0..weights.len()).map(|i| format!("m{i}")).collect();
        let candidates: Vec<(&str, u32)> = names.iter().map(String::as_str).zip(weights.iter().copied()).collect();
        let total: u32 = weights.iter().sum();
        let mut counts = vec![0u32; weights.len()];
        for _ in 0..total * cycles {
            let name = wrr.pick(&candidates).expect("a positive weight exists");
            let i = names.iter().position(|n| *n == name).expect("picked a candidate");
            counts[i] += 1;
        }
        let expected: Vec<u32> = weights.iter().map(|w| w * cycles).collect();
        prop_assert_eq!(counts, expected);
    }

    #[test]
    fn plan_is_deterministic_and_places_everything_it_can(value in 0u32..40, running in 0u32..10, stuck in 0u32..3) {
        let s = settings(WRR);
        let members = [member("member-cluster-1", running, stuck, stuck), member("member-cluster-2", 0, 0, 0)];
        let a = run(&s, f64::from(value), &members, &TaintBook::new(&s), &WrrState::default());
        let b = run(&s, f64::from(value), &members, &TaintBook::new(&s), &WrrState::default());
        prop_assert_eq!(&a, &b);
        let created: u32 = a.members.iter().map(|m| m.create).sum();
        prop_assert_eq!(created + a.unplaced, a.to_create);
        prop_assert!(a.replacements.iter().all(|r| r.from != r.to));
    }
}

/// A member away keeps its round-robin credit: the Jobs it was owed when it left are its
/// first ones when it returns, for a DSJ that lists its members and one that does not (whose
/// members the hub passes in as every registered one, away or not).
#[test]
fn an_away_member_keeps_what_the_round_robin_owes_it() {
    let unlisted = r#"
scaledJobSpec:
  jobTargetRef: {template: {spec: {containers: [{name: c}]}}}
  maxReplicaCount: 20
  triggers: [{type: rabbitmq, name: rabbit}]
"#;
    let listed = "memberClusters: [{name: a}, {name: b}]\n".to_owned() + unlisted;
    for yaml in [unlisted, listed.as_str()] {
        let s = settings(yaml);
        let taints = TaintBook::new(&s);
        // a is owed the next Job.
        let owed = WrrState {
            current: BTreeMap::from([("a".to_owned(), 1), ("b".to_owned(), -1)]),
        };
        let away = [
            DsjMemberObservation {
                state: MemberPhase::Unreachable,
                ..member("a", 0, 0, 0)
            },
            member("b", 0, 0, 0),
        ];
        // Two Jobs while a is away: both in b; a's credit is kept.
        let p = run(&s, 2.0, &away, &taints, &owed);
        assert_eq!(p.create()["b"], 2, "{yaml}");
        assert_eq!(
            p.wrr.current.get("a"),
            Some(&1),
            "{yaml}: a's credit dropped"
        );
        // a is back: the next Job is a's.
        let back = [member("a", 0, 0, 0), member("b", 2, 0, 0)];
        let p = run(&s, 3.0, &back, &taints, &p.wrr);
        assert_eq!(p.create()["a"], 1, "{yaml}: {p:?}");
    }
}

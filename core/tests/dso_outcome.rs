//! `dso::outcome`: every DSO safety rule as a table test, time as a parameter. Each test
//! names the fault it guards against; the end-to-end tests in `tests/tests/dso_safety_e2e.rs`
//! show the same with the real binaries.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kedge_core::crd::conditions::{
    EVENT_CONFLICT, EVENT_INVALID_SPEC, EVENT_MEMBER_LOST, EVENT_MEMBER_RETURNED,
    EVENT_NAMESPACE_NOT_ALLOWED,
};
use kedge_core::crd::dso::{DistributedScaledObjectStatus, DsoMemberClusterStatus};
use kedge_core::dso::member::{Claim, MemberFacts, MemberPhase, Session, claim};
use kedge_core::dso::outcome::{Command, DsoInput, DsoOutcome, outcome};
use kedge_core::validate::{DsoMemberSettings, DsoSettings, Pause};
use kedge_protocol::{ClusterCapacity, Failure, FailureCode, Retry, WorkloadRef, WorkloadStatus};

const GRACE: Duration = Duration::from_secs(60);

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn settings(members: &[(&str, u32)]) -> DsoSettings {
    DsoSettings {
        members: Some(
            members
                .iter()
                .map(|(name, weight)| DsoMemberSettings {
                    name: (*name).to_owned(),
                    weight: *weight,
                    tier: 0,
                    min_replicas: 0,
                    max_replicas: None,
                })
                .collect(),
        ),
        grace_period: GRACE,
        max_rebalance_percentage: 50,
        avoid_disruption: true,
        migrate_unschedulable_after: None,
        dynamic_weights: false,
        min_total: 1,
        max_total: 100,
        pause: Pause::No,
    }
}

fn workload() -> WorkloadRef {
    WorkloadRef::deployment("default", "web")
}

fn report(spec: i32) -> WorkloadStatus {
    WorkloadStatus {
        spec_replicas: spec,
        ready_replicas: spec,
        available_replicas: spec,
        exists: true,
        ..WorkloadStatus::absent(workload())
    }
}

/// A connected, fully reported member running `spec` replicas.
fn ready(name: &str, spec: i32) -> MemberFacts {
    MemberFacts {
        session: Session::Connected {
            id: "s".into(),
            reported: true,
        },
        report: Some(report(spec)),
        ..MemberFacts::new(name, workload())
    }
}

fn failure(code: FailureCode, retry: Retry) -> Failure {
    Failure {
        retry,
        code,
        message: "nope".into(),
    }
}

fn previous(entries: &[(&str, MemberPhase, i32, u64)]) -> DistributedScaledObjectStatus {
    DistributedScaledObjectStatus {
        member_cluster_statuses: entries
            .iter()
            .map(|(name, phase, desired, since)| {
                (
                    (*name).to_owned(),
                    DsoMemberClusterStatus {
                        current_replicas: *desired,
                        desired_replicas: *desired,
                        state: Some(phase.as_str().to_owned()),
                        last_status_change_time: Some(kedge_core::time::to_time(t(*since))),
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    }
}

fn run(
    s: &DsoSettings,
    total: Option<i32>,
    prev: &DistributedScaledObjectStatus,
    members: &[MemberFacts],
    now: SystemTime,
) -> DsoOutcome {
    outcome(&DsoInput {
        generation: Some(1),
        selector: "kedge.dev/distributedscaledobject=web",
        settings: Ok(s),
        not_allowed: &BTreeMap::new(),
        total,
        keda_unavailable: None,
        errors: &[],
        previous: prev,
        members,
        elsewhere: &[],
        now,
    })
}

fn command(o: &DsoOutcome, member: &str) -> Option<Command> {
    o.commands.get(member).copied()
}

fn member<'a>(o: &'a DsoOutcome, name: &str) -> &'a DsoMemberClusterStatus {
    &o.status.member_cluster_statuses[name]
}

fn condition<'a>(o: &'a DsoOutcome, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = o
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition: {:#?}", o.status.conditions));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn with_tracked(mut f: MemberFacts, phase: MemberPhase, since: u64) -> MemberFacts {
    f.tracked = Some((phase, t(since)));
    f
}

#[test]
fn healthy_members_get_their_share() {
    let s = settings(&[("a", 4), ("b", 6)]);
    let o = run(
        &s,
        Some(10),
        &Default::default(),
        &[ready("a", 1), ready("b", 1)],
        t(0),
    );
    assert_eq!(command(&o, "a"), Some(Command::Replicas(4)));
    assert_eq!(command(&o, "b"), Some(Command::Replicas(6)));
    assert_eq!(
        member(&o, "a").description.as_deref(),
        Some("Cluster is healthy")
    );
    assert!(!member(&o, "a").excluded);
    assert_eq!(condition(&o, "TotalSet").0, "True");
    assert_eq!(condition(&o, "Degraded").0, "False");
}

/// Case 1: a member whose command is refused (RBAC re-synced, an admission webhook) is held,
/// never told 0, even after the grace period; its share moves elsewhere.
#[test]
fn refused_past_grace_is_held_not_zeroed() {
    let s = settings(&[("a", 4), ("b", 6)]);
    let prev = previous(&[
        ("a", MemberPhase::Refused, 4, 0),
        ("b", MemberPhase::Ready, 6, 0),
    ]);
    for code in [
        FailureCode::Forbidden,
        FailureCode::Invalid,
        FailureCode::NamespaceNotAllowed,
        FailureCode::KindNotAllowed,
    ] {
        let mut a = ready("a", 4);
        a.command_failure = Some(failure(code, Retry::Permanent));
        let a = with_tracked(a, MemberPhase::Refused, 0);
        // Within the grace period the others plan around what it runs.
        let within = run(&s, Some(10), &prev, &[a.clone(), ready("b", 6)], t(30));
        assert_eq!(member(&within, "a").state.as_deref(), Some("Refused"));
        assert_eq!(command(&within, "a"), Some(Command::Hold), "{code:?}");
        assert_eq!(command(&within, "b"), Some(Command::Replicas(6)));
        // After it, the share moves; `a` is still only held.
        let after = run(&s, Some(10), &prev, &[a, ready("b", 6)], t(61));
        assert_eq!(command(&after, "a"), Some(Command::Hold), "{code:?}");
        assert_eq!(command(&after, "b"), Some(Command::Replicas(10)));
        assert!(member(&after, "a").excluded);
        assert_eq!(member(&after, "a").desired_replicas, 0);
        assert!(
            member(&after, "a")
                .description
                .as_deref()
                .unwrap()
                .contains("refused")
        );
    }
}

/// Case 1: a failure seen while observing (the report carries it) counts the same way.
#[test]
fn a_report_that_cannot_read_the_workload_holds_it() {
    let s = settings(&[("a", 1)]);
    let mut a = ready("a", 4);
    a.report = Some(WorkloadStatus {
        failure: Some(failure(FailureCode::Forbidden, Retry::Permanent)),
        ..WorkloadStatus::absent(workload())
    });
    let o = run(&s, Some(3), &Default::default(), &[a], t(0));
    assert_eq!(member(&o, "a").state.as_deref(), Some("Refused"));
    assert_eq!(command(&o, "a"), Some(Command::Hold));
}

/// Case 1: a workload deleted (and later re-created) is held, never told 0; once a report
/// shows it again the member is Ready and gets its share back.
#[test]
fn missing_workload_is_held_and_returns() {
    let s = settings(&[("a", 4), ("b", 6)]);
    let prev = previous(&[
        ("a", MemberPhase::WorkloadMissing, 4, 0),
        ("b", MemberPhase::Ready, 6, 0),
    ]);
    let mut a = ready("a", 0);
    a.report = Some(WorkloadStatus::absent(workload()));
    let a = with_tracked(a, MemberPhase::WorkloadMissing, 0);
    let o = run(&s, Some(10), &prev, &[a, ready("b", 6)], t(120));
    assert_eq!(command(&o, "a"), Some(Command::Hold));
    assert_eq!(command(&o, "b"), Some(Command::Replicas(10)));
    // Re-created with 3 replicas by GitOps: Ready again, nothing scaled down.
    let prev = o.status.clone();
    let a = with_tracked(ready("a", 3), MemberPhase::WorkloadMissing, 0);
    let back = run(&s, Some(10), &prev, &[a, ready("b", 10)], t(121));
    assert_eq!(member(&back, "a").state.as_deref(), Some("Ready"));
    let Some(Command::Replicas(n)) = command(&back, "a") else {
        panic!("{:?}", back.commands)
    };
    assert!(n >= 3, "returned member scaled down to {n}");
    assert!(
        back.events
            .iter()
            .any(|e| e.reason == EVENT_MEMBER_RETURNED)
    );
}

/// Case 2: after a hub restart nothing is planned from nothing. Weights 9:1, total 10;
/// member `a` comes back only after its grace period. It is never told anything below 9.
#[test]
fn hub_restart_with_a_late_member_never_scales_it_down() {
    let s = settings(&[("a", 9), ("b", 1)]);
    let prev = previous(&[
        ("a", MemberPhase::Ready, 9, 0),
        ("b", MemberPhase::Ready, 1, 0),
    ]);
    // The new hub: `b` reconnected and reported, `a` not yet.
    let a = MemberFacts::new("a", workload());
    let first = run(&s, Some(10), &prev, &[a.clone(), ready("b", 1)], t(100));
    assert_eq!(member(&first, "a").state.as_deref(), Some("NotReported"));
    assert_eq!(
        command(&first, "a"),
        None,
        "nothing is sent to a member not heard from"
    );
    assert_eq!(
        command(&first, "b"),
        Some(Command::Hold),
        "nothing moves on a count this hub has not seen reported"
    );
    assert_eq!(member(&first, "a").desired_replicas, 9);
    assert!(
        !first.events.iter().any(|e| e.reason == EVENT_MEMBER_LOST),
        "a restart loses no member"
    );
    // Its grace period passes: its share moves; it is still told nothing.
    let tracked = with_tracked(a, MemberPhase::NotReported, 100);
    let later = run(
        &s,
        Some(10),
        &first.status,
        &[tracked.clone(), ready("b", 1)],
        t(161),
    );
    assert_eq!(command(&later, "a"), None);
    assert_eq!(command(&later, "b"), Some(Command::Replicas(10)));
    // It connects: still nothing until its first full report.
    let mut connected = tracked;
    connected.session = Session::Connected {
        id: "s2".into(),
        reported: false,
    };
    let waiting = run(
        &s,
        Some(10),
        &later.status,
        &[connected, ready("b", 10)],
        t(170),
    );
    assert_eq!(command(&waiting, "a"), None);
    // Its report: it runs 9; b gives back, a keeps its 9.
    let back = run(
        &s,
        Some(10),
        &waiting.status,
        &[
            with_tracked(ready("a", 9), MemberPhase::NotReported, 100),
            ready("b", 10),
        ],
        t(171),
    );
    assert_eq!(command(&back, "a"), Some(Command::Replicas(9)));
    assert_eq!(command(&back, "b"), Some(Command::Replicas(1)));
}

/// Case 2: the previous status can be older than what members run (a hub stopped before it
/// wrote its last decision: counts alone are written at most once a second). The restarted
/// hub moves no member on it: `b` reports 2 while the status still says `a` 1 and `b` 3 of a
/// total of 4; `b` is held at 2, not raised to 3 (nor, the other way round, lowered), until
/// `a` reports. Then it is planned from both reports.
#[test]
fn a_restarted_hub_moves_no_member_on_a_stale_status() {
    let s = settings(&[("a", 1), ("b", 1)]);
    let stale = previous(&[
        ("a", MemberPhase::Ready, 1, 0),
        ("b", MemberPhase::Ready, 3, 0),
    ]);
    let a = MemberFacts::new("a", workload());
    let first = run(&s, Some(4), &stale, &[a.clone(), ready("b", 2)], t(100));
    assert_eq!(member(&first, "a").state.as_deref(), Some("NotReported"));
    assert_eq!(command(&first, "a"), None);
    assert_eq!(command(&first, "b"), Some(Command::Hold));
    let condition = first
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        condition.message.contains("until a report"),
        "{}",
        condition.message
    );
    // Still within a's grace period, the total changes: still nothing moves.
    let tracked = with_tracked(a, MemberPhase::NotReported, 100);
    let scaled = run(
        &s,
        Some(6),
        &first.status,
        &[tracked.clone(), ready("b", 2)],
        t(130),
    );
    assert_eq!(command(&scaled, "b"), Some(Command::Hold));
    // a reports the 2 it runs: both are planned from reports.
    let back = run(
        &s,
        Some(6),
        &scaled.status,
        &[
            with_tracked(ready("a", 2), MemberPhase::NotReported, 100),
            ready("b", 2),
        ],
        t(131),
    );
    assert_eq!(command(&back, "a"), Some(Command::Replicas(3)));
    assert_eq!(command(&back, "b"), Some(Command::Replicas(3)));
    // Had a never come back, its grace period ends and b takes the total.
    let late = run(
        &s,
        Some(6),
        &scaled.status,
        &[tracked, ready("b", 2)],
        t(161),
    );
    assert_eq!(command(&late, "b"), Some(Command::Replicas(6)));
}

/// Case 2: a connected member whose workload was not reported on yet is held until it is.
#[test]
fn a_workload_not_reported_yet_is_held() {
    let s = settings(&[("a", 1)]);
    let mut a = ready("a", 0);
    a.report = None;
    let o = run(&s, Some(5), &Default::default(), &[a], t(0));
    assert_eq!(member(&o, "a").state.as_deref(), Some("NotReported"));
    assert_eq!(command(&o, "a"), Some(Command::Hold));
}

/// Case 3: a DSO applied over running Deployments holds them until `/scale` is written.
#[test]
fn an_unset_total_holds_what_runs() {
    let s = settings(&[("a", 1), ("b", 1)]);
    let o = run(
        &s,
        None,
        &Default::default(),
        &[ready("a", 3), ready("b", 3)],
        t(0),
    );
    assert_eq!(command(&o, "a"), Some(Command::Hold));
    assert_eq!(command(&o, "b"), Some(Command::Hold));
    assert_eq!(member(&o, "a").desired_replicas, 3);
    let (status, reason, message) = condition(&o, "TotalSet");
    assert_eq!((status, reason), ("False", "AwaitingTotal"));
    assert!(message.contains("keep the 6 replicas"), "{message}");
    assert_eq!(condition(&o, "Paused").0, "False");
    // Below minReplicaCount: raised, only upwards.
    let mut min3 = settings(&[("a", 1), ("b", 1)]);
    min3.min_total = 5;
    let o = run(
        &min3,
        None,
        &Default::default(),
        &[ready("a", 3), ready("b", 0)],
        t(0),
    );
    let a = command(&o, "a");
    let b = command(&o, "b");
    assert!(matches!(a, Some(Command::Replicas(n)) if n >= 3), "{a:?}");
    assert!(matches!(b, Some(Command::Replicas(n)) if n >= 2), "{b:?}");
    // Once written, the total rules.
    let o = run(
        &s,
        Some(2),
        &Default::default(),
        &[ready("a", 3), ready("b", 3)],
        t(0),
    );
    assert_eq!(command(&o, "a"), Some(Command::Replicas(1)));
}

/// An invalid spec scales nothing anywhere: it releases what it commanded (the workloads
/// keep their replicas, and it holds no claim another DSO must lose to) and says so once.
#[test]
fn an_invalid_spec_scales_nothing_and_releases_its_workloads() {
    let prev = previous(&[("a", MemberPhase::Ready, 3, 0)]);
    let members = [ready("a", 3)];
    let input = DsoInput {
        generation: Some(2),
        selector: "x=y",
        settings: Err("spec.rebalancingPolicy.gracePeriod: too long"),
        not_allowed: &BTreeMap::new(),
        total: Some(10),
        keda_unavailable: None,
        errors: &[],
        previous: &prev,
        members: &members,
        elsewhere: &[],
        now: t(0),
    };
    let o = outcome(&input);
    assert_eq!(
        o.commands,
        BTreeMap::from([("a".to_owned(), Command::Clear)])
    );
    assert_eq!(condition(&o, "Ready").0, "False");
    // Degraded agrees with Ready: never "not ready" next to "not degraded".
    assert_eq!(
        condition(&o, "Degraded"),
        (
            "True",
            "ValidationFailed",
            "spec.rebalancingPolicy.gracePeriod: too long"
        )
    );
    assert_eq!(o.events.len(), 1);
    assert_eq!(o.events[0].reason, EVENT_INVALID_SPEC);
    let again = outcome(&DsoInput {
        previous: &o.status,
        ..input
    });
    assert!(again.events.is_empty(), "said once");
    // A negative total is invalid, not "scale to zero".
    let s = settings(&[("a", 1)]);
    let o = run(&s, Some(-1), &prev, &members, t(0));
    assert!(o.commands.values().all(|c| *c == Command::Clear));
}

/// A DSO targeting a member namespace its namespace was not granted plans nothing, releases
/// what it held in every member (never scaling the workloads there: refused as a whole, it
/// holds no claim) and says why, once.
#[test]
fn a_namespace_not_granted_refuses_the_dso_and_releases_its_workloads() {
    let prev = previous(&[
        ("a", MemberPhase::Ready, 3, 0),
        ("b", MemberPhase::Ready, 2, 0),
    ]);
    let members = [ready("a", 3), ready("b", 2)];
    let s = settings(&[("a", 1), ("b", 1)]);
    let refused = BTreeMap::from([(
        "b".to_owned(),
        "member \"b\": targetNamespace \"kube-system\" is not allowed".to_owned(),
    )]);
    let input = DsoInput {
        generation: Some(2),
        selector: "x=y",
        settings: Ok(&s),
        not_allowed: &refused,
        total: Some(10),
        keda_unavailable: None,
        errors: &[],
        previous: &prev,
        members: &members,
        elsewhere: &[],
        now: t(0),
    };
    let o = outcome(&input);
    assert_eq!(
        o.commands,
        BTreeMap::from([
            ("a".to_owned(), Command::Clear),
            ("b".to_owned(), Command::Clear)
        ])
    );
    assert!(o.plan.is_none());
    let (status, reason, message) = condition(&o, "Ready");
    assert_eq!((status, reason), ("False", "NamespaceNotAllowed"));
    assert!(message.contains("kube-system"), "{message}");
    assert_eq!(o.events.len(), 1);
    assert_eq!(o.events[0].reason, EVENT_NAMESPACE_NOT_ALLOWED);
    let again = outcome(&DsoInput {
        previous: &o.status,
        ..input
    });
    assert!(again.events.is_empty(), "said once");
}

/// Case 5: two DSOs target one workload: the older one scales it, the other clears its
/// command there and both say Conflict.
#[test]
fn two_dsos_on_one_workload() {
    let older = (t(0), "default/first".to_owned());
    let newer = (t(5), "default/second".to_owned());
    let both = [older.clone(), newer.clone()];
    assert_eq!(
        claim(&older, &both),
        Claim::Won(vec!["default/second".into()])
    );
    assert_eq!(claim(&newer, &both), Claim::Lost("default/first".into()));
    assert_eq!(claim(&older, std::slice::from_ref(&older)), Claim::Sole);

    let s = settings(&[("a", 1)]);
    let mut loser = ready("a", 3);
    loser.claim = claim(&newer, &both);
    let o = run(&s, Some(7), &Default::default(), &[loser], t(0));
    assert_eq!(command(&o, "a"), Some(Command::Clear));
    assert_eq!(member(&o, "a").state.as_deref(), Some("Conflict"));
    assert!(member(&o, "a").excluded);
    let (status, _, message) = condition(&o, "Conflict");
    assert_eq!(status, "True");
    assert!(message.contains("default/first"), "{message}");

    let mut winner = ready("a", 3);
    winner.claim = claim(&older, &both);
    let o = run(&s, Some(7), &Default::default(), &[winner], t(0));
    assert_eq!(command(&o, "a"), Some(Command::Replicas(7)));
    assert!(condition(&o, "Conflict").2.contains("default/second"));
}

/// Case 6: the agent reports another controller scaling the workload: held, Conflict
/// condition and an Event naming the member and the controller.
#[test]
fn a_local_autoscaler_is_a_conflict() {
    let s = settings(&[("a", 1), ("b", 1)]);
    let mut a = ready("a", 5);
    a.report.as_mut().unwrap().conflict = Some("HorizontalPodAutoscaler default/web".into());
    let o = run(&s, Some(4), &Default::default(), &[a, ready("b", 2)], t(0));
    assert_eq!(command(&o, "a"), Some(Command::Hold));
    let (status, reason, message) = condition(&o, "Conflict");
    assert_eq!((status, reason), ("True", "ScaledInMember"));
    assert!(
        message.contains("a: HorizontalPodAutoscaler default/web"),
        "{message}"
    );
    let event = o
        .events
        .iter()
        .find(|e| e.reason == EVENT_CONFLICT)
        .expect("event");
    assert!(
        event
            .note
            .starts_with("a: HorizontalPodAutoscaler default/web"),
        "{}",
        event.note
    );
}

/// Case 7: a transient command failure keeps the member Ready but shows in Degraded and in
/// the member's description.
#[test]
fn transient_failures_are_visible() {
    let s = settings(&[("a", 1)]);
    let mut a = ready("a", 1);
    a.command_failure = Some(failure(FailureCode::ApiUnavailable, Retry::Transient));
    let o = run(&s, Some(3), &Default::default(), &[a], t(0));
    assert_eq!(member(&o, "a").state.as_deref(), Some("Ready"));
    assert_eq!(command(&o, "a"), Some(Command::Replicas(3)));
    let (status, reason, message) = condition(&o, "Degraded");
    assert_eq!((status, reason), ("True", "CommandFailing"));
    assert!(message.contains("ApiUnavailable"), "{message}");
    assert!(
        member(&o, "a")
            .description
            .as_deref()
            .unwrap()
            .contains("retrying")
    );
    // Errors of the reconciliation itself show too, and shorten the requeue.
    let members = [ready("a", 1)];
    let errors = ["writing status: timed out".to_owned()];
    let o = outcome(&DsoInput {
        generation: None,
        selector: "x=y",
        settings: Ok(&s),
        not_allowed: &BTreeMap::new(),
        total: Some(1),
        keda_unavailable: None,
        errors: &errors,
        previous: &Default::default(),
        members: &members,
        elsewhere: &[],
        now: t(0),
    });
    assert_eq!(condition(&o, "Degraded").1, "ReconcileFailed");
    assert!(o.requeue <= Duration::from_secs(5));
}

/// Case 7: lastScalingProgressTime moves only when a member gets closer to its target.
#[test]
fn scaling_progress_time() {
    let s = settings(&[("a", 1)]);
    let mut stuck = ready("a", 2);
    stuck.report.as_mut().unwrap().ready_replicas = 1;
    let first = run(&s, Some(2), &Default::default(), &[stuck.clone()], t(0));
    let at = member(&first, "a").last_scaling_progress_time.clone();
    let later = run(&s, Some(2), &first.status, &[stuck], t(100));
    assert_eq!(
        member(&later, "a").last_scaling_progress_time,
        at,
        "no progress"
    );
    let done = run(&s, Some(2), &later.status, &[ready("a", 2)], t(200));
    assert_eq!(
        member(&done, "a").last_scaling_progress_time,
        Some(kedge_core::time::to_time(t(200)))
    );
}

/// Pause holds every member.
#[test]
fn paused_holds() {
    let mut s = settings(&[("a", 1)]);
    s.pause = Pause::Paused;
    let o = run(&s, Some(9), &Default::default(), &[ready("a", 2)], t(0));
    assert_eq!(command(&o, "a"), Some(Command::Hold));
}

/// Case 5: room is derived from the capacity the member reports, never taken on its word.
#[test]
fn room_comes_from_reported_capacity() {
    let mut s = settings(&[("a", 1), ("b", 1)]);
    s.dynamic_weights = true;
    let with = |name: &str, free_cpu: u64| {
        let mut f = ready(name, 0);
        f.report.as_mut().unwrap().pod_cpu_millis = 100;
        f.capacity = Some(ClusterCapacity {
            allocatable_cpu_millis: free_cpu,
            ..Default::default()
        });
        f
    };
    let o = run(
        &s,
        Some(10),
        &Default::default(),
        &[with("a", 2000), with("b", 500)],
        t(0),
    );
    assert_eq!(command(&o, "a"), Some(Command::Replicas(8)));
    assert_eq!(command(&o, "b"), Some(Command::Replicas(2)));
}

/// Case 4: extreme settings and times never panic.
#[test]
fn extreme_values_do_not_panic() {
    let mut s = settings(&[("a", u32::MAX), ("b", 1)]);
    s.grace_period = Duration::MAX;
    s.max_total = u32::MAX;
    let members = [
        with_tracked(ready("a", i32::MAX), MemberPhase::Unreachable, 0),
        ready("b", i32::MAX),
    ];
    for now in [
        UNIX_EPOCH,
        t(0),
        UNIX_EPOCH + Duration::from_secs(u64::MAX / 2),
    ] {
        let o = run(&s, Some(i32::MAX), &Default::default(), &members, now);
        assert!(o.requeue <= Duration::from_secs(30));
    }
}

/// Members the DSO no longer uses are cleared.
#[test]
fn members_no_longer_used_are_cleared() {
    let s = settings(&[("a", 1)]);
    let members = [ready("a", 1)];
    let elsewhere = ["old".to_owned()];
    let o = outcome(&DsoInput {
        generation: None,
        selector: "x=y",
        settings: Ok(&s),
        not_allowed: &BTreeMap::new(),
        total: Some(1),
        keda_unavailable: None,
        errors: &[],
        previous: &Default::default(),
        members: &members,
        elsewhere: &elsewhere,
        now: t(0),
    });
    assert_eq!(command(&o, "old"), Some(Command::Clear));
    let _: BTreeMap<String, Command> = o.commands;
}

#[test]
fn phases_round_trip_through_their_strings() {
    for p in MemberPhase::ALL {
        assert_eq!(p.as_str().parse::<MemberPhase>(), Ok(p));
    }
    assert!("Healthy".parse::<MemberPhase>().is_err());
}

/// A DSO over more members than its status may list (etcd stores at most 1.5 MiB per object):
/// the status names `MAX_LISTED_MEMBERS` of them, every member not Ready first, while its
/// counts cover all. A hub restarted on such a status holds the members it does not name
/// (they were Ready) until they report, exactly as it holds named ones: planned as new
/// members instead, the ones that reported first would take their shares.
#[test]
fn a_status_beyond_the_listing_bound_is_cut_and_a_restarted_hub_still_holds_every_member() {
    use kedge_core::crd::MAX_LISTED_MEMBERS;
    let n = MAX_LISTED_MEMBERS + 500;
    let names: Vec<String> = (0..n).map(|i| format!("m{i:04}")).collect();
    let weights: Vec<(&str, u32)> = names.iter().map(|m| (m.as_str(), 1)).collect();
    let s = DsoSettings {
        max_total: 10_000,
        ..settings(&weights)
    };
    let total = i32::try_from(2 * n).unwrap();
    let mut facts: Vec<MemberFacts> = names.iter().map(|m| ready(m, 2)).collect();
    // m1400 has lost its workload: not Ready, so it is listed although its name comes late.
    facts[1400].report = Some(WorkloadStatus::absent(workload()));
    let before = run(&s, Some(total), &Default::default(), &facts, t(0));
    let status = &before.status;
    assert_eq!(status.member_cluster_statuses.len(), MAX_LISTED_MEMBERS);
    assert_eq!(status.members_total_count, i32::try_from(n).unwrap());
    assert_eq!(status.total_current_replicas, total - 2);
    assert!(status.member_cluster_statuses.contains_key("m1400"));
    assert!(status.member_cluster_statuses.contains_key("m0998"));
    assert!(!status.member_cluster_statuses.contains_key("m0999"));
    // Every member is still told its share, listed or not.
    assert!(matches!(
        command(&before, "m1499"),
        Some(Command::Replicas(_))
    ));
    // A member that stops being Ready enters the list (another leaves it): the split is the
    // same, so no Scaled or Rebalanced Event says otherwise.
    let mut one_lost = facts.clone();
    one_lost[1300].session = Session::Unreachable {
        id: "s".into(),
        reason: "no heartbeat".into(),
    };
    let moved = run(&s, Some(total), status, &one_lost, t(1));
    assert!(moved.status.member_cluster_statuses.contains_key("m1300"));
    let reasons: Vec<&str> = moved.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, [EVENT_MEMBER_LOST], "{:?}", moved.events);

    // A new hub: the listed members are back, the 500 others have not reconnected yet.
    let restarted: Vec<MemberFacts> = facts
        .iter()
        .map(|f| {
            if status.member_cluster_statuses.contains_key(&f.name) {
                f.clone()
            } else {
                MemberFacts::new(&f.name, workload())
            }
        })
        .collect();
    let held = run(&s, Some(total), status, &restarted, t(10));
    assert_eq!(member(&held, "m1499").state.as_deref(), Some("NotReported"));
    assert_eq!(command(&held, "m0000"), Some(Command::Hold));
    assert_eq!(command(&held, "m1499"), None);
    // Once they report, every member is planned from its report: told what it was told
    // before the restart.
    let back = run(&s, Some(total), &held.status, &facts, t(11));
    for name in names.iter().filter(|m| *m != "m1400") {
        assert_eq!(command(&back, name), command(&before, name), "{name}");
    }
}

/// Members that change alike in one reconciliation share one Event past a handful: cutting
/// off half of a large fleet makes one `MemberLost` Event naming five members and counting
/// the rest (the DSO's reconciliation writes its Events before the next one starts; a
/// thousand Events were seconds of API writes). A few members get one Event each.
#[test]
fn members_that_change_alike_share_one_event() {
    let names: Vec<String> = (0..40).map(|i| format!("m{i:02}")).collect();
    let weights: Vec<(&str, u32)> = names.iter().map(|m| (m.as_str(), 1)).collect();
    let s = settings(&weights);
    let facts: Vec<MemberFacts> = names.iter().map(|m| ready(m, 1)).collect();
    let before = run(&s, Some(40), &Default::default(), &facts, t(0));
    let lost = |count: usize| -> Vec<MemberFacts> {
        facts
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mut f = f.clone();
                if i < count {
                    f.session = Session::Unreachable {
                        id: "s".into(),
                        reason: "no heartbeat".into(),
                    };
                }
                f
            })
            .collect()
    };
    let lost_events = |o: &DsoOutcome| -> Vec<String> {
        o.events
            .iter()
            .filter(|e| e.reason == EVENT_MEMBER_LOST)
            .map(|e| e.note.clone())
            .collect()
    };
    let few = run(&s, Some(40), &before.status, &lost(3), t(1));
    assert_eq!(lost_events(&few).len(), 3);
    let many = run(&s, Some(40), &before.status, &lost(30), t(1));
    let notes = lost_events(&many);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("m00: agent unreachable"),
        "{}",
        notes[0]
    );
    assert!(
        notes[0].contains("m04: ") && !notes[0].contains("m05: "),
        "{}",
        notes[0]
    );
    assert!(notes[0].ends_with("and 25 more"), "{}", notes[0]);
}

/// Status truth: members that all refuse the workload (the agents were installed for other
/// namespaces) leave nothing able to run it. The DSO is not Ready, and Degraded says the
/// same thing, not "insufficient capacity", which would send the user looking for nodes.
#[test]
fn every_member_refusing_is_not_ready_and_says_why_not_capacity() {
    let refusing = |name: &str| MemberFacts {
        report: Some(WorkloadStatus {
            failure: Some(failure(FailureCode::NamespaceNotAllowed, Retry::Permanent)),
            ..report(0)
        }),
        ..ready(name, 0)
    };
    let members = [refusing("a"), refusing("b")];
    let s = settings(&[("a", 1), ("b", 1)]);
    let o = run(
        &s,
        Some(8),
        &DistributedScaledObjectStatus::default(),
        &members,
        t(0),
    );
    let (status, reason, message) = condition(&o, "Ready");
    assert_eq!((status, reason), ("False", "NoMemberAvailable"));
    assert!(
        message.contains("a: agent cannot act on") && message.contains("NamespaceNotAllowed"),
        "{message}"
    );
    let (status, reason, _) = condition(&o, "Degraded");
    assert_eq!((status, reason), ("True", "NoMemberAvailable"));
    // One member usable again: Ready, and the shortfall names the member that is not.
    let members = [refusing("a"), ready("b", 0)];
    let o = run(
        &s,
        Some(8),
        &DistributedScaledObjectStatus::default(),
        &members,
        t(0),
    );
    assert_eq!(condition(&o, "Ready").0, "True");
}

/// Status truth: a DSO naming a member that has no MemberCluster is not Ready, and the
/// member's status names the command that enrolls it.
#[test]
fn a_member_that_does_not_exist_is_named_with_its_fix() {
    let members = [MemberFacts {
        session: Session::NotEnrolled,
        ..MemberFacts::new("edge-9", workload())
    }];
    let s = settings(&[("edge-9", 1)]);
    let o = run(
        &s,
        Some(3),
        &DistributedScaledObjectStatus::default(),
        &members,
        t(0),
    );
    let (status, reason, message) = condition(&o, "Ready");
    assert_eq!((status, reason), ("False", "NoMemberAvailable"));
    assert!(
        message.contains("kubectl kedge mc setup-member edge-9"),
        "{message}"
    );
    assert_eq!(
        o.status.member_cluster_statuses["edge-9"].state.as_deref(),
        Some("Pending")
    );
    assert!(o.commands.values().all(|c| *c != Command::Replicas(3)));
    // No member selected at all (memberClusters empty, nothing enrolled): not Ready either.
    let o = run(
        &settings(&[]),
        Some(3),
        &DistributedScaledObjectStatus::default(),
        &[],
        t(0),
    );
    let (status, reason, message) = condition(&o, "Ready");
    assert_eq!((status, reason), ("False", "NoMemberAvailable"));
    assert!(message.contains("no member is selected"), "{message}");
}

/// A member that went away before it acknowledged what it was last told runs either count:
/// here `a` was told 1 after reporting 2, and its acknowledgement and report were lost (a
/// relaying hub replica died). Planning around the 2 it reported would scale a healthy
/// member to 0 for a replica that may not exist; every member keeps what it runs instead,
/// until `a` reports or its grace period ends. (The sharded fleet bench at 30,000 members
/// found this: 648 healthy members were told 0 and then 1 again.)
#[test]
fn a_member_gone_before_it_acknowledged_moves_no_one_within_its_grace_period() {
    let s = settings(&[("a", 1), ("b", 1), ("c", 1)]);
    let gone = |unconfirmed: bool| MemberFacts {
        session: Session::Unreachable {
            id: "s".into(),
            reason: "no heartbeat".into(),
        },
        unconfirmed,
        ..with_tracked(ready("a", 2), MemberPhase::Unreachable, 100)
    };
    let members = |unconfirmed| [gone(unconfirmed), ready("b", 1), ready("c", 1)];
    let held = run(&s, Some(3), &Default::default(), &members(true), t(110));
    assert_eq!(command(&held, "a"), None);
    assert_eq!(command(&held, "b"), Some(Command::Hold));
    assert_eq!(command(&held, "c"), Some(Command::Hold));
    let (_, _, message) = condition(&held, "Ready");
    assert!(message.contains("until a report"), "{message}");
    // What it acknowledged is what it reported: the others are planned around it, as before.
    let planned = run(&s, Some(3), &Default::default(), &members(false), t(110));
    let told: u32 = ["b", "c"]
        .iter()
        .map(|m| match command(&planned, m) {
            Some(Command::Replicas(n)) => n,
            other => panic!("{m}: {other:?}"),
        })
        .sum();
    assert_eq!(told, 1, "{:?}", planned.commands);
    // Past its grace period its share moves to the others.
    let late = run(
        &s,
        Some(3),
        &held.status,
        &members(true),
        t(100) + GRACE + Duration::from_secs(1),
    );
    assert_eq!(command(&late, "b"), Some(Command::Replicas(2)));
    assert_eq!(command(&late, "c"), Some(Command::Replicas(1)));
}

/// The members the Ready condition names while it waits for their reports are bounded: a
/// replica of the hub that dies takes thousands of members away at once.
#[test]
fn the_members_awaited_are_named_up_to_twenty() {
    let names: Vec<String> = (0..30).map(|i| format!("m{i:02}")).collect();
    let weights: Vec<(&str, u32)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    let s = settings(&weights);
    let members: Vec<MemberFacts> = names
        .iter()
        .map(|n| MemberFacts::new(n, workload()))
        .collect();
    let prev = previous(
        &names
            .iter()
            .map(|n| (n.as_str(), MemberPhase::Ready, 1, 0))
            .collect::<Vec<_>>(),
    );
    let o = run(&s, Some(30), &prev, &members, t(10));
    let (_, _, message) = condition(&o, "Ready");
    assert!(message.contains("m00, m01"), "{message}");
    assert!(message.contains("m19, and 10 more"), "{message}");
    assert!(!message.contains("m20"), "{message}");
}

//! One reconciliation of a DistributedScaledObject as a pure function: what the hub knows
//! (the previous status, one [`MemberFacts`] per member, the validated spec, the total, the
//! time) in; the new status, the Events to publish, the command for each member and when to
//! look again out. The hub's controller only reads, calls [`outcome`] and writes; every DSO
//! rule lives here or in [`super::member`] and [`super::plan`], where a table test can reach
//! it with time as a parameter.
//!
//! The safety rules, each tested below and end to end:
//! - Nothing is ever commanded to a member the hub cannot plan for: an unreachable member,
//!   one not reported on since it (re)connected, one whose workload is missing, refused or
//!   scaled by something else. Such members are *held*: the agent observes and reports the
//!   workload but never changes its replicas. After `gracePeriod` their share moves to the
//!   others; what runs there stays.
//! - A total that was never written through `/scale` changes nothing that runs (raised to
//!   `minReplicaCount` at most).
//! - An invalid spec changes nothing anywhere.
//! - Two DSOs targeting one workload: the older one scales it, the other leaves it alone.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::member::{Claim, MemberFacts, MemberPhase, MemberView, view};
use super::plan::{DsoPlan, DsoPlanInput, MemberObservation, Reason, plan};
use crate::crd::conditions::{
    ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, CONDITION_CONFLICT, CONDITION_DEGRADED,
    CONDITION_PAUSED, CONDITION_READY, CONDITION_TOTAL_SET, EVENT_COMMAND_FAILING,
    EVENT_COMMAND_REFUSED, EVENT_CONFLICT, EVENT_INVALID_SPEC, EVENT_KEDA_UNAVAILABLE,
    EVENT_MEMBER_LOST, EVENT_MEMBER_RETURNED, EVENT_NAMESPACE_NOT_ALLOWED, EVENT_REBALANCED,
    EVENT_SCALED, EVENT_WORKLOAD_MISSING, REASON_AWAITING_TOTAL, REASON_CLAIMED_ELSEWHERE,
    REASON_COMMAND_FAILING, REASON_INSUFFICIENT_CAPACITY, REASON_KEDA_UNAVAILABLE,
    REASON_LOCAL_AUTOSCALER, REASON_MEMBER_UNREACHABLE, REASON_NAMESPACE_NOT_ALLOWED,
    REASON_NO_CONFLICT, REASON_NO_MEMBER_AVAILABLE, REASON_PAUSED_AT_REPLICAS,
    REASON_PAUSED_BY_ANNOTATION, REASON_RECONCILE_FAILED, REASON_RECONCILED, REASON_TOTAL_SET,
    REASON_VALIDATION_FAILED, condition,
};
use crate::crd::dso::{DistributedScaledObjectStatus, DsoMemberClusterStatus};
use crate::crd::listed_members;
use crate::time::{elapsed, to_time};
use crate::validate::{DsoSettings, Pause};

pub use crate::events::{Event, EventKind};

/// Longest wait between two reconciliations of one DSO.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Wait before retrying after part of a reconciliation failed.
pub const RETRY: Duration = Duration::from_secs(5);
/// Members a Scaled or Rebalanced Event names before it says how many more there are.
const SPLIT_SHOWN: usize = 20;

/// What one member is told for this DSO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Run this many replicas.
    Replicas(u32),
    /// Observe and report the workload, never change its replicas.
    Hold,
    /// This DSO wants nothing in the member any more.
    Clear,
}

/// Everything one reconciliation decides from.
#[derive(Clone, Copy, Debug)]
pub struct DsoInput<'a> {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.selector` to write (matches no pod in the hub).
    pub selector: &'a str,
    /// The validated spec and annotations, or why they are invalid.
    pub settings: Result<&'a DsoSettings, &'a str>,
    /// Members whose target namespace the DSO's namespace may not use, with why
    /// ([`crate::tenancy::refusals`]). Any entry refuses the whole DSO.
    pub not_allowed: &'a BTreeMap<String, String>,
    /// `spec.totalTargetReplicas`; `None` until KEDA or a user writes `/scale`.
    pub total: Option<i32>,
    /// Why the child ScaledObject cannot be created, when KEDA is missing.
    pub keda_unavailable: Option<&'a str>,
    /// Failures of this or the last reconciliation's I/O (hub cluster API, status write).
    pub errors: &'a [String],
    /// The status as last written (or read).
    pub previous: &'a DistributedScaledObjectStatus,
    /// One entry per member the DSO uses.
    pub members: &'a [MemberFacts],
    /// Members holding commands of this DSO that it no longer uses.
    pub elsewhere: &'a [String],
    /// The time.
    pub now: SystemTime,
}

/// The result of one reconciliation.
#[derive(Clone, Debug, PartialEq)]
pub struct DsoOutcome {
    /// The status to write (when it differs from what is there).
    pub status: DistributedScaledObjectStatus,
    /// Events to publish.
    pub events: Vec<Event>,
    /// What each member is told; members not listed are left as they are.
    pub commands: BTreeMap<String, Command>,
    /// Phase and since when, per member, for the next reconciliation's facts.
    pub tracked: BTreeMap<String, (MemberPhase, SystemTime)>,
    /// The plan, when the spec is valid.
    pub plan: Option<DsoPlan>,
    /// When to reconcile again at the latest.
    pub requeue: Duration,
}

/// The first [`SPLIT_SHOWN`] of `items` joined, then how many more there are.
fn shown<T: std::fmt::Display>(items: impl ExactSizeIterator<Item = T>) -> String {
    let more = items.len().saturating_sub(SPLIT_SHOWN);
    let mut shown: Vec<String> = items.take(SPLIT_SHOWN).map(|i| i.to_string()).collect();
    if more > 0 {
        shown.push(format!("and {more} more"));
    }
    shown.join(", ")
}

fn to_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Decides one reconciliation. See the module documentation for the rules.
pub fn outcome(input: &DsoInput<'_>) -> DsoOutcome {
    if !input.not_allowed.is_empty() {
        return not_allowed(input);
    }
    let settings = match (input.settings, input.total) {
        (Err(message), _) => return invalid(input, message),
        (Ok(_), Some(total)) if total < 0 => {
            return invalid(
                input,
                &format!("spec.totalTargetReplicas: must be >= 0, got {total}"),
            );
        }
        (Ok(settings), _) => settings,
    };
    let now = input.now;
    // A status cut to `MAX_LISTED_MEMBERS` lists every member that was not Ready first: a
    // member it leaves out was Ready when it was written. After a hub restart such a member
    // is held like a listed one until it reports, never taken for a new one.
    let cut = input.previous.is_cut();
    let was_ready = DsoMemberClusterStatus {
        state: Some(MemberPhase::Ready.as_str().to_owned()),
        ..DsoMemberClusterStatus::default()
    };
    let views: Vec<MemberView> = input
        .members
        .iter()
        .map(|facts| {
            let previous = input.previous.member_cluster_statuses.get(&facts.name);
            view(facts, previous.or(cut.then_some(&was_ready)), now)
        })
        .collect();
    let observations: Vec<MemberObservation> = views
        .iter()
        .filter(|v| v.phase != MemberPhase::Pending)
        .map(|v| observation(v, now))
        .collect();

    // Until the total is written, hold what runs (raised to minReplicaCount at most).
    let running: u32 = observations
        .iter()
        .map(|o| o.current_replicas)
        .fold(0, u32::saturating_add);
    let mut effective = settings.clone();
    // A member this hub process has no report from (it has just started, and the agent has
    // not reconnected yet) holds the count the previous status wanted there, which may be
    // older than what it runs: a hub stopped before it wrote its last decision. Planning
    // others around that count would move healthy members on a guess, so every member keeps
    // what it runs until the member reports or its gracePeriod runs out.
    // So does a member that went away before it acknowledged what it was last told: it runs
    // either count, and planning around the one it reported would scale healthy members
    // down (or up) for a difference that may not exist.
    let awaiting: Vec<&str> = views
        .iter()
        .filter(|v| {
            let unknown = (v.phase == MemberPhase::NotReported && v.count_unknown)
                || (v.phase == MemberPhase::Unreachable && v.unconfirmed);
            unknown && elapsed(v.since, now) <= settings.grace_period
        })
        .map(|v| v.name.as_str())
        .collect();
    let total = match input.total {
        Some(total) if !awaiting.is_empty() => {
            effective.pause = Pause::Paused;
            u32::try_from(total).unwrap_or(0)
        }
        Some(total) => u32::try_from(total).unwrap_or(0),
        None if settings.pause != Pause::No => 0,
        // Some member's replicas are not known yet: nothing to raise from.
        None if running >= settings.min_total
            || views.iter().any(|v| v.phase == MemberPhase::NotReported) =>
        {
            effective.pause = Pause::Paused;
            running
        }
        None => {
            // Scale out only: the change is distributed, nothing moves between members.
            effective.avoid_disruption = true;
            effective.max_rebalance_percentage = 0;
            settings.min_total
        }
    };
    let plan = plan(&DsoPlanInput {
        settings: &effective,
        total_target_replicas: total,
        members: &observations,
    });

    let holding = effective.pause == Pause::Paused;
    let mut commands = BTreeMap::new();
    let mut members = BTreeMap::new();
    let mut tracked = BTreeMap::new();
    // Indexed once (the first entry of a name wins, as a search from the front would find).
    let decisions: BTreeMap<&str, _> = plan
        .members
        .iter()
        .rev()
        .map(|d| (d.name.as_str(), d))
        .collect();
    let all_facts: BTreeMap<&str, _> = input
        .members
        .iter()
        .rev()
        .map(|f| (f.name.as_str(), f))
        .collect();
    // Only the entries the status will list are built (see `MAX_LISTED_MEMBERS`).
    let listed = listed_members(
        views
            .iter()
            .map(|v| (v.name.as_str(), v.phase == MemberPhase::Ready)),
    );
    for v in &views {
        let decision = decisions.get(v.name.as_str()).copied();
        let desired = decision.map_or(0, |d| d.desired);
        let facts = all_facts.get(v.name.as_str()).copied();
        let lost_claim = facts.is_some_and(|f| matches!(f.claim, Claim::Lost(_)));
        let command = if lost_claim {
            Some(Command::Clear)
        } else if !v.reachable {
            // Unreachable, or not reported on since it (re)connected: tell it nothing.
            None
        } else if v.phase.is_ready() && !holding {
            Some(Command::Replicas(desired))
        } else {
            Some(Command::Hold)
        };
        if let Some(c) = command {
            commands.insert(v.name.clone(), c);
        }
        tracked.insert(v.name.clone(), (v.phase, v.since));
        if listed
            .as_ref()
            .is_some_and(|l| !l.contains(v.name.as_str()))
        {
            continue;
        }
        let previous = input.previous.member_cluster_statuses.get(&v.name);
        let excluded = lost_claim
            || v.phase == MemberPhase::Pending
            || decision
                .is_some_and(|d| matches!(d.reason, Reason::Unreachable | Reason::NotConnected));
        members.insert(
            v.name.clone(),
            DsoMemberClusterStatus {
                current_replicas: v.ready_replicas,
                desired_replicas: to_i32(desired),
                description: Some(v.description.clone()),
                id: v.id.clone(),
                last_status_change_time: Some(to_time(v.since)),
                state: Some(v.phase.as_str().to_owned()),
                excluded,
                last_scaling_progress_time: progress(
                    previous,
                    v.ready_replicas,
                    to_i32(desired),
                    now,
                ),
            },
        );
    }
    for member in input.elsewhere {
        commands.insert(member.clone(), Command::Clear);
    }

    let healthy = views.iter().filter(|v| v.phase.is_ready()).count();
    let conditions = conditions(input, settings, &plan, &views, healthy, running, &awaiting);
    let total_current_replicas = views
        .iter()
        .map(|v| v.ready_replicas.max(0))
        .fold(0i32, i32::saturating_add);
    let status = DistributedScaledObjectStatus {
        total_current_replicas,
        member_cluster_statuses: members,
        members_healthy_count: count(healthy),
        members_total_count: count(views.len()),
        selector: Some(input.selector.to_owned()),
        conditions,
        // The controller adds the pod-metrics readings, which come from outside the plan.
        pod_metrics: Vec::new(),
    };
    let events = events(input, &status, &views);

    // Wake up when the first grace period of a member out of use runs out.
    let mut requeue = views
        .iter()
        .filter(|v| !v.phase.is_ready() && v.phase != MemberPhase::Pending)
        .filter_map(|v| settings.grace_period.checked_sub(elapsed(v.since, now)))
        .map(|left| left.saturating_add(Duration::from_millis(50)))
        .fold(RESYNC, Duration::min);
    if !input.errors.is_empty() {
        requeue = requeue.min(RETRY);
    }
    DsoOutcome {
        status,
        events,
        commands,
        tracked,
        plan: Some(plan),
        requeue,
    }
}

/// The planner's view of a member: Ready members run what they report; every other
/// member is treated as unreachable for as long as it has been in its phase, holding what
/// it runs until `gracePeriod`, after which its share moves.
fn observation(v: &MemberView, now: SystemTime) -> MemberObservation {
    let ready = v.phase.is_ready();
    MemberObservation {
        name: v.name.clone(),
        state: v.phase,
        unreachable_for: if ready {
            Duration::ZERO
        } else {
            elapsed(v.since, now)
        },
        current_replicas: v.spec_replicas,
        unschedulable_replicas: v.unschedulable.0,
        unschedulable_for: v.unschedulable.1,
        // What runs there now plus what still fits: the member's limit for tiers and the
        // basis of dynamic weights.
        capacity_replicas: v.room.map(|room| v.spec_replicas.saturating_add(room)),
    }
}

/// `lastScalingProgressTime`: the last time a member's ready replicas moved towards what is
/// wanted there (or reached it).
fn progress(
    previous: Option<&DsoMemberClusterStatus>,
    current: i32,
    desired: i32,
    now: SystemTime,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    let gap = |c: i32, d: i32| (i64::from(d) - i64::from(c)).unsigned_abs();
    let Some(p) = previous else {
        return Some(to_time(now));
    };
    let before = gap(p.current_replicas, p.desired_replicas);
    let after = gap(current, desired);
    let moved = after < before || (after == 0 && p.current_replicas != current);
    match &p.last_scaling_progress_time {
        Some(t) if !moved => Some(t.clone()),
        _ => Some(to_time(now)),
    }
}

/// A DSO that targets a namespace it was not granted: nothing is planned, and the members it
/// may not place workloads in are cleared (a grant taken back ends kedge's control there,
/// without touching the workload's replicas).
fn not_allowed(input: &DsoInput<'_>) -> DsoOutcome {
    let message = input
        .not_allowed
        .values()
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    let mut refused = refuse(
        input,
        REASON_NAMESPACE_NOT_ALLOWED,
        EVENT_NAMESPACE_NOT_ALLOWED,
        &message,
    );
    refused.commands = release_all(input);
    refused
}

/// A DSO whose spec is invalid: nothing is planned, and, like a DSO refused by namespace
/// policy, it releases every workload it commanded (their replicas stay as they are), so
/// it holds no claim another DSO would have to lose to.
fn invalid(input: &DsoInput<'_>, message: &str) -> DsoOutcome {
    let mut refused = refuse(input, REASON_VALIDATION_FAILED, EVENT_INVALID_SPEC, message);
    refused.commands = release_all(input);
    refused
}

/// `Clear` for every member of a refused DSO and every member still holding its commands.
fn release_all(input: &DsoInput<'_>) -> BTreeMap<String, Command> {
    input
        .members
        .iter()
        .map(|m| m.name.clone())
        .chain(input.not_allowed.keys().cloned())
        .chain(input.elsewhere.iter().cloned())
        .map(|member| (member, Command::Clear))
        .collect()
}

/// The conditions of a refused object: `Ready=False` and `Degraded=True`, both with
/// `reason` and `message` (so the two never disagree), the others as they were.
pub fn refused_conditions(
    previous: &[Condition],
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: SystemTime,
) -> Vec<Condition> {
    let mut conditions = vec![
        condition(
            previous,
            CONDITION_READY,
            false,
            reason,
            message.to_owned(),
            generation,
            now,
        ),
        condition(
            previous,
            CONDITION_DEGRADED,
            true,
            reason,
            message.to_owned(),
            generation,
            now,
        ),
    ];
    conditions.extend(
        previous
            .iter()
            .filter(|c| c.type_ != CONDITION_READY && c.type_ != CONDITION_DEGRADED)
            .cloned(),
    );
    conditions
}

/// `Ready=False` with `reason` and `message`, a Warning Event the first time, no command.
fn refuse(
    input: &DsoInput<'_>,
    reason: &'static str,
    event: &'static str,
    message: &str,
) -> DsoOutcome {
    let previous = input.previous;
    let mut status = previous.clone();
    status.selector = Some(input.selector.to_owned());
    status.conditions = refused_conditions(
        &previous.conditions,
        reason,
        message,
        input.generation,
        input.now,
    );
    let said_before = previous
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_READY && c.message == message);
    let events = if said_before {
        Vec::new()
    } else {
        vec![Event {
            kind: EventKind::Warning,
            reason: event,
            action: "Validate",
            note: message.to_owned(),
        }]
    };
    DsoOutcome {
        status,
        events,
        commands: BTreeMap::new(),
        tracked: BTreeMap::new(),
        plan: None,
        requeue: RESYNC,
    }
}

fn conditions(
    input: &DsoInput<'_>,
    settings: &DsoSettings,
    plan: &DsoPlan,
    views: &[MemberView],
    healthy: usize,
    running: u32,
    awaiting: &[&str],
) -> Vec<Condition> {
    let previous = &input.previous.conditions;
    let c = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(
            previous,
            type_,
            ok,
            reason,
            message,
            input.generation,
            input.now,
        )
    };
    // Nothing can run anywhere (no member, none enrolled, every one refusing or lost), and
    // no member is being waited for after a restart: not Ready, and why for each member.
    let unusable: Vec<String> = views
        .iter()
        .filter(|v| !v.phase.is_ready())
        .map(|v| format!("{}: {}", v.name, v.description))
        .collect();
    let none_usable = (healthy == 0 && awaiting.is_empty()).then(|| {
        if views.is_empty() {
            "no member is selected: memberClusters is empty and no MemberCluster has an \
             enrolled agent (enroll one with kubectl kedge mc setup-member NAME)"
                .to_owned()
        } else {
            format!("no member can run the workload: {}", unusable.join("; "))
        }
    });
    let mut out = vec![if let Some(why) = &none_usable {
        c(
            CONDITION_READY,
            false,
            REASON_NO_MEMBER_AVAILABLE,
            why.clone(),
        )
    } else {
        c(
            CONDITION_READY,
            true,
            REASON_RECONCILED,
            if awaiting.is_empty() {
                format!(
                    "{} replicas over {healthy} of {} members",
                    plan.total,
                    views.len()
                )
            } else {
                format!(
                    "every member keeps what it runs until {} report to this hub (or their gracePeriod ends)",
                    shown(awaiting.iter())
                )
            },
        )
    }];
    out.push(match settings.pause {
        Pause::No => c(
            CONDITION_PAUSED,
            false,
            "NotPaused",
            "scaling is not paused".into(),
        ),
        Pause::Paused => c(
            CONDITION_PAUSED,
            true,
            REASON_PAUSED_BY_ANNOTATION,
            format!("{ANNOTATION_PAUSED} is set: no member is changed"),
        ),
        Pause::AtReplicas(n) => c(
            CONDITION_PAUSED,
            true,
            REASON_PAUSED_AT_REPLICAS,
            format!("{ANNOTATION_PAUSED_REPLICAS} is set: the total is fixed at {n}"),
        ),
    });
    out.push(match input.total {
        Some(total) => c(
            CONDITION_TOTAL_SET,
            true,
            REASON_TOTAL_SET,
            format!("/scale set the total to {total}"),
        ),
        None => c(
            CONDITION_TOTAL_SET,
            false,
            REASON_AWAITING_TOTAL,
            format!(
                "no total was written to /scale yet (KEDA or kubectl scale); members keep the {running} replicas they run{}",
                if running < settings.min_total {
                    format!(", raised to minReplicaCount {}", settings.min_total)
                } else {
                    String::new()
                }
            ),
        ),
    });

    let not_ready: Vec<String> = views
        .iter()
        .filter(|v| !v.phase.is_ready())
        .map(|v| format!("{} ({})", v.name, v.phase))
        .collect();
    let failing: Vec<String> = views
        .iter()
        .filter_map(|v| v.failing.as_ref().map(|f| format!("{}: {f}", v.name)))
        .collect();
    out.push(if let Some(message) = input.keda_unavailable {
        c(
            CONDITION_DEGRADED,
            true,
            REASON_KEDA_UNAVAILABLE,
            message.to_owned(),
        )
    } else if !input.errors.is_empty() {
        c(
            CONDITION_DEGRADED,
            true,
            REASON_RECONCILE_FAILED,
            input.errors.join("; "),
        )
    } else if let Some(why) = none_usable {
        c(CONDITION_DEGRADED, true, REASON_NO_MEMBER_AVAILABLE, why)
    } else if !failing.is_empty() {
        c(
            CONDITION_DEGRADED,
            true,
            REASON_COMMAND_FAILING,
            failing.join("; "),
        )
    } else if plan.shortfall > 0 {
        c(
            CONDITION_DEGRADED,
            true,
            REASON_INSUFFICIENT_CAPACITY,
            if unusable.is_empty() {
                format!("{} replicas fit in no member", plan.shortfall)
            } else {
                format!(
                    "{} replicas fit in no usable member; not usable: {}",
                    plan.shortfall,
                    unusable.join("; ")
                )
            },
        )
    } else if !not_ready.is_empty() {
        c(
            CONDITION_DEGRADED,
            true,
            REASON_MEMBER_UNREACHABLE,
            format!("members not usable: {}", not_ready.join(", ")),
        )
    } else {
        c(
            CONDITION_DEGRADED,
            false,
            REASON_RECONCILED,
            "every member is usable".into(),
        )
    });

    let mut claimed = Vec::new();
    let mut local = Vec::new();
    for (facts, v) in input.members.iter().zip(views) {
        match &facts.claim {
            Claim::Lost(winner) => claimed.push(format!(
                "{}: DistributedScaledObject {winner} scales the same workload and came first",
                v.name
            )),
            Claim::Won(others) => claimed.push(format!(
                "{}: DistributedScaledObject {} also targets the workload and leaves it to this one",
                v.name,
                others.join(", ")
            )),
            Claim::Sole => {}
        }
        if let Some(other) = &v.other_controller {
            local.push(format!("{}: {other}", v.name));
        }
    }
    out.push(if !claimed.is_empty() {
        c(
            CONDITION_CONFLICT,
            true,
            REASON_CLAIMED_ELSEWHERE,
            claimed.join("; "),
        )
    } else if !local.is_empty() {
        c(
            CONDITION_CONFLICT,
            true,
            REASON_LOCAL_AUTOSCALER,
            format!("also scaled in the member: {}", local.join("; ")),
        )
    } else {
        c(
            CONDITION_CONFLICT,
            false,
            REASON_NO_CONFLICT,
            "nothing else scales the workload".into(),
        )
    });
    out
}

fn events(
    input: &DsoInput<'_>,
    status: &DistributedScaledObjectStatus,
    views: &[MemberView],
) -> Vec<Event> {
    let previous = input.previous;
    let mut per_member = Vec::new();
    // Members the status does not list (beyond `MAX_LISTED_MEMBERS`, all Ready) get no
    // Event of their own: the counts and conditions speak for them.
    for v in views
        .iter()
        .filter(|v| status.member_cluster_statuses.contains_key(&v.name))
    {
        let was = previous
            .member_cluster_statuses
            .get(&v.name)
            .and_then(|p| p.state.as_deref())
            .and_then(|s| s.parse::<MemberPhase>().ok());
        if was == Some(v.phase) {
            continue;
        }
        let (kind, reason) = match v.phase {
            // Back from a phase in which it was lost (not after a mere hub restart).
            MemberPhase::Ready | MemberPhase::NotReported
                if was.is_some_and(|w| {
                    matches!(
                        w,
                        MemberPhase::Unreachable
                            | MemberPhase::WorkloadMissing
                            | MemberPhase::Refused
                            | MemberPhase::Conflict
                    )
                }) =>
            {
                (EventKind::Normal, EVENT_MEMBER_RETURNED)
            }
            MemberPhase::Unreachable => (EventKind::Warning, EVENT_MEMBER_LOST),
            MemberPhase::WorkloadMissing => (EventKind::Warning, EVENT_WORKLOAD_MISSING),
            MemberPhase::Refused => (EventKind::Warning, EVENT_COMMAND_REFUSED),
            MemberPhase::Conflict => (EventKind::Warning, EVENT_CONFLICT),
            _ => continue,
        };
        per_member.push(Event {
            kind,
            reason,
            action: "Observe",
            note: format!("{}: {}", v.name, v.description),
        });
    }
    let mut out = crate::events::fold_alike(
        per_member,
        |e| e.reason,
        |e| &e.note,
        |e, note| Event { note, ..e },
    );
    let degraded = |s: &DistributedScaledObjectStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED && c.status == "True")
            .map(|c| c.reason.clone())
    };
    let degraded_now = degraded(status);
    if degraded_now != degraded(previous) {
        let message = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        match degraded_now.as_deref() {
            Some(REASON_KEDA_UNAVAILABLE) => out.push(Event {
                kind: EventKind::Warning,
                reason: EVENT_KEDA_UNAVAILABLE,
                action: "ApplyScaledObject",
                note: message,
            }),
            Some(REASON_COMMAND_FAILING) => out.push(Event {
                kind: EventKind::Warning,
                reason: EVENT_COMMAND_FAILING,
                action: "Apply",
                note: message,
            }),
            Some(REASON_RECONCILE_FAILED) => out.push(Event {
                kind: EventKind::Warning,
                reason: REASON_RECONCILE_FAILED,
                action: "Reconcile",
                note: message,
            }),
            _ => {}
        }
    }
    // Of a status cut to its listing bound, only members listed both before and now: one
    // that enters the list (it stopped being Ready) or leaves it is no change of the split.
    let cut = previous.is_cut() || status.is_cut();
    let split = |s: &DistributedScaledObjectStatus| -> BTreeMap<String, i32> {
        s.member_cluster_statuses
            .iter()
            .filter(|(m, _)| {
                !cut || (previous.member_cluster_statuses.contains_key(*m)
                    && status.member_cluster_statuses.contains_key(*m))
            })
            .map(|(m, s)| (m.clone(), s.desired_replicas))
            .collect()
    };
    let (before, now) = (split(previous), split(status));
    if before != now {
        // An Event's note holds 1 KiB: the first members, then how many more.
        let show = |d: &BTreeMap<String, i32>| shown(d.iter().map(|(m, r)| format!("{m}={r}")));
        let sum = |d: &BTreeMap<String, i32>| d.values().map(|v| i64::from(*v)).sum::<i64>();
        let reason = if sum(&before) == sum(&now) {
            EVENT_REBALANCED
        } else {
            EVENT_SCALED
        };
        out.push(Event {
            kind: EventKind::Normal,
            reason,
            action: "Distribute",
            note: format!(
                "total {}: {} (was {})",
                sum(&now),
                show(&now),
                show(&before)
            ),
        });
    }
    out
}

//! The vocabulary kedge writes into objects, each word defined once: annotation and label
//! names, condition types, condition reasons, member states ([`MemberPhase`]), trigger
//! states and Event reasons. Hub, CLI, `kubectl kedge simulate` and the agent use these.

use std::fmt;
use std::str::FromStr;

/// Annotation that pauses scaling of a DSO or Job creation of a DSJ (`"true"`).
pub const ANNOTATION_PAUSED: &str = "autoscaling.keda.sh/paused";
/// Annotation that pauses a DSO at a fixed total; wins over [`ANNOTATION_PAUSED`].
pub const ANNOTATION_PAUSED_REPLICAS: &str = "autoscaling.keda.sh/paused-replicas";
/// Label put on objects the hub owns for a DSO (and the value of its `/scale` selector).
pub const LABEL_DSO: &str = "kedge.dev/distributedscaledobject";
/// Label put on objects the hub owns for a DSJ, and by the agent on every Job it creates
/// for one and on that Job's pod template (value: the DSJ name). The agent watches, reports
/// and deletes only Jobs that carry it.
pub const LABEL_DSJ: &str = "kedge.dev/distributedscaledjob";
/// Annotation the agent puts on every Job it creates and on its pod template:
/// `namespace/name` of the owning DSJ. A delete for another owner is refused.
pub const ANNOTATION_OWNER: &str = "kedge.dev/owner";
/// Annotation on a failover Job: the name of the stuck Job it replaces (reported back by the
/// agent, so a restarted hub pairs them again).
pub const ANNOTATION_REPLACES: &str = "kedge.dev/replaces";
/// Annotation on a Job: a hash of the Job spec it was rendered with in its member
/// (`jobTargetRef` plus that member's `podOverrides`). Reported back by the agent, so the
/// hub knows which Jobs an update of the DSJ leaves behind (`rollout.strategy: default`).
pub const ANNOTATION_TEMPLATE: &str = "kedge.dev/template";
/// Label on Jobs created by a DSJ, naming the member they were placed in.
pub const LABEL_MEMBER: &str = "kedge.dev/member";

/// Condition: the resource is reconciled and its decisions are applied.
pub const CONDITION_READY: &str = "Ready";
/// Condition: scaling is paused by annotation.
pub const CONDITION_PAUSED: &str = "Paused";
/// Condition: some member is unreachable or capacity runs out.
pub const CONDITION_DEGRADED: &str = "Degraded";
/// Condition: the spec failed validation.
pub const CONDITION_INVALID_SPEC: &str = "InvalidSpec";

/// Reason: everything as wanted.
pub const REASON_RECONCILED: &str = "Reconciled";
/// Reason: `autoscaling.keda.sh/paused` is set.
pub const REASON_PAUSED_BY_ANNOTATION: &str = "PausedByAnnotation";
/// Reason: `autoscaling.keda.sh/paused-replicas` is set.
pub const REASON_PAUSED_AT_REPLICAS: &str = "PausedAtReplicas";
/// Reason: a member has been unreachable longer than the grace period.
pub const REASON_MEMBER_UNREACHABLE: &str = "MemberUnreachable";
/// Reason: members cannot hold the total.
pub const REASON_INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
/// Reason: the spec is invalid.
pub const REASON_VALIDATION_FAILED: &str = "ValidationFailed";
/// Reason: the spec targets a member namespace its hub namespace was not granted.
pub const REASON_NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
/// Reason: no member can take the work (none exists, none enrolled, every one refuses or is
/// unreachable); the message says why for each.
pub const REASON_NO_MEMBER_AVAILABLE: &str = "NoMemberAvailable";

/// Condition: something else also scales a workload of this resource.
pub const CONDITION_CONFLICT: &str = "Conflict";
/// Condition: whether the fleet-wide total has been written through `/scale`.
pub const CONDITION_TOTAL_SET: &str = "TotalSet";
/// Every condition type kedge writes (the printer columns may name only these).
pub const CONDITION_TYPES: [&str; 6] = [
    CONDITION_READY,
    CONDITION_PAUSED,
    CONDITION_DEGRADED,
    CONDITION_INVALID_SPEC,
    CONDITION_CONFLICT,
    CONDITION_TOTAL_SET,
];

/// Reason: an agent keeps failing to apply a command (transient errors).
pub const REASON_COMMAND_FAILING: &str = "CommandFailing";
/// Reason: part of the last reconciliation failed (hub cluster API, status write).
pub const REASON_RECONCILE_FAILED: &str = "ReconcileFailed";
/// Reason: the child ScaledObject cannot be created because KEDA is not installed.
pub const REASON_KEDA_UNAVAILABLE: &str = "KedaUnavailable";
/// Reason: no total was ever written through `/scale`; members keep what they run.
pub const REASON_AWAITING_TOTAL: &str = "AwaitingTotal";
/// Reason: the total was written through `/scale`.
pub const REASON_TOTAL_SET: &str = "TotalSet";
/// Reason: another DSO claimed the same workload first.
pub const REASON_CLAIMED_ELSEWHERE: &str = "ClaimedByAnotherDSO";
/// Reason: something in a member scales the workload besides kedge.
pub const REASON_LOCAL_AUTOSCALER: &str = "ScaledInMember";
/// Reason: no conflict.
pub const REASON_NO_CONFLICT: &str = "NoConflict";

// DSJ condition reasons.

/// `Ready=False`: a trigger cannot be read (after `dsj::outcome::first_reading_grace`), nothing is
/// created.
pub const REASON_METRIC_UNAVAILABLE: &str = "MetricUnavailable";
/// `Ready=False`: Jobs are wanted and no member can take any (none listed or registered,
/// all unreachable or hard-tainted).
pub const REASON_NO_ELIGIBLE_MEMBER: &str = "NoEligibleMember";
/// `Ready=False`: the strategy asked for Jobs that no eligible member could take.
pub const REASON_JOBS_UNPLACED: &str = "JobsUnplaced";
/// `Ready=False` when every member sent Jobs refused them; `Degraded=True` when some did.
pub const REASON_JOB_CREATE_FAILED: &str = "JobCreateFailed";
/// `Degraded=False`.
pub const REASON_NO_FAILURES: &str = "NoFailures";
/// `Degraded=False` while a new trigger has not had the time to publish its first value.
pub const REASON_AWAITING_METRIC: &str = "AwaitingMetric";

// MemberCluster condition reasons.

/// MemberCluster `Ready` reason when the agent is connected.
pub const REASON_CONNECTED: &str = "AgentConnected";
/// MemberCluster `Ready` reason when it is not.
pub const REASON_NOT_CONNECTED: &str = "AgentNotConnected";

/// `triggerMetricsStatus[].state`: the trigger was read and asks for Jobs.
pub const TRIGGER_ACTIVE: &str = "Active";
/// `triggerMetricsStatus[].state`: the trigger was read and asks for none.
pub const TRIGGER_INACTIVE: &str = "Inactive";
/// `triggerMetricsStatus[].state`: a new trigger waits for its first value.
pub const TRIGGER_PENDING: &str = "Pending";
/// `triggerMetricsStatus[].state`: the trigger cannot be read; nothing is created.
pub const TRIGGER_ERROR: &str = "Error";

// DSO Event reasons.

/// Event reason: the split over members changed at the same total.
pub const EVENT_REBALANCED: &str = "Rebalanced";
/// Event reason: the total changed and was split over the members.
pub const EVENT_SCALED: &str = "Scaled";
/// Event reason: a member stopped being usable for this DSO.
pub const EVENT_MEMBER_LOST: &str = "MemberLost";
/// Event reason: a member is usable again.
pub const EVENT_MEMBER_RETURNED: &str = "MemberReturned";
/// Event reason: an agent refused a command or cannot act on the workload.
pub const EVENT_COMMAND_REFUSED: &str = "CommandRefused";
/// Event reason: an agent keeps failing to apply a command.
pub const EVENT_COMMAND_FAILING: &str = "CommandFailing";
/// Event reason: the workload does not exist in a member.
pub const EVENT_WORKLOAD_MISSING: &str = "WorkloadMissing";
/// Event reason: something else scales the workload in a member.
pub const EVENT_CONFLICT: &str = "Conflict";
/// Event reason: the spec or annotations are invalid.
pub const EVENT_INVALID_SPEC: &str = "InvalidSpec";
/// Event reason: the spec targets a member namespace that was not granted.
pub const EVENT_NAMESPACE_NOT_ALLOWED: &str = REASON_NAMESPACE_NOT_ALLOWED;
/// Event reason: the child ScaledObject cannot be created.
pub const EVENT_KEDA_UNAVAILABLE: &str = REASON_KEDA_UNAVAILABLE;

// DSJ Event reasons (and [`EVENT_INVALID_SPEC`]).

/// Event: Jobs were created in this poll (KEDA's `KEDAJobsCreated`), naming where.
pub const EVENT_JOBS_CREATED: &str = "JobsCreated";
/// Event: a pending Job passed the grace period.
pub const EVENT_JOB_STUCK: &str = "JobStuck";
/// Event: a member's taint level changed.
pub const EVENT_TAINT_CHANGED: &str = "TaintChanged";
/// Event: a trigger could not be read (once per change).
pub const EVENT_METRIC_UNAVAILABLE: &str = REASON_METRIC_UNAVAILABLE;
/// Event: a member refused or failed the Jobs it was sent (with the agent's reason).
pub const EVENT_JOB_CREATE_FAILED: &str = REASON_JOB_CREATE_FAILED;
/// Event: a member refused or failed a delete (it is retried).
pub const EVENT_JOB_DELETE_FAILED: &str = "JobDeleteFailed";
/// Event: a `containerOverrides` entry names no container of the Job template.
pub const EVENT_UNKNOWN_CONTAINER: &str = "UnknownContainer";
/// Event: a failover Job replaces a stuck one.
pub const EVENT_FAILOVER: &str = "Failover";
/// Event: a Job made from an earlier spec is deleted (`rollout.strategy: default`).
pub const EVENT_JOB_ROLLED_OUT: &str = "JobRolledOut";
/// Event: a Job is deleted by the duplication policy or the history limits.
pub const EVENT_JOB_CLEANED_UP: &str = "JobCleanedUp";

/// The state of one member: `state` in a MemberCluster's status (`Ready`, `Pending`,
/// `Unreachable`), in a DSO's `memberClusterStatuses` (every phase) and in a DSJ's
/// (`Ready`, `Unreachable`). The planners take it too: a member that is not
/// [`MemberPhase::Ready`] runs nothing new and keeps what it holds until its grace period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberPhase {
    /// Connected, reported, the workload is there: it gets its share.
    Ready,
    /// Registered, its agent never connected: it gets nothing and holds nothing.
    Pending,
    /// Connected (or expected back after a hub restart) without a report to plan from.
    NotReported,
    /// Heartbeats missing.
    Unreachable,
    /// The workload does not exist in the member.
    WorkloadMissing,
    /// The agent refuses or cannot act on the workload (namespace policy, RBAC, invalid).
    Refused,
    /// Something else scales the workload: another DSO that came first, or a local
    /// autoscaler or hand edits in the member.
    Conflict,
}

impl MemberPhase {
    /// Every phase, for parsers and tests.
    pub const ALL: [MemberPhase; 7] = [
        MemberPhase::Ready,
        MemberPhase::Pending,
        MemberPhase::NotReported,
        MemberPhase::Unreachable,
        MemberPhase::WorkloadMissing,
        MemberPhase::Refused,
        MemberPhase::Conflict,
    ];

    /// The `state` string in status.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberPhase::Ready => "Ready",
            MemberPhase::Pending => "Pending",
            MemberPhase::NotReported => "NotReported",
            MemberPhase::Unreachable => "Unreachable",
            MemberPhase::WorkloadMissing => "WorkloadMissing",
            MemberPhase::Refused => "Refused",
            MemberPhase::Conflict => "Conflict",
        }
    }

    /// Whether the member runs its share of the DSO.
    pub fn is_ready(self) -> bool {
        self == MemberPhase::Ready
    }
}

impl fmt::Display for MemberPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `state` string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPhase(pub String);

impl FromStr for MemberPhase {
    type Err = UnknownPhase;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MemberPhase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPhase(s.to_owned()))
    }
}

/// A condition whose `lastTransitionTime` is `now`, or the previous one of the same type
/// when its status did not change (the Kubernetes convention).
pub fn condition(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: std::time::SystemTime,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let status = if status { "True" } else { "False" };
    condition_of(previous, type_, status, reason, message, generation, now)
}

/// [`condition`] with the status as written: `True`, `False` or `Unknown`.
pub fn condition_of(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: std::time::SystemTime,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(
            || crate::time::to_time(now),
            |c| c.last_transition_time.clone(),
        );
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

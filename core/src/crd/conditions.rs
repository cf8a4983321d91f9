//! Condition types, reasons, states and annotation names shared by hub, agent and CLI.

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

/// Member state: the agent is connected and heartbeating.
pub const STATE_READY: &str = "Ready";
/// Member state: heartbeats are missing.
pub const STATE_UNREACHABLE: &str = "Unreachable";
/// Member state: registered, agent never connected.
pub const STATE_PENDING: &str = "Pending";
/// Member state: connected, but no report since it (re)connected: nothing is planned for it.
pub const STATE_NOT_REPORTED: &str = "NotReported";
/// Member state: connected, but the workload does not exist there.
pub const STATE_WORKLOAD_MISSING: &str = "WorkloadMissing";
/// Member state: connected, but the agent refuses or cannot act on the workload.
pub const STATE_REFUSED: &str = "Refused";
/// Member state: something else scales the workload (another DSO, a local autoscaler).
pub const STATE_CONFLICT: &str = "Conflict";

/// Condition: something else also scales a workload of this resource.
pub const CONDITION_CONFLICT: &str = "Conflict";
/// Condition: whether the fleet-wide total has been written through `/scale`.
pub const CONDITION_TOTAL_SET: &str = "TotalSet";

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

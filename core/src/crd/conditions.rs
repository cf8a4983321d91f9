//! Condition types, reasons, states and annotation names shared by hub, agent and CLI.

/// Annotation that pauses scaling of a DSO or Job creation of a DSJ (`"true"`).
pub const ANNOTATION_PAUSED: &str = "autoscaling.keda.sh/paused";
/// Annotation that pauses a DSO at a fixed total; wins over [`ANNOTATION_PAUSED`].
pub const ANNOTATION_PAUSED_REPLICAS: &str = "autoscaling.keda.sh/paused-replicas";
/// Label put on objects the hub owns for a DSO (and the value of its `/scale` selector).
pub const LABEL_DSO: &str = "kedge.dev/distributedscaledobject";
/// Label put on objects the hub owns for a DSJ.
pub const LABEL_DSJ: &str = "kedge.dev/distributedscaledjob";
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

/// Member state: the agent is connected and heartbeating.
pub const STATE_READY: &str = "Ready";
/// Member state: heartbeats are missing.
pub const STATE_UNREACHABLE: &str = "Unreachable";
/// Member state: registered, agent never connected.
pub const STATE_PENDING: &str = "Pending";

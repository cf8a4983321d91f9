//! Every message that crosses the wire, one enum per direction.
//!
//! Durations are milliseconds (`*_ms`), instants are Unix milliseconds (`*_unix_ms`), so that
//! both sides agree without sharing a clock type.

use serde::{Deserialize, Serialize};

/// Messages the agent sends to the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// First message on the control stream.
    Hello(Hello),
    /// Liveness probe on the heartbeat stream.
    Heartbeat(Heartbeat),
    /// Outcome of applying one desired-state revision.
    Ack(Ack),
    /// What the agent observes in its cluster.
    Report(StatusReport),
    /// Asks for a fresh client certificate (control stream, protocol version 4 and later).
    Renew(crate::RenewRequest),
    /// Pod-metrics samples (control stream, protocol version 5 and later).
    PodMetrics(crate::PodMetricsReport),
}

/// Messages the hub sends to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HubMessage {
    /// The hub accepted the session.
    Welcome(Welcome),
    /// The hub refused the session; the stream is closed afterwards.
    Refused(Refusal),
    /// Answer to a [`Heartbeat`].
    HeartbeatAck(HeartbeatAck),
    /// What the member should run.
    DesiredState(DesiredState),
    /// Answer to a [`AgentMessage::Renew`].
    Renewed(crate::EnrollResponse),
    /// The pod-metrics scrapes to run (control stream, protocol version 5 and later).
    Scrape(crate::ScrapeTargets),
}

/// Opens a session. The member's identity is *not* here: it comes from its certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Protocol version the agent speaks.
    pub protocol_version: u16,
    /// Agent build version (semver).
    pub agent_version: String,
    /// `gitVersion` of the member's kube-apiserver, or empty when unknown.
    pub kubernetes_version: String,
    /// Highest desired-state revision the agent has applied, 0 if none.
    pub last_applied_revision: u64,
    /// Namespaces the agent is configured to manage; empty means every namespace.
    pub namespaces: Vec<String>,
}

/// Accepts a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Protocol version the hub will speak on this session.
    pub protocol_version: u16,
    /// Hub build version.
    pub hub_version: String,
    /// Unique id of this session, for logs on both sides.
    pub session_id: String,
    /// The member name the hub read from the agent's certificate.
    pub member: String,
    /// How often the agent must send a heartbeat.
    pub heartbeat_interval_ms: u64,
}

/// Why the hub refused a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalCode {
    /// The agent speaks a protocol version the hub does not support.
    UnsupportedVersion,
    /// The member was deleted or its certificate revoked.
    Revoked,
    /// The first message was not a `Hello`.
    UnexpectedMessage,
    /// The hub is shutting down or at its session limit; retry later.
    Unavailable,
}

/// Refuses a session with a reason a person can read in either side's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Machine-readable reason.
    pub code: RefusalCode,
    /// Human-readable explanation, including what to do about it.
    pub message: String,
    /// Oldest protocol version the hub accepts.
    pub min_protocol_version: u16,
    /// Newest protocol version the hub accepts.
    pub max_protocol_version: u16,
}

/// Liveness probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Increases by one per heartbeat within a session.
    pub seq: u64,
    /// Agent wall clock when sent, for skew diagnostics only.
    pub sent_unix_ms: i64,
}

/// Answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The `seq` being answered.
    pub seq: u64,
}

/// A workload kind with a `/scale` subresource in the member cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadRef {
    /// `apiVersion` of the target, e.g. `apps/v1`.
    pub api_version: String,
    /// `kind` of the target, e.g. `Deployment`.
    pub kind: String,
    /// Namespace in the member cluster.
    pub namespace: String,
    /// Name in the member cluster.
    pub name: String,
}

impl WorkloadRef {
    /// The `apps/v1` Deployment `namespace/name` (a DSO's default target kind).
    pub fn deployment(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// "Workload W should run R replicas", or "hold W": on behalf of one hub object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadReplicas {
    /// The target in the member cluster.
    pub workload: WorkloadRef,
    /// Desired replicas; `None` holds the workload: the agent observes and reports it but
    /// never changes its replicas (the hub cannot plan for it: missing, refused, contested).
    pub replicas: Option<i32>,
    /// The hub object this comes from, `namespace/name` of the DistributedScaledObject.
    pub owner: String,
}

/// A Job to create, with a deterministic name so that re-sending it is harmless.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCreate {
    /// Namespace in the member cluster.
    pub namespace: String,
    /// Deterministic Job name.
    pub name: String,
    /// `namespace/name` of the DistributedScaledJob.
    pub owner: String,
    /// The complete `batch/v1` Job as JSON.
    pub manifest_json: Vec<u8>,
}

/// How the pods of a deleted Job go (Kubernetes' `propagationPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Propagation {
    /// The Job goes at once; the garbage collector deletes its pods after it.
    #[default]
    Background,
    /// The Job stays, being deleted, until its pods are gone.
    Foreground,
}

/// A Job to delete (duplicate resolution, history cleanup, rollout of a changed spec, or the
/// deleted DSJ).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDelete {
    /// Namespace in the member cluster.
    pub namespace: String,
    /// Job name.
    pub name: String,
    /// `namespace/name` of the DistributedScaledJob.
    pub owner: String,
    /// How its pods go: `rollout.propagationPolicy` for a rollout, background otherwise.
    pub propagation: Propagation,
}

/// The complete desired state of one member at one revision. Level-triggered: the agent
/// converges to the latest one it received and nothing depends on earlier messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    /// Strictly increasing per member across hub restarts.
    pub revision: u64,
    /// Replica counts of every workload the hub manages in this member.
    pub workloads: Vec<WorkloadReplicas>,
    /// Jobs that should exist.
    pub create_jobs: Vec<JobCreate>,
    /// Jobs that should no longer exist.
    pub delete_jobs: Vec<JobDelete>,
}

/// Whether a failed command may succeed if retried unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Retry {
    /// Retrying may succeed (API unavailable, conflict, timeout).
    Transient,
    /// Retrying unchanged will fail again (forbidden namespace, invalid manifest, missing
    /// workload).
    Permanent,
}

/// What kind of failure a command met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureCode {
    /// The agent is not configured to manage the target namespace.
    NamespaceNotAllowed,
    /// The target workload does not exist in the member cluster.
    NotFound,
    /// The member kube-apiserver refused the agent (RBAC).
    Forbidden,
    /// The manifest or request is invalid.
    Invalid,
    /// The member kube-apiserver could not be reached or timed out.
    ApiUnavailable,
    /// An optimistic-concurrency conflict.
    Conflict,
    /// The Job exists but kedge did not create it for this owner: it lacks the
    /// `kedge.dev/distributedscaledjob` label or its `kedge.dev/owner` annotation names
    /// another DistributedScaledJob. The agent never deletes or adopts such a Job.
    NotOwned,
    /// Any other failure.
    Other,
    /// The agent is not configured to manage the target's kind (its `--kinds`), or a Job
    /// command's manifest is not a `batch/v1` Job. Last, because postcard encodes a
    /// variant by its index.
    KindNotAllowed,
}

/// A typed command failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Retry classification.
    pub retry: Retry,
    /// Failure class.
    pub code: FailureCode,
    /// Details for people.
    pub message: String,
}

/// What a command acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandTarget {
    /// A replica command.
    Workload(WorkloadRef),
    /// A Job create or delete, `namespace/name`.
    Job(String),
}

/// The outcome of one command of a desired-state revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    /// What the command acted on.
    pub target: CommandTarget,
    /// `None` when applied, the failure otherwise.
    pub failure: Option<Failure>,
}

/// Acknowledges a desired-state revision with the outcome of each of its commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The revision acknowledged.
    pub revision: u64,
    /// One result per command; commands not listed were no-ops.
    pub results: Vec<CommandResult>,
}

/// Observed state of one managed workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadStatus {
    /// The workload.
    pub workload: WorkloadRef,
    /// Whether the workload exists in the member cluster.
    pub exists: bool,
    /// `.spec.replicas`.
    pub spec_replicas: i32,
    /// `.status.readyReplicas`.
    pub ready_replicas: i32,
    /// `.status.availableReplicas`.
    pub available_replicas: i32,
    /// Pods of the workload not yet scheduled.
    pub pending_pods: i32,
    /// Pods the scheduler reported `Unschedulable`.
    pub unschedulable_pods: i32,
    /// How long the oldest unschedulable pod has been so, 0 if none.
    pub unschedulable_for_ms: u64,
    /// CPU one pod of the workload requests (millicores, from its pod template); 0: none.
    /// The hub derives the member's room for the workload from this and the reported
    /// capacity, so a member cannot claim more room than its capacity holds.
    pub pod_cpu_millis: u64,
    /// Memory one pod of the workload requests (bytes); 0: none.
    pub pod_memory_bytes: u64,
    /// Why the agent cannot read or act on the workload (RBAC, namespace policy), if so.
    /// A later report without it clears an earlier failure.
    pub failure: Option<Failure>,
    /// Something else in the member scales the workload (a local HPA or ScaledObject, or
    /// repeated edits by hand): the agent says who and stops restoring replicas.
    pub conflict: Option<String>,
}

impl WorkloadStatus {
    /// The status of a workload that does not exist in the member cluster.
    pub fn absent(workload: WorkloadRef) -> Self {
        Self {
            workload,
            exists: false,
            spec_replicas: 0,
            ready_replicas: 0,
            available_replicas: 0,
            pending_pods: 0,
            unschedulable_pods: 0,
            unschedulable_for_ms: 0,
            pod_cpu_millis: 0,
            pod_memory_bytes: 0,
            failure: None,
            conflict: None,
        }
    }
}

/// Phase of a managed Job, from the Job's conditions and its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobPhase {
    /// Not finished, and no pod of the Job is running or has succeeded (KEDA's default
    /// pending rule).
    Pending,
    /// Not finished, and at least one pod is running or has succeeded.
    Running,
    /// The Job's `Complete` condition is `True`.
    Succeeded,
    /// The Job's `Failed` condition is `True` (backoff limit or deadline exceeded).
    Failed,
}

/// A Job in the member cluster, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobRef {
    /// Namespace in the member cluster.
    pub namespace: String,
    /// Job name.
    pub name: String,
}

/// The pods of one Job that have the same pod condition types `True`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodConditionSet {
    /// The condition types that are `True`, sorted, e.g. `["Initialized", "PodScheduled"]`;
    /// at most [`MAX_POD_CONDITION_TYPES`].
    ///
    /// [`MAX_POD_CONDITION_TYPES`]: crate::MAX_POD_CONDITION_TYPES
    pub true_conditions: Vec<String>,
    /// How many of the Job's pods have exactly these conditions `True`.
    pub pods: u32,
}

/// Observed state of one managed Job: facts only, the hub decides what counts as pending or
/// stuck. Every string read from the member cluster is at most [`MAX_TEXT_BYTES`] long.
///
/// [`MAX_TEXT_BYTES`]: crate::MAX_TEXT_BYTES
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Namespace in the member cluster.
    pub namespace: String,
    /// Job name.
    pub name: String,
    /// `namespace/name` of the DistributedScaledJob (the Job's `kedge.dev/owner`).
    pub owner: String,
    /// Current phase.
    pub phase: JobPhase,
    /// The Job's `creationTimestamp`: since when a Job that is still pending has been.
    pub created_unix_ms: i64,
    /// Whether any pod of the Job is `Running` or `Succeeded` (KEDA's
    /// `isAnyPodRunningOrCompleted`).
    pub any_pod_running_or_completed: bool,
    /// The `True` condition types of the Job's pods, one entry per distinct set with the
    /// number of pods that have it; at most [`MAX_POD_CONDITION_SETS`] entries (those with
    /// the most conditions), sorted. Enough for either of KEDA's `pendingPodConditions`
    /// rules: since KEDA 2.18 an unfinished Job is pending unless one pod has every listed
    /// condition `True`; before, unless the (pod, listed condition) pairs that are `True`
    /// numbered exactly as many as the list.
    ///
    /// [`MAX_POD_CONDITION_SETS`]: crate::MAX_POD_CONDITION_SETS
    pub true_pod_conditions: Vec<PodConditionSet>,
    /// Why a pending Job's pods do not run, e.g. `Unschedulable` (the scheduler's reason) or
    /// `ImagePullBackOff` (a container's waiting reason); `None` when not pending or unknown.
    pub pending_reason: Option<String>,
    /// Reason of a failed Job's `Failed` condition, e.g. `BackoffLimitExceeded`.
    pub failure_reason: Option<String>,
    /// When the Job finished (succeeded or failed), for history cleanup.
    pub finished_unix_ms: Option<i64>,
    /// For a failover Job, the name of the stuck Job it replaces (its `kedge.dev/replaces`
    /// annotation), so that a restarted hub pairs them again for the duplication policy.
    pub replaces: Option<String>,
    /// Its `kedge.dev/template` annotation: a hash of the Job spec it was made from, so the
    /// hub can tell Jobs made from an earlier DSJ spec (`rollout.strategy: default`).
    pub template: Option<String>,
}

/// Free and total schedulable capacity of the member cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCapacity {
    /// Nodes in the cluster.
    pub nodes: u32,
    /// Nodes that are Ready and schedulable.
    pub ready_nodes: u32,
    /// Sum of allocatable CPU of ready nodes, millicores.
    pub allocatable_cpu_millis: u64,
    /// Sum of allocatable memory of ready nodes, bytes.
    pub allocatable_memory_bytes: u64,
    /// CPU requested by scheduled, non-terminated pods, millicores.
    pub requested_cpu_millis: u64,
    /// Memory requested by scheduled, non-terminated pods, bytes.
    pub requested_memory_bytes: u64,
}

/// What the agent observes. A `full` report replaces everything the hub knew of this member
/// (sent after every (re)connect); otherwise it updates only the entries it carries.
///
/// A report larger than a frame is split into parts, each a `Report`: every part but the
/// last has `more` set. The parts of a full report are the one with `full` set and those
/// after it up to and including the first without `more`; only then is the member's set of
/// Jobs complete, and a Job missing from every part is gone. The agent also keeps a full
/// report open (`more`) until it has listed the Jobs it manages, so that a hub never takes a
/// member's Jobs for gone because the agent has not seen them yet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Whether this report starts a complete set.
    pub full: bool,
    /// Whether more parts of this report follow.
    pub more: bool,
    /// Managed workloads.
    pub workloads: Vec<WorkloadStatus>,
    /// Managed Jobs: all of them over the parts of a full report, else those that changed.
    pub jobs: Vec<JobStatus>,
    /// Managed Jobs that no longer exist (never in a full report).
    pub removed_jobs: Vec<JobRef>,
    /// Cluster capacity, when it changed or in a full report.
    pub capacity: Option<ClusterCapacity>,
}

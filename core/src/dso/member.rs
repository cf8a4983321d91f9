//! One member as one DSO sees it: its phase, the workload the DSO scales there, and what the
//! hub knows of it. The hub translates sessions and agent reports into [`MemberFacts`]; every
//! rule that turns facts into a phase lives here.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use kedge_protocol::{ClusterCapacity, Failure, FailureCode, Retry, WorkloadRef, WorkloadStatus};

pub use crate::crd::conditions::{MemberPhase, UnknownPhase};
use crate::crd::dso::{DistributedScaledObjectSpec, DsoMemberClusterStatus};

/// Default `scaleTargetRef.apiVersion`.
pub const DEFAULT_TARGET_API_VERSION: &str = "apps/v1";
/// Default `scaleTargetRef.kind`.
pub const DEFAULT_TARGET_KIND: &str = "Deployment";

/// The workload a DSO scales in `member`: `scaleTargetRef` (default `apps/v1` Deployment)
/// in the member's `targetNamespace`, else the DSO's namespace.
/// For many members of one DSO, use [`Targets`].
pub fn target(spec: &DistributedScaledObjectSpec, namespace: &str, member: &str) -> WorkloadRef {
    let listed = spec.member_clusters.iter().find(|m| m.name == member);
    Targets {
        spec,
        namespace,
        namespaces: listed
            .map(|m| (m.name.as_str(), m.target_namespace.as_deref()))
            .into_iter()
            .collect(),
    }
    .of(member)
}

/// [`target`] for many members of one DSO: the listed members' target namespaces are
/// indexed once, so each lookup is O(log n) instead of a scan of `memberClusters`.
#[derive(Debug, Clone)]
pub struct Targets<'a> {
    spec: &'a DistributedScaledObjectSpec,
    namespace: &'a str,
    namespaces: std::collections::BTreeMap<&'a str, Option<&'a str>>,
}

impl<'a> Targets<'a> {
    /// The targets of the DSO `spec` in `namespace`.
    pub fn new(spec: &'a DistributedScaledObjectSpec, namespace: &'a str) -> Self {
        let mut namespaces = std::collections::BTreeMap::new();
        for m in &spec.member_clusters {
            // The first entry of a name wins, as in `target`.
            namespaces
                .entry(m.name.as_str())
                .or_insert(m.target_namespace.as_deref());
        }
        Self {
            spec,
            namespace,
            namespaces,
        }
    }

    /// What [`target`] returns for `member`.
    pub fn of(&self, member: &str) -> WorkloadRef {
        let target = &self.spec.scaled_object_spec.scale_target_ref;
        let namespace = self
            .namespaces
            .get(member)
            .copied()
            .flatten()
            .unwrap_or(self.namespace);
        WorkloadRef {
            api_version: target
                .api_version
                .clone()
                .unwrap_or_else(|| DEFAULT_TARGET_API_VERSION.to_owned()),
            kind: target
                .kind
                .clone()
                .unwrap_or_else(|| DEFAULT_TARGET_KIND.to_owned()),
            namespace: namespace.to_owned(),
            name: target.name.clone(),
        }
    }
}

/// The members a DSO uses: those it lists, else every registered or connected member.
pub fn members_of(
    spec: &DistributedScaledObjectSpec,
    registered: &BTreeSet<String>,
    connected: &BTreeSet<String>,
) -> BTreeSet<String> {
    if spec.member_clusters.is_empty() {
        registered.union(connected).cloned().collect()
    } else {
        spec.member_clusters
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }
}

/// How many more pods requesting `cpu_millis` and `memory_bytes` fit into the member's free
/// capacity (allocatable minus requested, summed over Ready nodes); `None` when a pod
/// requests nothing, so nothing bounds it. Computed by the hub from the reported capacity,
/// so an agent cannot claim more room than the capacity it reports.
pub fn room_for(capacity: &ClusterCapacity, cpu_millis: u64, memory_bytes: u64) -> Option<u32> {
    let free_cpu = capacity
        .allocatable_cpu_millis
        .saturating_sub(capacity.requested_cpu_millis);
    let free_memory = capacity
        .allocatable_memory_bytes
        .saturating_sub(capacity.requested_memory_bytes);
    let by_cpu = (cpu_millis > 0).then(|| free_cpu / cpu_millis);
    let by_memory = (memory_bytes > 0).then(|| free_memory / memory_bytes);
    let room = match (by_cpu, by_memory) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return None,
    };
    Some(u32::try_from(room).unwrap_or(u32::MAX))
}

/// The agent session of a member, as far as one DSO cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Session {
    /// The hub cluster has no MemberCluster of this name (or its agent never enrolled):
    /// nothing can run there until it is enrolled.
    NotEnrolled,
    /// The agent has not connected since the hub process started.
    Never,
    /// Connected. `reported`: its first full report of this session has arrived, so what
    /// the hub knows of the member is current.
    Connected {
        /// Session id, for `id` in status.
        id: String,
        /// Whether the session's first full report has arrived.
        reported: bool,
    },
    /// Heartbeats missing.
    Unreachable {
        /// Session id of the lost session.
        id: String,
        /// Why, as the session registry says.
        reason: String,
    },
}

/// Whether another DSO also targets the same workload in a member.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Claim {
    /// No other DSO targets it.
    #[default]
    Sole,
    /// This DSO came first; the others (`namespace/name`) leave the workload alone.
    Won(Vec<String>),
    /// Another DSO (`namespace/name`) came first: this one leaves the workload alone.
    Lost(String),
}

/// Decides which of the DSOs targeting one workload in one member may scale it: the oldest
/// (creation time, then `namespace/name`), so the answer never flaps.
pub fn claim(me: &(SystemTime, String), contenders: &[(SystemTime, String)]) -> Claim {
    let others: Vec<&(SystemTime, String)> = contenders.iter().filter(|c| *c != me).collect();
    if others.is_empty() {
        return Claim::Sole;
    }
    match others.iter().min() {
        Some(first) if *first < me => Claim::Lost(first.1.clone()),
        _ => Claim::Won(others.iter().map(|o| o.1.clone()).collect()),
    }
}

/// What the hub knows of one member, translated from its session, reports and acks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberFacts {
    /// Member name.
    pub name: String,
    /// The workload the DSO scales there ([`target`]).
    pub workload: WorkloadRef,
    /// The agent session.
    pub session: Session,
    /// The latest report on the DSO's workload there (this hub process only).
    pub report: Option<WorkloadStatus>,
    /// The latest failed command for the workload, unless a later report showed it healthy.
    pub command_failure: Option<Failure>,
    /// The member's latest reported capacity.
    pub capacity: Option<ClusterCapacity>,
    /// Whether another DSO targets the same workload there.
    pub claim: Claim,
    /// The phase this hub process saw last, and since when.
    pub tracked: Option<(MemberPhase, SystemTime)>,
    /// The member was sent a desired state it has not acknowledged: it may run what it was
    /// told or what it reported last (an acknowledgement and a report lost with a relaying
    /// replica that died, or with the member's link).
    pub unconfirmed: bool,
}

impl MemberFacts {
    /// A member whose agent never connected, with nothing known.
    pub fn new(name: impl Into<String>, workload: WorkloadRef) -> Self {
        Self {
            name: name.into(),
            workload,
            session: Session::Never,
            report: None,
            command_failure: None,
            capacity: None,
            claim: Claim::Sole,
            tracked: None,
            unconfirmed: false,
        }
    }
}

/// One member as one DSO sees it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// Member name.
    pub name: String,
    /// Phase.
    pub phase: MemberPhase,
    /// `description` in status: what is right or wrong, in a sentence.
    pub description: String,
    /// `id` in status: the agent session.
    pub id: Option<String>,
    /// Since when the member has been in `phase`.
    pub since: SystemTime,
    /// Replicas set in the member (`.spec.replicas`): what it runs, for the planner. For a
    /// member not reported on, what the previous status wanted there.
    pub spec_replicas: u32,
    /// Ready replicas, `currentReplicas` in status.
    pub ready_replicas: i32,
    /// Unschedulable pods and for how long.
    pub unschedulable: (u32, Duration),
    /// More replicas that fit in the member by the pods' requests; `None` when unbounded.
    pub room: Option<u32>,
    /// Whether the agent can be told anything now (connected and fully reported).
    pub reachable: bool,
    /// Whether `spec_replicas` is unknown to this hub process: no report on the workload
    /// reached it yet, so the count is the previous status' (possibly one a hub wrote
    /// before it stopped, and older than what the member runs).
    pub count_unknown: bool,
    /// Whether the member may run another count than its last report says: it was sent a
    /// desired state it has not acknowledged ([`MemberFacts::unconfirmed`]).
    pub unconfirmed: bool,
    /// A transient command failure to surface while the member stays Ready.
    pub failing: Option<String>,
    /// The controller the member reports as also scaling the workload.
    pub other_controller: Option<String>,
}

fn non_negative(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn kind_name(w: &WorkloadRef) -> String {
    format!("{} {}/{}", w.kind, w.namespace, w.name)
}

/// Whether a failure means the agent cannot act on the workload at all (as opposed to a
/// transient error worth retrying).
fn refuses(failure: &Failure) -> bool {
    failure.retry == Retry::Permanent
        && matches!(
            failure.code,
            FailureCode::NamespaceNotAllowed
                | FailureCode::KindNotAllowed
                | FailureCode::Forbidden
                | FailureCode::Invalid
        )
}

/// Since when a member has been in `phase`: what this process tracked while the phase
/// stays, else the previous status' time for the same phase, else `now`.
pub fn since(
    phase: MemberPhase,
    tracked: Option<(MemberPhase, SystemTime)>,
    previous: Option<&DsoMemberClusterStatus>,
    now: SystemTime,
) -> SystemTime {
    if let Some((p, t)) = tracked {
        return if p == phase { t } else { now };
    }
    match previous {
        Some(p) if p.state.as_deref() == Some(phase.as_str()) => p
            .last_status_change_time
            .as_ref()
            .map_or(now, crate::time::from_time),
        _ => now,
    }
}

/// Describes one member for a DSO. `previous` is the member's entry in the DSO's current
/// status: after a hub restart it says what the member ran and in which phase it was.
pub fn view(
    facts: &MemberFacts,
    previous: Option<&DsoMemberClusterStatus>,
    now: SystemTime,
) -> MemberView {
    let what = kind_name(&facts.workload);
    let previous_phase = previous
        .and_then(|p| p.state.as_deref())
        .and_then(|s| s.parse::<MemberPhase>().ok());
    let report = facts.report.as_ref();
    let existing = report.filter(|r| r.exists && r.failure.is_none());
    let (id, reachable) = match &facts.session {
        Session::Never => (previous.and_then(|p| p.id.clone()), false),
        Session::NotEnrolled => (None, false),
        Session::Connected { id, reported } => {
            (Some(format!("kedge-agent@{}/{id}", facts.name)), *reported)
        }
        Session::Unreachable { id, .. } => {
            (Some(format!("kedge-agent@{}/{id}", facts.name)), false)
        }
    };
    let mut failing = None;
    let mut other_controller = None;
    let (phase, description) = match (&facts.claim, &facts.session) {
        (Claim::Lost(winner), _) => (
            MemberPhase::Conflict,
            format!(
                "{what} is also targeted by DistributedScaledObject {winner}, which came first; this one leaves it alone"
            ),
        ),
        (_, Session::NotEnrolled) => (
            MemberPhase::Pending,
            format!(
                "no MemberCluster {:?} on the hub: enroll it with kubectl kedge mc setup-member {} \
                 (or fix the name in memberClusters)",
                facts.name, facts.name
            ),
        ),
        (_, Session::Never) => match previous_phase {
            None | Some(MemberPhase::Pending) => {
                (MemberPhase::Pending, "agent never connected".to_owned())
            }
            Some(MemberPhase::Unreachable) => (
                MemberPhase::Unreachable,
                "agent not connected since the hub started".to_owned(),
            ),
            Some(_) => (
                MemberPhase::NotReported,
                "agent not reconnected since the hub started; it keeps what it runs".to_owned(),
            ),
        },
        (_, Session::Unreachable { reason, .. }) => (
            MemberPhase::Unreachable,
            if reason.is_empty() {
                "agent unreachable".to_owned()
            } else {
                format!("agent unreachable: {reason}")
            },
        ),
        (
            _,
            Session::Connected {
                reported: false, ..
            },
        ) => (
            MemberPhase::NotReported,
            "agent connected; waiting for its first report before planning".to_owned(),
        ),
        (_, Session::Connected { reported: true, .. }) => match (report, &facts.command_failure) {
            (Some(r), _) if r.failure.as_ref().is_some_and(refuses) => {
                let f = r
                    .failure
                    .as_ref()
                    .map_or_else(String::new, |f| format!("{:?}: {}", f.code, f.message));
                (
                    MemberPhase::Refused,
                    format!("agent cannot act on {what}: {f}"),
                )
            }
            (_, Some(f)) if refuses(f) => (
                MemberPhase::Refused,
                format!("agent refused {what}: {:?}: {}", f.code, f.message),
            ),
            (_, Some(f)) if f.code == FailureCode::NotFound && existing.is_none() => (
                MemberPhase::WorkloadMissing,
                format!("{what} not found in the member; kedge does not create it"),
            ),
            (Some(r), _) if !r.exists => (
                MemberPhase::WorkloadMissing,
                format!("{what} not found in the member; kedge does not create it"),
            ),
            (Some(r), _) if r.conflict.is_some() => {
                let who = r.conflict.clone().unwrap_or_default();
                other_controller = Some(who.clone());
                (
                    MemberPhase::Conflict,
                    format!(
                        "{who} also scales {what} in the member; the agent stopped restoring replicas until it is gone"
                    ),
                )
            }
            (Some(r), failure) if r.failure.is_none() => {
                failing = failure.as_ref().map(|f| {
                    format!(
                        "last command failed ({:?}): {}; retrying",
                        f.code, f.message
                    )
                });
                (
                    MemberPhase::Ready,
                    failing
                        .clone()
                        .unwrap_or_else(|| "Cluster is healthy".to_owned()),
                )
            }
            (Some(r), _) => {
                let f = r
                    .failure
                    .as_ref()
                    .map_or_else(String::new, |f| format!("{:?}: {}", f.code, f.message));
                (
                    MemberPhase::NotReported,
                    format!("agent cannot read {what} right now ({f}); holding"),
                )
            }
            (None, _) => (
                MemberPhase::NotReported,
                format!("waiting for the agent's first report on {what}"),
            ),
        },
    };
    let since = since(phase, facts.tracked, previous, now);
    // What the member runs: its report when the workload is there, else what the previous
    // status wanted there (a member not heard from keeps what it ran).
    let spec_replicas = match existing {
        Some(r) if phase != MemberPhase::WorkloadMissing => non_negative(r.spec_replicas),
        _ => previous.map_or(0, |p| non_negative(p.desired_replicas)),
    };
    let ready_replicas = match report {
        Some(r) if r.exists => r.ready_replicas,
        Some(_) => 0,
        None => previous.map_or(0, |p| p.current_replicas),
    };
    let unschedulable = existing.map_or((0, Duration::ZERO), |r| {
        (
            non_negative(r.unschedulable_pods),
            Duration::from_millis(r.unschedulable_for_ms),
        )
    });
    let room = existing.and_then(|r| {
        facts
            .capacity
            .as_ref()
            .and_then(|c| room_for(c, r.pod_cpu_millis, r.pod_memory_bytes))
    });
    MemberView {
        name: facts.name.clone(),
        phase,
        description,
        id,
        since,
        spec_replicas,
        ready_replicas,
        unschedulable,
        room,
        reachable,
        count_unknown: report.is_none(),
        unconfirmed: facts.unconfirmed,
        failing,
        other_controller,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_targets_are_what_target_finds() {
        let spec: DistributedScaledObjectSpec = serde_yaml::from_str(
            "memberClusters:\n\
             - {name: a, targetNamespace: edge-a}\n\
             - {name: b}\n\
             - {name: a, targetNamespace: shadowed}\n\
             scaledObjectSpec:\n  scaleTargetRef: {name: web}\n  triggers: []\n",
        )
        .unwrap();
        let targets = Targets::new(&spec, "apps");
        for member in ["a", "b", "unlisted"] {
            assert_eq!(
                targets.of(member),
                target(&spec, "apps", member),
                "{member}"
            );
        }
        assert_eq!(targets.of("a").namespace, "edge-a", "the first entry wins");
        assert_eq!(targets.of("b").namespace, "apps");
        assert_eq!(targets.of("b").kind, DEFAULT_TARGET_KIND);
    }
}

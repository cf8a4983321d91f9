//! How one member looks to one DistributedScaledObject: its state for status, the observation
//! the planner decides from, and the workload it should run. Pure: snapshots and times in,
//! values out.

use std::time::{Duration, SystemTime};

use kedge_core::crd::DistributedScaledObject;
use kedge_core::crd::conditions::{STATE_PENDING, STATE_READY, STATE_UNREACHABLE};
use kedge_core::crd::dso::DsoMemberClusterStatus;
use kedge_core::dso::{MemberObservation, MemberState};
use kedge_protocol::{CommandTarget, FailureCode, WorkloadRef};

use crate::fleet::MemberSnapshot;
use crate::registry::SessionState;

/// Member state: connected, but the workload does not exist there.
pub const STATE_WORKLOAD_MISSING: &str = "WorkloadMissing";
/// Member state: connected, but the agent refuses to act on the workload.
pub const STATE_REFUSED: &str = "Refused";

/// Default `scaleTargetRef.apiVersion`.
pub const DEFAULT_TARGET_API_VERSION: &str = "apps/v1";
/// Default `scaleTargetRef.kind`.
pub const DEFAULT_TARGET_KIND: &str = "Deployment";

/// The workload a DSO scales in `member`.
pub fn target(dso: &DistributedScaledObject, namespace: &str, member: &str) -> WorkloadRef {
    let target = &dso.spec.scaled_object_spec.scale_target_ref;
    let namespace = dso
        .spec
        .member_clusters
        .iter()
        .find(|m| m.name == member)
        .and_then(|m| m.target_namespace.clone())
        .unwrap_or_else(|| namespace.to_owned());
    WorkloadRef {
        api_version: target
            .api_version
            .clone()
            .unwrap_or_else(|| DEFAULT_TARGET_API_VERSION.to_owned()),
        kind: target
            .kind
            .clone()
            .unwrap_or_else(|| DEFAULT_TARGET_KIND.to_owned()),
        namespace,
        name: target.name.clone(),
    }
}

/// One member as seen by one DSO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// Member name.
    pub name: String,
    /// `state` in status: Ready, Unreachable, Pending, WorkloadMissing or Refused.
    pub state: &'static str,
    /// `description` in status.
    pub description: String,
    /// `id` in status: the agent session.
    pub id: Option<String>,
    /// Replicas set in the member (`.spec.replicas`), for the planner.
    pub spec_replicas: u32,
    /// Ready replicas, `currentReplicas` in status.
    pub ready_replicas: i32,
    /// Unschedulable pods and for how long.
    pub unschedulable: (u32, Duration),
    /// More replicas that fit in the member by the pods' requests; `None` when unbounded.
    pub room: Option<u32>,
    /// Whether the planner may consider the member at all (false: never seen, nothing known).
    pub known: bool,
    /// Whether the agent is connected, so that it can be told its replicas.
    pub connected: bool,
}

impl MemberView {
    /// Whether the member can run this DSO's replicas now.
    pub fn is_ready(&self) -> bool {
        self.state == STATE_READY
    }

    /// The planner's observation, given since when the member has been in its state.
    pub fn observation(&self, in_state_for: Duration) -> Option<MemberObservation> {
        if !self.known {
            return None;
        }
        let ready = self.is_ready();
        Some(MemberObservation {
            name: self.name.clone(),
            state: if ready {
                MemberState::Ready
            } else {
                MemberState::Unreachable
            },
            unreachable_for: if ready { Duration::ZERO } else { in_state_for },
            current_replicas: self.spec_replicas,
            unschedulable_replicas: self.unschedulable.0,
            unschedulable_for: self.unschedulable.1,
            // What runs there now plus what still fits: the member's limit for tiers and the
            // basis of dynamic weights.
            capacity_replicas: self
                .room
                .map(|room| self.spec_replicas.saturating_add(room)),
        })
    }
}

fn non_negative(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Describes `member` for a DSO whose workload there is `workload`. `previous` is the
/// member's entry in the DSO's current status: it carries what was known before this hub
/// process started (the replicas a member ran when it has not reported yet). While
/// `starting` (the hub started less than a heartbeat deadline ago), a member that has not
/// reconnected yet keeps its previous state: agents need a moment to find the new hub.
pub fn view(
    member: &str,
    snapshot: Option<&MemberSnapshot>,
    workload: &WorkloadRef,
    previous: Option<&DsoMemberClusterStatus>,
    starting: bool,
) -> MemberView {
    let report = snapshot.and_then(|s| s.workloads.get(workload));
    let (spec_replicas, ready_replicas, unschedulable) = match report {
        Some(r) if r.exists => (
            non_negative(r.spec_replicas),
            r.ready_replicas,
            (
                non_negative(r.unschedulable_pods),
                Duration::from_millis(r.unschedulable_for_ms),
            ),
        ),
        Some(_) => (0, 0, (0, Duration::ZERO)),
        // Not reported since the hub started: what the previous status said it ran.
        None => (
            previous.map_or(0, |p| non_negative(p.desired_replicas)),
            previous.map_or(0, |p| p.current_replicas),
            (0, Duration::ZERO),
        ),
    };
    let mut v = MemberView {
        name: member.to_owned(),
        state: STATE_READY,
        description: "Cluster is healthy".to_owned(),
        id: None,
        spec_replicas,
        ready_replicas,
        unschedulable,
        room: report.filter(|r| r.exists).and_then(|r| r.room_replicas),
        known: true,
        connected: false,
    };
    let kind_name = format!("{} {}/{}", workload.kind, workload.namespace, workload.name);
    let session = snapshot.and_then(|s| s.session.as_ref());
    let Some(session) = session else {
        let seen_before = previous.is_some_and(|p| p.state.as_deref() != Some(STATE_PENDING));
        let carried = previous.and_then(|p| {
            [
                STATE_READY,
                STATE_UNREACHABLE,
                STATE_WORKLOAD_MISSING,
                STATE_REFUSED,
            ]
            .into_iter()
            .find(|s| p.state.as_deref() == Some(*s))
        });
        if let (true, Some(state), Some(p)) = (starting, carried, previous) {
            v.state = state;
            v.description = p.description.clone().unwrap_or_default();
            v.id = p.id.clone();
        } else if seen_before {
            v.state = STATE_UNREACHABLE;
            v.description = "agent not connected since the hub started".to_owned();
            v.id = previous.and_then(|p| p.id.clone());
        } else {
            v.state = STATE_PENDING;
            v.description = "agent never connected".to_owned();
            v.known = false;
        }
        return v;
    };
    v.id = Some(format!(
        "kedge-agent@{}/{}",
        session.member, session.session_id
    ));
    if session.state == SessionState::Unreachable {
        v.state = STATE_UNREACHABLE;
        v.description = if session.reason.is_empty() {
            "agent unreachable".to_owned()
        } else {
            format!("agent unreachable: {}", session.reason)
        };
        return v;
    }
    v.connected = true;
    let failure = snapshot.and_then(|s| {
        s.failures.iter().find_map(|(t, f)| match t {
            CommandTarget::Workload(w) if w == workload => Some(f),
            _ => None,
        })
    });
    match failure {
        // A later report that the workload exists wins over an older acknowledgement.
        Some(f) if f.code == FailureCode::NotFound && !report.is_some_and(|r| r.exists) => {
            v.state = STATE_WORKLOAD_MISSING;
            v.description =
                format!("{kind_name} not found in the member; kedge does not create it");
        }
        Some(f)
            if matches!(
                f.code,
                FailureCode::NamespaceNotAllowed | FailureCode::Forbidden | FailureCode::Invalid
            ) =>
        {
            v.state = STATE_REFUSED;
            v.description = format!("agent refused {kind_name}: {:?}: {}", f.code, f.message);
        }
        _ if report.is_some_and(|r| !r.exists) => {
            v.state = STATE_WORKLOAD_MISSING;
            v.description =
                format!("{kind_name} not found in the member; kedge does not create it");
        }
        // Reconnected after a hub restart and not reported on yet: what was true before
        // still is, until the agent says otherwise.
        None if report.is_none() => {
            if let Some(p) = previous
                && let Some(state) = [STATE_WORKLOAD_MISSING, STATE_REFUSED]
                    .into_iter()
                    .find(|s| p.state.as_deref() == Some(*s))
            {
                v.state = state;
                v.description = p.description.clone().unwrap_or_default();
            }
        }
        _ => {}
    }
    if v.state == STATE_WORKLOAD_MISSING || v.state == STATE_REFUSED {
        // Within the grace period the others plan around what this member was meant to
        // run, as for an unreachable member: a workload re-created a moment later causes
        // no churn elsewhere.
        v.spec_replicas = previous.map_or(0, |p| non_negative(p.desired_replicas));
    }
    v
}

/// Since when a member has been in `state`: kept while the state stays, `now` when it changes.
pub fn since(
    state: &str,
    tracked: Option<(&str, SystemTime)>,
    previous: Option<&DsoMemberClusterStatus>,
    now: SystemTime,
) -> SystemTime {
    if let Some((s, t)) = tracked {
        return if s == state { t } else { now };
    }
    // First look since the hub started: trust the status written before.
    match previous {
        Some(p) if p.state.as_deref() == Some(state) => p
            .last_status_change_time
            .as_ref()
            .map_or(now, |t| SystemTime::from(t.0)),
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kedge_protocol::{Failure, Retry, WorkloadStatus};

    use super::*;
    use crate::registry::MemberSession;

    fn workload() -> WorkloadRef {
        WorkloadRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "default".into(),
            name: "nginx".into(),
        }
    }

    fn session(state: SessionState) -> MemberSession {
        MemberSession {
            member: "m1".into(),
            state,
            reason: if state == SessionState::Unreachable {
                "no heartbeat for 3s".into()
            } else {
                String::new()
            },
            session_id: "s-1".into(),
            remote_addr: "127.0.0.1:1".into(),
            agent_version: "0.1.0".into(),
            kubernetes_version: "v1.33.0".into(),
            protocol_version: 1,
            connected_since_unix_ms: 0,
            last_heartbeat_unix_ms: 0,
            cert_not_after_unix: 0,
            sessions: 1,
        }
    }

    fn snapshot(state: SessionState, report: Option<WorkloadStatus>) -> MemberSnapshot {
        let mut workloads = BTreeMap::new();
        if let Some(r) = report {
            workloads.insert(r.workload.clone(), r);
        }
        MemberSnapshot {
            name: "m1".into(),
            session: Some(session(state)),
            workloads,
            capacity: None,
            failures: vec![],
            revision: 1,
            acked_revision: 1,
            last_report: None,
        }
    }

    fn status(exists: bool, spec: i32, ready: i32) -> WorkloadStatus {
        WorkloadStatus {
            workload: workload(),
            exists,
            spec_replicas: spec,
            ready_replicas: ready,
            available_replicas: ready,
            pending_pods: 0,
            unschedulable_pods: 0,
            unschedulable_for_ms: 0,
            room_replicas: None,
        }
    }

    #[test]
    fn connected_member_with_a_report_is_ready_with_its_replicas() {
        let s = snapshot(SessionState::Connected, Some(status(true, 4, 3)));
        let v = view("m1", Some(&s), &workload(), None, false);
        assert_eq!(v.state, STATE_READY);
        assert_eq!((v.spec_replicas, v.ready_replicas), (4, 3));
        let o = v.observation(Duration::from_secs(9)).unwrap();
        assert_eq!(o.state, MemberState::Ready);
        assert_eq!(o.unreachable_for, Duration::ZERO);
        assert_eq!(o.current_replicas, 4);
        assert_eq!(v.id.as_deref(), Some("kedge-agent@m1/s-1"));
    }

    #[test]
    fn a_missing_workload_counts_as_unreachable_for_the_dso() {
        let s = snapshot(SessionState::Connected, Some(status(false, 0, 0)));
        let v = view("m1", Some(&s), &workload(), None, false);
        assert_eq!(v.state, STATE_WORKLOAD_MISSING);
        assert!(v.description.contains("Deployment default/nginx not found"));
        let o = v.observation(Duration::from_secs(2)).unwrap();
        assert_eq!(o.state, MemberState::Unreachable);
        assert_eq!(o.unreachable_for, Duration::from_secs(2));
        assert_eq!(o.current_replicas, 0);
        // It holds the share it was given while the grace period runs.
        let previous = DsoMemberClusterStatus {
            desired_replicas: 3,
            state: Some(STATE_READY.into()),
            ..Default::default()
        };
        let v = view("m1", Some(&s), &workload(), Some(&previous), false);
        assert_eq!(v.observation(Duration::ZERO).unwrap().current_replicas, 3);
        assert_eq!(v.ready_replicas, 0);
    }

    #[test]
    fn a_workload_that_appears_is_ready_despite_the_older_not_found_ack() {
        let mut s = snapshot(SessionState::Connected, Some(status(true, 0, 0)));
        s.failures = vec![(
            CommandTarget::Workload(workload()),
            Failure {
                retry: Retry::Permanent,
                code: FailureCode::NotFound,
                message: "deployments.apps \"nginx\" not found".into(),
            },
        )];
        assert_eq!(
            view("m1", Some(&s), &workload(), None, false).state,
            STATE_READY
        );
        s.workloads.clear();
        assert_eq!(
            view("m1", Some(&s), &workload(), None, false).state,
            STATE_WORKLOAD_MISSING
        );
    }

    #[test]
    fn a_refused_namespace_shows_the_agents_message() {
        let mut s = snapshot(SessionState::Connected, None);
        s.failures = vec![(
            CommandTarget::Workload(workload()),
            Failure {
                retry: Retry::Permanent,
                code: FailureCode::NamespaceNotAllowed,
                message: "namespace default is not managed by this agent".into(),
            },
        )];
        let v = view("m1", Some(&s), &workload(), None, false);
        assert_eq!(v.state, STATE_REFUSED);
        assert!(v.description.contains("NamespaceNotAllowed"), "{v:?}");
        assert!(v.description.contains("not managed"), "{v:?}");
    }

    #[test]
    fn unreachable_and_unknown_members() {
        let s = snapshot(SessionState::Unreachable, Some(status(true, 4, 4)));
        let v = view("m1", Some(&s), &workload(), None, false);
        assert_eq!(v.state, STATE_UNREACHABLE);
        assert!(v.description.contains("no heartbeat"));
        assert_eq!(v.observation(Duration::ZERO).unwrap().current_replicas, 4);

        let never = view("m1", None, &workload(), None, false);
        assert_eq!(never.state, STATE_PENDING);
        assert!(never.observation(Duration::ZERO).is_none());

        // After a hub restart: the previous status tells what the member ran.
        let previous = DsoMemberClusterStatus {
            current_replicas: 3,
            desired_replicas: 4,
            state: Some(STATE_READY.into()),
            ..Default::default()
        };
        let v = view("m1", None, &workload(), Some(&previous), false);
        assert_eq!(v.state, STATE_UNREACHABLE);
        assert_eq!((v.spec_replicas, v.ready_replicas), (4, 3));
        assert!(!v.connected);
        // Right after the hub started, it keeps its previous state until its agent is back.
        let v = view("m1", None, &workload(), Some(&previous), true);
        assert_eq!(v.state, STATE_READY);
        assert!(v.is_ready() && !v.connected);
        assert_eq!(v.observation(Duration::ZERO).unwrap().current_replicas, 4);
    }

    #[test]
    fn a_missing_workload_stays_missing_across_a_hub_restart_until_reported() {
        let previous = DsoMemberClusterStatus {
            state: Some(STATE_WORKLOAD_MISSING.into()),
            description: Some("Deployment default/nginx not found".into()),
            ..Default::default()
        };
        let s = snapshot(SessionState::Connected, None);
        let v = view("m1", Some(&s), &workload(), Some(&previous), false);
        assert_eq!(v.state, STATE_WORKLOAD_MISSING);
        assert!(v.connected, "it is told its replicas, so that it reports");
        let s = snapshot(SessionState::Connected, Some(status(true, 2, 2)));
        let v = view("m1", Some(&s), &workload(), Some(&previous), false);
        assert_eq!(v.state, STATE_READY, "the report wins");
    }

    #[test]
    fn since_keeps_the_time_while_the_state_stays() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let now = t0 + Duration::from_secs(5);
        assert_eq!(since("Ready", Some(("Ready", t0)), None, now), t0);
        assert_eq!(since("Unreachable", Some(("Ready", t0)), None, now), now);
        let previous = DsoMemberClusterStatus {
            state: Some("Unreachable".into()),
            last_status_change_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1000).unwrap(),
            )),
            ..Default::default()
        };
        assert_eq!(since("Unreachable", None, Some(&previous), now), t0);
        assert_eq!(since("Ready", None, Some(&previous), now), now);
    }

    #[test]
    fn target_namespace_and_kind_defaults() {
        let dso: DistributedScaledObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": "nginx", "namespace": "web"},
            "spec": {
                "memberClusters": [{"name": "a", "targetNamespace": "edge"}, {"name": "b"}],
                "scaledObjectSpec": {"scaleTargetRef": {"name": "nginx"}}
            }
        }))
        .unwrap();
        let a = target(&dso, "web", "a");
        assert_eq!(
            (
                a.api_version.as_str(),
                a.kind.as_str(),
                a.namespace.as_str()
            ),
            ("apps/v1", "Deployment", "edge")
        );
        assert_eq!(target(&dso, "web", "b").namespace, "web");
    }
}

//! Translates what the [`Fleet`](crate::fleet::Fleet) knows of a member (its session, reports
//! and acknowledgements) and what the other DSOs claim into the [`MemberFacts`] that
//! `kedge_core::dso::outcome` decides from. No rule lives here: only translation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use kedge_core::crd::DistributedScaledObject;
use kedge_core::dso::member::{
    Claim, MemberFacts, MemberPhase, Session, Targets, claim, members_of,
};
use kedge_protocol::{CommandTarget, WorkloadRef};
use kube::ResourceExt;

use crate::fleet::MemberSnapshot;
use crate::registry::SessionState;

/// The facts of one member for one DSO whose workload there is `workload`.
pub fn facts(
    member: &str,
    workload: WorkloadRef,
    snapshot: Option<&MemberSnapshot>,
    claim: Claim,
    tracked: Option<(MemberPhase, SystemTime)>,
) -> MemberFacts {
    let session = match snapshot.and_then(|s| s.session.as_ref()) {
        None => Session::Never,
        Some(s) if s.state == SessionState::Unreachable => Session::Unreachable {
            id: s.session_id.clone(),
            reason: s.reason.clone(),
        },
        Some(s) => Session::Connected {
            id: s.session_id.clone(),
            reported: snapshot.is_some_and(|s| s.session_reported),
        },
    };
    let report = snapshot.and_then(|s| s.workloads.get(&workload)).cloned();
    let command_failure = snapshot.and_then(|s| {
        s.failures.iter().find_map(|(t, f)| match t {
            CommandTarget::Workload(w) if *w == workload => Some(f.clone()),
            _ => None,
        })
    });
    MemberFacts {
        name: member.to_owned(),
        workload,
        session,
        report,
        command_failure,
        capacity: snapshot.and_then(|s| s.capacity),
        claim,
        tracked,
    }
}

/// Who may scale each of `dso`'s workloads, given every DSO in the hub cluster: the oldest
/// DSO targeting the same workload in the same member wins (see
/// `kedge_core::dso::member::claim`).
pub fn claims(
    dso: &DistributedScaledObject,
    names: &BTreeSet<String>,
    registered: &BTreeSet<String>,
    connected: &BTreeSet<String>,
    all: &[std::sync::Arc<DistributedScaledObject>],
) -> BTreeMap<String, Claim> {
    let key = |d: &DistributedScaledObject| {
        (
            d.creation_timestamp()
                .map_or(SystemTime::UNIX_EPOCH, |t| kedge_core::time::from_time(&t)),
            format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any()),
        )
    };
    let me = key(dso);
    let namespace = dso.namespace().unwrap_or_default();
    let namespaces: Vec<String> = all
        .iter()
        .map(|o| o.namespace().unwrap_or_default())
        .collect();
    // Each DSO's targets indexed once: claims are computed for every member of the DSO.
    let others: Vec<_> = all
        .iter()
        .zip(&namespaces)
        .filter(|(o, _)| o.metadata.deletion_timestamp.is_none() && key(o) != me)
        .map(|(o, ns)| {
            (
                key(o),
                members_of(&o.spec, registered, connected),
                Targets::new(&o.spec, ns),
            )
        })
        .collect();
    // Alone on its workloads (the common case): nothing to compare, member by member.
    if others.is_empty() {
        return names.iter().map(|m| (m.clone(), Claim::Sole)).collect();
    }
    let mine = Targets::new(&dso.spec, &namespace);
    names
        .iter()
        .map(|member| {
            let mine = mine.of(member);
            let mut contenders = vec![me.clone()];
            contenders.extend(
                others
                    .iter()
                    .filter(|(_, members, targets)| {
                        members.contains(member) && targets.of(member) == mine
                    })
                    .map(|(k, ..)| k.clone()),
            );
            (member.clone(), claim(&me, &contenders))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn dso(
        name: &str,
        created: &str,
        members: &[&str],
        target_ns: Option<&str>,
    ) -> DistributedScaledObject {
        let members: Vec<serde_json::Value> = members
            .iter()
            .map(|m| serde_json::json!({"name": m, "targetNamespace": target_ns}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
            "spec": {"memberClusters": members,
                "scaledObjectSpec": {"scaleTargetRef": {"name": "web"}}}
        }))
        .unwrap()
    }

    #[test]
    fn the_older_dso_wins_a_shared_workload_in_shared_members_only() {
        let first = Arc::new(dso("first", "2026-01-01T00:00:00Z", &["a", "b"], None));
        let second = Arc::new(dso("second", "2026-01-02T00:00:00Z", &["b", "c"], None));
        let elsewhere = Arc::new(dso("third", "2025-01-01T00:00:00Z", &["b"], Some("other")));
        let all = vec![first.clone(), second.clone(), elsewhere];
        let none = BTreeSet::new();
        let names: BTreeSet<String> = ["b".to_owned(), "c".to_owned()].into();
        let c = claims(&second, &names, &none, &none, &all);
        assert_eq!(c["b"], Claim::Lost("default/first".into()));
        assert_eq!(c["c"], Claim::Sole);
        let names: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let c = claims(&first, &names, &none, &none, &all);
        assert_eq!(c["a"], Claim::Sole);
        assert_eq!(c["b"], Claim::Won(vec!["default/second".into()]));
    }
}

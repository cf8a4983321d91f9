//! Translates what the [`Fleet`](crate::fleet::Fleet) knows of a member (its session, reports
//! and acknowledgements) and what the other DSOs claim into the [`MemberFacts`] that
//! `kedge_core::dso::outcome` decides from. No rule lives here: only translation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use kedge_core::crd::DistributedScaledObject;
use kedge_core::crd::member::NamespaceMapping;
use kedge_core::dso::member::{
    Claim, MemberFacts, MemberPhase, Session, Targets, claim, members_of,
};
use kedge_core::{tenancy, validate};
use kedge_protocol::{CommandTarget, WorkloadRef};
use kube::ResourceExt;

use crate::fleet::MemberSnapshot;
use crate::registry::SessionState;

/// The facts of one member for one DSO whose workload there is `workload`; `missing`: the
/// member has no MemberCluster.
pub fn facts(
    member: &str,
    workload: WorkloadRef,
    snapshot: Option<&MemberSnapshot>,
    missing: bool,
    claim: Claim,
    tracked: Option<(MemberPhase, SystemTime)>,
) -> MemberFacts {
    let session = match snapshot.and_then(|s| s.session.as_ref()) {
        None if missing => Session::NotEnrolled,
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
    let unconfirmed = unconfirmed(snapshot, &workload);
    MemberFacts {
        name: member.to_owned(),
        workload,
        session,
        report,
        command_failure,
        capacity: snapshot.and_then(|s| s.capacity),
        claim,
        tracked,
        unconfirmed,
    }
}

/// Whether the member was sent a count for `workload` other than the one it reported last,
/// in a desired state it never acknowledged: it runs one or the other. (A state it was never
/// sent, or one that tells it what it reports, leaves no doubt.)
fn unconfirmed(snapshot: Option<&MemberSnapshot>, workload: &WorkloadRef) -> bool {
    let Some(s) = snapshot else {
        return false;
    };
    let Some(sent) = s
        .released
        .as_ref()
        .filter(|r| r.revision > s.acked_revision)
    else {
        return false;
    };
    let told = sent
        .workloads
        .iter()
        .find(|w| &w.workload == workload)
        .and_then(|w| w.replicas);
    let reported = s.workloads.get(workload).map(|r| r.spec_replicas);
    told.is_some_and(|told| Some(told) != reported)
}

/// Member → the namespace grants of its MemberCluster, read only when a claim needs them.
pub type Grants<'a> = &'a dyn Fn() -> BTreeMap<String, Vec<NamespaceMapping>>;

/// Whether DSO `o` may hold claims at all: its spec is valid and it places workloads only in
/// namespaces its own namespace was granted (`members`: its members, `targets`: its
/// workloads there). A DSO refused as a whole scales nothing, so it blocks no one.
fn admitted(
    o: &DistributedScaledObject,
    namespace: &str,
    members: &BTreeSet<String>,
    targets: &Targets<'_>,
    grants: &BTreeMap<String, Vec<NamespaceMapping>>,
) -> bool {
    if validate::dso(&o.spec, o.annotations()).is_err() {
        return false;
    }
    let placements: Vec<(&str, String)> = members
        .iter()
        .map(|m| (m.as_str(), targets.of(m).namespace))
        .collect();
    tenancy::refusals(
        namespace,
        placements.iter().map(|(m, n)| (*m, n.as_str())),
        grants,
    )
    .is_empty()
}

/// Who may scale each of `dso`'s workloads, given every DSO in the hub cluster: the oldest
/// admitted DSO targeting the same workload in the same member wins (see
/// `kedge_core::dso::member::claim`); invalid DSOs and DSOs refused by namespace policy hold
/// no claim.
pub fn claims(
    dso: &DistributedScaledObject,
    names: &BTreeSet<String>,
    registered: &BTreeSet<String>,
    connected: &BTreeSet<String>,
    all: &[std::sync::Arc<DistributedScaledObject>],
    grants_of: Grants<'_>,
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
                o,
                ns,
                key(o),
                members_of(&o.spec, registered, connected),
                Targets::new(&o.spec, ns),
            )
        })
        .collect();
    let grants = std::cell::OnceCell::new();
    let admitted_cache: Vec<std::cell::OnceCell<bool>> =
        others.iter().map(|_| std::cell::OnceCell::new()).collect();
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
                    .zip(&admitted_cache)
                    .filter(|((o, ns, _, members, targets), admitted_cache)| {
                        members.contains(member)
                            && targets.of(member) == mine
                            && *admitted_cache.get_or_init(|| {
                                admitted(o, ns, members, targets, grants.get_or_init(grants_of))
                            })
                    })
                    .map(|((_, _, k, ..), _)| k.clone()),
            );
            (member.clone(), claim(&me, &contenders))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fleet::testing::workload;

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
        let c = claims(&second, &names, &none, &none, &all, &BTreeMap::new);
        assert_eq!(c["b"], Claim::Lost("default/first".into()));
        assert_eq!(c["c"], Claim::Sole);
        let names: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let c = claims(&first, &names, &none, &none, &all, &BTreeMap::new);
        assert_eq!(c["a"], Claim::Sole);
        assert_eq!(c["b"], Claim::Won(vec!["default/second".into()]));
    }

    /// A member that reported `reported` replicas of `web` (`None`: nothing), was sent
    /// `sent` for it at revision 2 (`Some(None)`: held; `None`: nothing sent), and
    /// acknowledged revision `acked`.
    fn member(reported: Option<i32>, sent: Option<Option<i32>>, acked: u64) -> MemberSnapshot {
        use kedge_protocol::{DesiredState, WorkloadReplicas, WorkloadStatus};
        MemberSnapshot {
            name: "a".into(),
            session: None,
            session_reported: true,
            workloads: reported
                .map(|n| WorkloadStatus {
                    exists: true,
                    spec_replicas: n,
                    ..WorkloadStatus::absent(workload("web"))
                })
                .into_iter()
                .collect(),
            capacity: None,
            failures: Vec::new(),
            revision: 2,
            acked_revision: acked,
            released: sent.map(|replicas| {
                Arc::new(DesiredState {
                    revision: 2,
                    workloads: vec![WorkloadReplicas {
                        workload: workload("web"),
                        replicas,
                        owner: "default/web".into(),
                    }],
                    ..Default::default()
                })
            }),
            last_report: None,
        }
    }

    #[test]
    fn a_count_sent_and_not_acknowledged_is_unconfirmed_when_it_is_not_the_reported_one() {
        let web = workload("web");
        for (case, snapshot, want) in [
            ("nothing sent", member(Some(3), None, 0), false),
            (
                "sent 5, acknowledged",
                member(Some(3), Some(Some(5)), 2),
                false,
            ),
            (
                "sent 5, acknowledged later",
                member(Some(3), Some(Some(5)), 3),
                false,
            ),
            (
                "sent 5, not acknowledged, reports 3",
                member(Some(3), Some(Some(5)), 1),
                true,
            ),
            (
                "sent 3, not acknowledged, reports 3",
                member(Some(3), Some(Some(3)), 1),
                false,
            ),
            (
                "held, not acknowledged",
                member(Some(3), Some(None), 1),
                false,
            ),
            (
                "sent 5, not acknowledged, no report",
                member(None, Some(Some(5)), 1),
                true,
            ),
        ] {
            assert_eq!(unconfirmed(Some(&snapshot), &web), want, "{case}");
        }
        assert!(
            !unconfirmed(None, &web),
            "a member the hub knows nothing of"
        );
        // What it was sent for another workload says nothing about this one.
        let sent_web = member(Some(3), Some(Some(5)), 1);
        assert!(!unconfirmed(Some(&sent_web), &workload("api")));
    }

    fn in_namespace(mut d: DistributedScaledObject, namespace: &str) -> DistributedScaledObject {
        d.metadata.namespace = Some(namespace.to_owned());
        d
    }

    #[test]
    fn a_refused_or_invalid_dso_holds_no_claim() {
        // Older, but in namespace `team-b` placing into `default` without a grant.
        let refused = Arc::new(in_namespace(
            dso("refused", "2025-01-01T00:00:00Z", &["b"], Some("default")),
            "team-b",
        ));
        let mut invalid = dso("invalid", "2025-01-02T00:00:00Z", &["b"], None);
        invalid.spec.scaled_object_spec.polling_interval = Some(-5);
        let invalid = Arc::new(invalid);
        let allowed = Arc::new(dso("allowed", "2026-01-01T00:00:00Z", &["b"], None));
        let all = vec![refused.clone(), invalid.clone(), allowed.clone()];
        let none = BTreeSet::new();
        let names: BTreeSet<String> = ["b".to_owned()].into();
        let c = claims(&allowed, &names, &none, &none, &all, &BTreeMap::new);
        assert_eq!(c["b"], Claim::Sole);
        // Granted, the older DSO wins again, and says who it wins against.
        let granted = || {
            BTreeMap::from([(
                "b".to_owned(),
                vec![NamespaceMapping {
                    hub_namespace: "team-b".into(),
                    member_namespaces: vec!["default".into()],
                }],
            )])
        };
        let c = claims(&allowed, &names, &none, &none, &all, &granted);
        assert_eq!(c["b"], Claim::Lost("team-b/refused".into()));
    }
}

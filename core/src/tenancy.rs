//! Tenancy on the hub: where a DistributedScaledObject may place workloads.
//!
//! A hub namespace is a tenant boundary. A DSO places its workload in each member in the
//! member namespace named like its own, unless that member's `MemberCluster` grants its hub
//! namespace another one in `spec.namespaceMappings`. Anything else — `targetNamespace:
//! kube-system` from a tenant's namespace — is refused before any command is sent, so a
//! tenant who may write DSOs in one namespace cannot scale another team's (or the system's)
//! workloads in a member.

use std::collections::BTreeMap;

use crate::crd::member::NamespaceMapping;

/// Whether objects in `hub_namespace` may place workloads in `member_namespace` of a member
/// whose `MemberCluster` grants `mappings` (`None`: no `MemberCluster` known).
pub fn allowed(
    hub_namespace: &str,
    member_namespace: &str,
    mappings: Option<&[NamespaceMapping]>,
) -> bool {
    member_namespace == hub_namespace
        || mappings.into_iter().flatten().any(|m| {
            m.hub_namespace == hub_namespace
                && m.member_namespaces.iter().any(|n| n == member_namespace)
        })
}

/// The placements of `placements` (member → member namespace) that objects in
/// `hub_namespace` may not make, each with the message that says why and how to grant it.
/// `grants` holds the `spec.namespaceMappings` of every known `MemberCluster`.
pub fn refusals<'a>(
    hub_namespace: &str,
    placements: impl IntoIterator<Item = (&'a str, &'a str)>,
    grants: &BTreeMap<String, Vec<NamespaceMapping>>,
) -> BTreeMap<String, String> {
    placements
        .into_iter()
        .filter(|(member, namespace)| {
            !allowed(
                hub_namespace,
                namespace,
                grants.get(*member).map(Vec::as_slice),
            )
        })
        .map(|(member, namespace)| {
            (
                member.to_owned(),
                format!(
                    "member {member:?}: targetNamespace {namespace:?} is not allowed for objects \
                     in namespace {hub_namespace:?}; a member admin can grant it in MemberCluster \
                     {member} spec.namespaceMappings (hubNamespace: {hub_namespace}, \
                     memberNamespaces: [{namespace}])"
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(hub: &str, members: &[&str]) -> NamespaceMapping {
        NamespaceMapping {
            hub_namespace: hub.into(),
            member_namespaces: members.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn own_namespace_is_always_allowed_anything_else_only_when_granted() {
        assert!(allowed("apps", "apps", None));
        assert!(!allowed("apps", "kube-system", None));
        assert!(!allowed("apps", "kube-system", Some(&[])));
        let grants = [
            grant("apps", &["apps-edge"]),
            grant("ops", &["kube-system"]),
        ];
        assert!(allowed("apps", "apps-edge", Some(&grants)));
        // A grant is for one hub namespace: ops's grant does not extend to apps.
        assert!(!allowed("apps", "kube-system", Some(&grants)));
        assert!(allowed("ops", "kube-system", Some(&grants)));
        assert!(!allowed("ops", "apps-edge", Some(&grants)));
    }

    #[test]
    fn refusals_name_the_member_the_namespace_and_the_grant_to_write() {
        let grants = BTreeMap::from([("m2".to_owned(), vec![grant("apps", &["edge"])])]);
        let refused = refusals(
            "apps",
            [("m1", "apps"), ("m2", "edge"), ("m3", "kube-system")],
            &grants,
        );
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["m3"]);
        let message = &refused["m3"];
        assert!(message.contains("\"kube-system\""), "{message}");
        assert!(message.contains("MemberCluster m3"), "{message}");
        assert!(message.contains("hubNamespace: apps"), "{message}");
    }
}

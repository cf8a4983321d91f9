//! `ClusterProfile` (`multicluster.x-k8s.io/v1alpha1`): SIG-Multicluster's cluster-inventory
//! API (kubernetes-sigs/cluster-inventory-api, `apis/v1alpha1/clusterprofile_types.go`),
//! which OCM, GKE Fleet and KubeFleet publish and Headlamp, Argo CD, MultiKueue and
//! multicluster-runtime read. The hub publishes one per MemberCluster ([`profile`]); the
//! field names, list types and bounds follow upstream, so that an upstream CRD already in the
//! hub cluster accepts what the hub writes, and this CRD accepts what others write.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::MemberPhase;
use super::dsj::TaintRecord;
use super::member::MemberCluster;

/// API group of `ClusterProfile`.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// API version of `ClusterProfile`.
pub const VERSION: &str = "v1alpha1";
/// Label naming the cluster manager of a ClusterProfile (upstream `LabelClusterManagerKey`);
/// its value is `spec.clusterManager.name`.
pub const LABEL_CLUSTER_MANAGER: &str = "x-k8s.io/cluster-manager";
/// kedge's name as a cluster manager: the label value and `spec.clusterManager.name`.
pub const CLUSTER_MANAGER: &str = "kedge";

/// Condition (upstream `ClusterConditionControlPlaneHealthy`): `True` while the member's
/// agent holds a live session (it reaches its API server and reports), `False` when the hub
/// lost it, `Unknown` before it ever connected. kedge cannot tell a dead control plane from
/// a cut link: both are `False`.
pub const CONDITION_CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";
/// Condition: the member's agent has connected to the hub at least once. Upstream names no
/// such type (OCM's is `ManagedClusterJoined`); readers that want it filter on it.
pub const CONDITION_JOINED: &str = "Joined";
/// Reason: the agent's session is live.
pub const REASON_AGENT_CONNECTED: &str = "AgentConnected";
/// Reason: the agent's session was lost (or has not come back since the hub started).
pub const REASON_AGENT_UNREACHABLE: &str = "AgentUnreachable";
/// Reason: the agent has never connected.
pub const REASON_AGENT_NEVER_CONNECTED: &str = "AgentNeverConnected";

/// Property: `spec.clusterManager.name` again, for readers that look at properties only.
pub const PROPERTY_CLUSTER_MANAGER: &str = "kedge.dev/cluster-manager";
/// Property: the version of the member's agent.
pub const PROPERTY_AGENT_VERSION: &str = "kedge.dev/agent-version";
/// Property: the namespaces the agent serves (`MemberCluster` `spec.namespaces`),
/// comma-separated; absent when it serves all it was installed for without a list.
pub const PROPERTY_NAMESPACES: &str = "kedge.dev/namespaces";
/// Property: the DistributedScaledJob taints on this member in force now,
/// `NAMESPACE/DSJ:hard|soft until RFC3339` (a class-scoped taint as
/// `NAMESPACE/DSJ[CLASS>=SIZE]:…`), comma-separated; absent without one.
pub const PROPERTY_TAINTS: &str = "kedge.dev/taints";
/// Upstream bound of a property value.
pub const PROPERTY_VALUE_MAX: usize = 1024;

/// Spec of a [`ClusterProfile`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    doc = "ClusterProfile represents a single cluster in a multi-cluster deployment.",
    version = "v1alpha1",
    kind = "ClusterProfile",
    plural = "clusterprofiles",
    namespaced,
    status = "ClusterProfileStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileSpec {
    /// DisplayName defines a human-readable name of the ClusterProfile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    /// ClusterManager defines which cluster manager owns this ClusterProfile resource.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "ClusterManager is immutable"}]))]
    pub cluster_manager: ClusterManager,
}

/// The cluster manager owning a ClusterProfile; immutable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterManager {
    /// Name defines the name of the cluster manager.
    pub name: String,
}

/// Status of a [`ClusterProfile`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// Conditions contains the different condition statuses for this cluster.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Version defines the version information of the cluster.
    #[serde(default, skip_serializing_if = "ClusterVersion::is_empty")]
    pub version: ClusterVersion,
    /// Properties defines cluster characteristics through a list of Property objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub properties: Vec<Property>,
    /// Deprecated upstream in favour of `accessProviders`. kedge never writes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub credential_providers: Vec<AccessProvider>,
    /// AccessProviders is a list of cluster access providers that can provide access
    /// information for clusters. kedge publishes none, ever: it never exposes a member's
    /// API server (agents dial out to the hub; nothing dials into a member), so there is
    /// no address or credential to hand to a reader. Other cluster managers may fill it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub access_providers: Vec<AccessProvider>,
}

/// Version information of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterVersion {
    /// Kubernetes is the kubernetes version of the cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes: String,
}

impl ClusterVersion {
    fn is_empty(&self) -> bool {
        self.kubernetes.is_empty()
    }
}

/// A name/value property of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Property {
    /// Name is the name of a property resource on cluster.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Value is a property-dependent string.
    #[schemars(length(min = 1, max = 1024))]
    pub value: String,
    /// LastObservedTime is the last time the property was observed on the corresponding
    /// cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<Time>,
}

/// How to reach a cluster (upstream `AccessProvider`, a clientcmd `Cluster` per provider).
/// Modelled only so that this CRD keeps what other cluster managers write.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AccessProvider {
    /// Name of the provider (e.g. `kubeconfig`, `oidc`).
    pub name: String,
    /// Connection details of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<KubeconfigCluster>,
}

/// clientcmd's `Cluster` (`k8s.io/client-go/tools/clientcmd/api/v1`), as upstream embeds it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct KubeconfigCluster {
    /// Address of the kubernetes cluster (https://hostname:port).
    pub server: String,
    /// Name used to check the server certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// Skips the validity check of the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
    /// Path to a cert file for the certificate authority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    /// PEM-encoded certificate authority certificates (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "byte"))]
    pub certificate_authority_data: Option<String>,
    /// Proxy URL for requests to this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    /// Disables response compression for requests to this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_compression: Option<bool>,
    /// Additional information for extenders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<NamedExtension>,
}

/// A named clientcmd extension.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NamedExtension {
    /// Nickname of the extension.
    pub name: String,
    /// The extension's own object.
    #[schemars(extend("type" = "object", "x-kubernetes-preserve-unknown-fields" = true))]
    pub extension: serde_json::Value,
}

/// A DSJ taint on a member, with the DSJ that set it (`NAMESPACE/NAME`).
#[derive(Clone, Debug, PartialEq)]
pub struct MemberTaint {
    /// `NAMESPACE/NAME` of the DSJ.
    pub dsj: String,
    /// The taint as the DSJ's status records it.
    pub taint: TaintRecord,
}

/// The ClusterProfile kedge publishes for `member` in `namespace` at `now`: named like the
/// member, labelled and owned by [`CLUSTER_MANAGER`]. `taints` are the DSJ taints on this
/// member (those no longer in force are left out); `previous` is what was published before,
/// whose condition transition times and property observation times are kept while their
/// values stay.
pub fn profile(
    member: &MemberCluster,
    namespace: &str,
    taints: &[MemberTaint],
    previous: Option<&ClusterProfileStatus>,
    now: SystemTime,
) -> ClusterProfile {
    let name = member.metadata.name.clone().unwrap_or_default();
    let status = member.status.as_ref();
    let phase = status
        .and_then(|s| s.state.as_deref())
        .and_then(|s| s.parse::<MemberPhase>().ok())
        .unwrap_or(MemberPhase::Pending);
    let old = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let mut values = vec![(PROPERTY_CLUSTER_MANAGER, CLUSTER_MANAGER.to_owned())];
    if let Some(agent) = status.and_then(|s| s.agent_version.clone()) {
        values.push((PROPERTY_AGENT_VERSION, agent));
    }
    values.push((PROPERTY_NAMESPACES, member.spec.namespaces.join(",")));
    values.push((PROPERTY_TAINTS, taints_value(taints, now)));
    let old_properties = previous
        .map(|p| p.properties.as_slice())
        .unwrap_or_default();
    ClusterProfile {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some([(LABEL_CLUSTER_MANAGER.to_owned(), CLUSTER_MANAGER.to_owned())].into()),
            ..Default::default()
        },
        spec: ClusterProfileSpec {
            display_name: name,
            cluster_manager: ClusterManager {
                name: CLUSTER_MANAGER.to_owned(),
            },
        },
        status: Some(ClusterProfileStatus {
            conditions: conditions(phase, old, now),
            version: ClusterVersion {
                kubernetes: status
                    .and_then(|s| s.kubernetes_version.clone())
                    .unwrap_or_default(),
            },
            properties: properties(values, old_properties, now),
            ..Default::default()
        }),
    }
}

/// `ControlPlaneHealthy` and `Joined` of a member in `phase` (a MemberCluster's state is
/// `Ready`, `Unreachable` or `Pending`; anything else counts as never connected).
fn conditions(phase: MemberPhase, old: &[Condition], now: SystemTime) -> Vec<Condition> {
    let (healthy, reason, message) = match phase {
        MemberPhase::Ready => (
            "True",
            REASON_AGENT_CONNECTED,
            "the member's agent holds a live session with the hub",
        ),
        MemberPhase::Unreachable => (
            "False",
            REASON_AGENT_UNREACHABLE,
            "the hub lost the member's agent session (control plane or link down)",
        ),
        _ => (
            "Unknown",
            REASON_AGENT_NEVER_CONNECTED,
            "the member's agent has never connected",
        ),
    };
    let (joined, joined_reason, joined_message) =
        if matches!(phase, MemberPhase::Ready | MemberPhase::Unreachable) {
            (
                "True",
                REASON_AGENT_CONNECTED,
                "the member's agent has connected to the hub",
            )
        } else {
            (
                "False",
                REASON_AGENT_NEVER_CONNECTED,
                "the member's agent has never connected",
            )
        };
    vec![
        condition(
            old,
            CONDITION_CONTROL_PLANE_HEALTHY,
            healthy,
            reason,
            message,
            now,
        ),
        condition(
            old,
            CONDITION_JOINED,
            joined,
            joined_reason,
            joined_message,
            now,
        ),
    ]
}

/// The properties of `values` that have one (upstream requires a value), each cut to the
/// upstream bound; observed at `now` unless `old` had the same value.
fn properties(values: Vec<(&str, String)>, old: &[Property], now: SystemTime) -> Vec<Property> {
    values
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| {
            let value = bounded_value(value);
            let observed = old
                .iter()
                .find(|p| p.name == name && p.value == value)
                .and_then(|p| p.last_observed_time.clone())
                .unwrap_or_else(|| crate::time::to_time(now));
            Property {
                name: name.to_owned(),
                value,
                last_observed_time: Some(observed),
            }
        })
        .collect()
}

/// A condition whose transition time is kept from `previous` while its status stays.
fn condition(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: SystemTime,
) -> Condition {
    super::conditions::condition_of(
        previous,
        type_,
        status,
        reason,
        message.to_owned(),
        None,
        now,
    )
}

/// The [`PROPERTY_TAINTS`] value: the taints in force at `now`, sorted, comma-separated.
fn taints_value(taints: &[MemberTaint], now: SystemTime) -> String {
    let in_force = |until: &Option<Time>| {
        until
            .as_ref()
            .filter(|t| crate::time::from_time(t) > now)
            .map(|t| t.0.to_string())
    };
    let mut entries: Vec<String> = taints
        .iter()
        .filter_map(|t| {
            let (kind, until) = match in_force(&t.taint.hard_until) {
                Some(until) => ("hard", until),
                None => ("soft", in_force(&t.taint.soft_until)?),
            };
            let scope = match (&t.taint.class, t.taint.size) {
                (Some(class), Some(size)) => format!("[{class}>={size}]"),
                (Some(class), None) => format!("[{class}]"),
                _ => String::new(),
            };
            Some(format!("{}{scope}:{kind} until {until}", t.dsj))
        })
        .collect();
    entries.sort();
    entries.dedup();
    entries.join(",")
}

/// `value` cut to [`PROPERTY_VALUE_MAX`] bytes at a comma (a list), or at a character,
/// ending in `…` when cut.
fn bounded_value(value: String) -> String {
    if value.len() <= PROPERTY_VALUE_MAX {
        return value;
    }
    let room = PROPERTY_VALUE_MAX - '…'.len_utf8();
    let mut end = room;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let cut = value[..end].rfind(',').map_or(end, |comma| comma + 1);
    format!("{}…", &value[..cut])
}

/// Whether publishing `wanted` changes anything a reader sees in `current`: labels, spec,
/// version, properties (names and values) and conditions (type, status, reason, message).
/// Observation and transition times alone are not worth a write.
pub fn differs(current: Option<&ClusterProfile>, wanted: &ClusterProfile) -> bool {
    let Some(current) = current else {
        return true;
    };
    let manager = |p: &ClusterProfile| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_CLUSTER_MANAGER).cloned())
    };
    let status_key = |p: &ClusterProfile| {
        let s = p.status.clone().unwrap_or_default();
        let conditions: Vec<_> = s
            .conditions
            .into_iter()
            .map(|c| (c.type_, c.status, c.reason, c.message))
            .collect();
        let properties: Vec<_> = s
            .properties
            .into_iter()
            .map(|p| (p.name, p.value))
            .collect();
        (conditions, s.version, properties)
    };
    manager(current) != manager(wanted)
        || current.spec != wanted.spec
        || status_key(current) != status_key(wanted)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::crd::{MemberClusterSpec, MemberClusterStatus};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn member(state: Option<&str>) -> MemberCluster {
        let mut m = MemberCluster::new(
            "edge-1",
            MemberClusterSpec {
                namespaces: vec!["shop".into(), "batch".into()],
                ..Default::default()
            },
        );
        m.status = state.map(|state| MemberClusterStatus {
            state: Some(state.to_owned()),
            agent_version: Some("0.9.0".into()),
            kubernetes_version: Some("v1.33.1".into()),
            address: Some("203.0.113.7:40001".into()),
            ..Default::default()
        });
        m
    }

    fn cond<'a>(p: &'a ClusterProfile, type_: &str) -> &'a Condition {
        let status = p.status.as_ref().expect("a status");
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn property<'a>(p: &'a ClusterProfile, name: &str) -> Option<&'a str> {
        let status = p.status.as_ref().expect("a status");
        status
            .properties
            .iter()
            .find(|x| x.name == name)
            .map(|x| x.value.as_str())
    }

    #[test]
    fn member_states_map_to_the_upstream_conditions() {
        let table = [
            (Some("Ready"), "True", REASON_AGENT_CONNECTED, "True"),
            (
                Some("Unreachable"),
                "False",
                REASON_AGENT_UNREACHABLE,
                "True",
            ),
            (
                Some("Pending"),
                "Unknown",
                REASON_AGENT_NEVER_CONNECTED,
                "False",
            ),
            (None, "Unknown", REASON_AGENT_NEVER_CONNECTED, "False"),
        ];
        for (state, healthy, reason, joined) in table {
            let p = profile(&member(state), "kedge-system", &[], None, at(1_000));
            let c = cond(&p, CONDITION_CONTROL_PLANE_HEALTHY);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                (healthy, reason),
                "{state:?}"
            );
            assert!(!c.message.is_empty());
            assert_eq!(cond(&p, CONDITION_JOINED).status, joined, "{state:?}");
        }
    }

    #[test]
    fn a_profile_names_kedge_the_version_and_properties_but_no_address_or_access() {
        let p = profile(&member(Some("Ready")), "fleet", &[], None, at(1_000));
        assert_eq!(p.metadata.name.as_deref(), Some("edge-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("fleet"));
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()[LABEL_CLUSTER_MANAGER],
            CLUSTER_MANAGER
        );
        assert_eq!(p.spec.cluster_manager.name, "kedge");
        assert_eq!(p.spec.display_name, "edge-1");
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.version.kubernetes, "v1.33.1");
        assert_eq!(property(&p, PROPERTY_AGENT_VERSION), Some("0.9.0"));
        assert_eq!(property(&p, PROPERTY_NAMESPACES), Some("shop,batch"));
        assert_eq!(property(&p, PROPERTY_CLUSTER_MANAGER), Some("kedge"));
        assert_eq!(property(&p, PROPERTY_TAINTS), None);
        assert!(status.access_providers.is_empty() && status.credential_providers.is_empty());
        let json = serde_json::to_string(&p).unwrap();
        assert!(!json.contains("203.0.113.7"), "{json}");
        assert!(!json.contains("accessProviders") && !json.contains("credentialProviders"));
        // A member that never connected has no versions to show: those are left out, not
        // written empty (upstream requires a non-empty property value).
        let pending = profile(&member(None), "fleet", &[], None, at(1_000));
        assert_eq!(property(&pending, PROPERTY_AGENT_VERSION), None);
        let json = serde_json::to_value(&pending).unwrap();
        assert!(json["status"].get("version").is_none(), "{json}");
    }

    #[test]
    fn taints_in_force_are_listed_sorted_and_expired_ones_left_out() {
        let until = |secs| Some(crate::time::to_time(at(secs)));
        let taints = [
            MemberTaint {
                dsj: "ml/train".into(),
                taint: TaintRecord {
                    member: "edge-1".into(),
                    soft_until: until(2_000),
                    ..Default::default()
                },
            },
            MemberTaint {
                dsj: "batch/etl".into(),
                taint: TaintRecord {
                    member: "edge-1".into(),
                    class: Some("gpu".into()),
                    size: Some(4),
                    hard_until: until(1_500),
                    soft_until: until(3_000),
                    ..Default::default()
                },
            },
            MemberTaint {
                dsj: "old/gone".into(),
                taint: TaintRecord {
                    member: "edge-1".into(),
                    hard_until: until(500),
                    soft_until: until(900),
                    ..Default::default()
                },
            },
        ];
        let p = profile(&member(Some("Ready")), "fleet", &taints, None, at(1_000));
        assert_eq!(
            property(&p, PROPERTY_TAINTS),
            Some(
                "batch/etl[gpu>=4]:hard until 1970-01-01T00:25:00Z,ml/train:soft until 1970-01-01T00:33:20Z"
            )
        );
        // Past the hard end the soft window shows; past every end, nothing.
        let later = profile(&member(Some("Ready")), "fleet", &taints, None, at(2_500));
        assert_eq!(
            property(&later, PROPERTY_TAINTS),
            Some("batch/etl[gpu>=4]:soft until 1970-01-01T00:50:00Z")
        );
        let none = profile(&member(Some("Ready")), "fleet", &taints, None, at(4_000));
        assert_eq!(property(&none, PROPERTY_TAINTS), None);
    }

    #[test]
    fn a_long_value_is_cut_at_a_list_entry_within_the_upstream_bound() {
        let mut m = member(Some("Ready"));
        m.spec.namespaces = (0..200).map(|i| format!("namespace-{i:03}")).collect();
        let p = profile(&m, "fleet", &[], None, at(1_000));
        let value = property(&p, PROPERTY_NAMESPACES).unwrap();
        assert!(value.len() <= PROPERTY_VALUE_MAX, "{}", value.len());
        assert!(value.ends_with(",…") && value.starts_with("namespace-000,"));
        assert_eq!(bounded_value("short".into()), "short");
    }

    #[test]
    fn only_what_readers_see_is_worth_a_write() {
        let first = profile(&member(Some("Ready")), "fleet", &[], None, at(1_000));
        assert!(differs(None, &first));
        // Later, same member: the times are kept from what was published, and nothing differs.
        let again = profile(
            &member(Some("Ready")),
            "fleet",
            &[],
            first.status.as_ref(),
            at(5_000),
        );
        assert_eq!(again, first, "times are kept while values stay");
        // Times alone never differ.
        let mut retimed = first.clone();
        for c in &mut retimed.status.as_mut().unwrap().conditions {
            c.last_transition_time = crate::time::to_time(at(9_000));
        }
        assert!(!differs(Some(&first), &retimed));
        // A new state, a new Kubernetes version, a lost label: all differ.
        let lost = profile(
            &member(Some("Unreachable")),
            "fleet",
            &[],
            first.status.as_ref(),
            at(6_000),
        );
        assert!(differs(Some(&first), &lost));
        let c = cond(&lost, CONDITION_CONTROL_PLANE_HEALTHY);
        assert_eq!(c.last_transition_time, crate::time::to_time(at(6_000)));
        assert_eq!(
            cond(&lost, CONDITION_JOINED).last_transition_time,
            crate::time::to_time(at(1_000)),
            "Joined stayed True"
        );
        let mut upgraded = member(Some("Ready"));
        upgraded.status.as_mut().unwrap().kubernetes_version = Some("v1.34.0".into());
        let upgraded = profile(&upgraded, "fleet", &[], first.status.as_ref(), at(6_000));
        assert!(differs(Some(&first), &upgraded));
        let mut unlabelled = first.clone();
        unlabelled.metadata.labels = None;
        assert!(differs(Some(&unlabelled), &first));
    }
}

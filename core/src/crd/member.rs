//! `MemberCluster` (`mc`): the cluster-scoped registry entry of one member cluster.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{NAMESPACE_MAX_LENGTH, RFC1123_LABEL_PATTERN};

/// Spec of a [`MemberCluster`]. Identity is the resource name, which is also the name in
/// the agent's client certificate.
// kube's derive takes one `printcolumn(...)` per column; clippy sees repeated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kedge.dev",
    doc = "A member cluster registered with the kedge hub; its name is the identity in the agent certificate.",
    version = "v1alpha1",
    kind = "MemberCluster",
    plural = "memberclusters",
    shortname = "mc",
    category = "kedge",
    status = "MemberClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Agent", type_ = "string", json_path = ".status.agentVersion"),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".status.kubernetesVersion"
    ),
    printcolumn(
        name = "Heartbeat",
        type_ = "date",
        json_path = ".status.lastHeartbeatTime"
    ),
    printcolumn(
        name = "Cert-Expiry",
        type_ = "date",
        json_path = ".status.certificateExpiry",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterSpec {
    /// Free text for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Namespaces the agent is allowed to act in, as installed; informational on the hub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = NAMESPACE_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN)))]
    pub namespaces: Vec<String>,
    /// Member namespaces that DistributedScaledObjects of a hub namespace may target besides
    /// their own (`memberClusters[].targetNamespace`). Without an entry, a DSO places
    /// workloads only in the member namespace named like its own (see `docs/security.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_mappings: Vec<NamespaceMapping>,
}

/// A grant in [`MemberClusterSpec::namespace_mappings`]: objects in `hubNamespace` may place
/// workloads in `memberNamespaces` of this member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceMapping {
    /// Namespace in the hub cluster of the DSOs this grant is for.
    #[schemars(length(min = 1, max = NAMESPACE_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN))]
    pub hub_namespace: String,
    /// Member namespaces they may target.
    #[schemars(inner(length(min = 1, max = NAMESPACE_MAX_LENGTH), regex(pattern = RFC1123_LABEL_PATTERN)))]
    pub member_namespaces: Vec<String>,
}

/// Status of a [`MemberCluster`], written by the hub from agent sessions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterStatus {
    /// `Pending` (never connected), `Ready` or `Unreachable` (see [`super::conditions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Version the agent reported in its Hello.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Kubernetes version of the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// Address the agent's current or last session came from (HOST:PORT as the hub saw it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Last heartbeat received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// Expiry of the agent's current client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<Time>,
    /// Allocatable and allocated resources the agent reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<MemberCapacity>,
    /// What the current or last session's connection carried, as the hub counts it
    /// (refreshed with `lastHeartbeatTime`; `/metrics` has it live).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<MemberLink>,
    /// Ready, … (see [`super::conditions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The agent's link as the hub's end of its QUIC connection sees it: UDP payload bytes and
/// datagrams both ways (IP and UDP headers not counted), since the session started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberLink {
    /// When the session started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_start: Option<Time>,
    /// When these figures were taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<Time>,
    /// Smoothed round-trip time, milliseconds.
    #[serde(default)]
    pub rtt_milliseconds: u64,
    /// Bytes the hub sent to the agent.
    #[serde(default)]
    pub bytes_sent: u64,
    /// Bytes the hub received from the agent.
    #[serde(default)]
    pub bytes_received: u64,
    /// Datagrams the hub sent.
    #[serde(default)]
    pub packets_sent: u64,
    /// Datagrams the hub received.
    #[serde(default)]
    pub packets_received: u64,
    /// Packets the hub declared lost (and resent what they carried).
    #[serde(default)]
    pub lost_packets: u64,
    /// Bytes both ways until the session was established (the TLS handshake and `Hello`).
    #[serde(default)]
    pub handshake_bytes: u64,
    /// Times the agent's address changed under the live session (NAT rebinding, a new
    /// network), each followed by QUIC connection migration instead of a new handshake.
    #[serde(default)]
    pub migrations: u64,
}

/// Resources of a member cluster, summed over its schedulable nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberCapacity {
    /// Sum of node allocatable (cpu, memory, pods, …).
    #[serde(default)]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Sum of pod requests on those nodes.
    #[serde(default)]
    pub allocated: BTreeMap<String, Quantity>,
}

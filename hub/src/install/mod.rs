//! What kedge installs, rendered as Kubernetes objects by pure functions: no I/O, so that
//! `kubectl kedge mc setup-member` can print or apply them and tests can check every rule.
//!
//! - [`agent`]: a member cluster's agent — its namespace, ServiceAccount, least-privilege
//!   RBAC, connection Secret and Deployment.
//! - [`hub`]: the hub's own ServiceAccount and RBAC in the management cluster (and, for
//!   its external scaler, one Secret in KEDA's namespace).
//! - [`hub_deployment`]: the hub's whole install: namespace, RBAC, Deployment, Services.
//!
//! These functions are the source of truth for the Helm charts in `deploy/charts` too:
//! `agent_helm_values` and `hub_helm_values` turn the same settings into chart values, and
//! `tests/tests/charts.rs` renders the charts with the real Helm engine and fails on any
//! difference from what these functions render.

pub mod agent;
pub mod hub;
pub mod hub_deployment;

pub use agent::{
    AgentInstall, AgentKind, AgentNamespaces, Credentials, agent_helm_values, agent_manifests,
};
pub use hub::{HubInstall, ScalerInstall, hub_rbac};
pub use hub_deployment::{HubDeployment, ServiceType, hub_helm_values, hub_manifests};

use std::collections::BTreeSet;

use serde_json::Value;

/// One permission of an RBAC rule, flattened: (apiGroup, resource, verb, resourceName or
/// empty for every name).
pub type Grant = (String, String, String, String);

/// The security context of every kedge container: no privilege escalation, a read-only root
/// filesystem, not root, no capabilities (the pod adds `runAsUser` and seccomp).
pub(crate) fn container_security_context() -> Value {
    serde_json::json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

/// The strings of a JSON array (none when it is not one).
pub(crate) fn texts(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Every permission a Role or ClusterRole object grants, flattened, so that two renderings
/// (these functions, a Helm chart) compare rule for rule whatever their grouping.
pub fn grants(role: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in role["rules"].as_array().into_iter().flatten() {
        let names = texts(&r["resourceNames"]);
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for g in texts(&r["apiGroups"]) {
            for res in texts(&r["resources"]) {
                for v in texts(&r["verbs"]) {
                    for n in &names {
                        out.insert((g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

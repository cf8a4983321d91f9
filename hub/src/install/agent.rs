//! The agent's install in a member cluster, least privilege first.
//!
//! The agent's ServiceAccount may do exactly what the agent does, where it does it:
//! - cluster-wide, only `list` nodes, for the capacity it reports;
//! - in each allowed namespace, watch and scale (through `/scale`) the allowed kinds,
//!   list and watch pods (pending counts, kedge's Jobs' pods, the requests capacity
//!   subtracts) and the autoscalers that would fight it, and create, read, watch and delete
//!   Jobs. Pods of other namespaces are not the agent's to read: a pod spec carries its
//!   containers' environment, often secrets;
//! - in its own namespace, read and update its identity Secret and read its bootstrap
//!   Secret.
//!
//! It cannot read Secrets or ConfigMaps of workloads, change a Deployment's template, exec
//! into pods, or touch any namespace it was not given. The agent denies by default on top
//! of that: `--namespaces` and `--kinds` match the RBAC rendered here.

use std::collections::BTreeSet;

use k8s_openapi::ByteString;
use kedge_net::agent_cli::{env, flag};
use kedge_protocol::is_dns1123_label;
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The agent's name: ServiceAccount, Deployment, its ClusterRole and Roles.
pub const AGENT: &str = "kedge-agent";
/// The namespace the agent runs in unless told otherwise.
pub const DEFAULT_AGENT_NAMESPACE: &str = "kedge-system";
/// The Secret with the connection material (hub addresses, CA, token or certificate).
pub const BOOTSTRAP_SECRET: &str = "kedge-agent-bootstrap";
/// The Secret where an enrolled agent keeps its key and certificate.
pub const IDENTITY_SECRET: &str = "kedge-agent-identity";
/// Where the bootstrap Secret is mounted in the agent's container.
pub const CONFIG_DIR: &str = "/etc/kedge";
/// The agent's ops port (`/metrics`, `/healthz`, `/readyz`).
pub const OPS_PORT: u16 = 8081;
/// The agent image unless told otherwise.
pub const DEFAULT_IMAGE: &str = "ghcr.io/kedge-dev/kedge-agent";
/// The ClusterRole (and binding) for the cluster-wide reads.
pub const CAPACITY_ROLE: &str = "kedge-agent-capacity";
/// The Role (and binding) in the agent's namespace for its own Secrets.
pub const IDENTITY_ROLE: &str = "kedge-agent-identity";
/// The ClusterRole (and binding) that replaces the per-namespace Roles under
/// `--all-namespaces`.
pub const ALL_NAMESPACES_ROLE: &str = "kedge-agent-all-namespaces";

/// Secret keys.
pub mod keys {
    /// Comma-separated `HOST:PORT` list of hubs (the agent's `KEDGE_AGENT_HUB`).
    pub const HUB: &str = "hub";
    /// PEM bundle of the hub CA.
    pub const CA: &str = "ca.crt";
    /// The one-time bootstrap token.
    pub const TOKEN: &str = "token";
    /// The member's client certificate (PEM).
    pub const CERT: &str = "tls.crt";
    /// The member's private key (PEM).
    pub const KEY: &str = "tls.key";
}

/// How the agent proves who it is to the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A one-time bootstrap token: the agent generates its key, enrolls with the token and
    /// keeps its certificate in the identity Secret.
    Bootstrap {
        /// The token.
        token: String,
    },
    /// A client certificate and key made elsewhere (development certificates).
    Certificate {
        /// The certificate, PEM.
        cert_pem: String,
        /// The private key, PEM.
        key_pem: String,
    },
}

/// Where the agent may act: `Only` these namespaces, a Role and RoleBinding in each (they
/// must exist), or `All` (`--all-namespaces`), the same rules in a ClusterRole (not
/// recommended). The agent reads its flags into the same type.
pub use kedge_net::agent_cli::NamespaceScope as AgentNamespaces;

/// A workload kind the agent may scale: what `--kinds` names and what RBAC needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AgentKind {
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Resource (plural), e.g. `deployments`: RBAC names resources, not kinds.
    pub plural: String,
}

impl AgentKind {
    /// `apps/v1` Deployment.
    pub fn deployment() -> Self {
        Self::new("apps", "v1", "Deployment", "deployments")
    }

    /// `apps/v1` StatefulSet.
    pub fn stateful_set() -> Self {
        Self::new("apps", "v1", "StatefulSet", "statefulsets")
    }

    /// Any kind with a `/scale` subresource.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        }
    }

    /// As the agent's `--kinds` writes it: `group/version/Kind`, `version/Kind` for core.
    pub fn flag(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.version, self.kind)
        } else {
            format!("{}/{}/{}", self.group, self.version, self.kind)
        }
    }
}

/// Everything that makes one member's agent install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInstall {
    /// The namespace the agent runs in (created).
    pub agent_namespace: String,
    /// Where the agent may act.
    pub namespaces: AgentNamespaces,
    /// What it may scale.
    pub kinds: Vec<AgentKind>,
    /// Hub addresses, `HOST:PORT`, tried in order.
    pub hubs: Vec<String>,
    /// Name to verify in the hub's certificate when it is not the host of each address.
    pub hub_server_name: Option<String>,
    /// PEM bundle of the hub CA.
    pub ca_pem: String,
    /// How the agent authenticates.
    pub credentials: Credentials,
    /// Agent image, without tag.
    pub image: String,
    /// Agent image tag.
    pub tag: String,
}

impl AgentInstall {
    /// An install in [`DEFAULT_AGENT_NAMESPACE`] acting in `namespaces`, scaling
    /// Deployments and StatefulSets, with the image of this kedge version.
    pub fn new(
        hubs: Vec<String>,
        ca_pem: String,
        credentials: Credentials,
        namespaces: AgentNamespaces,
    ) -> Self {
        Self {
            agent_namespace: DEFAULT_AGENT_NAMESPACE.to_owned(),
            namespaces,
            kinds: vec![AgentKind::deployment(), AgentKind::stateful_set()],
            hubs,
            hub_server_name: None,
            ca_pem,
            credentials,
            image: DEFAULT_IMAGE.to_owned(),
            tag: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// Every problem that would make the rendered objects invalid or useless, all at once.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if !is_dns1123_label(&self.agent_namespace) {
            problems.push(format!(
                "agent namespace {:?} is not a namespace name (lowercase alphanumerics and '-', at most 63)",
                self.agent_namespace
            ));
        }
        problems.extend(self.namespaces.problems());
        if self.kinds.is_empty() {
            problems.push("no kinds: the agent could scale nothing".to_owned());
        }
        let word = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        };
        for k in &self.kinds {
            let group_ok = k.group.is_empty() || word(&k.group);
            let plural_ok = word(&k.plural) && k.plural == k.plural.to_ascii_lowercase();
            let kind_ok = word(&k.kind) && k.kind.starts_with(|c: char| c.is_ascii_uppercase());
            if !(group_ok && word(&k.version) && kind_ok && plural_ok) {
                problems.push(format!(
                    "kind {k:?} is not a group, version, Kind and lowercase plural"
                ));
            }
        }
        if self.hubs.iter().all(|h| h.trim().is_empty()) {
            problems.push("no hub address (HOST:PORT)".to_owned());
        }
        if let Some(h) = self.hubs.iter().find(|h| h.contains(',')) {
            problems.push(format!("hub address {h:?} contains a comma"));
        }
        problems.extend(
            self.hubs
                .iter()
                .filter(|h| !h.trim().is_empty() && !h.contains(',') && !is_host_port(h))
                .map(|h| {
                    format!(
                        "hub address {h:?} is not HOST:PORT (a port 1-65535; [::1]:7443 for IPv6)"
                    )
                }),
        );
        if self.ca_pem.trim().is_empty() {
            problems.push("empty hub CA bundle".to_owned());
        }
        match &self.credentials {
            Credentials::Bootstrap { token } if token.trim().is_empty() => {
                problems.push("empty bootstrap token".to_owned());
            }
            Credentials::Certificate { cert_pem, key_pem }
                if cert_pem.trim().is_empty() || key_pem.trim().is_empty() =>
            {
                problems.push("empty client certificate or key".to_owned());
            }
            _ => {}
        }
        if self.image.is_empty() || self.tag.is_empty() {
            problems.push("empty image or tag".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInstall(problems))
        }
    }
}

/// Whether `address` is `HOST:PORT` as the agent's `--hub` takes it: a host without
/// whitespace (an IPv6 address in brackets) and a port in 1..=65535.
fn is_host_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        !host.is_empty() && !host.contains(':') && !host.chars().any(char::is_whitespace)
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": AGENT,
        "app.kubernetes.io/part-of": "kedge",
    })
}

fn meta(name: &str, namespace: Option<&str>) -> Value {
    let mut m = json!({ "name": name, "labels": labels() });
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    m
}

fn rule(groups: &[&str], resources: &[String], verbs: &[&str]) -> Value {
    json!({ "apiGroups": groups, "resources": resources, "verbs": verbs })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn subject(install: &AgentInstall) -> Value {
    json!([{ "kind": "ServiceAccount", "name": AGENT, "namespace": install.agent_namespace }])
}

/// Cluster-wide, read-only: the agent reports the member's capacity (allocatable of Ready
/// nodes minus the requests of the running pods it serves beside), which needs every node.
/// It lists them a page at a time and never watches or gets one, so `list` is all it has.
/// The pods it subtracts are those of its namespaces, read under [`workload_rules`]: no
/// grant on pods reaches past them.
fn capacity_rules() -> Vec<Value> {
    vec![rule(&[""], &strings(&["nodes"]), &["list"])]
}

/// What the agent does in a namespace it manages, rule by rule.
fn workload_rules(kinds: &[AgentKind]) -> Vec<Value> {
    let groups: BTreeSet<&str> = kinds.iter().map(|k| k.group.as_str()).collect();
    let mut rules = Vec::new();
    for group in groups {
        let of_group: Vec<&AgentKind> = kinds.iter().filter(|k| k.group == group).collect();
        // Observing a workload watches the object (replicas, readiness, pod requests,
        // selector): one watch per kind and namespace, never a get.
        rules.push(rule(
            &[group],
            &of_group
                .iter()
                .map(|k| k.plural.clone())
                .collect::<Vec<_>>(),
            &["list", "watch"],
        ));
        // Scaling reads and merge-patches /scale: never the object itself, so the agent
        // cannot change a template, an image or a command.
        rules.push(rule(
            &[group],
            &of_group
                .iter()
                .map(|k| format!("{}/scale", k.plural))
                .collect::<Vec<_>>(),
            &["get", "patch"],
        ));
    }
    // Pending/unschedulable counts watch the pending pods of a workload's namespace; the Job
    // watch lists and watches the pods of kedge's Jobs by label; capacity lists the running
    // pods' requests.
    rules.push(rule(&[""], &strings(&["pods"]), &["list", "watch"]));
    // kedge's Jobs: created by deterministic name, read back on a name collision and
    // before a delete (to check kedge's label), watched by label, deleted on scale-in.
    rules.push(rule(
        &["batch"],
        &strings(&["jobs"]),
        &["create", "get", "list", "watch", "delete"],
    ));
    // Another autoscaler of the same workload is reported as a conflict instead of fought:
    // both kinds are watched in the namespaces of the workloads.
    rules.push(rule(
        &["autoscaling"],
        &strings(&["horizontalpodautoscalers"]),
        &["list", "watch"],
    ));
    rules.push(rule(
        &["keda.sh"],
        &strings(&["scaledobjects"]),
        &["list", "watch"],
    ));
    rules
}

/// The agent's own Secrets in its namespace. `get`/`update` are limited to the identity
/// Secret and `get` to the bootstrap Secret by `resourceNames`. RBAC cannot restrict
/// `create` by name (the name is not known when the request is authorized), so the
/// enrolling agent may create Secrets in its own namespace — which holds nothing else — but
/// it cannot read, list or change any Secret but these two.
fn identity_rules() -> Vec<Value> {
    vec![
        json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [IDENTITY_SECRET],
            "verbs": ["get", "update"]}),
        json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [BOOTSTRAP_SECRET],
            "verbs": ["get"]}),
        json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
    ]
}

fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta(name, None),
        "rules": rules,
    })
}

fn cluster_role_binding(install: &AgentInstall, name: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta(name, None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subject(install),
    })
}

fn role(name: &str, namespace: &str, rules: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(name, Some(namespace)),
        "rules": rules,
    })
}

fn role_binding(install: &AgentInstall, name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(name, Some(namespace)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subject(install),
    })
}

fn bytes(s: &str) -> Value {
    // A ByteString serializes as base64, as Secret `data` wants.
    serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap_or(Value::Null)
}

fn secret(install: &AgentInstall) -> Value {
    let mut data = serde_json::Map::new();
    let hubs: Vec<&str> = install
        .hubs
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .collect();
    data.insert(keys::HUB.into(), bytes(&hubs.join(",")));
    data.insert(keys::CA.into(), bytes(&install.ca_pem));
    match &install.credentials {
        Credentials::Bootstrap { token } => {
            data.insert(keys::TOKEN.into(), bytes(token));
        }
        Credentials::Certificate { cert_pem, key_pem } => {
            data.insert(keys::CERT.into(), bytes(cert_pem));
            data.insert(keys::KEY.into(), bytes(key_pem));
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(BOOTSTRAP_SECRET, Some(&install.agent_namespace)),
        "type": "Opaque",
        "data": data,
    })
}

fn file(key: &str) -> String {
    format!("{CONFIG_DIR}/{key}")
}

/// The agent's command-line arguments in its container; the hub addresses come from the
/// Secret through `KEDGE_AGENT_HUB`.
pub fn agent_args(install: &AgentInstall) -> Vec<String> {
    let mut args = Vec::new();
    let mut arg = |name: &str, value: String| args.extend([flag::dashed(name), value]);
    arg(flag::OPS_LISTEN, format!("0.0.0.0:{OPS_PORT}"));
    arg(flag::LOG_FORMAT, "json".to_owned());
    arg(flag::TLS_CA, file(keys::CA));
    match &install.credentials {
        Credentials::Bootstrap { .. } => {
            arg(flag::BOOTSTRAP_TOKEN_FILE, file(keys::TOKEN));
            arg(flag::IDENTITY_SECRET, IDENTITY_SECRET.to_owned());
            arg(flag::AGENT_NAMESPACE, format!("$({})", env::POD_NAMESPACE));
        }
        Credentials::Certificate { .. } => {
            arg(flag::TLS_CERT, file(keys::CERT));
            arg(flag::TLS_KEY, file(keys::KEY));
        }
    }
    if let Some(name) = &install.hub_server_name {
        arg(flag::HUB_SERVER_NAME, name.clone());
    }
    args.extend(install.namespaces.args());
    let kinds: Vec<String> = install.kinds.iter().map(AgentKind::flag).collect();
    args.extend([flag::dashed(flag::KINDS), kinds.join(",")]);
    args
}

fn deployment(install: &AgentInstall) -> Value {
    let probe = |path: &str, period: u32| {
        json!({
            "httpGet": {"path": path, "port": "ops"},
            "periodSeconds": period,
            "failureThreshold": 3,
        })
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(AGENT, Some(&install.agent_namespace)),
        "spec": {
            // One agent per member: two would present the same identity.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": AGENT}},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "serviceAccountName": AGENT,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": AGENT,
                        "image": format!("{}:{}", install.image, install.tag),
                        "args": agent_args(install),
                        "env": [
                            {"name": env::POD_NAMESPACE,
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": env::HUB,
                             "valueFrom": {"secretKeyRef": {"name": BOOTSTRAP_SECRET, "key": keys::HUB}}},
                        ],
                        "ports": [{"name": "ops", "containerPort": OPS_PORT, "protocol": "TCP"}],
                        "livenessProbe": probe("/healthz", 10),
                        // Ready while a session with the hub is up.
                        "readinessProbe": probe("/readyz", 5),
                        // Measured: ~13 MiB idle, under 20 MiB with 1,000 Jobs.
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "32Mi"},
                            "limits": {"memory": "128Mi"},
                        },
                        "securityContext": super::container_security_context(),
                        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": true}],
                    }],
                    "volumes": [{
                        "name": "config",
                        // 0440: readable by the agent's group (fsGroup) only.
                        "secret": {"secretName": BOOTSTRAP_SECRET, "defaultMode": 0o440},
                    }],
                },
            },
        },
    })
}

/// The same install as values of the `kedge-agent` Helm chart (`deploy/charts/kedge-agent`):
/// the chart rendered with them in the namespace `agent_namespace` is [`agent_manifests`]
/// without the Namespace (`helm install --create-namespace` makes it).
/// `tests/tests/charts.rs` renders the chart with the real Helm engine and holds the two
/// to each other.
pub fn agent_helm_values(install: &AgentInstall) -> Value {
    let hubs: Vec<&str> = install
        .hubs
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .collect();
    let mut hub = json!({ "addresses": hubs });
    if let Some(name) = &install.hub_server_name {
        hub["serverName"] = json!(name);
    }
    let mut values = json!({
        "hub": hub,
        "caBundle": install.ca_pem,
        "kinds": install.kinds.iter().map(|k| json!({
            "group": k.group, "version": k.version, "kind": k.kind, "plural": k.plural,
        })).collect::<Vec<_>>(),
        "image": {"repository": install.image, "tag": install.tag},
    });
    match &install.credentials {
        Credentials::Bootstrap { token } => {
            values["credentials"] = json!("bootstrap");
            values["bootstrapToken"] = json!(token);
        }
        Credentials::Certificate { cert_pem, key_pem } => {
            values["credentials"] = json!("certificate");
            values["certificate"] = json!({ "cert": cert_pem, "key": key_pem });
        }
    }
    match &install.namespaces {
        AgentNamespaces::Only(list) => {
            let list: BTreeSet<&str> = list.iter().map(String::as_str).collect();
            values["namespaces"] = json!(list);
        }
        AgentNamespaces::All => values["allNamespaces"] = json!(true),
    }
    values
}

/// The agent's install, in apply order: Namespace, ServiceAccount, the cluster-wide
/// ClusterRole and binding, a Role and RoleBinding per allowed namespace (or one
/// ClusterRole for all), the Role for its own Secrets, the bootstrap Secret and the
/// Deployment. Check the input with [`AgentInstall::validate`] first.
pub fn agent_manifests(install: &AgentInstall) -> Vec<Value> {
    let ns = install.agent_namespace.as_str();
    let mut out = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, None)}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(AGENT, Some(ns))}),
        cluster_role(CAPACITY_ROLE, capacity_rules()),
        cluster_role_binding(install, CAPACITY_ROLE),
    ];
    let mut kinds = install.kinds.clone();
    kinds.sort();
    kinds.dedup();
    match &install.namespaces {
        AgentNamespaces::Only(list) => {
            let list: BTreeSet<&String> = list.iter().collect();
            for namespace in list {
                out.push(role(AGENT, namespace, workload_rules(&kinds)));
                out.push(role_binding(install, AGENT, namespace));
            }
        }
        AgentNamespaces::All => {
            out.push(cluster_role(ALL_NAMESPACES_ROLE, workload_rules(&kinds)));
            out.push(cluster_role_binding(install, ALL_NAMESPACES_ROLE));
        }
    }
    out.push(role(IDENTITY_ROLE, ns, identity_rules()));
    out.push(role_binding(install, IDENTITY_ROLE, ns));
    out.push(secret(install));
    out.push(deployment(install));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::{Grant, grants, texts};

    fn install(namespaces: AgentNamespaces, credentials: Credentials) -> AgentInstall {
        AgentInstall::new(
            vec!["hub.example:7443".into(), "10.0.0.2:7443".into()],
            "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".into(),
            credentials,
            namespaces,
        )
    }

    fn apps_and_web() -> AgentNamespaces {
        AgentNamespaces::Only(vec!["web".into(), "apps".into()])
    }

    fn cert() -> Credentials {
        Credentials::Certificate {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        }
    }

    fn token() -> Credentials {
        Credentials::Bootstrap {
            token: "kedge-bootstrap.secret".into(),
        }
    }

    fn kind_name(o: &Value) -> (String, String, String) {
        let s = |p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        (s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
    }

    fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
        objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn set(items: &[(&str, &str, &str, &str)]) -> BTreeSet<Grant> {
        items
            .iter()
            .map(|(a, b, c, d)| ((*a).into(), (*b).into(), (*c).into(), (*d).into()))
            .collect()
    }

    #[test]
    fn objects_come_in_apply_order() {
        let objects = agent_manifests(&install(apps_and_web(), cert()));
        let order: Vec<(String, String, String)> = objects.iter().map(kind_name).collect();
        let expected = [
            ("Namespace", "", "kedge-system"),
            ("ServiceAccount", "kedge-system", "kedge-agent"),
            ("ClusterRole", "", "kedge-agent-capacity"),
            ("ClusterRoleBinding", "", "kedge-agent-capacity"),
            ("Role", "apps", "kedge-agent"),
            ("RoleBinding", "apps", "kedge-agent"),
            ("Role", "web", "kedge-agent"),
            ("RoleBinding", "web", "kedge-agent"),
            ("Role", "kedge-system", "kedge-agent-identity"),
            ("RoleBinding", "kedge-system", "kedge-agent-identity"),
            ("Secret", "kedge-system", "kedge-agent-bootstrap"),
            ("Deployment", "kedge-system", "kedge-agent"),
        ]
        .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
        assert_eq!(order, expected);
        for o in &objects {
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/part-of"],
                "kedge"
            );
        }
    }

    /// Every grant is one the agent's code needs (see the comments at each rule); this
    /// table is the whole of what it may do.
    #[test]
    fn every_rule_is_what_the_agent_does_and_nothing_more() {
        let objects = agent_manifests(&install(apps_and_web(), cert()));
        let cluster = of_kind(&objects, "ClusterRole");
        assert_eq!(cluster.len(), 1);
        assert_eq!(
            grants(cluster[0]),
            set(&[("", "nodes", "list", "")]),
            "cluster-wide: nodes for capacity only, read-only, never a pod"
        );
        let workload = set(&[
            ("apps", "deployments", "list", ""),
            ("apps", "deployments", "watch", ""),
            ("apps", "statefulsets", "list", ""),
            ("apps", "statefulsets", "watch", ""),
            ("apps", "deployments/scale", "get", ""),
            ("apps", "deployments/scale", "patch", ""),
            ("apps", "statefulsets/scale", "get", ""),
            ("apps", "statefulsets/scale", "patch", ""),
            ("", "pods", "list", ""),
            ("", "pods", "watch", ""),
            ("batch", "jobs", "create", ""),
            ("batch", "jobs", "get", ""),
            ("batch", "jobs", "list", ""),
            ("batch", "jobs", "watch", ""),
            ("batch", "jobs", "delete", ""),
            ("autoscaling", "horizontalpodautoscalers", "list", ""),
            ("autoscaling", "horizontalpodautoscalers", "watch", ""),
            ("keda.sh", "scaledobjects", "list", ""),
            ("keda.sh", "scaledobjects", "watch", ""),
        ]);
        let roles = of_kind(&objects, "Role");
        for r in roles.iter().filter(|r| r["metadata"]["name"] == AGENT) {
            assert_eq!(grants(r), workload, "{}", r["metadata"]["namespace"]);
        }
        let identity = roles
            .iter()
            .find(|r| r["metadata"]["name"] == IDENTITY_ROLE)
            .unwrap();
        assert_eq!(identity["metadata"]["namespace"], "kedge-system");
        assert_eq!(
            grants(identity),
            set(&[
                ("", "secrets", "get", IDENTITY_SECRET),
                ("", "secrets", "update", IDENTITY_SECRET),
                ("", "secrets", "get", BOOTSTRAP_SECRET),
                ("", "secrets", "create", ""),
            ])
        );
    }

    #[test]
    fn no_wildcards_no_escalation_verbs_no_secrets_in_workload_namespaces() {
        for namespaces in [apps_and_web(), AgentNamespaces::All] {
            let objects = agent_manifests(&install(namespaces, token()));
            for r in of_kind(&objects, "Role")
                .into_iter()
                .chain(of_kind(&objects, "ClusterRole"))
            {
                for (group, resource, verb, _) in grants(r) {
                    assert!(
                        ![&group, &resource, &verb].iter().any(|s| s.contains('*')),
                        "wildcard in {}",
                        r["metadata"]["name"]
                    );
                    for forbidden in ["escalate", "bind", "impersonate", "deletecollection"] {
                        assert_ne!(verb, forbidden);
                    }
                    for forbidden in ["pods/exec", "pods/attach", "configmaps", "serviceaccounts"] {
                        assert_ne!(resource, forbidden);
                    }
                    if resource == "secrets" {
                        assert_eq!(r["metadata"]["name"], IDENTITY_ROLE);
                    }
                    // The workloads themselves are watched, only /scale is written.
                    if ["deployments", "statefulsets"].contains(&resource.as_str()) {
                        assert!(["list", "watch"].contains(&verb.as_str()), "{verb}");
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_namespaced_outside_the_allowed_and_agent_namespaces() {
        let objects = agent_manifests(&install(apps_and_web(), cert()));
        for o in &objects {
            let (kind, namespace, _) = kind_name(o);
            match kind.as_str() {
                "Namespace" | "ClusterRole" | "ClusterRoleBinding" => {
                    assert_eq!(namespace, "", "{kind}");
                }
                "Role" | "RoleBinding" => assert!(
                    ["apps", "web", "kedge-system"].contains(&namespace.as_str()),
                    "{kind} in {namespace}"
                ),
                _ => assert_eq!(namespace, "kedge-system", "{kind}"),
            }
        }
        // Every binding names the agent's ServiceAccount and only it.
        for b in of_kind(&objects, "RoleBinding")
            .into_iter()
            .chain(of_kind(&objects, "ClusterRoleBinding"))
        {
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "name": "kedge-agent", "namespace": "kedge-system"}])
            );
            assert_eq!(b["roleRef"]["name"], b["metadata"]["name"]);
        }
        // All namespaces: one ClusterRole with the workload rules instead of the Roles.
        let all = agent_manifests(&install(AgentNamespaces::All, cert()));
        assert!(
            of_kind(&all, "Role")
                .iter()
                .all(|r| r["metadata"]["name"] == IDENTITY_ROLE)
        );
        let names: Vec<&Value> = of_kind(&all, "ClusterRole")
            .iter()
            .map(|r| &r["metadata"]["name"])
            .collect();
        assert_eq!(names, [CAPACITY_ROLE, ALL_NAMESPACES_ROLE]);
    }

    fn container(objects: &[Value]) -> &Value {
        &of_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    }

    fn args(objects: &[Value]) -> Vec<String> {
        texts(&container(objects)["args"])
    }

    fn secret_data(objects: &[Value]) -> BTreeSet<String> {
        let s = of_kind(objects, "Secret")[0];
        s["data"].as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn certificate_credentials_are_mounted_files() {
        let objects = agent_manifests(&install(apps_and_web(), cert()));
        assert_eq!(
            secret_data(&objects),
            ["ca.crt", "hub", "tls.crt", "tls.key"]
                .map(String::from)
                .into()
        );
        let s = of_kind(&objects, "Secret")[0];
        // base64 of "hub.example:7443,10.0.0.2:7443"
        let hub: ByteString = serde_json::from_value(s["data"]["hub"].clone()).unwrap();
        assert_eq!(hub.0, b"hub.example:7443,10.0.0.2:7443");
        assert_eq!(
            args(&objects),
            [
                "--ops-listen",
                "0.0.0.0:8081",
                "--log-format",
                "json",
                "--tls-ca",
                "/etc/kedge/ca.crt",
                "--tls-cert",
                "/etc/kedge/tls.crt",
                "--tls-key",
                "/etc/kedge/tls.key",
                "--namespaces",
                "apps,web",
                "--kinds",
                "apps/v1/Deployment,apps/v1/StatefulSet",
            ]
        );
    }

    #[test]
    fn bootstrap_credentials_enroll_into_the_identity_secret() {
        let mut i = install(AgentNamespaces::All, token());
        i.hub_server_name = Some("kedge-hub.example".into());
        i.kinds.push(AgentKind::new(
            "",
            "v1",
            "ReplicationController",
            "replicationcontrollers",
        ));
        let objects = agent_manifests(&i);
        assert_eq!(
            secret_data(&objects),
            ["ca.crt", "hub", "token"].map(String::from).into()
        );
        let a = args(&objects).join(" ");
        assert!(
            a.contains(
                "--tls-ca /etc/kedge/ca.crt --bootstrap-token-file /etc/kedge/token \
                 --identity-secret kedge-agent-identity --agent-namespace $(POD_NAMESPACE)"
            ),
            "{a}"
        );
        assert!(
            !a.contains("--tls-cert") && !a.contains("--namespaces"),
            "{a}"
        );
        assert!(
            a.contains("--hub-server-name kedge-hub.example --all-namespaces"),
            "{a}"
        );
        assert!(
            a.ends_with("--kinds apps/v1/Deployment,apps/v1/StatefulSet,v1/ReplicationController"),
            "{a}"
        );
        // The core-group kind gets its RBAC in the core group.
        let all = of_kind(&objects, "ClusterRole")[1];
        assert!(grants(all).contains(&(
            String::new(),
            "replicationcontrollers/scale".into(),
            "patch".into(),
            String::new()
        )));
    }

    #[test]
    fn the_deployment_runs_unprivileged_with_probes_and_limits() {
        let mut i = install(apps_and_web(), cert());
        i.image = "registry.example/kedge-agent".into();
        i.tag = "1.2.3".into();
        let objects = agent_manifests(&i);
        let d = of_kind(&objects, "Deployment")[0];
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], AGENT);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let c = container(&objects);
        assert_eq!(c["image"], "registry.example/kedge-agent:1.2.3");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["ports"][0]["containerPort"], OPS_PORT);
        assert!(c["resources"]["limits"]["memory"].is_string());
        assert_eq!(c["volumeMounts"][0]["mountPath"], CONFIG_DIR);
        assert_eq!(pod["volumes"][0]["secret"]["secretName"], BOOTSTRAP_SECRET);
        assert_eq!(
            c["env"][1]["valueFrom"]["secretKeyRef"],
            json!({"name": BOOTSTRAP_SECRET, "key": "hub"})
        );
        // Typed check: the Deployment is one the API accepts.
        let typed: k8s_openapi::api::apps::v1::Deployment =
            serde_json::from_value(d.clone()).unwrap();
        assert_eq!(typed.spec.unwrap().replicas, Some(1));
    }

    #[test]
    fn bad_input_is_reported_all_at_once() {
        let mut i = install(
            AgentNamespaces::Only(vec![]),
            Credentials::Bootstrap { token: " ".into() },
        );
        i.hubs = vec![" ".into()];
        i.agent_namespace = "Kedge".into();
        i.kinds = vec![AgentKind::new("apps", "v1", "deployment", "Deployments")];
        let Err(Error::InvalidInstall(problems)) = i.validate() else {
            panic!("accepted")
        };
        for expected in [
            "agent namespace \"Kedge\"",
            "no namespaces",
            "is not a group, version, Kind",
            "no hub address",
            "empty bootstrap token",
        ] {
            assert!(
                problems.iter().any(|p| p.contains(expected)),
                "{expected}: {problems:?}"
            );
        }
        let mut i = install(
            AgentNamespaces::Only(vec!["apps".into(), "kube_system".into()]),
            cert(),
        );
        assert!(matches!(i.validate(), Err(Error::InvalidInstall(p)) if p.len() == 1));
        i.namespaces = apps_and_web();
        assert!(i.validate().is_ok());
    }

    #[test]
    fn hub_addresses_must_be_host_and_port() {
        for ok in [
            "hub.example:7443",
            "10.0.0.2:1",
            "[::1]:7443",
            "localhost:65535",
        ] {
            assert!(is_host_port(ok), "{ok}");
        }
        for bad in [
            "hub.example",
            "hub.example:",
            ":7443",
            "hub:0",
            "hub:65536",
            "hub:x",
            "::1:7443",
            "[::1]7443",
            "[nothost]:1",
            "a b:1",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
        let mut i = install(apps_and_web(), cert());
        i.hubs = vec!["hub.example:7443".into(), "hub.example".into()];
        let Err(Error::InvalidInstall(problems)) = i.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("\"hub.example\" is not HOST:PORT"),
            "{problems:?}"
        );
    }
}

//! The hub's RBAC in the management cluster: exactly the API calls the hub makes, each rule
//! with the call it serves. The hub reads and writes kedge's own resources, the KEDA
//! ScaledObjects it owns, Events and its Lease, and with the external scaler its own
//! Secrets and KEDA's copy of them by name; it reads no Secrets of users, no pods and no
//! workloads (those live in the members, where only agents act).

use serde_json::{Value, json};

use crate::podmetrics::certs::{CLIENT_SECRET, TLS_SECRET, TRIGGER_AUTHENTICATION};

/// The hub's ServiceAccount, ClusterRole and binding.
pub const HUB: &str = "kedge-hub";
/// The Role (and binding) for the hub's Lease.
pub const LEASE_ROLE: &str = "kedge-hub-lease";
/// The Role (and binding) for the hub CA and bootstrap token Secrets.
pub const ENROLLMENT_ROLE: &str = "kedge-hub-enrollment";
/// The Role (and binding) for the ClusterProfiles the hub publishes, in their namespace.
pub const CLUSTER_PROFILES_ROLE: &str = "kedge-hub-cluster-profiles";
/// The Roles (and bindings), in the hub's and in KEDA's namespace, for the external
/// scaler's Secrets; also its Service.
pub const SCALER: &str = "kedge-hub-scaler";

/// KEDA's external scaler for `kedge-pod-metrics` triggers (`--scaler-listen`): a gRPC
/// endpoint with mutual TLS whose certificates the hub issues and rotates itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalerInstall {
    /// KEDA's namespace (`--keda-namespace`), where the hub writes KEDA's client Secret.
    pub keda_namespace: String,
    /// TCP port of the listener and of the Service [`SCALER`].
    pub port: u16,
    /// `--scaler-cert-lifetime`.
    pub cert_lifetime: String,
    /// `--scaler-address`, what KEDA dials; empty: the Service, `kedge-hub-scaler.NAMESPACE.svc:PORT`.
    pub address: String,
}

impl Default for ScalerInstall {
    fn default() -> Self {
        Self {
            keda_namespace: "keda".to_owned(),
            port: crate::podmetrics::scaler::DEFAULT_PORT,
            cert_lifetime: "30d".to_owned(),
            address: String::new(),
        }
    }
}

impl ScalerInstall {
    /// What KEDA dials (`--scaler-address`): `address`, else the Service [`SCALER`] of the
    /// hub's `namespace`. Passed always: the hub's own default names the Service `kedge-hub`,
    /// the UDP one agents dial.
    pub fn address_in(&self, namespace: &str) -> String {
        if self.address.is_empty() {
            format!("{SCALER}.{namespace}.svc:{}", self.port)
        } else {
            self.address.clone()
        }
    }
}

/// What the hub's RBAC depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubInstall {
    /// The namespace the hub runs in: its ServiceAccount and Lease live there.
    pub namespace: String,
    /// The Lease that elects the active hub (`--lease-name`).
    pub lease_name: String,
    /// Whether the DistributedScaledJob controller runs (`--dsj-enabled`).
    pub dsj_enabled: bool,
    /// Whether the hub keeps its CA in the Secret `kedge-hub-ca` and enrolls members with
    /// bootstrap tokens (no `--tls-*` files, the default install).
    pub enrollment: bool,
    /// KEDA's external scaler, on by default; `None`: no scaler (DSOs with
    /// `kedge-pod-metrics` triggers are Degraded).
    pub scaler: Option<ScalerInstall>,
    /// Whether the hub publishes ClusterProfiles (`--cluster-profiles`).
    pub cluster_profiles: bool,
    /// Their namespace (`--cluster-profile-namespace`); `None`: the hub's.
    pub cluster_profile_namespace: Option<String>,
}

impl HubInstall {
    /// Where the hub publishes ClusterProfiles; `None` when it does not.
    pub fn cluster_profile_namespace(&self) -> Option<&str> {
        self.cluster_profiles.then(|| {
            self.cluster_profile_namespace
                .as_deref()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(&self.namespace)
        })
    }
}

impl Default for HubInstall {
    fn default() -> Self {
        Self {
            namespace: super::agent::DEFAULT_AGENT_NAMESPACE.to_owned(),
            lease_name: HUB.to_owned(),
            dsj_enabled: false,
            enrollment: true,
            scaler: Some(ScalerInstall::default()),
            cluster_profiles: true,
            cluster_profile_namespace: None,
        }
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({ "apiGroups": [group], "resources": resources, "verbs": verbs })
}

fn named(group: &str, resource: &str, name: &str, verbs: &[&str]) -> Value {
    json!({ "apiGroups": [group], "resources": [resource], "resourceNames": [name],
        "verbs": verbs })
}

fn labels() -> Value {
    json!({ "app.kubernetes.io/name": HUB, "app.kubernetes.io/part-of": "kedge" })
}

/// Cluster-wide: DSOs and DSJs live in any namespace, so do their ScaledObjects and Events.
fn cluster_rules(install: &HubInstall) -> Vec<Value> {
    let mut rules = vec![
        // The DSO controller lists and watches DSOs; kube's finalizer helper adds and
        // removes the finalizer with a JSON patch.
        rule(
            "kedge.dev",
            &["distributedscaledobjects"],
            &["list", "watch", "patch"],
        ),
        // Status by server-side apply.
        rule(
            "kedge.dev",
            &["distributedscaledobjects/status"],
            &["patch"],
        ),
        // Members: listed for a DSO's placement and watched (metadata) by admission: only
        // members with a MemberCluster get a session; a refusal is confirmed by a list (by
        // name, or of all for live sessions). Enrollment creates them, not the hub.
        rule("kedge.dev", &["memberclusters"], &["list", "watch"]),
        rule("kedge.dev", &["memberclusters/status"], &["patch"]),
        // The ScaledObject the hub owns per DSO (and DSJ): watched through the owner,
        // server-side applied. An apply that creates the object is authorized as `create`.
        rule(
            "keda.sh",
            &["scaledobjects"],
            &["list", "watch", "patch", "create"],
        ),
        // Events about DSOs and DSJs (events.k8s.io/v1, created, never updated).
        rule("events.k8s.io", &["events"], &["create"]),
    ];
    if install.enrollment {
        // Enrollment reads the MemberCluster a token names (its uid goes into the
        // certificate).
        rules.push(rule("kedge.dev", &["memberclusters"], &["get"]));
    }
    if install.scaler.is_some() {
        // The ClusterTriggerAuthentication that hands KEDA the scaler's client certificate,
        // server-side applied (never read back). An apply that creates it is authorized as
        // `create` with its name (unlike a POST), so both verbs are for it alone.
        rules.push(named(
            "keda.sh",
            "clustertriggerauthentications",
            TRIGGER_AUTHENTICATION,
            &["patch", "create"],
        ));
    }
    if install.dsj_enabled {
        rules.extend([
            rule(
                "kedge.dev",
                &["distributedscaledjobs"],
                &["list", "watch", "patch"],
            ),
            rule("kedge.dev", &["distributedscaledjobs/status"], &["patch"]),
            // KEDA's trigger values for a DSJ's shadow ScaledObject, read as the HPA reads
            // them. The external metrics API names each metric as a resource, and KEDA names
            // metrics per trigger (`s0-rabbitmq-jobs`), so this is the one rule that cannot
            // list its resources; it is read-only, in a group that serves only metric values.
            rule("external.metrics.k8s.io", &["*"], &["list"]),
        ]);
    }
    rules
}

/// In the hub's namespace: its Lease, by name. RBAC cannot restrict `create` by name (the
/// name is not part of a create's authorization), so `create` is for Leases in that
/// namespace; `get` and `update` only for the hub's own.
fn lease_rules(install: &HubInstall) -> Vec<Value> {
    vec![
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [install.lease_name], "verbs": ["get", "update"]}),
        rule("coordination.k8s.io", &["leases"], &["create"]),
    ]
}

/// In the hub's namespace, with enrollment: the CA Secret (read, created on first start) and
/// the bootstrap token Secrets (read, and deleted to spend a token). Token Secrets are named
/// per member, and RBAC cannot restrict `create` by name, so these verbs cover the Secrets
/// of the hub's own namespace, where nothing but the hub's Secrets belongs.
fn enrollment_rules() -> Vec<Value> {
    vec![rule("", &["secrets"], &["get", "create", "delete"])]
}

/// With the external scaler, in the hub's namespace: the Secret with its CA and
/// certificates, read (and read again when another hub created it first), created on first
/// start by a POST, which RBAC cannot restrict by name, and replaced when renewed.
fn scaler_rules() -> Vec<Value> {
    vec![
        named("", "secrets", TLS_SECRET, &["get", "update"]),
        rule("", &["secrets"], &["create"]),
    ]
}

/// With the external scaler, in KEDA's namespace: KEDA's copy of the client certificate,
/// read to compare and server-side applied when it differs (an apply that creates it is
/// authorized as `create` with its name). No other Secret of KEDA's.
fn scaler_keda_rules() -> Vec<Value> {
    vec![named(
        "",
        "secrets",
        CLIENT_SECRET,
        &["get", "patch", "create"],
    )]
}

/// In the ClusterProfile namespace: the profiles kedge publishes, listed (by its label) at
/// start and every few minutes, server-side applied with their status (an apply that
/// creates one is authorized as `create`), and deleted when their member goes. No `get` or
/// `watch`: the hub reads them only by that list.
fn cluster_profile_rules() -> Vec<Value> {
    vec![
        rule(
            "multicluster.x-k8s.io",
            &["clusterprofiles"],
            &["list", "patch", "create", "delete"],
        ),
        rule(
            "multicluster.x-k8s.io",
            &["clusterprofiles/status"],
            &["patch"],
        ),
    ]
}

/// A Role `name` in `role_ns` with `rules`, and its binding to the hub's ServiceAccount in
/// `ns`.
fn role_in(role_ns: &str, ns: &str, name: &str, rules: Vec<Value>) -> [Value; 2] {
    let subjects = json!([{ "kind": "ServiceAccount", "name": HUB, "namespace": ns }]);
    [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": role_ns, "labels": labels()},
            "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": role_ns, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects}),
    ]
}

/// A Role `name` in the hub's namespace with `rules`, and its binding to the hub.
fn namespaced_role(ns: &str, name: &str, rules: Vec<Value>) -> [Value; 2] {
    role_in(ns, ns, name, rules)
}

/// The hub's ServiceAccount and RBAC, in apply order: ServiceAccount, ClusterRole,
/// ClusterRoleBinding, Role and RoleBinding for the Lease, with enrollment those for its
/// Secrets, with the external scaler those for its Secrets in the hub's and in KEDA's
/// namespace, and when it publishes ClusterProfiles those for them in their namespace. Every
/// namespace must exist.
pub fn hub_rbac(install: &HubInstall) -> Vec<Value> {
    let ns = install.namespace.as_str();
    let mut objects = hub_rbac_base(install);
    if install.enrollment {
        objects.extend(namespaced_role(ns, ENROLLMENT_ROLE, enrollment_rules()));
    }
    if let Some(profiles) = install.cluster_profile_namespace() {
        objects.extend(role_in(
            profiles,
            ns,
            CLUSTER_PROFILES_ROLE,
            cluster_profile_rules(),
        ));
    }
    if let Some(scaler) = &install.scaler {
        objects.extend(namespaced_role(ns, SCALER, scaler_rules()));
        objects.extend(role_in(
            &scaler.keda_namespace,
            ns,
            SCALER,
            scaler_keda_rules(),
        ));
    }
    objects
}

fn hub_rbac_base(install: &HubInstall) -> Vec<Value> {
    let ns = install.namespace.as_str();
    let subjects = json!([{ "kind": "ServiceAccount", "name": HUB, "namespace": ns }]);
    [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": HUB, "namespace": ns, "labels": labels()}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": HUB, "labels": labels()}, "rules": cluster_rules(install)}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": HUB, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": HUB},
            "subjects": subjects}),
    ]
    .into_iter()
    .chain(namespaced_role(ns, LEASE_ROLE, lease_rules(install)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::install::{Grant, grants};

    fn set(items: &[(&str, &str, &str, &str)]) -> BTreeSet<Grant> {
        items
            .iter()
            .map(|(a, b, c, d)| ((*a).into(), (*b).into(), (*c).into(), (*d).into()))
            .collect()
    }

    fn of_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
        objects.iter().find(|o| o["kind"] == kind).unwrap()
    }

    /// The object of `kind` named `name` in `namespace`.
    fn find<'a>(objects: &'a [Value], kind: &str, namespace: &str, name: &str) -> &'a Value {
        objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && o["metadata"]["namespace"] == namespace
            })
            .unwrap_or_else(|| panic!("no {kind} {namespace}/{name}"))
    }

    /// The table is the hub's API calls, one by one (grep the hub for `Api::`): anything
    /// added to the hub that needs more fails here first.
    #[test]
    fn the_hub_may_make_exactly_its_api_calls() {
        let objects = hub_rbac(&HubInstall {
            dsj_enabled: true,
            enrollment: false,
            cluster_profile_namespace: Some("fleet".into()),
            ..HubInstall::default()
        });
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding"
            ]
        );
        // The ClusterProfiles: list at start, server-side apply of object and status
        // (create when new), delete when the member goes; in their namespace only.
        let profiles = "clusterprofiles";
        let mcx = "multicluster.x-k8s.io";
        assert_eq!(
            grants(find(&objects, "Role", "fleet", CLUSTER_PROFILES_ROLE)),
            set(&[
                (mcx, profiles, "list", ""),
                (mcx, profiles, "patch", ""),
                (mcx, profiles, "create", ""),
                (mcx, profiles, "delete", ""),
                (mcx, "clusterprofiles/status", "patch", ""),
            ])
        );
        let dso = "distributedscaledobjects";
        let dsj = "distributedscaledjobs";
        let cta = "clustertriggerauthentications";
        let expected = set(&[
            ("kedge.dev", dso, "list", ""),
            ("kedge.dev", dso, "watch", ""),
            ("kedge.dev", dso, "patch", ""),
            ("kedge.dev", "distributedscaledobjects/status", "patch", ""),
            ("kedge.dev", dsj, "list", ""),
            ("kedge.dev", dsj, "watch", ""),
            ("kedge.dev", dsj, "patch", ""),
            ("kedge.dev", "distributedscaledjobs/status", "patch", ""),
            ("kedge.dev", "memberclusters", "list", ""),
            ("kedge.dev", "memberclusters", "watch", ""),
            ("kedge.dev", "memberclusters/status", "patch", ""),
            ("keda.sh", "scaledobjects", "list", ""),
            ("keda.sh", "scaledobjects", "watch", ""),
            ("keda.sh", "scaledobjects", "patch", ""),
            ("keda.sh", "scaledobjects", "create", ""),
            ("keda.sh", cta, "patch", "kedge-scaler"),
            ("keda.sh", cta, "create", "kedge-scaler"),
            ("events.k8s.io", "events", "create", ""),
            ("external.metrics.k8s.io", "*", "list", ""),
        ]);
        assert_eq!(grants(of_kind(&objects, "ClusterRole")), expected);
        let lease = find(&objects, "Role", "kedge-system", LEASE_ROLE);
        assert_eq!(
            grants(lease),
            set(&[
                ("coordination.k8s.io", "leases", "get", "kedge-hub"),
                ("coordination.k8s.io", "leases", "update", "kedge-hub"),
                ("coordination.k8s.io", "leases", "create", ""),
            ])
        );
        // The external scaler: its Secret in the hub's namespace (get_opt, create, replace),
        // KEDA's copy in KEDA's namespace (get_opt, server-side apply).
        assert_eq!(
            grants(find(&objects, "Role", "kedge-system", SCALER)),
            set(&[
                ("", "secrets", "get", "kedge-scaler-tls"),
                ("", "secrets", "update", "kedge-scaler-tls"),
                ("", "secrets", "create", ""),
            ])
        );
        assert_eq!(
            grants(find(&objects, "Role", "keda", SCALER)),
            set(&[
                ("", "secrets", "get", "kedge-scaler-client"),
                ("", "secrets", "patch", "kedge-scaler-client"),
                ("", "secrets", "create", "kedge-scaler-client"),
            ])
        );
        // Every Role is bound to the hub's ServiceAccount, in its own namespace.
        for (ns, name) in [
            ("kedge-system", LEASE_ROLE),
            ("kedge-system", SCALER),
            ("keda", SCALER),
            ("fleet", CLUSTER_PROFILES_ROLE),
        ] {
            let binding = find(&objects, "RoleBinding", ns, name);
            assert_eq!(binding["roleRef"]["name"], name);
            assert_eq!(
                binding["subjects"],
                json!([{"kind": "ServiceAccount", "name": HUB, "namespace": "kedge-system"}])
            );
        }
    }

    /// With enrollment, Secrets only in the hub's own namespace, and only what enrollment
    /// does with them; the MemberCluster a token names is read, never written.
    #[test]
    fn enrollment_adds_only_its_secrets_in_the_hub_namespace() {
        let objects = hub_rbac(&HubInstall {
            scaler: None,
            ..HubInstall::default()
        });
        let enrollment = find(&objects, "Role", "kedge-system", ENROLLMENT_ROLE);
        assert_eq!(
            grants(enrollment),
            set(&[
                ("", "secrets", "get", ""),
                ("", "secrets", "create", ""),
                ("", "secrets", "delete", ""),
            ])
        );
        let cluster = grants(of_kind(&objects, "ClusterRole"));
        assert!(cluster.iter().all(|(_, r, _, _)| r != "secrets"));
        assert!(cluster.contains(&(
            "kedge.dev".into(),
            "memberclusters".into(),
            "get".into(),
            "".into()
        )));
        let bindings = objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding")
            .count();
        assert_eq!(bindings, 3, "the Lease, enrollment, ClusterProfiles");
    }

    /// The scaler reaches into KEDA's namespace for one Secret by name and into the cluster
    /// for one ClusterTriggerAuthentication by name; without it, neither.
    #[test]
    fn the_scaler_adds_only_its_named_secrets_and_trigger_authentication() {
        let install = HubInstall {
            namespace: "kedge".into(),
            scaler: Some(ScalerInstall {
                keda_namespace: "keda-system".into(),
                ..ScalerInstall::default()
            }),
            ..HubInstall::default()
        };
        let with = hub_rbac(&install);
        let keda = find(&with, "Role", "keda-system", SCALER);
        assert!(
            grants(keda)
                .iter()
                .all(|(g, r, _, n)| g.is_empty() && r == "secrets" && n == "kedge-scaler-client"),
            "{keda}"
        );
        assert_eq!(
            find(&with, "RoleBinding", "keda-system", SCALER)["subjects"][0]["namespace"],
            "kedge"
        );
        let own = grants(find(&with, "Role", "kedge", SCALER));
        // Only `create`, which RBAC cannot restrict by name, is for any Secret (of the hub's
        // own namespace).
        assert!(
            own.iter()
                .all(|(_, _, v, n)| n == "kedge-scaler-tls" || v == "create")
        );
        let cluster = grants(of_kind(&with, "ClusterRole"));
        let ctas: Vec<&Grant> = cluster
            .iter()
            .filter(|(_, r, _, _)| r == "clustertriggerauthentications")
            .collect();
        assert_eq!(ctas.len(), 2);
        assert!(ctas.iter().all(|(_, _, _, n)| n == "kedge-scaler"));

        let without = hub_rbac(&HubInstall {
            scaler: None,
            ..install
        });
        assert!(without.iter().all(|o| o["metadata"]["name"] != SCALER));
        assert!(
            grants(of_kind(&without, "ClusterRole"))
                .iter()
                .all(|(_, r, _, _)| r != "clustertriggerauthentications")
        );
    }

    /// ClusterProfiles go to the hub's namespace unless told otherwise; turned off, the hub
    /// may not touch them at all.
    #[test]
    fn cluster_profile_rules_follow_the_publisher() {
        let install = HubInstall {
            namespace: "kedge".into(),
            ..HubInstall::default()
        };
        assert_eq!(install.cluster_profile_namespace(), Some("kedge"));
        let with = hub_rbac(&install);
        find(&with, "Role", "kedge", CLUSTER_PROFILES_ROLE);
        let cluster = grants(of_kind(&with, "ClusterRole"));
        assert!(
            cluster
                .iter()
                .all(|(g, _, _, _)| g != "multicluster.x-k8s.io")
        );
        let without = hub_rbac(&HubInstall {
            cluster_profiles: false,
            ..install
        });
        assert!(
            without
                .iter()
                .all(|o| o["metadata"]["name"] != CLUSTER_PROFILES_ROLE)
        );
    }

    #[test]
    fn no_secrets_no_workloads_and_one_justified_wildcard() {
        for dsj_enabled in [false, true] {
            let objects = hub_rbac(&HubInstall {
                namespace: "kedge".into(),
                lease_name: "hub-lease".into(),
                dsj_enabled,
                enrollment: false,
                scaler: None,
                cluster_profiles: false,
                cluster_profile_namespace: None,
            });
            let all: Vec<Grant> = grants(of_kind(&objects, "ClusterRole"))
                .into_iter()
                .chain(grants(of_kind(&objects, "Role")))
                .collect();
            for (group, resource, verb, _) in &all {
                assert!(
                    !["secrets", "pods", "deployments", "jobs", "configmaps"]
                        .contains(&resource.as_str()),
                    "{resource}"
                );
                assert!(!group.contains('*') && !verb.contains('*'));
                if resource.contains('*') {
                    assert_eq!(
                        (group.as_str(), verb.as_str()),
                        ("external.metrics.k8s.io", "list")
                    );
                }
                assert!(
                    !["delete", "deletecollection", "escalate", "bind"].contains(&verb.as_str())
                );
            }
            let dsj = all
                .iter()
                .any(|(_, r, _, _)| r.starts_with("distributedscaledjobs"));
            assert_eq!(dsj, dsj_enabled, "DSJ rules only with the DSJ controller");
            let lease = of_kind(&objects, "Role");
            assert_eq!(lease["metadata"]["namespace"], "kedge");
            assert_eq!(lease["rules"][0]["resourceNames"], json!(["hub-lease"]));
            assert_eq!(
                of_kind(&objects, "ClusterRoleBinding")["subjects"][0]["namespace"],
                "kedge"
            );
        }
    }
}

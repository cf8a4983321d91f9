//! RBAC authorization with the rules of kube-apiserver's RBAC authorizer
//! (`plugin/pkg/auth/authorizer/rbac`): ClusterRoleBindings first, then the RoleBindings of
//! the request's namespace; `*` verbs, groups and resources, `*/subresource`,
//! `resourceNames`, non-resource URLs with a trailing `*`; members of `system:masters` are
//! always allowed, as the apiserver's privileged-group authorizer does.
//!
//! Limits: role aggregation is whatever `rules` the aggregated ClusterRole already holds
//! (the aggregation controller is not modelled); there is no impersonation.

use serde_json::Value;

/// Where the authorizer finds RBAC objects (as `rbac.authorization.k8s.io/v1` JSON).
pub trait RbacSource {
    /// The Role `name` in `namespace`.
    fn role(&self, namespace: &str, name: &str) -> Option<Value>;
    /// The ClusterRole `name`.
    fn cluster_role(&self, name: &str) -> Option<Value>;
    /// Every RoleBinding in `namespace`.
    fn role_bindings(&self, namespace: &str) -> Vec<Value>;
    /// Every ClusterRoleBinding.
    fn cluster_role_bindings(&self) -> Vec<Value>;
}

/// An [`RbacSource`] over a flat list of RBAC objects told apart by `kind` (`Role`,
/// `ClusterRole`, `RoleBinding`, `ClusterRoleBinding`; anything else is ignored), e.g.
/// everything a store lists under `rbac.authorization.k8s.io`.
#[derive(Debug, Clone, Copy)]
pub struct RbacObjects<'a>(pub &'a [Value]);

impl RbacObjects<'_> {
    fn of_kind<'s>(&'s self, kind: &'s str) -> impl Iterator<Item = &'s Value> + 's {
        self.0.iter().filter(move |o| str_field(o, "/kind") == kind)
    }
}

impl RbacSource for RbacObjects<'_> {
    fn role(&self, namespace: &str, name: &str) -> Option<Value> {
        self.of_kind("Role")
            .find(|r| {
                str_field(r, "/metadata/namespace") == namespace
                    && str_field(r, "/metadata/name") == name
            })
            .cloned()
    }

    fn cluster_role(&self, name: &str) -> Option<Value> {
        self.of_kind("ClusterRole")
            .find(|r| str_field(r, "/metadata/name") == name)
            .cloned()
    }

    fn role_bindings(&self, namespace: &str) -> Vec<Value> {
        self.of_kind("RoleBinding")
            .filter(|b| str_field(b, "/metadata/namespace") == namespace)
            .cloned()
            .collect()
    }

    fn cluster_role_bindings(&self) -> Vec<Value> {
        self.of_kind("ClusterRoleBinding").cloned().collect()
    }
}

/// The authenticated user of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// `alice`, or `system:serviceaccount:NS:NAME`.
    pub name: String,
    /// The user's groups.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The user a ServiceAccount token authenticates as, with its three groups.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// A plain user in `groups` plus `system:authenticated`.
    pub fn user(name: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        UserInfo {
            name: name.to_owned(),
            groups,
        }
    }
}

/// What a request wants to do, as the apiserver's `RequestInfo` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// Whether this is a resource request (else a non-resource URL such as `/healthz`).
    pub resource_request: bool,
    /// The namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// The API group, empty for the core group.
    pub api_group: String,
    /// The resource (plural), e.g. `deployments`.
    pub resource: String,
    /// The subresource, e.g. `scale`, or empty.
    pub subresource: String,
    /// The object name, empty for list/create/collection requests.
    pub name: String,
    /// The URL path (used for non-resource requests).
    pub path: String,
}

impl RequestAttributes {
    /// A resource request.
    pub fn resource(verb: &str, api_group: &str, resource: &str, namespace: &str) -> Self {
        RequestAttributes {
            verb: verb.to_owned(),
            resource_request: true,
            namespace: namespace.to_owned(),
            api_group: api_group.to_owned(),
            resource: resource.to_owned(),
            ..Default::default()
        }
    }

    /// Sets the object name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Sets the subresource.
    pub fn subresource(mut self, subresource: &str) -> Self {
        self.subresource = subresource.to_owned();
        self
    }

    /// A non-resource request (`/healthz`, `/version`, `/apis`).
    pub fn non_resource(verb: &str, path: &str) -> Self {
        RequestAttributes {
            verb: verb.to_owned(),
            path: path.to_owned(),
            ..Default::default()
        }
    }
}

/// The authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// `RBAC: allowed by ...` when allowed; when denied, empty or the resolution errors
    /// (`RBAC: clusterrole.rbac.authorization.k8s.io "x" not found`).
    pub reason: String,
}

fn str_field<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn subject_applies(subject: &Value, user: &UserInfo, binding_namespace: &str) -> bool {
    let name = str_field(subject, "/name");
    match str_field(subject, "/kind") {
        "User" => user.name == name,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = match str_field(subject, "/namespace") {
                "" => binding_namespace,
                ns => ns,
            };
            !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn describe_subject(subject: &Value, binding_namespace: &str) -> String {
    let kind = str_field(subject, "/kind");
    let name = str_field(subject, "/name");
    if kind == "ServiceAccount" {
        let ns = match str_field(subject, "/namespace") {
            "" => binding_namespace,
            ns => ns,
        };
        return format!("{kind} {:?}", format!("{name}/{ns}"));
    }
    format!("{kind} {name:?}")
}

/// Whether one `PolicyRule` allows the request (`rbac.RuleAllows`).
pub fn rule_allows(rule: &Value, attrs: &RequestAttributes) -> bool {
    let verbs = strings(rule, "verbs");
    if !verbs.iter().any(|v| v == "*" || *v == attrs.verb) {
        return false;
    }
    if !attrs.resource_request {
        return strings(rule, "nonResourceURLs").iter().any(|u| {
            u == "*"
                || *u == attrs.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| attrs.path.starts_with(prefix))
        });
    }
    if !strings(rule, "apiGroups")
        .iter()
        .any(|g| g == "*" || *g == attrs.api_group)
    {
        return false;
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resource_ok = strings(rule, "resources").iter().any(|r| {
        r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule, "resourceNames");
    names.is_empty() || names.contains(&attrs.name)
}

/// Authorizes `attrs` for `user` against the RBAC objects of `src`.
pub fn authorize(src: &impl RbacSource, user: &UserInfo, attrs: &RequestAttributes) -> Decision {
    if user.groups.iter().any(|g| g == "system:masters") {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut errors: Vec<String> = Vec::new();
    let resolve = |ref_kind: &str, ref_name: &str, ns: &str, errors: &mut Vec<String>| {
        let role = match ref_kind {
            "ClusterRole" => src.cluster_role(ref_name),
            "Role" if !ns.is_empty() => src.role(ns, ref_name),
            _ => None,
        };
        if role.is_none() {
            errors.push(format!(
                "{}.rbac.authorization.k8s.io {ref_name:?} not found",
                ref_kind.to_lowercase()
            ));
        }
        role
    };
    let allows = |role: &Value| {
        role.get("rules")
            .and_then(Value::as_array)
            .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, attrs)))
    };

    for b in src.cluster_role_bindings() {
        let Some(subject) = b
            .get("subjects")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().find(|s| subject_applies(s, user, "")))
        else {
            continue;
        };
        let (kind, name) = (
            str_field(&b, "/roleRef/kind"),
            str_field(&b, "/roleRef/name"),
        );
        if kind != "ClusterRole" {
            continue;
        }
        if resolve(kind, name, "", &mut errors).is_some_and(|r| allows(&r)) {
            return Decision {
                allowed: true,
                reason: format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {name:?} to {}",
                    str_field(&b, "/metadata/name"),
                    describe_subject(subject, "")
                ),
            };
        }
    }
    if !attrs.namespace.is_empty() {
        for b in src.role_bindings(&attrs.namespace) {
            let Some(subject) = b.get("subjects").and_then(Value::as_array).and_then(|s| {
                s.iter()
                    .find(|s| subject_applies(s, user, &attrs.namespace))
            }) else {
                continue;
            };
            let (kind, name) = (
                str_field(&b, "/roleRef/kind"),
                str_field(&b, "/roleRef/name"),
            );
            if resolve(kind, name, &attrs.namespace, &mut errors).is_some_and(|r| allows(&r)) {
                return Decision {
                    allowed: true,
                    reason: format!(
                        "RBAC: allowed by RoleBinding {:?} of {kind} {name:?} to {}",
                        format!("{}/{}", str_field(&b, "/metadata/name"), attrs.namespace),
                        describe_subject(subject, &attrs.namespace)
                    ),
                };
            }
        }
    }
    Decision {
        allowed: false,
        reason: if errors.is_empty() {
            String::new()
        } else if let [one] = errors.as_slice() {
            format!("RBAC: {one}")
        } else {
            format!("RBAC: [{}]", errors.join(", "))
        },
    }
}

/// The `Status.message` of the 403 Forbidden the real server returns for a denied
/// request, e.g. `pods "p" is forbidden: User "alice" cannot get resource "pods" in API
/// group "" in the namespace "ns"`.
pub fn forbidden_message(user: &UserInfo, attrs: &RequestAttributes, reason: &str) -> String {
    let mut msg = if !attrs.resource_request {
        format!(
            "User {:?} cannot {} path {:?}",
            user.name, attrs.verb, attrs.path
        )
    } else {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        if attrs.namespace.is_empty() {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                user.name, attrs.verb, attrs.api_group
            )
        } else {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                user.name, attrs.verb, attrs.api_group, attrs.namespace
            )
        }
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    if !attrs.resource_request {
        return format!("forbidden: {msg}");
    }
    let qualified = if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {msg}")
    } else {
        format!("{qualified} {:?} is forbidden: {msg}", attrs.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Default)]
    struct Objects {
        roles: Vec<Value>,
        cluster_roles: Vec<Value>,
        role_bindings: Vec<Value>,
        cluster_role_bindings: Vec<Value>,
    }

    fn name_of(v: &Value) -> &str {
        str_field(v, "/metadata/name")
    }

    impl RbacSource for Objects {
        fn role(&self, namespace: &str, name: &str) -> Option<Value> {
            self.roles
                .iter()
                .find(|r| name_of(r) == name && str_field(r, "/metadata/namespace") == namespace)
                .cloned()
        }
        fn cluster_role(&self, name: &str) -> Option<Value> {
            self.cluster_roles
                .iter()
                .find(|r| name_of(r) == name)
                .cloned()
        }
        fn role_bindings(&self, namespace: &str) -> Vec<Value> {
            self.role_bindings
                .iter()
                .filter(|b| str_field(b, "/metadata/namespace") == namespace)
                .cloned()
                .collect()
        }
        fn cluster_role_bindings(&self) -> Vec<Value> {
            self.cluster_role_bindings.clone()
        }
    }

    fn fixture() -> Objects {
        Objects {
            roles: vec![json!({
                "metadata": {"name": "agent", "namespace": "apps"},
                "rules": [
                    {"apiGroups": ["apps"], "resources": ["deployments/scale", "statefulsets/scale"],
                     "verbs": ["get", "update", "patch"]},
                    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]},
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                     "resourceNames": ["agent-config"]}
                ]
            })],
            cluster_roles: vec![
                json!({"metadata": {"name": "read-nodes"}, "rules": [
                    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
                    {"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}
                ]}),
                json!({"metadata": {"name": "scaler"}, "rules": [
                    {"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get", "update"]}
                ]}),
            ],
            role_bindings: vec![
                json!({"metadata": {"name": "agent", "namespace": "apps"},
                       "roleRef": {"kind": "Role", "name": "agent"},
                       "subjects": [{"kind": "ServiceAccount", "name": "kedge-agent",
                                     "namespace": "kedge-system"}]}),
                json!({"metadata": {"name": "scalers", "namespace": "apps"},
                       "roleRef": {"kind": "ClusterRole", "name": "scaler"},
                       "subjects": [{"kind": "Group", "name": "scalers"}]}),
                json!({"metadata": {"name": "local-sa", "namespace": "apps"},
                       "roleRef": {"kind": "ClusterRole", "name": "read-nodes"},
                       "subjects": [{"kind": "ServiceAccount", "name": "local"}]}),
                json!({"metadata": {"name": "dangling", "namespace": "other"},
                       "roleRef": {"kind": "Role", "name": "missing"},
                       "subjects": [{"kind": "User", "name": "bob"}]}),
            ],
            cluster_role_bindings: vec![json!({
                "metadata": {"name": "agent-read"},
                "roleRef": {"kind": "ClusterRole", "name": "read-nodes"},
                "subjects": [{"kind": "ServiceAccount", "name": "kedge-agent",
                              "namespace": "kedge-system"},
                             {"kind": "User", "name": "alice"}]
            })],
        }
    }

    fn agent() -> UserInfo {
        UserInfo::service_account("kedge-system", "kedge-agent")
    }

    fn allowed(user: &UserInfo, attrs: &RequestAttributes) -> bool {
        authorize(&fixture(), user, attrs).allowed
    }

    #[test]
    fn agent_minimal_rbac() {
        let a = agent();
        let scale = RequestAttributes::resource("update", "apps", "deployments", "apps")
            .named("web")
            .subresource("scale");
        assert!(allowed(&a, &scale));
        // The deployment itself is not writable, nor scale in another namespace.
        let deploy =
            RequestAttributes::resource("update", "apps", "deployments", "apps").named("web");
        assert!(!allowed(&a, &deploy));
        let elsewhere = RequestAttributes::resource("update", "apps", "deployments", "default")
            .named("web")
            .subresource("scale");
        assert!(!allowed(&a, &elsewhere));
        for verb in ["create", "delete", "list", "watch", "deletecollection"] {
            assert!(
                allowed(
                    &a,
                    &RequestAttributes::resource(verb, "batch", "jobs", "apps")
                ),
                "{verb}"
            );
        }
        // Jobs in a different group name do not match.
        assert!(!allowed(
            &a,
            &RequestAttributes::resource("create", "", "jobs", "apps")
        ));
        // Cluster-wide reads via the ClusterRoleBinding, in any namespace and cluster scope.
        assert!(allowed(
            &a,
            &RequestAttributes::resource("list", "", "pods", "")
        ));
        assert!(allowed(
            &a,
            &RequestAttributes::resource("watch", "", "nodes", "")
        ));
        assert!(!allowed(
            &a,
            &RequestAttributes::resource("delete", "", "nodes", "").named("n1")
        ));
        // The status subresource is not covered by "pods".
        assert!(!allowed(
            &a,
            &RequestAttributes::resource("get", "", "pods", "apps")
                .named("p")
                .subresource("status")
        ));
    }

    #[test]
    fn resource_names() {
        let a = agent();
        let get =
            |name: &str| RequestAttributes::resource("get", "", "configmaps", "apps").named(name);
        assert!(allowed(&a, &get("agent-config")));
        assert!(!allowed(&a, &get("other")));
        // A list has no name, so a resourceNames rule does not grant it.
        assert!(!allowed(
            &a,
            &RequestAttributes::resource("list", "", "configmaps", "apps")
        ));
    }

    #[test]
    fn groups_wildcards_and_subresource_wildcard() {
        let u = UserInfo::user("carol", &["scalers"]);
        let scale = |group: &str, res: &str| {
            RequestAttributes::resource("update", group, res, "apps")
                .named("x")
                .subresource("scale")
        };
        assert!(allowed(&u, &scale("apps", "statefulsets")));
        assert!(allowed(&u, &scale("kedge.dev", "distributedscaledobjects")));
        assert!(!allowed(
            &u,
            &RequestAttributes::resource("update", "apps", "deployments", "apps")
        ));
        assert!(!allowed(
            &u,
            &RequestAttributes::resource("update", "apps", "deployments", "apps")
                .subresource("status")
        ));
        assert!(!allowed(
            &UserInfo::user("dave", &[]),
            &scale("apps", "statefulsets")
        ));
    }

    #[test]
    fn service_account_subject_defaults_to_binding_namespace() {
        let local = UserInfo::service_account("apps", "local");
        assert!(allowed(
            &local,
            &RequestAttributes::resource("get", "", "pods", "apps").named("p")
        ));
        let other = UserInfo::service_account("other", "local");
        assert!(!allowed(
            &other,
            &RequestAttributes::resource("get", "", "pods", "apps").named("p")
        ));
    }

    #[test]
    fn non_resource_urls() {
        let alice = UserInfo::user("alice", &[]);
        assert!(allowed(
            &alice,
            &RequestAttributes::non_resource("get", "/healthz")
        ));
        assert!(allowed(
            &alice,
            &RequestAttributes::non_resource("get", "/apis/apps/v1")
        ));
        assert!(!allowed(
            &alice,
            &RequestAttributes::non_resource("get", "/metrics")
        ));
        assert!(!allowed(
            &alice,
            &RequestAttributes::non_resource("post", "/healthz")
        ));
    }

    #[test]
    fn masters_and_reasons() {
        let root = UserInfo::user("admin", &["system:masters"]);
        assert!(allowed(
            &root,
            &RequestAttributes::resource("delete", "", "nodes", "").named("n")
        ));

        let d = authorize(
            &fixture(),
            &agent(),
            &RequestAttributes::resource("list", "", "pods", "apps"),
        );
        assert_eq!(
            d.reason,
            "RBAC: allowed by ClusterRoleBinding \"agent-read\" of ClusterRole \"read-nodes\" to \
             ServiceAccount \"kedge-agent/kedge-system\""
        );
        let d = authorize(
            &fixture(),
            &agent(),
            &RequestAttributes::resource("create", "batch", "jobs", "apps"),
        );
        assert_eq!(
            d.reason,
            "RBAC: allowed by RoleBinding \"agent/apps\" of Role \"agent\" to ServiceAccount \
             \"kedge-agent/kedge-system\""
        );
        let bob = UserInfo::user("bob", &[]);
        let d = authorize(
            &fixture(),
            &bob,
            &RequestAttributes::resource("get", "", "pods", "other"),
        );
        assert_eq!(
            d,
            Decision {
                allowed: false,
                reason: "RBAC: role.rbac.authorization.k8s.io \"missing\" not found".into()
            }
        );
    }

    #[test]
    fn flat_object_list_source() {
        let objects = vec![
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "a"},
                   "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "b"},
                   "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "rb", "namespace": "a"},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "User", "name": "eve"}]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "nodes"},
                   "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "crb"},
                   "roleRef": {"kind": "ClusterRole", "name": "nodes"},
                   "subjects": [{"kind": "Group", "name": "ops"}]}),
            json!({"kind": "ConfigMap", "metadata": {"name": "r", "namespace": "a"}}),
        ];
        let src = RbacObjects(&objects);
        let eve = UserInfo::user("eve", &["ops"]);
        let get = |ns: &str| RequestAttributes::resource("get", "", "pods", ns).named("p");
        assert!(authorize(&src, &eve, &get("a")).allowed);
        assert!(
            !authorize(&src, &eve, &get("b")).allowed,
            "the binding is in namespace a"
        );
        let del = RequestAttributes::resource("delete", "", "pods", "a").named("p");
        assert!(
            !authorize(&src, &eve, &del).allowed,
            "namespace a's role only allows get"
        );
        let nodes = RequestAttributes::resource("list", "", "nodes", "");
        assert!(authorize(&src, &eve, &nodes).allowed);
        assert!(!authorize(&src, &UserInfo::user("mallory", &[]), &nodes).allowed);
    }

    #[test]
    fn forbidden_messages() {
        let bob = UserInfo::user("bob", &[]);
        let get = RequestAttributes::resource("get", "", "pods", "ns").named("p1");
        assert_eq!(
            forbidden_message(&bob, &get, ""),
            "pods \"p1\" is forbidden: User \"bob\" cannot get resource \"pods\" in API group \"\" \
             in the namespace \"ns\""
        );
        let list = RequestAttributes::resource("list", "apps", "deployments", "");
        assert_eq!(
            forbidden_message(&bob, &list, ""),
            "deployments.apps is forbidden: User \"bob\" cannot list resource \"deployments\" in \
             API group \"apps\" at the cluster scope"
        );
        let scale = RequestAttributes::resource("patch", "apps", "deployments", "ns")
            .named("web")
            .subresource("scale");
        assert_eq!(
            forbidden_message(&bob, &scale, "RBAC: x"),
            "deployments.apps \"web\" is forbidden: User \"bob\" cannot patch resource \
             \"deployments/scale\" in API group \"apps\" in the namespace \"ns\": RBAC: x"
        );
        assert_eq!(
            forbidden_message(
                &bob,
                &RequestAttributes::non_resource("get", "/metrics"),
                ""
            ),
            "forbidden: User \"bob\" cannot get path \"/metrics\""
        );
    }
}

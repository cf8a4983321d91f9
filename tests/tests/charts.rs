//! The Helm charts in `deploy/charts`, rendered by the real Helm engine (helm-python-sdk):
//! their RBAC and the agent's flags are exactly what kedge's Rust renderers produce for the
//! same settings (`kedge_hub::install`, the source of truth that `setup-member` applies),
//! every object validates against the Kubernetes schemas, `lint` is clean, and bad values are
//! refused by `values.schema.json` with a message naming the value.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};

use clap::Parser;
use k8s_openapi::ByteString;
use kedge_agent::config::AgentArgs;
use kedge_hub::install::agent::{BOOTSTRAP_SECRET, agent_args};
use kedge_hub::install::{
    AgentInstall, AgentKind, AgentNamespaces, Credentials, HubDeployment, HubInstall,
    ScalerInstall, ServiceType, agent_helm_values, agent_manifests, hub_helm_values, hub_manifests,
    hub_rbac,
};
use serde::Deserialize;
use serde_json::{Value, json};
use support::helm::{self, Rendered};

const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

fn texts(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Each RBAC object by (kind, namespace, name) with what it grants or binds, one line per
/// grant (`group resource verb [resourceName]`), so two renderings compare as sets.
fn rbac(objects: &[&Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for o in objects
        .iter()
        .filter(|o| RBAC_KINDS.iter().any(|k| o["kind"] == *k))
    {
        let key = format!(
            "{} {}/{}",
            o["kind"].as_str().unwrap_or(""),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        );
        let mut lines = BTreeSet::new();
        for r in o["rules"].as_array().into_iter().flatten() {
            let mut names = texts(&r["resourceNames"]);
            if names.is_empty() {
                names.push(String::new());
            }
            for g in texts(&r["apiGroups"]) {
                for res in texts(&r["resources"]) {
                    for v in texts(&r["verbs"]) {
                        for n in &names {
                            lines.insert(format!("rule {g:?} {res} {v} {n}").trim_end().to_owned());
                        }
                    }
                }
            }
        }
        if !o["roleRef"].is_null() {
            lines.insert(format!(
                "roleRef {}/{}",
                o["roleRef"]["kind"].as_str().unwrap_or(""),
                o["roleRef"]["name"].as_str().unwrap_or("")
            ));
        }
        for s in o["subjects"].as_array().into_iter().flatten() {
            lines.insert(format!(
                "subject {} {}/{}",
                s["kind"].as_str().unwrap_or(""),
                s["namespace"].as_str().unwrap_or(""),
                s["name"].as_str().unwrap_or("")
            ));
        }
        out.insert(key, lines);
    }
    out
}

/// Fails naming every object and grant the chart and the Rust renderer disagree on.
fn assert_same_rbac(case: &str, chart: &Rendered, rust: &[Value]) {
    let chart = rbac(&chart.objects.iter().collect::<Vec<_>>());
    let rust = rbac(&rust.iter().collect::<Vec<_>>());
    let mut differences = Vec::new();
    for key in chart.keys().chain(rust.keys()).collect::<BTreeSet<_>>() {
        match (chart.get(key), rust.get(key)) {
            (Some(_), None) => differences.push(format!("{key}: only in the chart")),
            (None, Some(_)) => differences.push(format!("{key}: only in the Rust renderer")),
            (Some(c), Some(r)) => {
                for extra in c.difference(r) {
                    differences.push(format!("{key}: the chart adds {extra}"));
                }
                for missing in r.difference(c) {
                    differences.push(format!("{key}: the chart lacks {missing}"));
                }
            }
            (None, None) => {}
        }
    }
    assert!(
        differences.is_empty(),
        "{case}: chart RBAC differs from kedge_hub::install:\n  {}",
        differences.join("\n  ")
    );
}

fn rendered(chart: &str, namespace: &str, values: &Value) -> Rendered {
    let r = helm::render(chart, namespace, values)
        .unwrap_or_else(|e| panic!("{chart} refused {values}: {e}"));
    assert!(
        r.invalid.is_empty(),
        "{chart} with {values}: objects the Kubernetes schemas refuse:\n{}",
        r.invalid.join("\n")
    );
    assert!(
        r.unvalidated.iter().all(|k| k == "ServiceMonitor"),
        "{chart}: kinds without a schema: {:?}",
        r.unvalidated
    );
    r
}

/// (case, release namespace, values, the same settings for `hub_rbac`).
fn hub_cases() -> Vec<(&'static str, &'static str, Value, HubInstall)> {
    vec![
        ("defaults", "kedge-system", json!({}), HubInstall::default()),
        (
            "DSJ, another namespace and Lease, NodePort, every option on",
            "kedge",
            json!({
                "dsj": {"enabled": true},
                "dso": {"enabled": false},
                "lease": {"name": "hub-lease", "duration": "20s"},
                "log": {"format": "text", "level": "debug"},
                "heartbeat": {"interval": "2s", "tolerance": 5},
                "server": {"dnsNames": ["hub.example.com"], "ips": ["10.0.0.9", "fd00::9"]},
                "quic": {"port": 7000, "service": {"type": "NodePort", "nodePort": 30443,
                    "externalTrafficPolicy": "Local"}},
                "replicas": 2,
                "sharding": {"enabled": true},
                "serviceMonitor": {"enabled": true},
                "podDisruptionBudget": {"enabled": true},
                "networkPolicy": {"enabled": true},
                "scaler": {"port": 9443, "kedaNamespace": "keda-system", "certLifetime": "7d",
                    "address": "scaler.example:443"},
                "clusterProfiles": {"namespace": "fleet"},
            }),
            HubInstall {
                namespace: "kedge".into(),
                lease_name: "hub-lease".into(),
                dsj_enabled: true,
                enrollment: true,
                scaler: Some(scaler_elsewhere()),
                cluster_profiles: true,
                cluster_profile_namespace: Some("fleet".into()),
            },
        ),
        (
            "ClusterIP",
            "kedge-system",
            json!({"quic": {"service": {"type": "ClusterIP"}}}),
            HubInstall::default(),
        ),
        (
            "no scaler",
            "kedge-system",
            json!({"scaler": {"enabled": false}}),
            HubInstall {
                scaler: None,
                ..HubInstall::default()
            },
        ),
        (
            "no ClusterProfiles",
            "kedge-system",
            json!({"clusterProfiles": {"enabled": false}}),
            HubInstall {
                cluster_profiles: false,
                ..HubInstall::default()
            },
        ),
    ]
}

/// The scaler of the "every option on" case: another port, KEDA namespace, lifetime and
/// address.
fn scaler_elsewhere() -> ScalerInstall {
    ScalerInstall {
        keda_namespace: "keda-system".into(),
        port: 9443,
        cert_lifetime: "7d".into(),
        address: "scaler.example:443".into(),
    }
}

#[test]
fn hub_chart_rbac_is_what_hub_rbac_renders() {
    for (case, namespace, values, install) in hub_cases() {
        let chart = rendered("kedge-hub", namespace, &values);
        assert_same_rbac(case, &chart, &hub_rbac(&install));
    }
}

fn object_keys<'a>(objects: impl Iterator<Item = &'a Value>) -> BTreeSet<String> {
    objects
        .filter(|o| o["kind"] != "Namespace")
        .map(|o| {
            format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The chart rendered with `hub_helm_values` is what `hub_manifests` (`kubectl kedge install
/// hub`) renders for the same settings: objects, RBAC, the Deployment's pod and container,
/// the Services.
#[test]
fn hub_chart_is_what_hub_manifests_renders() {
    let other = HubDeployment {
        rbac: HubInstall {
            namespace: "kedge".into(),
            lease_name: "hub-lease".into(),
            dsj_enabled: true,
            enrollment: true,
            scaler: Some(scaler_elsewhere()),
            cluster_profiles: true,
            cluster_profile_namespace: Some("fleet".into()),
        },
        dso_enabled: false,
        image: "registry.example/kedge-hub".into(),
        tag: "1.2.3".into(),
        replicas: 2,
        sharding: true,
        quic_port: 7000,
        ops_port: 9090,
        service_type: ServiceType::NodePort,
        heartbeat_interval: "2s".into(),
        heartbeat_tolerance: 5,
        lease_duration: "20s".into(),
        log_format: "text".into(),
        log_level: "debug".into(),
        server_dns_names: vec!["hub.example.com".into(), "kedge.example.com".into()],
        server_ips: vec!["10.0.0.9".into()],
        server_cert_lifetime: "60d".into(),
        member_cert_lifetime: "12h".into(),
        ops_token_secret: Some("hub-ops-token".into()),
    };
    let mut no_scaler = HubDeployment::default();
    no_scaler.rbac.scaler = None;
    let mut no_profiles = HubDeployment::default();
    no_profiles.rbac.cluster_profiles = false;
    for d in [HubDeployment::default(), other, no_scaler, no_profiles] {
        d.validate().unwrap();
        let case = format!("{:?}, {:?}", d.rbac, d.service_type);
        let chart = rendered("kedge-hub", &d.rbac.namespace, &hub_helm_values(&d));
        let rust = hub_manifests(&d);
        assert_hub_chart(&case, &chart, &rust);
    }
}

/// Fails naming the first difference between the hub chart as rendered and `rust`, the
/// objects of `hub_manifests` (or `kubectl kedge install hub`).
fn assert_hub_chart(case: &str, chart: &Rendered, rust: &[Value]) {
    let rust: Vec<Value> = rust
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
        .cloned()
        .collect();
    assert_eq!(
        object_keys(chart.objects.iter()),
        object_keys(rust.iter()),
        "{case}: objects"
    );
    assert_same_rbac(case, chart, &rust);
    let find = |kind: &str, name: &str| {
        rust.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap()
            .clone()
    };
    let (cd, rd) = (
        chart.get("Deployment", "kedge-hub"),
        find("Deployment", "kedge-hub"),
    );
    for pointer in [
        "/spec/replicas",
        "/spec/strategy",
        "/spec/selector",
        "/spec/template/spec/serviceAccountName",
        "/spec/template/spec/terminationGracePeriodSeconds",
        "/spec/template/spec/securityContext",
        "/spec/template/spec/volumes",
    ] {
        assert_eq!(
            cd.pointer(pointer),
            rd.pointer(pointer),
            "{case}: {pointer}"
        );
    }
    let (cc, rc) = (
        &cd["spec"]["template"]["spec"]["containers"][0],
        &rd["spec"]["template"]["spec"]["containers"][0],
    );
    for field in [
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
        "image",
        "imagePullPolicy",
    ] {
        assert_eq!(cc[field], rc[field], "{case}: container {field}");
    }
    for name in ["kedge-hub", "kedge-hub-metrics", "kedge-hub-scaler"] {
        if !rust
            .iter()
            .any(|o| o["kind"] == "Service" && o["metadata"]["name"] == name)
        {
            continue;
        }
        let (cs, rs) = (chart.get("Service", name), find("Service", name));
        for field in ["type", "ports", "selector"] {
            assert_eq!(
                cs["spec"][field], rs["spec"][field],
                "{case}: Service {name} {field}"
            );
        }
    }
}

/// The hub's flags as `FLAG -> value` from the container's args (every flag takes a value).
fn flags(container: &Value) -> BTreeMap<String, String> {
    let args = texts(&container["args"]);
    assert_eq!(args.len() % 2, 0, "{args:?}");
    args.chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

fn assert_hardened(pod: &Value, container: &Value) {
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "ops");
}

#[test]
fn hub_chart_runs_the_hub_hardened_with_the_values_given() {
    let cases = hub_cases();
    let defaults = rendered("kedge-hub", "kedge-system", &cases[0].2);
    let d = defaults.get("Deployment", "kedge-hub");
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_hardened(pod, c);
    assert_eq!(pod["serviceAccountName"], "kedge-hub");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let f = flags(c);
    for (flag, value) in [
        ("--listen", "0.0.0.0:7443"),
        ("--ops-listen", "0.0.0.0:8080"),
        ("--dso-enabled", "true"),
        ("--dsj-enabled", "false"),
        ("--heartbeat-interval", "5s"),
        ("--heartbeat-tolerance", "3"),
        ("--lease-name", "kedge-hub"),
        ("--log-format", "json"),
        ("--cluster-profile-namespace", "kedge-system"),
    ] {
        assert_eq!(f.get(flag).map(String::as_str), Some(value), "{flag}");
    }
    assert!(!f.contains_key("--server-dns-names") && !f.contains_key("--tls-ca"));
    assert!(!f.contains_key("--sharding"), "sharding is opt-in");
    assert_eq!(
        c["env"][0],
        json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    );
    let quic = defaults.get("Service", "kedge-hub");
    assert_eq!(quic["spec"]["type"], "LoadBalancer");
    assert_eq!(quic["spec"]["ports"][0]["protocol"], "UDP");
    assert_eq!(
        defaults.get("Service", "kedge-hub-metrics")["spec"]["type"],
        "ClusterIP"
    );
    for optional in ["ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy"] {
        assert!(
            defaults.of_kind(optional).is_empty(),
            "{optional} is opt-in"
        );
    }

    let all = rendered("kedge-hub", "kedge", &cases[1].2);
    let c = &all.get("Deployment", "kedge-hub")["spec"]["template"]["spec"]["containers"][0];
    let f = flags(c);
    for (flag, value) in [
        ("--listen", "0.0.0.0:7000"),
        ("--dso-enabled", "false"),
        ("--dsj-enabled", "true"),
        ("--heartbeat-interval", "2s"),
        ("--heartbeat-tolerance", "5"),
        ("--lease-name", "hub-lease"),
        ("--lease-duration", "20s"),
        ("--log-format", "text"),
        ("--server-dns-names", "hub.example.com"),
        ("--server-ips", "10.0.0.9,fd00::9"),
        ("--cluster-profile-namespace", "fleet"),
        ("--sharding", "true"),
        ("--scaler-listen", "0.0.0.0:9443"),
        ("--scaler-address", "scaler.example:443"),
        ("--keda-namespace", "keda-system"),
        ("--scaler-cert-lifetime", "7d"),
    ] {
        assert_eq!(f.get(flag).map(String::as_str), Some(value), "{flag}");
    }
    let quic = all.get("Service", "kedge-hub");
    assert_eq!(quic["spec"]["type"], "NodePort");
    assert_eq!(quic["spec"]["ports"][0]["nodePort"], 30443);
    assert_eq!(
        all.get("ServiceMonitor", "kedge-hub")["spec"]["endpoints"][0]["port"],
        "ops"
    );
    assert_eq!(
        all.get("PodDisruptionBudget", "kedge-hub")["spec"]["maxUnavailable"],
        1
    );
    let np = all.get("NetworkPolicy", "kedge-hub");
    assert_eq!(
        np["spec"]["ingress"][0]["ports"][0],
        json!({"port": 7000, "protocol": "UDP"})
    );

    let cluster_ip = rendered("kedge-hub", "kedge-system", &cases[2].2);
    assert_eq!(
        cluster_ip.get("Service", "kedge-hub")["spec"]["type"],
        "ClusterIP"
    );
}

/// The external scaler, on by default: flags naming the Service KEDA dials (not the hub's
/// own default, the UDP Service), its TCP port and Service, RBAC for its Secrets by name in
/// the release's and KEDA's namespace and for its ClusterTriggerAuthentication, and with a
/// NetworkPolicy a way in from KEDA's namespace only; off, none of it.
#[test]
fn hub_chart_scaler_is_on_by_default_and_off_entirely() {
    let on = rendered(
        "kedge-hub",
        "kedge",
        &json!({"networkPolicy": {"enabled": true}}),
    );
    let c = &on.get("Deployment", "kedge-hub")["spec"]["template"]["spec"]["containers"][0];
    let f = flags(c);
    for (flag, value) in [
        ("--scaler-listen", "0.0.0.0:9090"),
        ("--scaler-address", "kedge-hub-scaler.kedge.svc:9090"),
        ("--keda-namespace", "keda"),
        ("--scaler-cert-lifetime", "30d"),
    ] {
        assert_eq!(f.get(flag).map(String::as_str), Some(value), "{flag}");
    }
    assert!(
        c["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "scaler", "containerPort": 9090, "protocol": "TCP"}))
    );
    let service = on.get("Service", "kedge-hub-scaler");
    assert_eq!(service["metadata"]["namespace"], "kedge");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "scaler", "port": 9090, "targetPort": "scaler", "protocol": "TCP"}])
    );
    let grants = rbac(&on.objects.iter().collect::<Vec<_>>());
    let lines =
        |items: &[&str]| -> BTreeSet<String> { items.iter().map(|s| (*s).to_owned()).collect() };
    assert_eq!(
        grants["Role kedge/kedge-hub-scaler"],
        lines(&[
            r#"rule "" secrets create"#,
            r#"rule "" secrets get kedge-scaler-tls"#,
            r#"rule "" secrets update kedge-scaler-tls"#,
        ])
    );
    assert_eq!(
        grants["Role keda/kedge-hub-scaler"],
        lines(&[
            r#"rule "" secrets create kedge-scaler-client"#,
            r#"rule "" secrets get kedge-scaler-client"#,
            r#"rule "" secrets patch kedge-scaler-client"#,
        ])
    );
    for ns in ["kedge", "keda"] {
        assert_eq!(
            grants[&format!("RoleBinding {ns}/kedge-hub-scaler")],
            lines(&[
                "roleRef Role/kedge-hub-scaler",
                "subject ServiceAccount kedge/kedge-hub"
            ])
        );
    }
    let ctas: BTreeSet<String> = grants["ClusterRole /kedge-hub"]
        .iter()
        .filter(|l| l.contains("clustertriggerauthentications"))
        .cloned()
        .collect();
    assert_eq!(
        ctas,
        lines(&[
            r#"rule "keda.sh" clustertriggerauthentications create kedge-scaler"#,
            r#"rule "keda.sh" clustertriggerauthentications patch kedge-scaler"#,
        ])
    );
    assert_eq!(
        on.get("NetworkPolicy", "kedge-hub")["spec"]["ingress"][2],
        json!({"ports": [{"port": 9090, "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]})
    );

    let off = rendered(
        "kedge-hub",
        "kedge",
        &json!({"scaler": {"enabled": false}, "networkPolicy": {"enabled": true}}),
    );
    for o in &off.objects {
        assert!(!o.to_string().contains("scaler"), "{o}");
        assert_ne!(o["metadata"]["namespace"], "keda", "{o}");
    }
    assert_eq!(
        off.get("NetworkPolicy", "kedge-hub")["spec"]["ingress"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Both listen on TCP in one pod.
    let clash = helm::render(
        "kedge-hub",
        "kedge",
        &json!({"scaler": {"port": 8080}, "ops": {"port": 8080}}),
    );
    assert!(
        clash
            .as_ref()
            .is_err_and(|e| e.contains("scaler.port must differ from ops.port")),
        "{clash:?}"
    );
}

#[test]
fn hub_chart_crds_are_deploy_crds() {
    let root = helm::workspace();
    let names = |dir: &str| -> BTreeSet<String> {
        std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let generated = names("deploy/crds");
    assert_eq!(
        names("deploy/charts/kedge-hub/crds"),
        generated,
        "the chart's CRDs are copies of deploy/crds: cp deploy/crds/*.yaml deploy/charts/kedge-hub/crds/"
    );
    for f in &generated {
        let a = std::fs::read_to_string(root.join("deploy/crds").join(f)).unwrap();
        let b = std::fs::read_to_string(root.join("deploy/charts/kedge-hub/crds").join(f)).unwrap();
        assert!(
            a == b,
            "deploy/charts/kedge-hub/crds/{f} differs from deploy/crds/{f} (`make crds` updates both)"
        );
    }
    // Helm ships them, and they validate (structural schemas included).
    let r = rendered("kedge-hub", "kedge-system", &json!({}));
    let kinds: BTreeSet<&str> = r
        .crds
        .iter()
        .filter_map(|c| c["spec"]["names"]["kind"].as_str())
        .collect();
    // ClusterProfile (SIG-Multicluster's cluster inventory) too: Helm installs a CRD of
    // crds/ only when absent, so one from OCM or KubeFleet stays as it is.
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterProfile",
            "DistributedScaledJob",
            "DistributedScaledObject",
            "MemberCluster"
        ])
    );
    let profiles = r
        .crds
        .iter()
        .find(|c| c["spec"]["names"]["kind"] == "ClusterProfile")
        .unwrap();
    assert_eq!(profiles["spec"]["group"], "multicluster.x-k8s.io");
    assert_eq!(profiles["spec"]["scope"], "Namespaced");
}

const CA: &str = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";

/// (case, release namespace, values, the same settings for `agent_manifests`).
fn agent_cases() -> Vec<(&'static str, &'static str, Value, AgentInstall)> {
    let bootstrap = {
        let i = AgentInstall::new(
            vec!["hub.example:7443".into()],
            CA.into(),
            Credentials::Bootstrap {
                token: "kedge-bootstrap.abc".into(),
            },
            AgentNamespaces::Only(vec!["web".into(), "apps".into()]),
        );
        (
            "bootstrap token, two namespaces",
            "kedge-system",
            json!({"hub": {"addresses": ["hub.example:7443"]}, "caBundle": CA,
                "bootstrapToken": "kedge-bootstrap.abc", "namespaces": ["web", "apps"]}),
            i,
        )
    };
    let certificate = {
        let mut i = AgentInstall::new(
            vec!["10.0.0.1:7443".into(), "10.0.0.2:7443".into()],
            CA.into(),
            Credentials::Certificate {
                cert_pem: "CERT".into(),
                key_pem: "KEY".into(),
            },
            AgentNamespaces::All,
        );
        i.agent_namespace = "edge-agent".into();
        i.hub_server_name = Some("kedge-hub.example".into());
        i.kinds.push(AgentKind::new(
            "",
            "v1",
            "ReplicationController",
            "replicationcontrollers",
        ));
        (
            "certificate, all namespaces, two hubs, a core kind, another namespace",
            "edge-agent",
            json!({"hub": {"addresses": ["10.0.0.1:7443", "10.0.0.2:7443"],
                    "serverName": "kedge-hub.example"},
                "credentials": "certificate", "caBundle": CA,
                "certificate": {"cert": "CERT", "key": "KEY"}, "allNamespaces": true,
                "kinds": [
                    {"group": "apps", "version": "v1", "kind": "Deployment", "plural": "deployments"},
                    {"group": "apps", "version": "v1", "kind": "StatefulSet", "plural": "statefulsets"},
                    {"group": "", "version": "v1", "kind": "ReplicationController",
                        "plural": "replicationcontrollers"}]}),
            i,
        )
    };
    let one_kind = {
        let mut i = bootstrap.3.clone();
        i.namespaces = AgentNamespaces::Only(vec!["jobs".into()]);
        i.kinds = vec![AgentKind::deployment()];
        (
            "one namespace, Deployments only",
            "kedge-system",
            json!({"hub": {"addresses": ["hub.example:7443"]}, "caBundle": CA,
                "bootstrapToken": "kedge-bootstrap.abc", "namespaces": ["jobs"],
                "kinds": [{"group": "apps", "version": "v1", "kind": "Deployment",
                    "plural": "deployments"}]}),
            i,
        )
    };
    vec![bootstrap, certificate, one_kind]
}

fn agent_container(objects: &[&Value]) -> Value {
    let d = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("a Deployment");
    d["spec"]["template"]["spec"]["containers"][0].clone()
}

/// The chart rendered with the hand-written values of each case, and with the values
/// `agent_helm_values` (what `setup-member --output helm-values` prints) makes of the same
/// install, is what `agent_manifests` renders for that install.
#[test]
fn agent_chart_is_what_agent_manifests_renders() {
    for (case, namespace, values, install) in agent_cases() {
        install.validate().unwrap();
        let rust = agent_manifests(&install);
        assert_eq!(
            texts(&agent_container(&rust.iter().collect::<Vec<_>>())["args"]),
            agent_args(&install)
        );
        let chart = rendered("kedge-agent", namespace, &values);
        assert_agent_chart(case, &chart, &rust);
        // What the chart passes starts the agent (its hubs come from the environment).
        let args = texts(&agent_container(&chart.objects.iter().collect::<Vec<_>>())["args"]);
        let line = ["kedge-agent", "--hub", "hub.example:7443"]
            .into_iter()
            .map(str::to_owned)
            .chain(args.iter().cloned());
        if let Err(error) = AgentArgs::try_parse_from(line).and_then(AgentArgs::checked) {
            panic!("{case}: kedge-agent refuses the chart's args {args:?}: {error}");
        }
        let generated = rendered("kedge-agent", namespace, &agent_helm_values(&install));
        assert_agent_chart(
            &format!("{case}, from agent_helm_values"),
            &generated,
            &rust,
        );
        let hub: ByteString =
            serde_json::from_value(chart.get("Secret", BOOTSTRAP_SECRET)["data"]["hub"].clone())
                .unwrap();
        assert_eq!(String::from_utf8(hub.0).unwrap(), install.hubs.join(","));
    }
}

/// Fails naming the first difference between the agent chart as rendered and `rust`, the
/// objects of `agent_manifests` (or `kubectl kedge install agent`).
fn assert_agent_chart(case: &str, chart: &Rendered, rust: &[Value]) {
    // The chart leaves the namespace to `helm install --create-namespace`.
    let rust: Vec<Value> = rust
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .cloned()
        .collect();
    let key = |o: &Value| {
        format!(
            "{} {}/{}",
            o["kind"].as_str().unwrap_or(""),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let chart_keys: BTreeSet<String> = chart.objects.iter().map(key).collect();
    let rust_keys: BTreeSet<String> = rust.iter().map(key).collect();
    assert_eq!(chart_keys, rust_keys, "{case}: objects");
    assert_same_rbac(case, chart, &rust);

    let secret = chart.get("Secret", BOOTSTRAP_SECRET);
    let rust_secret = rust.iter().find(|o| o["kind"] == "Secret").unwrap();
    assert_eq!(secret["data"], rust_secret["data"], "{case}: Secret data");

    let c = agent_container(&chart.objects.iter().collect::<Vec<_>>());
    let r = agent_container(&rust.iter().collect::<Vec<_>>());
    for field in [
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
        "image",
    ] {
        assert_eq!(c[field], r[field], "{case}: container {field}");
    }
    let pod = &chart.get("Deployment", "kedge-agent")["spec"];
    let rust_pod = &rust.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"];
    for pointer in [
        "/replicas",
        "/strategy",
        "/template/spec/serviceAccountName",
        "/template/spec/securityContext",
        "/template/spec/volumes",
    ] {
        assert_eq!(
            pod.pointer(pointer),
            rust_pod.pointer(pointer),
            "{case}: {pointer}"
        );
    }
    assert_hardened(&pod["template"]["spec"], &c);
}

#[test]
fn agent_chart_reads_an_existing_secret() {
    let values = json!({"existingSecret": "edge-1-connection", "namespaces": ["web"]});
    let chart = rendered("kedge-agent", "kedge-system", &values);
    assert!(chart.of_kind("Secret").is_empty(), "no Secret of its own");
    let pod = &chart.get("Deployment", "kedge-agent")["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        "edge-1-connection"
    );
    assert_eq!(
        pod["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"],
        "edge-1-connection"
    );
    // The identity Role reads that Secret by name instead of kedge-agent-bootstrap.
    let identity = chart.get("Role", "kedge-agent-identity");
    let names: BTreeSet<String> = identity["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| texts(&r["resourceNames"]))
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "edge-1-connection".to_owned(),
            "kedge-agent-identity".to_owned()
        ])
    );
}

#[test]
fn charts_lint_clean() {
    let values = &agent_cases()[0].2;
    for (chart, values) in [("kedge-hub", &json!(null)), ("kedge-agent", values)] {
        let path = helm::chart(chart);
        let report = helm::helm(&["lint", path.to_str().unwrap()], values);
        assert_eq!(report["total_charts_linted"], 1, "{chart}: {report}");
        // Severity 1 is information ("icon is recommended"); warnings and errors fail.
        let findings: Vec<&Value> = report["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_u64() != Some(1))
            .collect();
        assert!(findings.is_empty(), "{chart}: {findings:?}");
        assert_eq!(report["errors"], json!([]), "{chart}");
    }
    // Lint runs the schema: an agent without its required values is an error.
    let path = helm::chart("kedge-agent");
    let report = helm::helm(&["lint", path.to_str().unwrap()], &json!(null));
    assert!(!report["errors"].as_array().unwrap().is_empty(), "{report}");
}

#[test]
fn bad_values_are_refused_naming_the_value() {
    let agent = agent_cases()[0].2.clone();
    let with = |base: &Value, patch: Value| {
        let mut v = base.clone();
        json_patch::merge(&mut v, &patch);
        v
    };
    let cases = [
        (
            "kedge-hub",
            json!({"heartbeat": {"interval": "-5s"}}),
            "/heartbeat/interval",
        ),
        (
            "kedge-hub",
            json!({"heartbeat": {"tolerance": 0}}),
            "/heartbeat/tolerance",
        ),
        (
            "kedge-hub",
            json!({"quic": {"service": {"type": "External"}}}),
            "/quic/service/type",
        ),
        (
            "kedge-hub",
            json!({"log": {"format": "xml"}}),
            "/log/format",
        ),
        (
            "kedge-hub",
            json!({"dsj": {"enabled": "yes"}}),
            "/dsj/enabled",
        ),
        (
            "kedge-hub",
            json!({"server": {"ips": ["not-an-ip"]}}),
            "/server/ips/0",
        ),
        ("kedge-hub", json!({"replicas": 0}), "/replicas"),
        (
            "kedge-hub",
            json!({"scaler": {"kedaNamespace": "KEDA"}}),
            "/scaler/kedaNamespace",
        ),
        (
            "kedge-hub",
            json!({"scaler": {"address": "scaler.example"}}),
            "/scaler/address",
        ),
        (
            "kedge-hub",
            json!({"scaler": {"certLifetime": "a month"}}),
            "/scaler/certLifetime",
        ),
        (
            "kedge-hub",
            json!({"heartbeatInterval": "5s"}),
            "'heartbeatInterval' not allowed",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"hub": {"addresses": []}})),
            "/hub/addresses",
        ),
        ("kedge-agent", with(&agent, json!({"hub": null})), "/hub"),
        (
            "kedge-agent",
            with(&agent, json!({"hub": {"addresses": ["hub.example"]}})),
            "/hub/addresses/0",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"caBundle": ""})),
            "/caBundle",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"bootstrapToken": ""})),
            "/bootstrapToken",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"namespaces": []})),
            "/namespaces",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"namespaces": ["Web"]})),
            "/namespaces/0",
        ),
        (
            "kedge-agent",
            with(&agent, json!({"credentials": "certificate"})),
            "/certificate/cert",
        ),
        (
            "kedge-agent",
            with(
                &agent,
                json!({"kinds": [{"group": "apps", "version": "v1",
            "kind": "deployment", "plural": "deployments"}]}),
            ),
            "/kinds/0/kind",
        ),
    ];
    for (chart, values, expected) in cases {
        match helm::render(chart, "kedge-system", &values) {
            Ok(_) => panic!("{chart} accepted {values}"),
            Err(e) => {
                assert!(
                    e.contains("values don't meet the specifications of the schema")
                        && e.contains(expected),
                    "{chart} with {values}: expected a schema error at {expected}, got: {e}"
                );
            }
        }
    }
}

/// `kubectl-kedge ARGS`' output.
fn kubectl_kedge(args: &[&str]) -> String {
    let out = std::process::Command::new(support::bin("kubectl-kedge"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kedge {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The real `kubectl kedge install hub|agent`: its manifests are what the chart renders with
/// the values it prints for the same flags (`-o helm-values`); its CRDs are deploy/crds.
#[test]
fn kubectl_kedge_install_prints_what_the_charts_render() {
    let hub_flags = [
        "install",
        "hub",
        "--namespace",
        "kedge",
        "--dsj-enabled",
        "true",
        "--service-type",
        "NodePort",
        "--heartbeat-interval",
        "2s",
        "--server-dns-names",
        "hub.example.com",
        "--tag",
        "1.2.3",
    ];
    let manifests = yaml_documents(&kubectl_kedge(&hub_flags));
    let values: Value = serde_yaml::from_str(&kubectl_kedge(
        &[&hub_flags[..], &["-o", "helm-values"]].concat(),
    ))
    .unwrap();
    let chart = rendered("kedge-hub", "kedge", &values);
    assert_hub_chart("kubectl kedge install hub", &chart, &manifests);
    let crds: BTreeSet<String> = manifests
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let chart_crds: BTreeSet<String> = chart
        .crds
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(crds, chart_crds);

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, CA).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "kedge-bootstrap.abc\n").unwrap();
    let agent_flags = [
        "install",
        "agent",
        "--hub-address",
        "hub.example:7443,10.0.0.2:7443",
        "--hub-server-name",
        "kedge-hub.example",
        "--ca-file",
        ca.to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
        "--namespaces",
        "web,apps",
        "--agent-namespace",
        "edge-agent",
    ];
    let manifests = yaml_documents(&kubectl_kedge(&agent_flags));
    let values: Value = serde_yaml::from_str(&kubectl_kedge(
        &[&agent_flags[..], &["-o", "helm-values"]].concat(),
    ))
    .unwrap();
    assert_eq!(values["bootstrapToken"], "kedge-bootstrap.abc");
    let chart = rendered("kedge-agent", "edge-agent", &values);
    assert_agent_chart("kubectl kedge install agent", &chart, &manifests);

    // Uninstall lists what install made, without the namespace, the CRDs or the CA.
    let listed = yaml_documents(&kubectl_kedge(&[
        "uninstall",
        "hub",
        "--namespace",
        "kedge",
    ]));
    let kinds: BTreeSet<&str> = listed.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert!(!kinds.contains("Namespace") && !kinds.contains("CustomResourceDefinition"));
    assert!(
        listed
            .iter()
            .all(|o| o["metadata"]["name"] != "kedge-hub-ca")
    );
    assert_eq!(
        object_keys(listed.iter()),
        object_keys(
            hub_manifests(&HubDeployment {
                rbac: HubInstall {
                    namespace: "kedge".into(),
                    dsj_enabled: true,
                    ..HubInstall::default()
                },
                ..HubDeployment::default()
            })
            .iter()
        )
    );
    let with_crds = yaml_documents(&kubectl_kedge(&[
        "uninstall",
        "hub",
        "--include-crds",
        "--include-ca",
    ]));
    assert!(
        with_crds
            .iter()
            .any(|o| o["kind"] == "CustomResourceDefinition")
    );
    assert!(
        with_crds
            .iter()
            .any(|o| o["metadata"]["name"] == "kedge-hub-ca")
    );
    // The ClusterProfile CRD is installed with the hub but never deleted by it: other cluster
    // managers' profiles may live in it.
    assert!(
        !with_crds
            .iter()
            .any(|o| o["metadata"]["name"] == "clusterprofiles.multicluster.x-k8s.io")
    );
}

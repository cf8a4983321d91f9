//! The hub's whole install in the management cluster, beside its RBAC ([`super::hub`]): the
//! namespace, the Deployment, the UDP Service agents dial, the metrics Service and, with the
//! external scaler, the TCP Service KEDA dials. What `kubectl kedge install hub` prints,
//! and, through [`hub_helm_values`], what the `kedge-hub` Helm chart renders for the same
//! settings (`tests/tests/charts.rs` holds the chart to these functions with the real Helm
//! engine).

use kedge_protocol::is_dns1123_label;
use serde_json::{Value, json};

use super::hub::{HUB, HubInstall, SCALER, hub_rbac};
use crate::error::{Error, Result};

/// The hub image unless told otherwise.
pub const DEFAULT_HUB_IMAGE: &str = "ghcr.io/kedge-dev/kedge-hub";
/// The metrics Service.
pub const METRICS_SERVICE: &str = "kedge-hub-metrics";

/// How agents reach the hub's QUIC Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ServiceType {
    /// An external load balancer (UDP): agents outside the cluster dial its address.
    #[default]
    #[value(name = "LoadBalancer")]
    LoadBalancer,
    /// A port on every node.
    #[value(name = "NodePort")]
    NodePort,
    /// Inside the cluster only (agents reach it through a tunnel or another front).
    #[value(name = "ClusterIP")]
    ClusterIP,
}

impl ServiceType {
    /// The Service's `.spec.type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::LoadBalancer => "LoadBalancer",
            ServiceType::NodePort => "NodePort",
            ServiceType::ClusterIP => "ClusterIP",
        }
    }
}

/// Everything that makes the hub's install; [`Default`] is the chart's `values.yaml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubDeployment {
    /// Namespace, Lease name, controllers and the external scaler: what the RBAC depends on.
    /// The install always enrolls members with bootstrap tokens (its CA in the Secret
    /// `kedge-hub-ca`).
    pub rbac: HubInstall,
    /// `--dso-enabled`.
    pub dso_enabled: bool,
    /// Image without tag.
    pub image: String,
    /// Image tag.
    pub tag: String,
    /// Hub replicas (one holds the Lease and is ready).
    pub replicas: u32,
    /// `--sharding`: every replica serves the agents the Service sends it (and is ready),
    /// relaying their sessions to the Lease holder.
    pub sharding: bool,
    /// UDP port of the QUIC listener (container and Service).
    pub quic_port: u16,
    /// TCP port of `/metrics`, `/healthz`, `/readyz`.
    pub ops_port: u16,
    /// Type of the QUIC Service.
    pub service_type: ServiceType,
    /// `--heartbeat-interval`, e.g. `5s`.
    pub heartbeat_interval: String,
    /// `--heartbeat-tolerance` (1–100).
    pub heartbeat_tolerance: u32,
    /// `--lease-duration`.
    pub lease_duration: String,
    /// `--log-format`: `json` or `text`.
    pub log_format: String,
    /// `RUST_LOG`.
    pub log_level: String,
    /// `--server-dns-names`; empty keeps the hub's defaults.
    pub server_dns_names: Vec<String>,
    /// `--server-ips`; empty keeps the hub's default.
    pub server_ips: Vec<String>,
    /// `--server-cert-lifetime`.
    pub server_cert_lifetime: String,
    /// `--member-cert-lifetime`.
    pub member_cert_lifetime: String,
    /// A Secret in the hub namespace whose key `token` is the ops token: mounted and passed
    /// as `--ops-token-file`, so `/v1/sessions` needs it. `None`: served to 127.0.0.1 and ::1
    /// in the pod only (`kubectl port-forward`).
    pub ops_token_secret: Option<String>,
}

impl Default for HubDeployment {
    fn default() -> Self {
        Self {
            rbac: HubInstall::default(),
            dso_enabled: true,
            image: DEFAULT_HUB_IMAGE.to_owned(),
            tag: env!("CARGO_PKG_VERSION").to_owned(),
            replicas: 1,
            sharding: false,
            quic_port: 7443,
            ops_port: crate::config::DEFAULT_OPS_PORT,
            service_type: ServiceType::LoadBalancer,
            heartbeat_interval: "5s".to_owned(),
            heartbeat_tolerance: 3,
            lease_duration: "15s".to_owned(),
            log_format: "json".to_owned(),
            log_level: "info".to_owned(),
            server_dns_names: Vec::new(),
            server_ips: Vec::new(),
            server_cert_lifetime: "30d".to_owned(),
            member_cert_lifetime: "24h".to_owned(),
            ops_token_secret: None,
        }
    }
}

impl HubDeployment {
    /// Every problem that would make the install invalid, all at once (the ranges the hub's
    /// flags accept are checked again by the hub at start).
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if !is_dns1123_label(&self.rbac.namespace) {
            problems.push(format!(
                "namespace {:?} is not a namespace name",
                self.rbac.namespace
            ));
        }
        if let Some(ns) = self.rbac.cluster_profile_namespace()
            && !is_dns1123_label(ns)
        {
            problems.push(format!(
                "ClusterProfile namespace {ns:?} is not a namespace name"
            ));
        }
        if let Some(secret) = &self.ops_token_secret
            && !is_dns1123_label(secret)
        {
            problems.push(format!("ops token Secret {secret:?} is not a Secret name"));
        }
        if !self.rbac.enrollment {
            problems.push(
                "the install enrolls members with bootstrap tokens: enrollment must be on"
                    .to_owned(),
            );
        }
        let duration = |s: &str| {
            let unit = s.trim_start_matches(|c: char| c.is_ascii_digit());
            unit.len() < s.len() && ["ms", "s", "m", "h", "d"].contains(&unit)
        };
        for (flag, value) in [
            ("heartbeat interval", &self.heartbeat_interval),
            ("lease duration", &self.lease_duration),
            ("server certificate lifetime", &self.server_cert_lifetime),
            ("member certificate lifetime", &self.member_cert_lifetime),
        ] {
            if !duration(value) {
                problems.push(format!(
                    "{flag} {value:?} is not a whole number and one unit (ms, s, m, h, d)"
                ));
            }
        }
        if !(1..=100).contains(&self.heartbeat_tolerance) {
            problems.push(format!(
                "heartbeat tolerance {} is not within 1–100",
                self.heartbeat_tolerance
            ));
        }
        if !["json", "text"].contains(&self.log_format.as_str()) {
            problems.push(format!(
                "log format {:?} is not json or text",
                self.log_format
            ));
        }
        if self.replicas == 0 || self.quic_port == 0 || self.ops_port == 0 {
            problems.push("replicas and ports must be positive".to_owned());
        }
        if let Some(ip) = self
            .server_ips
            .iter()
            .find(|ip| ip.parse::<std::net::IpAddr>().is_err())
        {
            problems.push(format!("server IP {ip:?} is not an IP address"));
        }
        if self.image.is_empty() || self.tag.is_empty() {
            problems.push("empty image or tag".to_owned());
        }
        if let Some(scaler) = &self.rbac.scaler {
            if !is_dns1123_label(&scaler.keda_namespace) {
                problems.push(format!(
                    "KEDA namespace {:?} is not a namespace name",
                    scaler.keda_namespace
                ));
            }
            if !duration(&scaler.cert_lifetime) {
                problems.push(format!(
                    "scaler certificate lifetime {:?} is not a whole number and one unit (ms, s, m, h, d)",
                    scaler.cert_lifetime
                ));
            }
            // Both listen on TCP in the same pod.
            if scaler.port == 0 || scaler.port == self.ops_port {
                problems.push(format!(
                    "scaler port {} must be positive and differ from the ops port",
                    scaler.port
                ));
            }
            let host_port = scaler
                .address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !scaler.address.is_empty() && !host_port {
                problems.push(format!(
                    "scaler address {:?} is not host:port",
                    scaler.address
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInstall(problems))
        }
    }

    /// The hub's arguments in its container.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            ("--listen", format!("0.0.0.0:{}", self.quic_port)),
            ("--ops-listen", format!("0.0.0.0:{}", self.ops_port)),
            ("--log-format", self.log_format.clone()),
            ("--dso-enabled", self.dso_enabled.to_string()),
            ("--dsj-enabled", self.rbac.dsj_enabled.to_string()),
            ("--heartbeat-interval", self.heartbeat_interval.clone()),
            (
                "--heartbeat-tolerance",
                self.heartbeat_tolerance.to_string(),
            ),
            ("--lease-name", self.rbac.lease_name.clone()),
            ("--lease-duration", self.lease_duration.clone()),
            ("--server-cert-lifetime", self.server_cert_lifetime.clone()),
            ("--member-cert-lifetime", self.member_cert_lifetime.clone()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect();
        match self.rbac.cluster_profile_namespace() {
            Some(ns) => args.extend(["--cluster-profile-namespace".to_owned(), ns.to_owned()]),
            None => args.extend(["--cluster-profiles".to_owned(), "false".to_owned()]),
        }
        if self.sharding {
            args.extend(["--sharding".to_owned(), "true".to_owned()]);
        }
        if !self.server_dns_names.is_empty() {
            args.extend([
                "--server-dns-names".to_owned(),
                self.server_dns_names.join(","),
            ]);
        }
        if !self.server_ips.is_empty() {
            args.extend(["--server-ips".to_owned(), self.server_ips.join(",")]);
        }
        if self.ops_token_secret.is_some() {
            args.extend([
                "--ops-token-file".to_owned(),
                format!("{OPS_TOKEN_DIR}/token"),
            ]);
        }
        if let Some(scaler) = &self.rbac.scaler {
            args.extend([
                "--scaler-listen".to_owned(),
                format!("0.0.0.0:{}", scaler.port),
                "--scaler-address".to_owned(),
                scaler.address_in(&self.rbac.namespace),
                "--keda-namespace".to_owned(),
                scaler.keda_namespace.clone(),
                "--scaler-cert-lifetime".to_owned(),
                scaler.cert_lifetime.clone(),
            ]);
        }
        args
    }
}

/// Where the ops token Secret is mounted.
pub const OPS_TOKEN_DIR: &str = "/etc/kedge-ops";

fn labels() -> Value {
    json!({ "app.kubernetes.io/name": HUB, "app.kubernetes.io/part-of": "kedge" })
}

fn selector() -> Value {
    json!({ "app.kubernetes.io/name": HUB, "app.kubernetes.io/instance": HUB })
}

/// The container's environment: the hub's namespace, with sharding the pod's IP (where the
/// other replicas relay to while it is active), and the log filter.
fn env(d: &HubDeployment) -> Value {
    let mut env = vec![json!({"name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})];
    if d.sharding {
        env.push(json!({"name": "POD_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
    }
    env.push(json!({"name": "RUST_LOG", "value": d.log_level}));
    json!(env)
}

fn deployment(d: &HubDeployment) -> Value {
    let ns = d.rbac.namespace.as_str();
    let probe = |path: &str, period: u32| {
        json!({"httpGet": {"path": path, "port": "ops"}, "periodSeconds": period,
            "failureThreshold": 3})
    };
    let mut pod_labels = labels();
    pod_labels["app.kubernetes.io/instance"] = json!(HUB);
    let mut ports = vec![
        json!({"name": "quic", "containerPort": d.quic_port, "protocol": "UDP"}),
        json!({"name": "ops", "containerPort": d.ops_port, "protocol": "TCP"}),
    ];
    if let Some(scaler) = &d.rbac.scaler {
        ports.push(json!({"name": "scaler", "containerPort": scaler.port, "protocol": "TCP"}));
    }
    let mut deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": HUB, "namespace": ns, "labels": labels()},
        "spec": {
            "replicas": d.replicas,
            // Only the Lease holder is ready: a rolling update would wait for ever for a new
            // pod while the old one holds the Lease. The old hubs stop first.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector()},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": HUB,
                    // Long enough to close every session with SHUTDOWN and release the Lease.
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": HUB,
                        "image": format!("{}:{}", d.image, d.tag),
                        "imagePullPolicy": "IfNotPresent",
                        "args": d.args(),
                        "env": env(d),
                        "ports": ports,
                        "livenessProbe": probe("/healthz", 10),
                        // Ready only on the Lease holder (with sharding, on every replica that
                        // knows it): the Service sends agents to the ready ones.
                        "readinessProbe": probe("/readyz", 5),
                        // Sized from `make footprint` (docs/performance.md "Sizing the hub").
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": {"memory": "256Mi"},
                        },
                        "securityContext": super::container_security_context(),
                    }],
                },
            },
        },
    });
    if let Some(secret) = &d.ops_token_secret {
        let pod = &mut deployment["spec"]["template"]["spec"];
        // 0440: readable by the hub's group (fsGroup) only.
        pod["securityContext"]["fsGroup"] = json!(65532);
        pod["volumes"] = json!([{"name": "ops-token",
            "secret": {"secretName": secret, "defaultMode": 0o440,
                "items": [{"key": "token", "path": "token"}]}}]);
        pod["containers"][0]["volumeMounts"] =
            json!([{"name": "ops-token", "mountPath": OPS_TOKEN_DIR, "readOnly": true}]);
    }
    deployment
}

fn services(d: &HubDeployment) -> Vec<Value> {
    let ns = d.rbac.namespace.as_str();
    let mut metrics_labels = labels();
    metrics_labels["app.kubernetes.io/component"] = json!("metrics");
    let mut services = vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": HUB, "namespace": ns, "labels": labels()},
            "spec": {"type": d.service_type.as_str(), "selector": selector(),
                "ports": [{"name": "quic", "port": d.quic_port, "targetPort": "quic",
                    "protocol": "UDP"}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": METRICS_SERVICE, "namespace": ns, "labels": metrics_labels},
            "spec": {"type": "ClusterIP", "selector": selector(),
                "ports": [{"name": "ops", "port": d.ops_port, "targetPort": "ops",
                    "protocol": "TCP"}]},
        }),
    ];
    if let Some(scaler) = &d.rbac.scaler {
        let mut scaler_labels = labels();
        scaler_labels["app.kubernetes.io/component"] = json!("scaler");
        // KEDA's operator dials the scaler here; as with QUIC, only the ready hub (the
        // Lease holder) is behind it.
        services.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SCALER, "namespace": ns, "labels": scaler_labels},
            "spec": {"type": "ClusterIP", "selector": selector(),
                "ports": [{"name": "scaler", "port": scaler.port, "targetPort": "scaler",
                    "protocol": "TCP"}]},
        }));
    }
    services
}

/// The hub's install in apply order, CRDs apart (`kubectl kedge crds`): Namespace, the
/// ServiceAccount and RBAC of [`hub_rbac`], the Deployment, the QUIC and metrics Services
/// and with the external scaler its Service. KEDA's namespace must exist (KEDA installed).
/// Check the input with [`HubDeployment::validate`] first.
pub fn hub_manifests(d: &HubDeployment) -> Vec<Value> {
    let mut out = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": d.rbac.namespace, "labels": labels()}})];
    out.extend(hub_rbac(&d.rbac));
    out.push(deployment(d));
    out.extend(services(d));
    out
}

/// The same install as values of the `kedge-hub` chart, installed in the namespace
/// `rbac.namespace`.
pub fn hub_helm_values(d: &HubDeployment) -> Value {
    json!({
        "image": {"repository": d.image, "tag": d.tag},
        "replicas": d.replicas,
        "sharding": {"enabled": d.sharding},
        "dso": {"enabled": d.dso_enabled},
        "dsj": {"enabled": d.rbac.dsj_enabled},
        "clusterProfiles": {"enabled": d.rbac.cluster_profiles,
            "namespace": d.rbac.cluster_profile_namespace.clone().unwrap_or_default()},
        "log": {"format": d.log_format, "level": d.log_level},
        "heartbeat": {"interval": d.heartbeat_interval, "tolerance": d.heartbeat_tolerance},
        "lease": {"name": d.rbac.lease_name, "duration": d.lease_duration},
        "server": {"dnsNames": d.server_dns_names, "ips": d.server_ips,
            "certLifetime": d.server_cert_lifetime,
            "memberCertLifetime": d.member_cert_lifetime},
        "quic": {"port": d.quic_port,
            "service": {"type": d.service_type.as_str(), "port": d.quic_port}},
        "ops": {"port": d.ops_port, "service": {"port": d.ops_port},
            "tokenSecret": d.ops_token_secret.clone().unwrap_or_default()},
        "scaler": match &d.rbac.scaler {
            Some(s) => json!({"enabled": true, "port": s.port, "kedaNamespace": s.keda_namespace,
                "certLifetime": s.cert_lifetime, "address": s.address}),
            None => json!({"enabled": false}),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::ScalerInstall;

    #[test]
    fn defaults_are_valid_and_flags_follow_the_settings() {
        let d = HubDeployment::default();
        d.validate().unwrap();
        let args = d.args().join(" ");
        assert!(args.starts_with("--listen 0.0.0.0:7443 --ops-listen 0.0.0.0:8080"));
        assert!(!args.contains("--server-dns-names"));
        assert!(args.contains("--cluster-profile-namespace kedge-system"));
        let objects = hub_manifests(&d);
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
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
                "RoleBinding",
                "Role",
                "RoleBinding",
                "Deployment",
                "Service",
                "Service",
                "Service"
            ]
        );
    }

    /// ClusterProfiles: their namespace passed (the hub's unless another is given), or
    /// publishing turned off; a bad namespace is refused.
    #[test]
    fn cluster_profile_flags_follow_the_settings() {
        let mut d = HubDeployment::default();
        d.rbac.cluster_profile_namespace = Some("fleet".into());
        assert!(
            d.args()
                .join(" ")
                .contains("--cluster-profile-namespace fleet")
        );
        d.rbac.cluster_profile_namespace = Some("Not_A_Name".into());
        assert!(
            d.validate()
                .unwrap_err()
                .to_string()
                .contains("ClusterProfile namespace")
        );
        d.rbac.cluster_profiles = false;
        d.validate().unwrap();
        let args = d.args().join(" ");
        assert!(args.contains("--cluster-profiles false"), "{args}");
        assert!(!args.contains("--cluster-profile-namespace"), "{args}");
    }

    /// The scaler, on by default, is told the Service KEDA dials (the hub's own default
    /// names the UDP Service); off, nothing of it is rendered.
    #[test]
    fn an_ops_token_secret_is_mounted_and_passed() {
        let plain = deployment(&HubDeployment::default());
        assert!(plain["spec"]["template"]["spec"]["volumes"].is_null());
        assert!(
            !HubDeployment::default()
                .args()
                .contains(&"--ops-token-file".to_owned())
        );
        let d = HubDeployment {
            ops_token_secret: Some("hub-ops-token".into()),
            ..HubDeployment::default()
        };
        d.validate().unwrap();
        let args = d.args().join(" ");
        assert!(
            args.contains("--ops-token-file /etc/kedge-ops/token"),
            "{args}"
        );
        let pod = &deployment(&d)["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][0]["secret"]["secretName"], "hub-ops-token");
        assert_eq!(pod["volumes"][0]["secret"]["defaultMode"], 0o440);
        assert_eq!(pod["securityContext"]["fsGroup"], 65532);
        assert_eq!(
            pod["containers"][0]["volumeMounts"][0]["mountPath"],
            OPS_TOKEN_DIR
        );
        let bad = HubDeployment {
            ops_token_secret: Some("Not_A_Name".into()),
            ..HubDeployment::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("ops token Secret")
        );
    }

    #[test]
    fn the_scaler_listens_where_its_service_points() {
        let d = HubDeployment::default();
        let args = d.args().join(" ");
        assert!(
            args.ends_with(
                "--scaler-listen 0.0.0.0:9090 \
                 --scaler-address kedge-hub-scaler.kedge-system.svc:9090 \
                 --keda-namespace keda --scaler-cert-lifetime 30d"
            ),
            "{args}"
        );
        let objects = hub_manifests(&d);
        let service = objects
            .iter()
            .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == SCALER)
            .unwrap();
        assert_eq!(service["spec"]["type"], "ClusterIP");
        assert_eq!(
            service["spec"]["ports"],
            json!([{"name": "scaler", "port": 9090, "targetPort": "scaler", "protocol": "TCP"}])
        );
        let container = &objects.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"]
            ["spec"]["containers"][0];
        assert_eq!(
            container["ports"][2],
            json!({"name": "scaler", "containerPort": 9090, "protocol": "TCP"})
        );

        let mut elsewhere = HubDeployment::default();
        elsewhere.rbac.scaler = Some(ScalerInstall {
            address: "scaler.example:443".into(),
            ..ScalerInstall::default()
        });
        assert!(
            elsewhere
                .args()
                .join(" ")
                .contains("--scaler-address scaler.example:443")
        );

        let mut off = HubDeployment::default();
        off.rbac.scaler = None;
        off.validate().unwrap();
        assert!(!off.args().join(" ").contains("scaler"));
        let objects = hub_manifests(&off);
        assert!(
            objects
                .iter()
                .all(|o| !o.to_string().contains("scaler") && o["metadata"]["namespace"] != "keda")
        );
        assert_eq!(hub_helm_values(&off)["scaler"], json!({"enabled": false}));
    }

    #[test]
    fn sharding_passes_the_flag_and_the_pod_ip() {
        let plain = deployment(&HubDeployment::default());
        let container = &plain["spec"]["template"]["spec"]["containers"][0];
        assert!(!container["args"].to_string().contains("--sharding"));
        assert!(!container["env"].to_string().contains("POD_IP"));
        let sharded = HubDeployment {
            replicas: 3,
            sharding: true,
            ..HubDeployment::default()
        };
        let d = deployment(&sharded);
        let container = &d["spec"]["template"]["spec"]["containers"][0];
        assert!(sharded.args().join(" ").contains("--sharding true"));
        assert_eq!(
            container["env"][1],
            json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        );
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(hub_helm_values(&sharded)["sharding"]["enabled"], true);
    }

    #[test]
    fn bad_settings_are_reported_all_at_once() {
        let d = HubDeployment {
            heartbeat_interval: "-5s".into(),
            heartbeat_tolerance: 0,
            log_format: "xml".into(),
            server_ips: vec!["hub.example".into()],
            ..HubDeployment::default()
        };
        let Err(Error::InvalidInstall(problems)) = d.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("heartbeat interval \"-5s\""));

        let mut d = HubDeployment::default();
        d.rbac.scaler = Some(ScalerInstall {
            keda_namespace: "KEDA".into(),
            port: d.ops_port,
            cert_lifetime: "a month".into(),
            address: "scaler.example".into(),
        });
        let Err(Error::InvalidInstall(problems)) = d.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.len(), 4, "{problems:?}");
    }
}

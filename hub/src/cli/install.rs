//! `kubectl kedge install hub|agent` and `kubectl kedge uninstall hub|agent`, in the style of
//! `linkerd install`: the manifests come from `kedge_hub::install`, the same functions the
//! Helm charts are tested against (`tests/tests/charts.rs`), printed for
//! `kubectl apply -f -`; `uninstall` prints what to pipe to `kubectl delete -f -`, keeping the
//! CRDs (and with them every DSO, DSJ and MemberCluster) and the hub CA unless asked.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::{Error, Result};
use crate::install::agent::{DEFAULT_AGENT_NAMESPACE, DEFAULT_IMAGE, IDENTITY_SECRET};
use crate::install::hub::ScalerInstall;
use crate::install::hub_deployment::DEFAULT_HUB_IMAGE;
use crate::install::{
    AgentInstall, AgentNamespaces, Credentials, HubDeployment, HubInstall, ServiceType,
    agent_helm_values, agent_manifests, hub_helm_values, hub_manifests,
};

/// What to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Kubernetes manifests (`kubectl apply -f -`).
    Manifests,
    /// Values for the matching Helm chart (`helm install -f -`).
    HelmValues,
}

/// `kubectl kedge install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// What to install.
    #[command(subcommand)]
    pub what: InstallCommand,
}

/// What `install` renders.
#[derive(Debug, Subcommand)]
pub enum InstallCommand {
    /// The hub in the management cluster: CRDs, namespace, RBAC, Deployment, Services.
    #[command(after_help = "Examples:
  kubectl kedge install hub | kubectl apply -f -
  kubectl kedge install hub --replicas 2 --dsj-enabled true | kubectl apply -f -
  kubectl kedge install hub -o helm-values > values.yaml")]
    Hub(HubArgs),
    /// An agent in a member cluster: RBAC per namespace, connection Secret, Deployment.
    #[command(after_help = "Examples:
  kubectl kedge install agent --hub-address hub.example.com:7443 --ca-file ca.crt \\
    --token-file token --namespaces shop,web | kubectl --kubeconfig edge-1.kubeconfig apply -f -
  kubectl kedge install agent --hub-address hub.example.com:7443 --ca-file ca.crt \\
    --cert-file edge-1.crt --key-file edge-1.key --namespaces shop -o helm-values")]
    Agent(AgentArgs),
}

/// Settings of `install hub` (the `kedge-hub` chart's values, as flags).
#[derive(Debug, Args)]
pub struct HubArgs {
    /// The hub's namespace (created).
    #[arg(long, default_value = DEFAULT_AGENT_NAMESPACE)]
    pub namespace: String,
    /// Run the DistributedScaledObject controller.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub dso_enabled: bool,
    /// Run the DistributedScaledJob controller (adds its RBAC).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub dsj_enabled: bool,
    /// Publish a SIG-Multicluster ClusterProfile per member (adds RBAC for them in their
    /// namespace; docs/cluster-inventory.md).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_profiles: bool,
    /// Namespace of the ClusterProfiles (must exist); default: --namespace.
    #[arg(long)]
    pub cluster_profile_namespace: Option<String>,
    /// The hub image, without tag.
    #[arg(long, default_value = DEFAULT_HUB_IMAGE)]
    pub image: String,
    /// The image tag (default: this release).
    #[arg(long)]
    pub tag: Option<String>,
    /// Hub replicas (one active, the others standby on the Lease).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Sharded replicas (docs/scale.md): every replica holds the sessions of the agents the
    /// Service sends it and relays them to the active one, which decides for every object.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub sharding: bool,
    /// UDP port of the QUIC listener and its Service.
    #[arg(long, default_value_t = 7443)]
    pub quic_port: u16,
    /// Port of /metrics, /healthz, /readyz.
    #[arg(long, default_value_t = crate::config::DEFAULT_OPS_PORT)]
    pub ops_port: u16,
    /// Type of the QUIC Service agents dial.
    #[arg(long, value_enum, default_value_t = ServiceType::LoadBalancer)]
    pub service_type: ServiceType,
    /// The hub's --heartbeat-interval.
    #[arg(long, default_value = "5s")]
    pub heartbeat_interval: String,
    /// The hub's --heartbeat-tolerance.
    #[arg(long, default_value_t = 3)]
    pub heartbeat_tolerance: u32,
    /// The Lease that elects the active hub.
    #[arg(long, default_value = "kedge-hub")]
    pub lease_name: String,
    /// The hub's --lease-duration.
    #[arg(long, default_value = "15s")]
    pub lease_duration: String,
    /// json or text.
    #[arg(long, default_value = "json")]
    pub log_format: String,
    /// RUST_LOG of the hub.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// DNS names of the hub's server certificate, comma-separated (the names agents dial).
    #[arg(long, value_delimiter = ',')]
    pub server_dns_names: Vec<String>,
    /// IP addresses of the hub's server certificate, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub server_ips: Vec<String>,
    /// A Secret in the hub namespace whose key `token` is the ops token (create it first,
    /// e.g. from `head -c 32 /dev/urandom | base64`): `/v1/sessions` then needs it
    /// (`kubectl kedge sessions --token-file`); without, it answers 127.0.0.1 and ::1 in the
    /// pod only (`kubectl port-forward`).
    #[arg(long)]
    pub ops_token_secret: Option<String>,
    /// Serve the KEDA external scaler for `kedge-pod-metrics` triggers (its Service, port and
    /// RBAC in KEDA's namespace, which must exist).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub scaler_enabled: bool,
    /// KEDA's namespace (where the scaler's client Secret for KEDA goes).
    #[arg(long, default_value = "keda")]
    pub keda_namespace: String,
    /// TCP port of the external scaler and its Service `kedge-hub-scaler`.
    #[arg(long, default_value_t = crate::podmetrics::scaler::DEFAULT_PORT)]
    pub scaler_port: u16,
    /// Leave the CRDs out (installed separately, e.g. `kubectl kedge crds`).
    #[arg(long)]
    pub skip_crds: bool,
    /// Manifests, or the same install as `kedge-hub` chart values.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Manifests)]
    pub output: Output,
}

impl HubArgs {
    fn deployment(&self) -> HubDeployment {
        let defaults = HubDeployment::default();
        HubDeployment {
            rbac: HubInstall {
                namespace: self.namespace.clone(),
                lease_name: self.lease_name.clone(),
                dsj_enabled: self.dsj_enabled,
                enrollment: true,
                scaler: self.scaler_enabled.then(|| ScalerInstall {
                    keda_namespace: self.keda_namespace.clone(),
                    port: self.scaler_port,
                    ..ScalerInstall::default()
                }),
                cluster_profiles: self.cluster_profiles,
                cluster_profile_namespace: self.cluster_profile_namespace.clone(),
            },
            dso_enabled: self.dso_enabled,
            image: self.image.clone(),
            tag: self.tag.clone().unwrap_or(defaults.tag),
            replicas: self.replicas,
            sharding: self.sharding,
            quic_port: self.quic_port,
            ops_port: self.ops_port,
            service_type: self.service_type,
            heartbeat_interval: self.heartbeat_interval.clone(),
            heartbeat_tolerance: self.heartbeat_tolerance,
            lease_duration: self.lease_duration.clone(),
            log_format: self.log_format.clone(),
            log_level: self.log_level.clone(),
            server_dns_names: self.server_dns_names.clone(),
            server_ips: self.server_ips.clone(),
            server_cert_lifetime: defaults.server_cert_lifetime,
            member_cert_lifetime: defaults.member_cert_lifetime,
            ops_token_secret: self.ops_token_secret.clone(),
        }
    }
}

/// Settings of `install agent` (the `kedge-agent` chart's values, as flags).
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The hub's QUIC address as the member reaches it, HOST:PORT; several, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub hub_address: Vec<String>,
    /// Name to verify in the hub's certificate when it is not the host of --hub-address.
    #[arg(long)]
    pub hub_server_name: Option<String>,
    /// The hub CA bundle (PEM): key ca.crt of what setup-member prints, or tls.crt of the
    /// hub's Secret kedge-hub-ca.
    #[arg(long)]
    pub ca_file: PathBuf,
    /// A one-time bootstrap token (from `kubectl kedge mc setup-member`).
    #[arg(
        long,
        required_unless_present = "cert_file",
        conflicts_with = "cert_file"
    )]
    pub token_file: Option<PathBuf>,
    /// A client certificate made elsewhere (with --key-file) instead of a token.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The key of --cert-file.
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Where the agent may act.
    #[command(flatten)]
    pub scope: super::NamespaceArgs,
    /// The namespace the agent runs in (created).
    #[arg(long, default_value = DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,
    /// The agent image, without tag.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The image tag (default: this release).
    #[arg(long)]
    pub tag: Option<String>,
    /// Manifests, or the same install as `kedge-agent` chart values.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Manifests)]
    pub output: Output,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|error| Error::Read {
        path: path.display().to_string(),
        error,
    })
}

impl AgentArgs {
    fn install(&self) -> Result<AgentInstall> {
        let credentials = match (&self.token_file, &self.cert_file, &self.key_file) {
            (Some(token), _, _) => Credentials::Bootstrap {
                token: read(token)?.trim().to_owned(),
            },
            (None, Some(cert), Some(key)) => Credentials::Certificate {
                cert_pem: read(cert)?,
                key_pem: read(key)?,
            },
            _ => {
                return Err(Error::Argument(
                    "give --token-file, or --cert-file with --key-file".to_owned(),
                ));
            }
        };
        let mut install = AgentInstall::new(
            self.hub_address.clone(),
            read(&self.ca_file)?,
            credentials,
            self.scope.scope(),
        );
        install.hub_server_name = self.hub_server_name.clone();
        install.agent_namespace = self.agent_namespace.clone();
        install.image = self.image.clone();
        if let Some(tag) = &self.tag {
            install.tag = tag.clone();
        }
        Ok(install)
    }
}

/// `kubectl kedge uninstall`.
#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// What to remove.
    #[command(subcommand)]
    pub what: UninstallCommand,
}

/// What `uninstall` lists for `kubectl delete -f -`.
#[derive(Debug, Subcommand)]
pub enum UninstallCommand {
    /// The hub's objects; the CRDs (and so every DSO, DSJ and MemberCluster) and the CA
    /// Secret stay unless asked.
    #[command(after_help = "Examples:
  kubectl kedge uninstall hub | kubectl delete -f -
  kubectl kedge uninstall hub --include-crds --include-ca | kubectl delete -f -")]
    Hub {
        /// The hub's namespace.
        #[arg(long, default_value = DEFAULT_AGENT_NAMESPACE)]
        namespace: String,
        /// The Lease of the hub's Role.
        #[arg(long, default_value = "kedge-hub")]
        lease_name: String,
        /// Also the CRDs: deletes every DSO, DSJ and MemberCluster of the cluster. Not the
        /// ClusterProfile CRD, which other cluster managers' profiles may share.
        #[arg(long)]
        include_crds: bool,
        /// Also the hub CA Secret: every member must be enrolled again.
        #[arg(long)]
        include_ca: bool,
        /// The ClusterProfiles' namespace the hub was installed with
        /// (`--cluster-profile-namespace`); its Role there goes, the profiles stay. Default:
        /// --namespace.
        #[arg(long)]
        cluster_profile_namespace: Option<String>,
    },
    /// An agent's objects, its identity Secret included; the workloads it scaled stay as they
    /// are.
    #[command(after_help = "Examples:
  kubectl kedge uninstall agent --namespaces shop,web \\
    | kubectl --kubeconfig edge-1.kubeconfig delete -f -")]
    Agent {
        /// The namespaces the agent was given (their Roles go).
        #[arg(long, value_delimiter = ',')]
        namespaces: Vec<String>,
        /// The namespace the agent runs in (kept: delete it yourself if it holds nothing
        /// else).
        #[arg(long, default_value = DEFAULT_AGENT_NAMESPACE)]
        agent_namespace: String,
    },
}

fn write_objects(objects: &[Value], out: &mut impl std::io::Write) -> Result<()> {
    for object in objects {
        write!(out, "---\n{}", serde_yaml::to_string(object)?)?;
    }
    Ok(())
}

/// The CRDs as objects: `shipped`, every CRD the hub chart carries (ClusterProfile too);
/// otherwise kedge's own only.
fn crds(shipped: bool) -> Result<Vec<Value>> {
    let crds = if shipped {
        kedge_core::crd::shipped_crds()
    } else {
        kedge_core::crd::crds()
    };
    Ok(crds
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?)
}

/// Runs `install`.
pub fn install(args: &InstallArgs, out: &mut impl std::io::Write) -> Result<()> {
    let invalid = |e: crate::Error| Error::Argument(e.to_string());
    match &args.what {
        InstallCommand::Hub(hub) => {
            let d = hub.deployment();
            d.validate().map_err(invalid)?;
            if hub.output == Output::HelmValues {
                write!(out, "{}", serde_yaml::to_string(&hub_helm_values(&d))?)?;
                return Ok(());
            }
            writeln!(
                out,
                "# kedge hub {}: apply to the management cluster (kubectl apply -f -).",
                d.tag
            )?;
            if !hub.skip_crds {
                write_objects(&crds(true)?, out)?;
            }
            write_objects(&hub_manifests(&d), out)
        }
        InstallCommand::Agent(agent) => {
            let install = agent.install()?;
            install.validate().map_err(invalid)?;
            if agent.output == Output::HelmValues {
                write!(
                    out,
                    "{}",
                    serde_yaml::to_string(&agent_helm_values(&install))?
                )?;
                return Ok(());
            }
            writeln!(
                out,
                "# kedge agent {}: apply to the member cluster (kubectl apply -f -).",
                install.tag
            )?;
            write_objects(&agent_manifests(&install), out)
        }
    }
}

/// A reference to an object: enough for `kubectl delete -f`.
fn reference(o: &Value) -> Value {
    let mut metadata = json!({"name": o["metadata"]["name"]});
    if let Some(ns) = o["metadata"]["namespace"].as_str() {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": metadata})
}

fn secret(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace}})
}

/// Runs `uninstall`: what the install made, minus its namespace, as references.
pub fn uninstall(args: &UninstallArgs, out: &mut impl std::io::Write) -> Result<()> {
    let mut objects: Vec<Value> = Vec::new();
    let what = match &args.what {
        UninstallCommand::Hub {
            namespace,
            lease_name,
            include_crds,
            include_ca,
            cluster_profile_namespace,
        } => {
            let d = HubDeployment {
                rbac: HubInstall {
                    namespace: namespace.clone(),
                    lease_name: lease_name.clone(),
                    // Both controllers' objects are named alike; DSJ only adds rules.
                    dsj_enabled: true,
                    enrollment: true,
                    scaler: HubInstall::default().scaler,
                    // The ClusterProfiles' Role where the install put it; the profiles
                    // themselves stay.
                    cluster_profiles: true,
                    cluster_profile_namespace: cluster_profile_namespace.clone(),
                },
                ..HubDeployment::default()
            };
            objects.extend(hub_manifests(&d).iter().map(reference));
            if *include_ca {
                objects.push(secret(namespace, crate::ca::CA_SECRET));
            }
            // Not the ClusterProfile CRD: it may hold other cluster managers' profiles.
            if *include_crds {
                objects.extend(crds(false)?.iter().map(reference));
            }
            "management cluster"
        }
        UninstallCommand::Agent {
            namespaces,
            agent_namespace,
        } => {
            let mut install = AgentInstall::new(
                vec!["unused:1".to_owned()],
                String::new(),
                Credentials::Bootstrap {
                    token: String::new(),
                },
                // Without a list, every Role the agent can have: its ClusterRole for all.
                AgentNamespaces::from_flags(namespaces, namespaces.is_empty()),
            );
            install.agent_namespace = agent_namespace.clone();
            objects.extend(agent_manifests(&install).iter().map(reference));
            objects.push(secret(agent_namespace, IDENTITY_SECRET));
            "member cluster"
        }
    };
    objects.retain(|o| o["kind"] != "Namespace");
    writeln!(
        out,
        "# Pipe to kubectl delete --ignore-not-found -f - against the {what}."
    )?;
    write_objects(&objects, out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    /// `kubectl kedge uninstall ARGS`, as YAML.
    fn uninstalled(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(["kubectl-kedge", "uninstall"].iter().chain(args))
            .expect("valid arguments");
        let Command::Uninstall(args) = cli.command else {
            panic!("not uninstall");
        };
        let mut out = Vec::new();
        uninstall(&args, &mut out).expect("uninstall renders");
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn uninstall_hub_removes_the_cluster_profile_role_where_the_install_put_it() {
        let role = |yaml: &str, namespace: &str| {
            yaml.split("\n---\n").any(|doc| {
                let has = |line: &str| doc.lines().any(|l| l.trim() == line);
                has("kind: Role")
                    && has(&format!(
                        "name: {}",
                        crate::install::hub::CLUSTER_PROFILES_ROLE
                    ))
                    && has(&format!("namespace: {namespace}"))
            })
        };
        let default = uninstalled(&["hub"]);
        assert!(role(&default, "kedge-system"), "{default}");
        let custom = uninstalled(&["hub", "--cluster-profile-namespace", "fleet"]);
        assert!(role(&custom, "fleet"), "{custom}");
        assert!(!role(&custom, "kedge-system"), "{custom}");
    }
}

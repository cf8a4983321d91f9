//! Command-line and environment configuration of `kedge-hub`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kedge_net::telemetry::LogFormat;

use crate::registry::Liveness;
use crate::server::ServerLimits;

/// The kedge hub: makes every scaling, placement and taint decision for a fleet of member
/// clusters whose agents dial in over QUIC with mutual TLS.
#[derive(Debug, Clone, Parser)]
#[command(name = "kedge-hub", version)]
pub struct HubArgs {
    /// UDP address of the QUIC listener agents dial.
    #[arg(long, env = "KEDGE_HUB_LISTEN", default_value = "0.0.0.0:7443")]
    pub listen: SocketAddr,
    /// TCP address of the ops endpoint (/metrics, /healthz, /readyz, /v1/sessions).
    #[arg(long, env = "KEDGE_HUB_OPS_LISTEN", default_value = "0.0.0.0:8080")]
    pub ops_listen: SocketAddr,
    /// PEM file with the hub's server certificate chain.
    #[arg(long, env = "KEDGE_HUB_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM file with the hub's server private key.
    #[arg(long, env = "KEDGE_HUB_TLS_KEY")]
    pub tls_key: PathBuf,
    /// PEM bundle of the CA that signs member client certificates.
    #[arg(long, env = "KEDGE_HUB_TLS_CA")]
    pub tls_ca: PathBuf,
    /// How often agents must send a heartbeat (e.g. 5s, 500ms).
    #[arg(long, env = "KEDGE_HUB_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Missed heartbeat intervals before a member is Unreachable.
    #[arg(long, env = "KEDGE_HUB_HEARTBEAT_TOLERANCE", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub heartbeat_tolerance: u32,
    /// Concurrent agent connections beyond which new ones are refused.
    #[arg(long, env = "KEDGE_HUB_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Kubeconfig of the hub cluster (where DSOs and MemberClusters live); default:
    /// in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "KEDGE_HUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Run the DistributedScaledObject controller.
    #[arg(long, env = "DSO_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub dso_enabled: bool,
    /// Run the DistributedScaledJob controller (not part of this release: accepted and
    /// reported, no controller runs).
    #[arg(long, env = "DSJ_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub dsj_enabled: bool,
    /// Talk to the hub cluster at all (MemberCluster status, DSOs). `false` runs the QUIC
    /// server alone.
    #[arg(long, env = "KEDGE_HUB_CONTROLLERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub controllers: bool,
    /// Log format: text or json.
    #[arg(long, env = "KEDGE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

impl HubArgs {
    /// The liveness rule.
    pub fn liveness(&self) -> Liveness {
        Liveness {
            interval: self.heartbeat_interval,
            tolerance: self.heartbeat_tolerance,
        }
    }

    /// Where the controllers find the hub cluster and which run; `None` when disabled.
    pub fn controllers(&self) -> Option<crate::controller::ControllerConfig> {
        self.controllers
            .then(|| crate::controller::ControllerConfig {
                kubeconfig: self.kubeconfig.clone(),
                dso: self.dso_enabled,
            })
    }

    /// Server limits.
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections.max(1),
            ..ServerLimits::default()
        }
    }
}

//! Command-line and environment configuration of `kedge-hub`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kedge_net::telemetry::LogFormat;

use crate::registry::Liveness;
use crate::server::ServerLimits;

/// Port of the hub's ops endpoint, in every setup: the hub's default `--ops-listen`, the Helm
/// chart's and `kubectl kedge install hub`'s `0.0.0.0:PORT` (where `kubectl port-forward`
/// reaches it), and where `kubectl kedge sessions` looks first.
pub const DEFAULT_OPS_PORT: u16 = 8080;

/// The hub's default `--ops-listen`: loopback, [`DEFAULT_OPS_PORT`].
pub const DEFAULT_OPS_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, DEFAULT_OPS_PORT));

/// The environment variable of `--ops-listen`; `kubectl kedge sessions` reads it too, so that
/// a shell that started the hub with it finds the hub.
pub const OPS_LISTEN_ENV: &str = "KEDGE_HUB_OPS_LISTEN";

/// The kedge hub: makes every scaling, placement and taint decision for a fleet of member
/// clusters whose agents dial in over QUIC with mutual TLS.
#[derive(Debug, Clone, Parser)]
#[command(name = "kedge-hub", version)]
pub struct HubArgs {
    /// UDP address of the QUIC listener agents dial.
    #[arg(long, env = "KEDGE_HUB_LISTEN", default_value = "0.0.0.0:7443")]
    pub listen: SocketAddr,
    /// TCP address of the ops endpoint (/metrics, /healthz, /readyz, /v1/sessions).
    /// Loopback by default; in a cluster set 0.0.0.0:8080 so that kubelet probes and
    /// Prometheus reach it (the Helm chart and `kubectl kedge install hub` do).
    #[arg(long, env = OPS_LISTEN_ENV, default_value_t = DEFAULT_OPS_LISTEN)]
    pub ops_listen: SocketAddr,
    /// PEM file with the hub's server certificate chain. With --tls-key and --tls-ca:
    /// certificates from files, no enrollment. Without all three: the hub CA comes from the
    /// Secret kedge-hub-ca in --namespace (created on first start) and members enroll.
    #[arg(long, env = "KEDGE_HUB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file with the hub's server private key.
    #[arg(long, env = "KEDGE_HUB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM bundle of the CA that signs member client certificates.
    #[arg(long, env = "KEDGE_HUB_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The hub namespace: where the CA Secret and bootstrap token Secrets live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kedge-system")]
    pub namespace: String,
    /// DNS names of the hub's server certificate (CA-Secret mode), comma-separated; default:
    /// localhost, kedge-hub, kedge-hub.NAMESPACE, kedge-hub.NAMESPACE.svc.
    #[arg(long, env = "KEDGE_HUB_SERVER_DNS_NAMES", value_delimiter = ',')]
    pub server_dns_names: Vec<String>,
    /// IP addresses of the hub's server certificate (CA-Secret mode), comma-separated.
    #[arg(
        long,
        env = "KEDGE_HUB_SERVER_IPS",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    pub server_ips: Vec<std::net::IpAddr>,
    /// Lifetime of the hub's server certificate (CA-Secret mode); renewed at two thirds.
    #[arg(long, env = "KEDGE_HUB_SERVER_CERT_LIFETIME", default_value = "30d", value_parser = duration_within(SERVER_CERT_LIFETIME))]
    pub server_cert_lifetime: Duration,
    /// Lifetime of member client certificates issued at enrollment and renewal (agents
    /// renew at two thirds of it).
    #[arg(long, env = "KEDGE_HUB_MEMBER_CERT_LIFETIME", default_value = "24h", value_parser = duration_within(crate::enroll::MEMBER_CERT_LIFETIME))]
    pub member_cert_lifetime: Duration,
    /// How often agents must send a heartbeat (e.g. 5s, 500ms).
    #[arg(long, env = "KEDGE_HUB_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = duration_within(HEARTBEAT_INTERVAL))]
    pub heartbeat_interval: Duration,
    /// Missed heartbeat intervals before a member is Unreachable.
    #[arg(long, env = "KEDGE_HUB_HEARTBEAT_TOLERANCE", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub heartbeat_tolerance: u32,
    /// How long a deleted member stays listed in `/v1/sessions` (Unreachable, with why its
    /// session was revoked) before the hub forgets it and its per-member metric series.
    #[arg(long, env = "KEDGE_HUB_FORGET_DEPARTED_AFTER", default_value = "5m", value_parser = duration_within(FORGET_DEPARTED_AFTER))]
    pub forget_departed_after: Duration,
    /// Established agent sessions beyond which new ones are refused (handshakes in progress
    /// do not count: see --max-handshakes).
    #[arg(long, env = "KEDGE_HUB_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_connections: u32,
    /// Handshakes (TLS and Hello) in progress beyond which new connections are refused.
    #[arg(long, env = "KEDGE_HUB_MAX_HANDSHAKES", default_value_t = crate::server::DEFAULT_MAX_HANDSHAKES, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_handshakes: u32,
    /// Handshakes in progress from one source (an IPv4 address or an IPv6 /64) beyond which
    /// its new connections are refused.
    #[arg(long, env = "KEDGE_HUB_MAX_HANDSHAKES_PER_SOURCE", default_value_t = crate::server::DEFAULT_MAX_HANDSHAKES_PER_SOURCE, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_handshakes_per_source: u32,
    /// Of --max-handshakes, the handshakes only sources (addresses) that held an agent
    /// session in the last 24 hours may take, so that strangers cannot keep known agents out;
    /// default: a quarter of --max-handshakes.
    #[arg(long, env = "KEDGE_HUB_HANDSHAKE_RESERVE", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub handshake_reserve: Option<u32>,
    /// Time a peer has to prove an identity: to finish the TLS handshake and, on an
    /// enrollment connection, to send its request. Peers that stall are closed after it, or
    /// earlier (after 1s) when a newer attempt needs their place.
    #[arg(long, env = "KEDGE_HUB_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = duration_within(HANDSHAKE_TIMEOUT))]
    pub handshake_timeout: Duration,
    /// File holding a bearer token: `/v1/sessions` then answers any peer presenting it (and
    /// no one without it); unset, it answers peers at 127.0.0.1 or ::1 only (processes in the
    /// hub's pod, `kubectl port-forward`).
    #[arg(long, env = "KEDGE_HUB_OPS_TOKEN_FILE")]
    pub ops_token_file: Option<PathBuf>,
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
    /// Publish one SIG-Multicluster ClusterProfile (multicluster.x-k8s.io/v1alpha1) per
    /// MemberCluster, for cluster-inventory readers (Headlamp, Argo CD, MultiKueue); see
    /// docs/cluster-inventory.md. Without the ClusterProfile CRD the hub warns and retries.
    #[arg(long, env = "KEDGE_HUB_CLUSTER_PROFILES", default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_profiles: bool,
    /// Namespace of the published ClusterProfiles (it must exist); default: --namespace.
    #[arg(long, env = "KEDGE_HUB_CLUSTER_PROFILE_NAMESPACE", value_parser = namespace_name)]
    pub cluster_profile_namespace: Option<String>,
    /// Name of the coordination.k8s.io/v1 Lease that elects the one active hub.
    #[arg(long, env = "KEDGE_HUB_LEASE_NAME", default_value = "kedge-hub")]
    pub lease_name: String,
    /// Namespace of the Lease; default: $POD_NAMESPACE, else kedge-system.
    #[arg(long, env = "KEDGE_HUB_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a hub that stopped renewing keeps the Lease (whole seconds, 1s to 10m;
    /// rounded up). A standby takes over within about this long after the active hub dies.
    #[arg(long, env = "KEDGE_HUB_LEASE_DURATION", default_value = "15s", value_parser = parse_lease_duration)]
    pub lease_duration: Duration,
    /// Sharded replicas (docs/scale.md): every replica holds the sessions of the agents that
    /// dial it, and one that is not active relays them to the active one, which decides for
    /// every object. Needs the hub cluster and the hub CA Secret (not --tls-cert).
    #[arg(long, env = "KEDGE_HUB_SHARDING", default_value_t = false, action = clap::ArgAction::Set)]
    pub sharding: bool,
    /// With --sharding: the IP:PORT the other replicas dial to relay sessions to this one
    /// while it is active (published in its Lease). Default: $POD_IP and the --listen port,
    /// or --listen itself when it names one address.
    #[arg(long, env = "KEDGE_HUB_RELAY_ADDRESS")]
    pub relay_address: Option<std::net::SocketAddr>,
    /// How long a watch of the hub cluster (DSOs, DSJs, MemberClusters) may fail to list or
    /// watch before `/readyz` answers 503 naming it (the controllers act on nothing new
    /// meanwhile).
    #[arg(long, env = "KEDGE_HUB_WATCH_FAILURE_TOLERANCE", default_value = "30s", value_parser = duration_within(WATCH_FAILURE_TOLERANCE))]
    pub watch_failure_tolerance: Duration,
    /// Serve KEDA's external-scaler gRPC API (for `kedge-pod-metrics` triggers) on this
    /// address, with mutual TLS from certificates the hub issues and rotates; unset: no
    /// scaler, and DSOs with such triggers are Degraded. The Helm chart sets 0.0.0.0:9090.
    #[arg(long, env = "KEDGE_HUB_SCALER_LISTEN")]
    pub scaler_listen: Option<std::net::SocketAddr>,
    /// The `host:port` KEDA dials to reach the scaler (the hub's Service); the server
    /// certificate names its host. Default: kedge-hub.NAMESPACE.svc and the listen port.
    #[arg(long, env = "KEDGE_HUB_SCALER_ADDRESS")]
    pub scaler_address: Option<String>,
    /// KEDA's namespace, where the Secret its ClusterTriggerAuthentication names must be
    /// (KEDA's KEDA_CLUSTER_OBJECT_NAMESPACE).
    #[arg(long, env = "KEDGE_HUB_KEDA_NAMESPACE", default_value = "keda")]
    pub keda_namespace: String,
    /// Lifetime of the scaler's server and client certificates; reissued at two thirds.
    #[arg(long, env = "KEDGE_HUB_SCALER_CERT_LIFETIME", default_value = "30d", value_parser = duration_within(SERVER_CERT_LIFETIME))]
    pub scaler_cert_lifetime: Duration,
    /// Log format: text or json.
    #[arg(long, env = "KEDGE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// The external scaler's settings (`--scaler-*`).
#[derive(Debug, Clone)]
pub struct ScalerSettings {
    /// Where it listens.
    pub listen: std::net::SocketAddr,
    /// What KEDA dials (`scalerAddress` of the child ScaledObjects' triggers).
    pub address: String,
    /// Its certificates.
    pub certs: crate::podmetrics::certs::CertsConfig,
}

/// Where the hub's TLS certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// `--tls-cert`, `--tls-key`, `--tls-ca`: fixed files, no enrollment.
    Files {
        /// Server certificate chain.
        cert: PathBuf,
        /// Server key.
        key: PathBuf,
        /// CA bundle of member certificates.
        ca: PathBuf,
    },
    /// The hub CA in the Secret `kedge-hub-ca`; server certificate issued and renewed from
    /// it; members enroll with bootstrap tokens.
    CaSecret,
}

/// Bounds of `--heartbeat-interval`: faster floods the hub with heartbeats, slower hides a
/// dead member for too long.
pub const HEARTBEAT_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(600));
/// Bounds of `--forget-departed-after`.
pub const FORGET_DEPARTED_AFTER: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));
/// Bounds of `--server-cert-lifetime` (the shortest is for tests of renewal).
pub const SERVER_CERT_LIFETIME: (Duration, Duration) = (
    Duration::from_secs(10),
    Duration::from_secs(5 * 365 * 24 * 3600),
);
/// Bounds of `--watch-failure-tolerance`.
pub const WATCH_FAILURE_TOLERANCE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));
/// Bounds of `--handshake-timeout`: shorter fails agents on slow links, longer lets a
/// stalled peer hold its permit longer.
pub const HANDSHAKE_TIMEOUT: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(60));
/// Bounds of `--lease-duration`.
pub const LEASE_DURATION: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));

fn duration_within(
    (min, max): (Duration, Duration),
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    kedge_net::flags::duration_within(min, max)
}

/// Parses a namespace name (an RFC 1123 label).
fn namespace_name(value: &str) -> Result<String, String> {
    if kedge_protocol::is_dns1123_label(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

/// Parses `--lease-duration`: within [`LEASE_DURATION`], rounded up to whole seconds because
/// `leaseDurationSeconds` is an integer.
fn parse_lease_duration(value: &str) -> Result<Duration, String> {
    let duration = duration_within(LEASE_DURATION)(value)?;
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Ok(Duration::from_secs(seconds))
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
                dsj: self.dsj_enabled,
                scaler_address: self.scaler().ok().flatten().map(|s| s.address),
                watch_failure_tolerance: self.watch_failure_tolerance,
                cluster_profiles: self.cluster_profiles.then(|| {
                    self.cluster_profile_namespace
                        .clone()
                        .filter(|ns| !ns.is_empty())
                        .unwrap_or_else(|| self.namespace.clone())
                }),
            })
    }

    /// The Lease this hub competes for, as candidate `identity`; `None` without a hub
    /// cluster (`--controllers false`), where the hub is active alone.
    /// `pod_namespace` is `$POD_NAMESPACE`, the default namespace.
    pub fn lease(
        &self,
        pod_namespace: Option<String>,
        identity: String,
    ) -> Option<crate::lease::LeaseConfig> {
        self.controllers.then(|| crate::lease::LeaseConfig {
            name: self.lease_name.clone(),
            namespace: self
                .lease_namespace
                .clone()
                .or(pod_namespace.filter(|ns| !ns.is_empty()))
                .unwrap_or_else(|| "kedge-system".to_owned()),
            duration: self.lease_duration,
            identity,
            relay_address: None,
        })
    }

    /// With `--sharding`, where this replica takes relayed sessions while it is active;
    /// `Ok(None)` without sharding. `pod_ip` is `$POD_IP`.
    pub fn relay_address(
        &self,
        pod_ip: Option<&str>,
    ) -> Result<Option<std::net::SocketAddr>, String> {
        if !self.sharding {
            return Ok(None);
        }
        if !self.controllers {
            return Err("--sharding needs the hub cluster (--controllers true): replicas share it and its Lease".into());
        }
        if self.tls_cert.is_some() {
            return Err("--sharding needs the hub CA Secret (no --tls-cert/--tls-key/--tls-ca): each replica issues its relay certificate from the CA".into());
        }
        if let Some(address) = self.relay_address {
            if address.ip().is_unspecified() || address.port() == 0 {
                return Err(format!(
                    "--relay-address {address} must be one IP address and port the other replicas can dial"
                ));
            }
            return Ok(Some(address));
        }
        let port = self.listen.port();
        if let Some(ip) = pod_ip.filter(|ip| !ip.is_empty()) {
            let ip: std::net::IpAddr = ip
                .parse()
                .map_err(|_| format!("$POD_IP {ip:?} is not an IP address; set --relay-address"))?;
            return Ok(Some(std::net::SocketAddr::new(ip, port)));
        }
        if self.listen.ip().is_unspecified() || port == 0 {
            return Err(format!(
                "--sharding: set --relay-address (or $POD_IP): --listen {} names no one address the other replicas can dial",
                self.listen
            ));
        }
        Ok(Some(self.listen))
    }

    /// Where the hub's certificates come from.
    pub fn tls_source(&self) -> crate::Result<TlsSource> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            (None, None, None) => Ok(TlsSource::CaSecret),
            _ => Err(crate::Error::TlsFlags),
        }
    }

    /// The external scaler's settings; `None` without `--scaler-listen`. An address whose
    /// host cannot be named by a certificate is an error.
    pub fn scaler(&self) -> Result<Option<ScalerSettings>, String> {
        let Some(listen) = self.scaler_listen else {
            return Ok(None);
        };
        if !self.controllers {
            return Err("--scaler-listen needs the hub cluster (--controllers true): the scaler answers for DistributedScaledObjects".into());
        }
        let address = self
            .scaler_address
            .clone()
            .unwrap_or_else(|| format!("kedge-hub.{}.svc:{}", self.namespace, listen.port()));
        let host = match address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            _ => {
                return Err(format!(
                    "--scaler-address {address:?} must be host:port (what KEDA dials, e.g. kedge-hub.kedge-system.svc:9090)"
                ));
            }
        };
        Ok(Some(ScalerSettings {
            listen,
            address,
            certs: crate::podmetrics::certs::CertsConfig {
                hub_namespace: self.namespace.clone(),
                keda_namespace: self.keda_namespace.clone(),
                names: vec![host],
                lifetime: self.scaler_cert_lifetime,
            },
        }))
    }

    /// Names of the server certificate in CA-Secret mode: DNS names, then IP addresses.
    pub fn server_cert(&self) -> crate::ca::ServerCertConfig {
        let ns = &self.namespace;
        let mut names = if self.server_dns_names.is_empty() {
            vec![
                "localhost".to_owned(),
                "kedge-hub".to_owned(),
                format!("kedge-hub.{ns}"),
                format!("kedge-hub.{ns}.svc"),
            ]
        } else {
            self.server_dns_names.clone()
        };
        names.extend(self.server_ips.iter().map(ToString::to_string));
        crate::ca::ServerCertConfig {
            names,
            lifetime: self.server_cert_lifetime,
            transport: self.transport(),
        }
    }

    /// The QUIC transport of the hub's sessions, from the heartbeat rule.
    pub fn transport(&self) -> kedge_net::tls::TransportTuning {
        kedge_net::tls::TransportTuning::hub(self.liveness().deadline())
    }

    /// Server limits; an error naming the flags when the reserve leaves strangers nothing.
    pub fn limits(&self) -> Result<ServerLimits, String> {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        let max_handshakes = count(self.max_handshakes);
        let handshake_reserve = self
            .handshake_reserve
            .map_or_else(|| crate::budget::default_reserve(max_handshakes), count);
        if handshake_reserve >= max_handshakes {
            return Err(format!(
                "--handshake-reserve ({handshake_reserve}) must be less than --max-handshakes \
                 ({max_handshakes}): agents enrolling for the first time need a share"
            ));
        }
        Ok(ServerLimits {
            max_connections: count(self.max_connections),
            max_handshakes,
            max_handshakes_per_source: count(self.max_handshakes_per_source),
            handshake_reserve,
            handshake_timeout: self.handshake_timeout,
            ..ServerLimits::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ops_endpoint_listens_on_loopback_unless_told_otherwise() {
        let args = HubArgs::try_parse_from(["kedge-hub"]).unwrap();
        assert_eq!(args.ops_listen, "127.0.0.1:8080".parse().unwrap());
        let wide = HubArgs::try_parse_from(["kedge-hub", "--ops-listen", "0.0.0.0:8080"]).unwrap();
        assert_eq!(wide.ops_listen, "0.0.0.0:8080".parse().unwrap());
    }

    /// ClusterProfiles go to the hub's namespace unless another is named; `false` stops them.
    #[test]
    fn cluster_profiles_are_published_in_the_hub_namespace_unless_told_otherwise() {
        let profiles = |args: &[&str]| {
            let args = HubArgs::try_parse_from([&["kedge-hub"][..], args].concat()).unwrap();
            args.controllers().unwrap().cluster_profiles
        };
        assert_eq!(profiles(&[]).as_deref(), Some("kedge-system"));
        assert_eq!(
            profiles(&["--namespace", "kedge"]).as_deref(),
            Some("kedge")
        );
        assert_eq!(
            profiles(&[
                "--namespace",
                "kedge",
                "--cluster-profile-namespace",
                "fleet"
            ])
            .as_deref(),
            Some("fleet")
        );
        assert_eq!(profiles(&["--cluster-profiles", "false"]), None);
        assert!(
            HubArgs::try_parse_from(["kedge-hub", "--cluster-profile-namespace", "A_B"]).is_err()
        );
    }

    #[test]
    fn the_scaler_is_off_unless_asked_and_names_what_keda_dials() {
        let off = HubArgs::try_parse_from(["kedge-hub"]).unwrap();
        assert!(off.scaler().unwrap().is_none());
        assert_eq!(off.controllers().unwrap().scaler_address, None);
        let on = HubArgs::try_parse_from([
            "kedge-hub",
            "--namespace",
            "hub-ns",
            "--scaler-listen",
            "0.0.0.0:9090",
        ])
        .unwrap();
        let scaler = on.scaler().unwrap().unwrap();
        assert_eq!(scaler.address, "kedge-hub.hub-ns.svc:9090");
        assert_eq!(scaler.certs.names, ["kedge-hub.hub-ns.svc"]);
        assert_eq!(scaler.certs.keda_namespace, "keda");
        assert_eq!(scaler.certs.lifetime, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(
            on.controllers().unwrap().scaler_address.as_deref(),
            Some("kedge-hub.hub-ns.svc:9090")
        );
        let ip = HubArgs::try_parse_from([
            "kedge-hub",
            "--scaler-listen",
            "127.0.0.1:0",
            "--scaler-address",
            "[::1]:7000",
        ])
        .unwrap();
        assert_eq!(ip.scaler().unwrap().unwrap().certs.names, ["::1"]);
        let bad = HubArgs::try_parse_from([
            "kedge-hub",
            "--scaler-listen",
            "127.0.0.1:0",
            "--scaler-address",
            "no-port",
        ])
        .unwrap();
        assert!(bad.scaler().unwrap_err().contains("must be host:port"));
        let alone = HubArgs::try_parse_from([
            "kedge-hub",
            "--scaler-listen",
            "127.0.0.1:0",
            "--controllers",
            "false",
        ])
        .unwrap();
        assert!(alone.scaler().unwrap_err().contains("--controllers true"));
    }

    fn parse(extra: &[&str]) -> Result<HubArgs, clap::Error> {
        let mut args = vec![
            "kedge-hub",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--tls-ca",
            "ca",
        ];
        args.extend_from_slice(extra);
        HubArgs::try_parse_from(args)
    }

    #[test]
    fn tls_flags_go_together() {
        assert!(matches!(
            parse(&[]).unwrap().tls_source(),
            Ok(TlsSource::Files { .. })
        ));
        let bare = HubArgs::try_parse_from(["kedge-hub", "--namespace", "hub-ns"]).unwrap();
        assert_eq!(bare.tls_source().unwrap(), TlsSource::CaSecret);
        let server = bare.server_cert();
        assert_eq!(
            server.names,
            [
                "localhost",
                "kedge-hub",
                "kedge-hub.hub-ns",
                "kedge-hub.hub-ns.svc",
                "127.0.0.1"
            ]
        );
        assert_eq!(server.lifetime, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(bare.member_cert_lifetime, Duration::from_secs(24 * 3600));
        let half = HubArgs::try_parse_from(["kedge-hub", "--tls-cert", "c"]).unwrap();
        let err = half.tls_source().unwrap_err().to_string();
        assert!(err.contains("go together"), "{err}");
        let custom = HubArgs::try_parse_from([
            "kedge-hub",
            "--server-dns-names",
            "hub.example",
            "--server-ips",
            "10.0.0.1,::1",
        ])
        .unwrap();
        assert_eq!(
            custom.server_cert().names,
            ["hub.example", "10.0.0.1", "::1"]
        );
        let err = HubArgs::try_parse_from(["kedge-hub", "--member-cert-lifetime", "5s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be between 10s"), "{err}");
    }

    #[test]
    fn lease_defaults() {
        let args = parse(&[]).unwrap();
        let lease = args.lease(None, "me".into()).unwrap();
        assert_eq!(lease.name, "kedge-hub");
        assert_eq!(lease.namespace, "kedge-system");
        assert_eq!(lease.duration, Duration::from_secs(15));
        assert_eq!(lease.identity, "me");
        let lease = args.lease(Some("hub-ns".into()), "me".into()).unwrap();
        assert_eq!(lease.namespace, "hub-ns");
        let args = parse(&["--lease-namespace", "explicit", "--lease-name", "l"]).unwrap();
        let lease = args.lease(Some("hub-ns".into()), "me".into()).unwrap();
        assert_eq!(
            (lease.name.as_str(), lease.namespace.as_str()),
            ("l", "explicit")
        );
    }

    #[test]
    fn relay_addresses() {
        let address = |flags: &[&str], pod_ip: Option<&str>| {
            HubArgs::try_parse_from([&["kedge-hub"][..], flags].concat())
                .unwrap()
                .relay_address(pod_ip)
        };
        assert_eq!(address(&[], Some("10.0.0.1")), Ok(None));
        let on = ["--sharding", "true"];
        assert_eq!(
            address(&on, Some("10.0.0.1")),
            Ok(Some("10.0.0.1:7443".parse().unwrap()))
        );
        let listen = [&on[..], &["--listen", "127.0.0.2:9000"]].concat();
        assert_eq!(
            address(&listen, None),
            Ok(Some("127.0.0.2:9000".parse().unwrap()))
        );
        let explicit = [&on[..], &["--relay-address", "10.1.2.3:7000"]].concat();
        assert_eq!(
            address(&explicit, Some("10.0.0.1")),
            Ok(Some("10.1.2.3:7000".parse().unwrap()))
        );
        let bad: [(&[&str], Option<&str>, &str); 5] = [
            (&on, None, "--relay-address"),
            (&on, Some("not-an-ip"), "$POD_IP"),
            (
                &["--sharding", "true", "--relay-address", "0.0.0.0:7443"],
                None,
                "one IP address",
            ),
            (
                &["--sharding", "true", "--controllers", "false"],
                None,
                "hub cluster",
            ),
            (
                &[
                    "--sharding",
                    "true",
                    "--tls-cert",
                    "c",
                    "--tls-key",
                    "k",
                    "--tls-ca",
                    "a",
                ],
                None,
                "CA Secret",
            ),
        ];
        for (flags, pod_ip, expected) in bad {
            let error = address(flags, pod_ip).unwrap_err();
            assert!(error.contains(expected), "{flags:?}: {error}");
        }
    }

    #[test]
    fn no_lease_without_a_hub_cluster() {
        let args = parse(&["--controllers", "false"]).unwrap();
        assert_eq!(args.lease(None, "me".into()), None);
    }

    #[test]
    fn lease_durations() {
        let duration = |v: &str| parse(&["--lease-duration", v]).map(|a| a.lease_duration);
        assert_eq!(duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(duration("1500ms").unwrap(), Duration::from_secs(2));
        for bad in ["0s", "0", "999ms", "soon", "10m 1s", "5124095576030431h"] {
            let error = duration(bad).unwrap_err().to_string();
            assert!(error.contains("--lease-duration"), "{bad}: {error}");
        }
        let error = duration("500ms").unwrap_err().to_string();
        assert!(error.contains("must be between 1s and 10m"), "{error}");
    }

    #[test]
    fn flags_out_of_range_are_refused_naming_the_flag_and_range() {
        for (flag, bad, expected) in [
            (
                "--heartbeat-interval",
                "0s",
                "must be between 100ms and 10m",
            ),
            (
                "--heartbeat-interval",
                "1h",
                "must be between 100ms and 10m",
            ),
            (
                "--heartbeat-interval",
                "5124095576030431h",
                "must be between",
            ),
            ("--heartbeat-tolerance", "0", "0 is not in 1..=100"),
            ("--heartbeat-tolerance", "4294967295", "is not in 1..=100"),
            ("--max-connections", "0", "0 is not in 1..=100000"),
            ("--max-connections", "18446744073709551615", "invalid value"),
            ("--max-connections", "-1", "unexpected argument"),
            ("--max-handshakes", "0", "0 is not in 1..=100000"),
            ("--max-handshakes-per-source", "0", "0 is not in 1..=100000"),
            ("--handshake-timeout", "500ms", "must be between 1s and 1m"),
            ("--handshake-timeout", "2m", "must be between 1s and 1m"),
            ("--handshake-reserve", "-1", "unexpected argument"),
        ] {
            let error = parse(&[flag, bad]).unwrap_err().to_string();
            assert!(
                error.contains(flag) || expected == "unexpected argument",
                "{flag} {bad}: {error}"
            );
            assert!(error.contains(expected), "{flag} {bad}: {error}");
        }
        let args = parse(&[
            "--heartbeat-interval",
            "100ms",
            "--max-connections",
            "100000",
        ])
        .unwrap();
        assert_eq!(args.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(args.limits().unwrap().max_connections, 100_000);
        let limits = parse(&[]).unwrap().limits().unwrap();
        assert_eq!(
            (
                limits.max_handshakes,
                limits.max_handshakes_per_source,
                limits.handshake_reserve,
                limits.handshake_timeout
            ),
            (256, 16, 64, Duration::from_secs(5))
        );
        let limits = parse(&[
            "--max-handshakes",
            "8",
            "--max-handshakes-per-source",
            "2",
            "--handshake-timeout",
            "2s",
        ])
        .unwrap()
        .limits()
        .unwrap();
        assert_eq!(
            (
                limits.max_handshakes,
                limits.max_handshakes_per_source,
                limits.handshake_reserve,
                limits.handshake_timeout
            ),
            (8, 2, 2, Duration::from_secs(2))
        );
        let error = parse(&["--max-handshakes", "8", "--handshake-reserve", "8"])
            .unwrap()
            .limits()
            .unwrap_err();
        assert!(
            error.contains("--handshake-reserve (8) must be less than --max-handshakes (8)"),
            "{error}"
        );
        let limits = parse(&["--handshake-reserve", "0"])
            .unwrap()
            .limits()
            .unwrap();
        assert_eq!(limits.handshake_reserve, 0);
    }
}

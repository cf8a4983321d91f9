//! Command-line and environment configuration of `kedge-agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};
use kedge_net::agent_cli::{env, flag};
use kedge_net::telemetry::LogFormat;

use crate::policy::{DEFAULT_KINDS, KindPolicy, NamespacePolicy, Policy, WorkloadKind};

/// The kedge member agent: dials out to the hub over QUIC with mutual TLS, applies what the hub
/// decides in this cluster and reports back. The member name is the Common Name of its
/// client certificate.
#[derive(Debug, Clone, Parser)]
#[command(name = "kedge-agent", version)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["namespaces", "all_namespaces"])))]
pub struct AgentArgs {
    /// The hub's QUIC address, HOST:PORT; several, comma-separated, for hubs in high
    /// availability: the agent dials them round robin until the active one accepts.
    #[arg(long = flag::HUB, env = env::HUB, value_delimiter = ',', required = true)]
    pub hub: Vec<String>,
    /// Name to verify in every hub's certificate; defaults to HOST of each --hub address.
    #[arg(long = flag::HUB_SERVER_NAME, env = "KEDGE_AGENT_HUB_SERVER_NAME")]
    pub hub_server_name: Option<String>,
    /// PEM file with this member's client certificate (with --tls-key). Without it the agent
    /// uses the identity Secret, enrolling with --bootstrap-token-file when it holds nothing
    /// usable.
    #[arg(long = flag::TLS_CERT, env = "KEDGE_AGENT_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file with this member's private key.
    #[arg(long = flag::TLS_KEY, env = "KEDGE_AGENT_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// File holding the one-time bootstrap token `<member>.<secret>` from
    /// `kubectl kedge mc setup-member`; used when the identity Secret holds no usable
    /// certificate, or one enrolled with another token (the member was set up again).
    #[arg(long = flag::BOOTSTRAP_TOKEN_FILE, env = "KEDGE_AGENT_BOOTSTRAP_TOKEN_FILE")]
    pub bootstrap_token_file: Option<PathBuf>,
    /// Secret (in --agent-namespace) where the agent keeps its key and certificate.
    #[arg(
        long = flag::IDENTITY_SECRET,
        env = "KEDGE_AGENT_IDENTITY_SECRET",
        default_value = "kedge-agent-identity"
    )]
    pub identity_secret: String,
    /// The agent's own namespace, where its identity Secret lives.
    #[arg(long = flag::AGENT_NAMESPACE, env = env::POD_NAMESPACE, default_value = "kedge-system")]
    pub agent_namespace: String,
    /// PEM bundle of the hub CA.
    #[arg(long = flag::TLS_CA, env = "KEDGE_AGENT_TLS_CA")]
    pub tls_ca: PathBuf,
    /// TCP address of the ops endpoint (/metrics, /healthz, /readyz); loopback unless
    /// widened (the chart and `kubectl kedge install agent` set 0.0.0.0:8081 for probes).
    #[arg(long = flag::OPS_LISTEN, env = "KEDGE_AGENT_OPS_LISTEN", default_value = "127.0.0.1:8081")]
    pub ops_listen: SocketAddr,
    /// Namespaces the agent may act in (comma-separated); commands for any other namespace
    /// are refused. Required unless --all-namespaces.
    #[arg(long = flag::NAMESPACES, env = "KEDGE_AGENT_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Let the agent act in every namespace (not recommended: its RBAC must then be
    /// cluster-wide, and a compromised hub reaches every namespace).
    #[arg(long = flag::ALL_NAMESPACES, env = "KEDGE_AGENT_ALL_NAMESPACES", action = ArgAction::SetTrue, conflicts_with = "namespaces")]
    pub all_namespaces: bool,
    /// Workload kinds the agent may scale, comma-separated `group/version/Kind` (`v1/Kind`
    /// for the core group); commands for any other kind are refused.
    #[arg(long = flag::KINDS, env = "KEDGE_AGENT_KINDS", value_delimiter = ',', default_value = DEFAULT_KINDS)]
    pub kinds: Vec<WorkloadKind>,
    /// First reconnect delay; doubles (with jitter) up to --reconnect-max.
    #[arg(long, env = "KEDGE_AGENT_RECONNECT_INITIAL", default_value = "500ms", value_parser = duration_within(RECONNECT_INITIAL))]
    pub reconnect_initial: Duration,
    /// Longest reconnect delay.
    #[arg(long, env = "KEDGE_AGENT_RECONNECT_MAX", default_value = "30s", value_parser = duration_within(RECONNECT_MAX))]
    pub reconnect_max: Duration,
    /// Missed heartbeat answers after which the hub is considered gone.
    #[arg(long, env = "KEDGE_AGENT_HEARTBEAT_TOLERANCE", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub heartbeat_tolerance: u32,
    /// Kubeconfig of the member cluster; default: in-cluster, then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "KEDGE_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How often the report loop runs without a watch event (managed workloads are watched:
    /// their changes are reported at once); at most one report each.
    #[arg(long, env = "KEDGE_AGENT_REPORT_INTERVAL", default_value = "2s", value_parser = duration_within(REPORT_INTERVAL))]
    pub report_interval: Duration,
    /// How long a watch of managed workloads, their pods and autoscalers stays open before it
    /// is renewed (from where it was, without a list): a permission revoked meanwhile is
    /// noticed and reported at the latest then (the API server checks RBAC when a watch
    /// starts).
    #[arg(long, env = "KEDGE_AGENT_WATCH_TIMEOUT", default_value = "60s", value_parser = duration_within(WATCH_TIMEOUT))]
    pub watch_timeout: Duration,
    /// How often cluster capacity (nodes, pod requests) is recomputed.
    #[arg(long, env = "KEDGE_AGENT_CAPACITY_INTERVAL", default_value = "10s", value_parser = duration_within(CAPACITY_INTERVAL))]
    pub capacity_interval: Duration,
    /// Log format: text or json.
    #[arg(long = flag::LOG_FORMAT, env = "KEDGE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// Bounds of `--watch-timeout`: whole seconds (the API server's `timeoutSeconds`), at most
/// kube-runtime's own default.
pub const WATCH_TIMEOUT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(290));
/// Bounds of `--reconnect-initial`.
pub const RECONNECT_INITIAL: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(60));
/// Bounds of `--reconnect-max` (and at least `--reconnect-initial`).
pub const RECONNECT_MAX: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// Bounds of `--report-interval`: it paces reports without a watch event (an unschedulable
/// pod's age moves once each, capacity is read on the tick) and retries; changes seen by the
/// watches are reported at once anyway.
pub const REPORT_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(600));
/// Bounds of `--capacity-interval`.
pub const CAPACITY_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));

fn duration_within(
    (min, max): (Duration, Duration),
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    kedge_net::flags::duration_within(min, max)
}

impl AgentArgs {
    /// Parses the command line and checks the rules between flags; exits with clap's usage
    /// error when a flag is out of range or two contradict each other.
    pub fn parse_checked() -> Self {
        Self::parse().checked().unwrap_or_else(|e| e.exit())
    }

    /// The rules between flags that clap cannot express per flag.
    pub fn checked(self) -> Result<Self, clap::Error> {
        if self.reconnect_max < self.reconnect_initial {
            return Err(<Self as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--reconnect-max ({}) must be at least --reconnect-initial ({})",
                    humantime::format_duration(self.reconnect_max),
                    humantime::format_duration(self.reconnect_initial)
                ),
            ));
        }
        if self.hubs().is_empty() {
            return Err(<Self as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::InvalidValue,
                "--hub needs at least one HOST:PORT",
            ));
        }
        if let Err(problems) = NamespacePolicy::parse(&self.namespaces, self.all_namespaces) {
            return Err(<Self as clap::CommandFactory>::command()
                .error(clap::error::ErrorKind::InvalidValue, problems));
        }
        Ok(self)
    }

    /// What the agent may touch: the namespaces and kinds it was given.
    pub fn policy(&self) -> Policy {
        Policy {
            // `checked` refused an empty list; should one get here, it allows nothing.
            namespaces: NamespacePolicy::from_flags(&self.namespaces, self.all_namespaces),
            kinds: KindPolicy::new(&self.kinds),
        }
    }

    /// The hub addresses, in order, without blanks.
    pub fn hubs(&self) -> Vec<String> {
        self.hub
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The TLS server name to verify for `hub`: --hub-server-name, else the host part of
    /// `hub`.
    pub fn server_name(&self, hub: &str) -> String {
        if let Some(name) = &self.hub_server_name {
            return name.clone();
        }
        let host = hub.rsplit_once(':').map_or(hub, |(host, _)| host);
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command line with TLS flags, `--namespaces apps` unless `flags` set the scope,
    /// and `flags`, checked as at startup.
    fn with(flags: &[&str]) -> Result<AgentArgs, clap::Error> {
        let scoped = flags
            .iter()
            .any(|f| *f == "--namespaces" || *f == "--all-namespaces");
        let scope: &[&str] = if scoped {
            &[]
        } else {
            &["--namespaces", "apps"]
        };
        without_scope(&[scope, flags].concat())
    }

    /// The command line with TLS flags and `flags` only.
    fn without_scope(flags: &[&str]) -> Result<AgentArgs, clap::Error> {
        let tls = ["--tls-cert", "c", "--tls-key", "k", "--tls-ca", "ca"];
        let all = std::iter::once("kedge-agent")
            .chain(tls)
            .chain(flags.iter().copied());
        AgentArgs::try_parse_from(all).and_then(AgentArgs::checked)
    }

    #[test]
    fn the_agent_acts_only_where_it_was_told() {
        // Neither --namespaces nor --all-namespaces: a usage error naming both.
        let error = without_scope(&["--hub", "hub:7443"]).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        let text = error.to_string();
        assert!(
            text.contains("--namespaces") && text.contains("--all-namespaces"),
            "{text}"
        );
        let error = without_scope(&["--hub", "h:1", "--namespaces", " , "])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--namespaces needs at least one"), "{error}");
        let error = without_scope(&["--hub", "h:1", "--namespaces", "apps,Web"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"Web\" is not a namespace name"), "{error}");
        let error =
            without_scope(&["--hub", "h:1", "--namespaces", "a", "--all-namespaces"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);

        let policy = without_scope(&["--hub", "h:1", "--namespaces", "b,a"])
            .unwrap()
            .policy();
        assert_eq!(
            policy.namespaces,
            NamespacePolicy::Only(vec!["a".into(), "b".into()])
        );
        let policy = without_scope(&["--hub", "h:1", "--all-namespaces"])
            .unwrap()
            .policy();
        assert_eq!(policy.namespaces, NamespacePolicy::All);
    }

    #[test]
    fn the_ops_endpoint_listens_on_loopback_unless_told_otherwise() {
        let args = with(&["--hub", "h:1"]).unwrap();
        assert_eq!(args.ops_listen, "127.0.0.1:8081".parse().unwrap());
        let wide = with(&["--hub", "h:1", "--ops-listen", "0.0.0.0:8081"]).unwrap();
        assert_eq!(wide.ops_listen, "0.0.0.0:8081".parse().unwrap());
    }

    #[test]
    fn kinds_default_to_deployments_and_statefulsets() {
        let kinds = |flags: &[&str]| -> Vec<String> {
            with(&[&["--hub", "h:1"][..], flags].concat())
                .unwrap()
                .policy()
                .kinds
                .kinds()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(kinds(&[]), ["apps/v1/Deployment", "apps/v1/StatefulSet"]);
        assert_eq!(
            kinds(&["--kinds", "apps/v1/Deployment,v1/ReplicationController"]),
            ["apps/v1/Deployment", "v1/ReplicationController"]
        );
        let error = with(&["--hub", "h:1", "--kinds", "Deployment"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--kinds") && error.contains("group/version/Kind"),
            "{error}"
        );
    }

    fn args(hub: &str) -> AgentArgs {
        with(&["--hub", hub]).unwrap()
    }

    #[test]
    fn enrollment_flags() {
        let parse = |extra: &[&str]| {
            let all = [
                "kedge-agent",
                "--hub",
                "hub:7443",
                "--tls-ca",
                "ca",
                "--namespaces",
                "apps",
            ]
            .into_iter()
            .chain(extra.iter().copied());
            AgentArgs::try_parse_from(all).and_then(AgentArgs::checked)
        };
        let a = parse(&["--bootstrap-token-file", "/etc/kedge/token"]).unwrap();
        assert_eq!(a.tls_cert, None);
        assert_eq!(a.identity_secret, "kedge-agent-identity");
        assert_eq!(
            a.bootstrap_token_file.as_deref(),
            Some(std::path::Path::new("/etc/kedge/token"))
        );
        let a = parse(&["--identity-secret", "id", "--agent-namespace", "edge"]).unwrap();
        assert_eq!(
            (a.identity_secret.as_str(), a.agent_namespace.as_str()),
            ("id", "edge")
        );
        // A certificate without its key (or the reverse) is refused.
        assert!(parse(&["--tls-cert", "c"]).is_err());
        assert!(parse(&["--tls-key", "k"]).is_err());
    }

    #[test]
    fn server_name_defaults_to_the_hub_host() {
        let name = |hub: &str| args(hub).server_name(hub);
        assert_eq!(name("hub.example:7443"), "hub.example");
        assert_eq!(name("127.0.0.1:7443"), "127.0.0.1");
        assert_eq!(name("[::1]:7443"), "::1");
        let mut a = args("10.0.0.1:7443");
        a.hub_server_name = Some("kedge-hub.kedge-system.svc".into());
        assert_eq!(a.server_name("10.0.0.1:7443"), "kedge-hub.kedge-system.svc");
    }

    #[test]
    fn several_hubs() {
        let a = args("hub-0.example:7443, hub-1.example:7443,,[::1]:7443");
        assert_eq!(
            a.hubs(),
            ["hub-0.example:7443", "hub-1.example:7443", "[::1]:7443"]
        );
        let names: Vec<String> = a.hubs().iter().map(|h| a.server_name(h)).collect();
        assert_eq!(names, ["hub-0.example", "hub-1.example", "::1"]);
        let mut a = a;
        a.hub_server_name = Some("kedge-hub".into());
        assert!(a.hubs().iter().all(|h| a.server_name(h) == "kedge-hub"));
        assert_eq!(args("hub:7443").hubs(), ["hub:7443"]);
    }

    fn parse(extra: &[&str]) -> Result<AgentArgs, clap::Error> {
        with(&[&["--hub", "hub:7443"][..], extra].concat())
    }

    #[test]
    fn flags_out_of_range_are_refused_naming_the_flag_and_range() {
        for (flag, bad, expected) in [
            ("--report-interval", "0s", "must be between 50ms and 10m"),
            ("--report-interval", "5124095576030431h", "must be between"),
            ("--capacity-interval", "0s", "must be between 100ms and 1h"),
            ("--reconnect-initial", "0s", "must be between 10ms and 1m"),
            ("--reconnect-max", "2h", "must be between 100ms and 1h"),
            ("--heartbeat-tolerance", "0", "0 is not in 1..=100"),
        ] {
            let error = parse(&[flag, bad]).unwrap_err().to_string();
            assert!(error.contains(flag), "{flag} {bad}: {error}");
            assert!(error.contains(expected), "{flag} {bad}: {error}");
        }
        let error = parse(&["--reconnect-initial", "10s", "--reconnect-max", "1s"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--reconnect-max (1s) must be at least --reconnect-initial (10s)"),
            "{error}"
        );
        let error = with(&["--hub", " , "]).unwrap_err().to_string();
        assert!(error.contains("--hub needs at least one"), "{error}");
        let ok = parse(&["--report-interval", "50ms", "--reconnect-max", "500ms"]).unwrap();
        assert_eq!(ok.report_interval, Duration::from_millis(50));
    }
}

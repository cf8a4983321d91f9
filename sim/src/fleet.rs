//! A whole local fleet on loopback (`kedge-sim up`): one simulated hub cluster and N member
//! clusters, kedge's CRDs and KEDA's CRDs and namespace installed on the hub, the real
//! `kedge-hub` keeping its CA in a Secret, the agents' namespaces created in every cluster,
//! each member enrolled with the real `kubectl kedge mc setup-member` (its install applied
//! to the member cluster), and one real `kedge-agent` per member run as that install's Deployment runs it: with the Secret's
//! bootstrap token and a token of its least-privilege ServiceAccount. A member given a
//! [`LinkSpec`] reaches the hub through a [`LinkEmulator`] (`kedge-sim up --link`).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::link::{LinkEmulator, LinkSpec};
use crate::{Error, Result, Sim, SimConfig};

/// Name of the hub's simulated cluster.
pub const HUB_CLUSTER: &str = "hub";

/// How to lay out the fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Member clusters, named `member-1` … `member-N`.
    pub members: usize,
    /// Where kubeconfigs, certificates and logs go.
    pub dir: PathBuf,
    /// Where `kedge-hub` and `kedge-agent` are.
    pub bin_dir: PathBuf,
    /// Heartbeat interval the hub asks for (e.g. `1s`).
    pub heartbeat: String,
    /// Settings of every simulated cluster.
    pub sim: SimConfig,
    /// The namespaces every agent may act in (its `--namespaces`): agents deny by default.
    pub agent_namespaces: Vec<String>,
    /// Extra flags for every agent (e.g. shorter report intervals in tests).
    pub agent_args: Vec<String>,
    /// Members whose agent reaches the hub through a link emulator, and its spec.
    pub links: BTreeMap<String, LinkSpec>,
    /// Also run `kubectl kedge dashboard` on the hub cluster (a free loopback port).
    pub dashboard: bool,
}

impl FleetConfig {
    /// Defaults: `members` members whose agents act in `default` only, binaries next to the
    /// running executable.
    pub fn new(members: usize, dir: PathBuf) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let bin_dir = exe
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::Fleet("cannot locate the kedge binaries".into()))?;
        Ok(Self {
            members,
            dir,
            bin_dir,
            heartbeat: "1s".into(),
            sim: SimConfig::default(),
            agent_namespaces: vec!["default".into()],
            agent_args: Vec::new(),
            links: BTreeMap::new(),
            dashboard: false,
        })
    }
}

/// A running fleet; [`Fleet::shutdown`] stops it.
#[derive(Debug)]
pub struct Fleet {
    /// The simulated clusters (`hub`, `member-1`, …).
    pub sim: Sim,
    hub: Child,
    agents: Vec<(String, Option<Child>)>,
    /// The link emulators in front of members' agents, alive as long as the fleet.
    links: BTreeMap<String, LinkEmulator>,
    /// `kubectl kedge dashboard` and its port, when asked for.
    dashboard: Option<(Child, u16)>,
    config: FleetConfig,
    quic_port: u16,
    ops_port: u16,
    scaler_port: u16,
}

fn free_udp_port() -> Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn free_tcp_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(program: &Path, args: &[String], log: &Path) -> Result<Child> {
    let file = std::fs::File::create(log)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true);
    command
        .spawn()
        .map_err(|e| Error::Fleet(format!("cannot start {}: {e}", program.display())))
}

impl Fleet {
    /// Starts everything and waits until every agent is connected.
    pub async fn up(config: FleetConfig) -> Result<Fleet> {
        let members: Vec<String> = (1..=config.members)
            .map(|i| format!("member-{i}"))
            .collect();
        check_links(&config.links, &members)?;
        for binary in ["kedge-hub", "kedge-agent", "kubectl-kedge"] {
            if !config.bin_dir.join(binary).exists() {
                return Err(Error::Fleet(format!(
                    "{} not found in {}: build the workspace binaries first (cargo build --workspace --bins)",
                    binary,
                    config.bin_dir.display()
                )));
            }
        }
        std::fs::create_dir_all(config.dir.join("logs"))?;
        // A previous run's file would name ports nothing listens on any more.
        remove_if_present(&config.dir.join(FLEET_ENV))?;
        let mut names = vec![HUB_CLUSTER.to_owned()];
        names.extend(members.iter().cloned());
        let sim = Sim::start(&names, config.sim.clone(), Some(&config.dir)).await?;
        let hub_cluster = sim
            .cluster(HUB_CLUSTER)
            .ok_or_else(|| Error::Fleet("the hub cluster did not start".into()))?;
        install_crds(hub_cluster.client()?).await?;
        // The agents' namespaces, in every member and on the hub (where the workloads that
        // spread to them are created), as a newcomer would otherwise create them by hand.
        for name in &names {
            let cluster = sim
                .cluster(name)
                .ok_or_else(|| Error::Fleet(format!("the cluster {name} did not start")))?;
            create_namespaces(cluster.client()?, &config.agent_namespaces).await?;
        }

        let (quic_port, ops_port, scaler_port) =
            (free_udp_port()?, free_tcp_port()?, free_tcp_port()?);
        let hub = start_hub(&config, quic_port, ops_port, scaler_port)?;
        let mut fleet = Fleet {
            sim,
            hub,
            agents: Vec::new(),
            links: BTreeMap::new(),
            dashboard: None,
            config,
            quic_port,
            ops_port,
            scaler_port,
        };
        fleet.wait_for_hub_ca(Duration::from_secs(30)).await?;
        fleet.start_links().await?;
        std::fs::create_dir_all(fleet.config.dir.join("agents"))?;
        for member in &members {
            fleet.setup_member(member).await?;
            let child = fleet.spawn_agent(member)?;
            fleet.agents.push((member.clone(), Some(child)));
        }
        fleet
            .wait_connected(&members, Duration::from_secs(60))
            .await?;
        if fleet.config.dashboard {
            fleet.start_dashboard(Duration::from_secs(30)).await?;
        }
        // Written once the fleet is ready, so its presence means the facts are live.
        let facts = fleet.facts().absolute()?;
        std::fs::write(facts.env_file(), facts.to_env())?;
        Ok(fleet)
    }

    /// Starts `kubectl kedge dashboard` on the hub cluster, as a user would, and waits until
    /// it listens.
    async fn start_dashboard(&mut self, limit: Duration) -> Result<()> {
        let port = free_tcp_port()?;
        let args = [
            "dashboard".to_owned(),
            "--kubeconfig".to_owned(),
            self.kubeconfig(HUB_CLUSTER).display().to_string(),
            "--port".to_owned(),
            port.to_string(),
        ];
        let log = self.config.dir.join("logs/dashboard.log");
        let child = spawn(&self.config.bin_dir.join("kubectl-kedge"), &args, &log)?;
        self.dashboard = Some((child, port));
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if start.elapsed() > limit {
                return Err(Error::Fleet(format!(
                    "kubectl kedge dashboard did not listen on port {port} within {limit:?}; see {}",
                    log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Starts a link emulator towards the hub for each member given a spec.
    async fn start_links(&mut self) -> Result<()> {
        let hub = SocketAddr::from(([127, 0, 0, 1], self.quic_port));
        for (member, spec) in &self.config.links {
            let link = LinkEmulator::start(spec.clone(), hub).await?;
            self.links.insert(member.clone(), link);
        }
        Ok(())
    }

    /// Waits until the hub has created its CA Secret (on its first start).
    async fn wait_for_hub_ca(&self, limit: Duration) -> Result<()> {
        let client = self.cluster_client(HUB_CLUSTER)?;
        let secrets: Api<Secret> = Api::namespaced(client, HUB_NAMESPACE);
        let start = Instant::now();
        loop {
            if secrets.get_opt("kedge-hub-ca").await?.is_some() {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Fleet(format!(
                    "the hub created no CA Secret within {limit:?}; see {}",
                    self.config.dir.join("logs/hub.log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn cluster_client(&self, name: &str) -> Result<kube::Client> {
        self.sim
            .cluster(name)
            .ok_or_else(|| Error::Fleet(format!("no cluster {name}")))?
            .client()
    }

    /// Enrolls `member` with the real `kubectl kedge mc setup-member`, which creates its
    /// MemberCluster and bootstrap token and applies the agent's install to the member, and
    /// writes what the agent's Deployment mounts (the Secret's token and CA bundle) and a
    /// kubeconfig with a token of the agent's ServiceAccount into `agents/`.
    async fn setup_member(&self, member: &str) -> Result<()> {
        let out = Command::new(self.config.bin_dir.join("kubectl-kedge"))
            .args(["mc", "setup-member", member, "--namespaces"])
            .arg(self.config.agent_namespaces.join(","))
            .args([
                "--hub-address",
                &self.hub_addr(),
                "--hub-server-name",
                "localhost",
            ])
            .arg("--kubeconfig")
            .arg(self.kubeconfig(HUB_CLUSTER))
            .arg("--member-kubeconfig")
            .arg(self.kubeconfig(member))
            .args(["--hub-namespace", HUB_NAMESPACE])
            .output()
            .await?;
        if !out.status.success() {
            return Err(Error::Fleet(format!(
                "kubectl kedge mc setup-member {member}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let secrets: Api<Secret> = Api::namespaced(self.cluster_client(member)?, AGENT_NAMESPACE);
        let secret = secrets.get("kedge-agent-bootstrap").await?;
        let dir = self.agent_dir(member);
        std::fs::create_dir_all(&dir)?;
        for key in ["token", "ca.crt"] {
            let value = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| {
                    Error::Fleet(format!("{member}: the install's Secret has no {key}"))
                })?;
            std::fs::write(dir.join(key), &value.0)?;
        }
        let cluster = self
            .sim
            .cluster(member)
            .ok_or_else(|| Error::Fleet(format!("no cluster {member}")))?;
        let token = cluster.service_account_token(AGENT_NAMESPACE, "kedge-agent");
        std::fs::write(
            dir.join("kubeconfig"),
            cluster.kubeconfig_with_token(&token),
        )?;
        Ok(())
    }

    /// Where an agent's mounted files and kubeconfig are.
    fn agent_dir(&self, member: &str) -> PathBuf {
        self.config.dir.join("agents").join(member)
    }

    fn spawn_agent(&self, member: &str) -> Result<Child> {
        let dir = self.agent_dir(member);
        let path = |file: &str| dir.join(file).display().to_string();
        // Through its link emulator, if it has one; setup-member named the hub itself.
        let hub = self
            .links
            .get(member)
            .map_or_else(|| self.hub_addr(), |l| l.local_addr().to_string());
        let args = vec![
            "--hub".into(),
            hub,
            "--hub-server-name".into(),
            "localhost".into(),
            "--tls-ca".into(),
            path("ca.crt"),
            "--bootstrap-token-file".into(),
            path("token"),
            "--agent-namespace".into(),
            AGENT_NAMESPACE.into(),
            "--kubeconfig".into(),
            path("kubeconfig"),
            "--ops-listen".into(),
            "127.0.0.1:0".into(),
            "--reconnect-initial".into(),
            "200ms".into(),
            "--reconnect-max".into(),
            "2s".into(),
            "--namespaces".into(),
            self.config.agent_namespaces.join(","),
        ];
        let args: Vec<String> = args
            .into_iter()
            .chain(self.config.agent_args.iter().cloned())
            .collect();
        let log = self.config.dir.join("logs").join(format!("{member}.log"));
        spawn(&self.config.bin_dir.join("kedge-agent"), &args, &log)
    }

    /// Kubeconfig of a cluster of the fleet (`hub` or a member).
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        kubeconfig(&self.config.dir, cluster)
    }

    /// What a user needs to reach the fleet, with paths as the fleet was configured.
    pub fn facts(&self) -> FleetFacts {
        FleetFacts {
            dir: self.config.dir.clone(),
            bin_dir: self.config.bin_dir.clone(),
            members: self.members(),
            ops_url: self.ops_url(),
            hub_addr: self.hub_addr(),
            scaler_addr: self.scaler_addr(),
            dashboard_url: self
                .dashboard
                .as_ref()
                .map(|(_, port)| format!("http://127.0.0.1:{port}/")),
        }
    }

    /// Member names.
    pub fn members(&self) -> Vec<String> {
        self.agents.iter().map(|(name, _)| name.clone()).collect()
    }

    /// The hub's ops endpoint.
    pub fn ops_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ops_port)
    }

    /// The address of the hub's KEDA external scaler (gRPC with mutual TLS).
    pub fn scaler_addr(&self) -> String {
        format!("127.0.0.1:{}", self.scaler_port)
    }

    /// The link emulator between `member`'s agent and the hub, if it was given one.
    pub fn link(&self, member: &str) -> Option<&LinkEmulator> {
        self.links.get(member)
    }

    /// The hub's QUIC address.
    pub fn hub_addr(&self) -> String {
        format!("127.0.0.1:{}", self.quic_port)
    }

    /// The fleet's directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Process id of the hub, while it runs.
    pub fn hub_pid(&self) -> Option<u32> {
        self.hub.id()
    }

    /// Process id of a member's agent, while it runs.
    pub fn agent_pid(&self, member: &str) -> Option<u32> {
        self.agents
            .iter()
            .find(|(n, _)| n == member)?
            .1
            .as_ref()?
            .id()
    }

    /// The hub's session registry (`GET /v1/sessions`).
    pub async fn sessions(&self) -> Result<Vec<Value>> {
        let url = format!("{}/v1/sessions", self.ops_url());
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| Error::Fleet(format!("{url}: {e}")))?;
        let client = HttpClient::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let response = tokio::time::timeout(Duration::from_secs(5), client.get(uri))
            .await
            .map_err(|_| Error::Fleet(format!("{url}: no answer")))?
            .map_err(|e| Error::Fleet(format!("{url}: {e}")))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Error::Fleet(format!("{url}: {e}")))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| Error::Fleet(format!("{url}: {e}")))
    }

    /// Waits until every listed member has a connected session.
    pub async fn wait_connected(&self, members: &[String], limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Ok(sessions) = self.sessions().await {
                let connected = |m: &String| {
                    sessions
                        .iter()
                        .any(|s| s["member"] == m.as_str() && s["state"] == "Connected")
                };
                if members.iter().all(connected) {
                    return Ok(());
                }
            }
            if start.elapsed() > limit {
                return Err(Error::Fleet(format!(
                    "agents not connected after {limit:?}; see {}",
                    self.config.dir.join("logs").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every process (SIGTERM, then kill after 5 s) and the simulated clusters.
    pub async fn shutdown(mut self) {
        if let Some((child, _)) = self.dashboard.as_mut() {
            stop(child).await;
        }
        for (_, agent) in &mut self.agents {
            if let Some(child) = agent.as_mut() {
                stop(child).await;
            }
        }
        for link in self.links.values() {
            link.shutdown();
        }
        stop(&mut self.hub).await;
        self.sim.shutdown().await;
        // Nothing it names answers any more.
        let _ = remove_if_present(&self.config.dir.join(FLEET_ENV));
    }
}

/// Every member named in `links` is one of `members`.
fn check_links(links: &BTreeMap<String, LinkSpec>, members: &[String]) -> Result<()> {
    match links.keys().find(|m| !members.contains(m)) {
        Some(unknown) => Err(Error::Fleet(format!(
            "a link for {unknown}, which is not a member (the members are {})",
            members.join(", ")
        ))),
        None => Ok(()),
    }
}

fn kubeconfig(dir: &Path, cluster: &str) -> PathBuf {
    dir.join(format!("{cluster}.kubeconfig"))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// The file in the fleet's directory that names its kubeconfigs, endpoints and logs.
pub const FLEET_ENV: &str = "fleet.env";

/// What a user needs to reach a running fleet: the live view's header shows it and
/// `DIR/fleet.env` holds it for another terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetFacts {
    /// The fleet's directory (kubeconfigs, `logs/`, `fleet.env`).
    pub dir: PathBuf,
    /// Where `kedge-hub`, `kedge-agent` and `kubectl-kedge` are.
    pub bin_dir: PathBuf,
    /// Member names.
    pub members: Vec<String>,
    /// The hub's ops endpoint (`/v1/sessions`, metrics).
    pub ops_url: String,
    /// The hub's QUIC address.
    pub hub_addr: String,
    /// The hub's KEDA external scaler.
    pub scaler_addr: String,
    /// `kubectl kedge dashboard`, when the fleet runs one.
    pub dashboard_url: Option<String>,
}

impl FleetFacts {
    /// Kubeconfig of `hub` or a member.
    pub fn kubeconfig(&self, cluster: &str) -> PathBuf {
        kubeconfig(&self.dir, cluster)
    }

    /// The hub's and the agents' logs.
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// `DIR/fleet.env`.
    pub fn env_file(&self) -> PathBuf {
        self.dir.join(FLEET_ENV)
    }

    /// The same facts with absolute paths, for a file read from anywhere.
    pub fn absolute(&self) -> Result<Self> {
        Ok(Self {
            dir: std::path::absolute(&self.dir)?,
            bin_dir: std::path::absolute(&self.bin_dir)?,
            ..self.clone()
        })
    }

    /// The same facts with paths under `cwd` shortened to relative ones, for the screen.
    pub fn relative_to(&self, cwd: &Path) -> Self {
        let short = |p: &Path| {
            p.strip_prefix(cwd)
                .map_or_else(|_| p.to_owned(), Path::to_owned)
        };
        Self {
            dir: short(&self.dir),
            bin_dir: short(&self.bin_dir),
            ..self.clone()
        }
    }

    /// `KEY=VALUE` lines a shell can source (`set -a; . DIR/fleet.env; set +a`).
    /// `KEDGE_HUB_OPS_URL` is what `kubectl kedge sessions` reads.
    pub fn to_env(&self) -> String {
        let path = |p: PathBuf| p.display().to_string();
        let mut pairs = vec![
            (
                "HUB_KUBECONFIG".to_owned(),
                path(self.kubeconfig(HUB_CLUSTER)),
            ),
            ("MEMBERS".to_owned(), self.members.join(",")),
        ];
        for member in &self.members {
            let key = format!("{}_KUBECONFIG", member.to_uppercase().replace('-', "_"));
            pairs.push((key, path(self.kubeconfig(member))));
        }
        pairs.extend([
            ("OPS_URL".to_owned(), self.ops_url.clone()),
            ("KEDGE_HUB_OPS_URL".to_owned(), self.ops_url.clone()),
            ("HUB_ADDR".to_owned(), self.hub_addr.clone()),
            ("SCALER_ADDR".to_owned(), self.scaler_addr.clone()),
            ("LOGS_DIR".to_owned(), path(self.logs())),
            ("KEDGE_BIN_DIR".to_owned(), path(self.bin_dir.clone())),
        ]);
        if let Some(url) = &self.dashboard_url {
            pairs.push(("DASHBOARD_URL".to_owned(), url.clone()));
        }
        let mut out = String::from(
            "# kedge-sim up: the running fleet (removed when it stops).\n\
             # In a shell: set -a; . THIS_FILE; set +a\n",
        );
        for (key, value) in pairs {
            out.push_str(&format!("{key}={}\n", shell_quoted(&value)));
        }
        out
    }
}

/// `value` as one shell word: unchanged when it has only safe characters, else in single
/// quotes.
fn shell_quoted(value: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-:,@%+=".contains(c);
    if !value.is_empty() && value.chars().all(safe) {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

fn start_hub(
    config: &FleetConfig,
    quic_port: u16,
    ops_port: u16,
    scaler_port: u16,
) -> Result<Child> {
    let scaler = format!("127.0.0.1:{scaler_port}");
    // No certificate files: the hub keeps its CA in the Secret kedge-hub-ca of its namespace
    // and enrolls members.
    let args = vec![
        "--listen".into(),
        format!("127.0.0.1:{quic_port}"),
        "--ops-listen".into(),
        format!("127.0.0.1:{ops_port}"),
        "--namespace".into(),
        HUB_NAMESPACE.into(),
        "--server-dns-names".into(),
        "localhost".into(),
        "--heartbeat-interval".into(),
        config.heartbeat.clone(),
        "--kubeconfig".into(),
        config
            .dir
            .join(format!("{HUB_CLUSTER}.kubeconfig"))
            .display()
            .to_string(),
        // The local fleet runs both controllers.
        "--dsj-enabled".into(),
        "true".into(),
        // And the external scaler KEDA calls for `kedge-pod-metrics` triggers.
        "--scaler-listen".into(),
        scaler.clone(),
        "--scaler-address".into(),
        scaler,
    ];
    let log = config.dir.join("logs").join("hub.log");
    spawn(&config.bin_dir.join("kedge-hub"), &args, &log)
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The namespace the hub runs in (its Lease lives there), as the Helm chart would create it.
pub const HUB_NAMESPACE: &str = "kedge-system";

/// The namespace of each agent in its member cluster (what `setup-member` installs).
pub const AGENT_NAMESPACE: &str = "kedge-system";

/// Creates the namespaces that do not exist yet.
pub async fn create_namespaces(client: kube::Client, names: &[impl AsRef<str>]) -> Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    for name in names.iter().map(AsRef::as_ref) {
        let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .map_err(|e| Error::Fleet(format!("namespace {name}: {e}")))?;
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What installing the hub chart puts in the hub cluster: the CRDs and the hub's namespace;
/// and KEDA, which runs next to the hub: its CRDs (ScaledObject, TriggerAuthentication,
/// ClusterTriggerAuthentication) and its namespace.
pub async fn install_crds(client: kube::Client) -> Result<()> {
    create_namespaces(
        client.clone(),
        &[HUB_NAMESPACE, crate::keda::KEDA_NAMESPACE],
    )
    .await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut crds = kedge_core::crd::shipped_crds();
    for keda in crate::keda::CRDS {
        let keda: CustomResourceDefinition =
            serde_yaml::from_str(keda).map_err(|e| Error::Fleet(format!("KEDA CRD: {e}")))?;
        crds.push(keda);
    }
    for crd in crds {
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> FleetFacts {
        FleetFacts {
            dir: "/home/me/kedge/.kedge-fleet".into(),
            bin_dir: "/home/me/kedge/target/debug".into(),
            members: vec!["member-1".into(), "member-2".into()],
            ops_url: "http://127.0.0.1:41000".into(),
            hub_addr: "127.0.0.1:41001".into(),
            scaler_addr: "127.0.0.1:41002".into(),
            dashboard_url: Some("http://127.0.0.1:41003/".into()),
        }
    }

    #[test]
    fn the_env_file_names_every_kubeconfig_and_endpoint() {
        assert_eq!(
            facts().to_env(),
            "# kedge-sim up: the running fleet (removed when it stops).\n\
             # In a shell: set -a; . THIS_FILE; set +a\n\
             HUB_KUBECONFIG=/home/me/kedge/.kedge-fleet/hub.kubeconfig\n\
             MEMBERS=member-1,member-2\n\
             MEMBER_1_KUBECONFIG=/home/me/kedge/.kedge-fleet/member-1.kubeconfig\n\
             MEMBER_2_KUBECONFIG=/home/me/kedge/.kedge-fleet/member-2.kubeconfig\n\
             OPS_URL=http://127.0.0.1:41000\n\
             KEDGE_HUB_OPS_URL=http://127.0.0.1:41000\n\
             HUB_ADDR=127.0.0.1:41001\n\
             SCALER_ADDR=127.0.0.1:41002\n\
             LOGS_DIR=/home/me/kedge/.kedge-fleet/logs\n\
             KEDGE_BIN_DIR=/home/me/kedge/target/debug\n\
             DASHBOARD_URL=http://127.0.0.1:41003/\n"
        );
    }

    #[test]
    fn links_name_members_of_the_fleet() {
        let members = vec!["member-1".to_owned(), "member-2".to_owned()];
        let mut links = BTreeMap::new();
        assert!(check_links(&links, &members).is_ok());
        links.insert("member-2".to_owned(), LinkSpec::default());
        assert!(check_links(&links, &members).is_ok());
        links.insert("member-3".to_owned(), LinkSpec::default());
        let err = check_links(&links, &members).expect_err("member-3 is unknown");
        assert_eq!(
            err.to_string(),
            Error::Fleet(
                "a link for member-3, which is not a member (the members are member-1, member-2)"
                    .into()
            )
            .to_string()
        );
    }

    #[test]
    fn odd_paths_are_quoted_for_the_shell() {
        assert_eq!(shell_quoted("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quoted("it's"), "'it'\\''s'");
        assert_eq!(shell_quoted(""), "''");
        assert_eq!(shell_quoted("/tmp/ok-1.x"), "/tmp/ok-1.x");
    }

    #[test]
    fn paths_under_the_working_directory_are_shown_relative() {
        let shown = facts().relative_to(Path::new("/home/me/kedge"));
        assert_eq!(shown.dir, Path::new(".kedge-fleet"));
        assert_eq!(shown.bin_dir, Path::new("target/debug"));
        let elsewhere = facts().relative_to(Path::new("/srv"));
        assert_eq!(elsewhere, facts());
    }
}
